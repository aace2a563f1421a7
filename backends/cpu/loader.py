"""Import a cached module and compile its kernels eagerly, one signature each.

Kernels are compiled (or loaded from Numba's cache) here rather than at their first call,
so a long compile can report progress, and afterwards each kernel's compilation is
disabled: a call with other argument types is an error, not a silent recompile.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from irc.backends.cpu.kernel_library import KernelLibrary

Progress = Callable[[int, int, str], None]  # (kernels done, kernels in all, what now)
S = TypeVar("S")  # a loader's statistics
PREFIX = "irc_cpu"  # sys.modules names of the generated modules: irc_cpu_<key>


@dataclass
class LoadStats:
    kernels: int = 0
    cache_hits: int = 0  # kernels Numba loaded from its on-disk cache
    compiled: int = 0  # kernels compiled from source
    seconds: float = 0.0
    retried: bool = False  # Numba's cache was unreadable and was cleared once


def import_module(path: Path, key: str, prefix: str = PREFIX) -> ModuleType:
    """Import the generated module at ``path`` as ``<prefix>_<key>`` (the cuda backend's too)."""
    name = f"{prefix}_{key[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba looks functions' modules up by name
    spec.loader.exec_module(module)
    return module


def _compile_kernel(fn: Any, sig: str) -> bool:
    """Compile (or load from Numba's cache) one signature; True when it came from a cache."""
    before = len(fn.overloads)
    fn.compile(sig)
    if len(fn.overloads) == before:  # compiled earlier in this process (a kernel shared by graphs)
        return True
    return bool(sum(fn.stats.cache_hits.values()))


def _compile_all(module: ModuleType, progress: Progress | None, stats: LoadStats,
                 library: KernelLibrary | None = None) -> None:
    """Compile every kernel; with a library, the module runs the shared copy of each kernel,
    compiled by a child process when the cache lacks it (see ``compile_elsewhere``)."""
    sigs = module.SIGNATURES
    stats.kernels = len(sigs)
    if library is not None:
        missing = [(name, sig) for name, sig in sigs if not library.cached(name)]
        if missing:
            order = {name: i for i, (name, _) in enumerate(missing)}

            def done(name: str) -> None:
                if progress is not None and name in order and order[name] + 1 < len(missing):
                    progress(order[name] + 1, len(sigs), missing[order[name] + 1][0])
            if progress is not None:
                progress(0, len(sigs), missing[0][0])
            if library.compile_elsewhere(missing, done):
                stats.compiled = len(missing)  # by the child; any it left are counted below
    for i, (name, sig) in enumerate(sigs):
        if progress is not None and library is None:
            progress(i, len(sigs), name)
        if library is None:
            fn = getattr(module, name)
            hit = _compile_kernel(fn, sig)
        else:
            try:
                fn = library.kernel(name)
                hit = _compile_kernel(fn, sig)
            except Exception:
                # a truncated or corrupted Numba cache file raises from pickle or the index
                # reader: clear this kernel's files and compile again (a real error recurs)
                library.forget(name)
                stats.retried = True
                library.compile_elsewhere([(name, sig)])
                fn = library.kernel(name)
                hit = _compile_kernel(fn, sig)
            setattr(module, name, fn)
        fn.disable_compile()
        if library is None or not hit:
            stats.cache_hits += 1 if hit else 0
            stats.compiled += 0 if hit else 1
    if library is not None:
        stats.compiled = min(stats.compiled, stats.kernels)
        stats.cache_hits = stats.kernels - stats.compiled
    if progress is not None:
        progress(len(sigs), len(sigs), "done")


def numba_cache_files(path: Path) -> list[Path]:
    """Numba's index and data files for the module at ``path`` (``__pycache__/<stem>.*``)."""
    pycache = path.parent / "__pycache__"
    if not pycache.is_dir():
        return []
    return sorted(p for p in pycache.iterdir() if p.name.startswith(path.stem + ".") and p.suffix in (".nbi", ".nbc"))


def import_and_compile(path: Path, key: str, prefix: str,
                       compile_all: Callable[[ModuleType, bool], S]) -> tuple[ModuleType, S]:
    """Import the module and compile its kernels (``compile_all(module, retried)`` returns the
    stats). A truncated or corrupted Numba cache file raises from pickle or the index reader:
    then clear this module's files and do it again, once; a real error recurs and propagates."""
    module = import_module(path, key, prefix)
    try:
        return module, compile_all(module, False)
    except Exception:
        for f in numba_cache_files(path):
            f.unlink(missing_ok=True)
        module = import_module(path, key, prefix)
        return module, compile_all(module, True)


def load(path: Path, key: str, progress: Progress | None = None,
         library: KernelLibrary | None = None) -> tuple[ModuleType, LoadStats]:
    """Import and compile; if Numba's cache for this module is unreadable, clear it and retry once."""
    start = time.perf_counter()
    if library is not None:
        stats = LoadStats()
        module = import_module(path, key)
        _compile_all(module, progress, stats, library)
    else:
        def compile_all(module: ModuleType, retried: bool) -> LoadStats:
            stats = LoadStats(retried=retried)
            _compile_all(module, progress, stats)
            return stats

        module, stats = import_and_compile(path, key, PREFIX, compile_all)
    stats.seconds = time.perf_counter() - start
    return module, stats
