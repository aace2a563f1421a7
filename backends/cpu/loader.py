"""Import a cached module and compile its kernels eagerly, one signature each.

Kernels are compiled (or loaded from Numba's cache) here rather than at their first call,
so a long compile can report progress, and afterwards each kernel's compilation is
disabled: a call with other argument types is an error, not a silent recompile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from irc.backends.common.loader import Progress, import_and_compile, import_module
from irc.backends.cpu.kernel_library import compile_signature

if TYPE_CHECKING:
    from irc.backends.cpu.kernel_library import KernelLibrary

PREFIX = "irc_cpu"  # sys.modules names of the generated modules: irc_cpu_<key>


@dataclass
class LoadStats:
    kernels: int = 0
    cache_hits: int = 0  # kernels Numba loaded from its on-disk cache
    compiled: int = 0  # kernels compiled from source
    seconds: float = 0.0
    retried: bool = False  # Numba's cache was unreadable and was cleared once


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
            hit = compile_signature(fn, sig)
        else:
            try:
                fn, hit = library.load(name, sig)
            except Exception:
                # a file Numba cannot read (its own format checks) raises from pickle or the
                # index reader: clear this kernel's files and compile again (a real error recurs)
                library.forget(name)
                stats.retried = True
                library.compile_elsewhere([(name, sig)])
                fn, hit = library.load(name, sig)
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


def load(path: Path, key: str, text: str, progress: Progress | None = None,
         library: KernelLibrary | None = None) -> tuple[ModuleType, LoadStats]:
    """Run ``text`` (the checked contents of ``path``) and compile its kernels; if Numba's
    cache for this module is unreadable, clear it and retry once."""
    start = time.perf_counter()
    if library is not None:
        stats = LoadStats()
        module = import_module(path, key, PREFIX, text)
        _compile_all(module, progress, stats, library)
    else:
        def compile_all(module: ModuleType, retried: bool) -> LoadStats:
            stats = LoadStats(retried=retried)
            _compile_all(module, progress, stats)
            return stats

        module, stats = import_and_compile(path, key, PREFIX, text, compile_all)
    stats.seconds = time.perf_counter() - start
    return module, stats
