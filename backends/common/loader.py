"""Run a generated module from the cache (the cpu and cuda backends' loaders both do).

A module is executed from the text irc checked, compiled here: Python's import machinery
would run ``__pycache__/<name>.pyc`` instead whenever its stamp (the source's mtime and
size) matches, and a planted ``.pyc`` with the right stamp is not the checked source. No
``.pyc`` is read or written. Each module is registered in ``sys.modules`` under
``<prefix>_<key>``: numba looks a function's module up by name when it compiles or caches
it, and finds the source file (for its cache's stamp) through the code's file name.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from irc.backends.common import manifest

Progress = Callable[[int, int, str], None]  # (kernels done, kernels in all, what now)
S = TypeVar("S")  # a loader's statistics


@contextlib.contextmanager
def numba_cache_beside_source() -> Iterator[None]:
    """Numba caches a function where ``NUMBA_CACHE_DIR`` says when it is set, out of irc's
    sight: while irc's modules run their decorators, the cache is the ``__pycache__`` beside
    the module, the folder irc keeps private and checks."""
    try:
        from numba.core import config
    except ImportError:  # the module's own import of numba reports it
        yield
        return
    saved = config.CACHE_DIR
    config.CACHE_DIR = ""
    try:
        yield
    finally:
        config.CACHE_DIR = saved


def exec_source(path: Path, name: str, text: str) -> ModuleType:
    """Run ``text`` (the checked contents of ``path``) as the module ``name``."""
    code = compile(text, str(path), "exec", dont_inherit=True)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # numba looks functions' modules up by name
    try:
        with numba_cache_beside_source():
            exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_module(path: Path, key: str, prefix: str, text: str) -> ModuleType:
    """The generated module at ``path`` (whose checked contents are ``text``) as ``<prefix>_<key>``.
    Its kernels' decorators make Numba's ``__pycache__`` beside it: made private here first."""
    manifest.pycache(path)
    return exec_source(path, f"{prefix}_{key[:24]}", text)


def import_and_compile(path: Path, key: str, prefix: str, text: str,
                       compile_all: Callable[[ModuleType, bool], S]) -> tuple[ModuleType, S]:
    """Import the module and compile its kernels (``compile_all(module, retried)`` returns the
    stats), with Numba's files for it checked first and sealed after (:mod:`.manifest`).
    A file that still cannot be read (Numba's own format checks) raises from pickle or the
    index reader: then clear this module's files and do it again, once; a real error recurs."""
    manifest.verify(path)
    module = import_module(path, key, prefix, text)
    try:
        stats = compile_all(module, False)
    except Exception:
        manifest.forget(path)
        module = import_module(path, key, prefix, text)
        stats = compile_all(module, True)
    manifest.seal(path)
    return module, stats
