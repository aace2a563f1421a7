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

Progress = Callable[[int, int, str], None]  # (kernels done, kernels in all, what now)


@dataclass
class LoadStats:
    kernels: int = 0
    cache_hits: int = 0  # kernels Numba loaded from its on-disk cache
    compiled: int = 0  # kernels compiled from source
    seconds: float = 0.0
    retried: bool = False  # Numba's cache was unreadable and was cleared once


def import_module(path: Path, key: str) -> ModuleType:
    name = f"irc_cpu_{key[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba looks functions' modules up by name
    spec.loader.exec_module(module)
    return module


def _compile_all(module: ModuleType, progress: Progress | None, stats: LoadStats) -> None:
    sigs = module.SIGNATURES
    stats.kernels = len(sigs)
    for i, (name, sig) in enumerate(sigs):
        if progress is not None:
            progress(i, len(sigs), name)
        fn = getattr(module, name)
        fn.compile(sig)
        fn.disable_compile()
        hits = sum(fn.stats.cache_hits.values())
        stats.cache_hits += 1 if hits else 0
        stats.compiled += 0 if hits else 1
    if progress is not None:
        progress(len(sigs), len(sigs), "done")


def numba_cache_files(path: Path) -> list[Path]:
    """Numba's index and data files for the module at ``path`` (``__pycache__/<stem>.*``)."""
    pycache = path.parent / "__pycache__"
    if not pycache.is_dir():
        return []
    return sorted(p for p in pycache.iterdir() if p.name.startswith(path.stem + ".") and p.suffix in (".nbi", ".nbc"))


def load(path: Path, key: str, progress: Progress | None = None) -> tuple[ModuleType, LoadStats]:
    """Import and compile; if Numba's cache for this module is unreadable, clear it and retry once."""
    start = time.perf_counter()
    stats = LoadStats()
    module = import_module(path, key)
    try:
        _compile_all(module, progress, stats)
    except Exception:
        # A truncated or corrupted Numba cache file raises from pickle or the index reader.
        # Clear this module's files and compile again; a real error will recur and propagate.
        for f in numba_cache_files(path):
            f.unlink(missing_ok=True)
        stats = LoadStats(retried=True)
        module = import_module(path, key)
        _compile_all(module, progress, stats)
    stats.seconds = time.perf_counter() - start
    return module, stats
