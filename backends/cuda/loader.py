"""Import a cached CUDA module, bind its reduction path, and compile its kernels eagerly.

Kernels are compiled here (or loaded from numba's cache beside the module) rather than at
their first launch, so a long compile reports progress and each kernel's compile time is
known. The simulator compiles nothing: its kernels are the Python functions themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from irc.backends.common.loader import Progress, import_and_compile
from irc.backends.common.loader import import_module as import_generated
from irc.backends.cuda.module import PATHS

PREFIX = "irc_cuda"  # sys.modules names of the generated modules: irc_cuda_<key>


@dataclass
class LoadStats:
    kernels: int = 0
    seconds: float = 0.0
    compile_seconds: dict[str, float] = field(default_factory=dict)  # kernel -> seconds (GPU only)
    retried: bool = False  # numba's cache was unreadable and was cleared once


def import_module(path: Path, key: str, text: str) -> ModuleType:
    return import_generated(path, key, PREFIX, text)


def kernels_for(module: ModuleType, path: str) -> list[tuple[str, str]]:
    """(name, signature) of the kernels a run with reduction ``path`` launches."""
    other = [f"__{p}" for p in PATHS if p != path]
    return [(name, sig) for name, sig in module.SIGNATURES if not any(name.endswith(s) for s in other)]


def _compile_all(module: ModuleType, path: str, simulator: bool, progress: Progress | None,
                 stats: LoadStats) -> None:
    module.use_reduction(path)
    todo = kernels_for(module, path)
    stats.kernels = len(todo)
    for i, (name, sig) in enumerate(todo):
        if progress is not None:
            progress(i, len(todo), name)
        if simulator:
            continue
        start = time.perf_counter()
        getattr(module, name).compile(sig)
        stats.compile_seconds[name] = time.perf_counter() - start
    if progress is not None:
        progress(len(todo), len(todo), "done")


def load(path: Path, key: str, text: str, reduction: str, simulator: bool,
         progress: Progress | None = None) -> tuple[ModuleType, LoadStats]:
    """Run ``text`` (the checked contents of ``path``), bind the reduction path and compile the
    kernels; if numba's cache for this module is unreadable, clear it and retry once."""
    start = time.perf_counter()

    def compile_all(module: ModuleType, retried: bool) -> LoadStats:
        stats = LoadStats(retried=retried)
        _compile_all(module, reduction, simulator, progress, stats)
        return stats

    module, stats = import_and_compile(path, key, PREFIX, text, compile_all)
    stats.seconds = time.perf_counter() - start
    return module, stats
