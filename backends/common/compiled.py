"""What a compiled graph of either code-generating backend does the same way: it holds the
imported module and checks the weights and inputs a run is given against the module's
WEIGHTS and INPUTS tables (the same tables in the cpu and cuda modules); and how either backend
finds its generated module in the cache (``cached_build``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from irc.backends.common.cache import entry_lock, entry_path, read_entry, with_fallback, write_entry
from irc.diagnostics import IrcError

T = TypeVar("T")

INT_DTYPES = ("i64", "i32", "i8", "int8")


class CompiledModule:
    """A generated module from the cache, imported and compiled (a backend's subclass runs it)."""

    def __init__(self, module: ModuleType, path: Path, key: str, source: str, stats: Any, rebuilt: bool):
        self.module = module
        self.path = path
        self.key = key
        self.source = source
        self.stats = stats
        self.rebuilt = rebuilt  # the cached source was missing or invalid and was written
        self.profile: dict[str, float] | None = None  # set to {} to collect seconds per op

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.module.WEIGHTS)

    def _weights(self, weights: dict[str, Any]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for key, shape in self.module.WEIGHTS:
            if key not in weights:
                raise IrcError(f"missing weight '{key}' (expected shape {list(shape)})")
            arr = np.asarray(weights[key])
            if tuple(arr.shape) != tuple(shape):
                raise IrcError(f"weight '{key}' has shape {list(arr.shape)}, the model expects {list(shape)}")
            if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
                raise IrcError(f"weight '{key}' holds {arr.dtype}, not numbers")
            out[key] = _writeable(np.ascontiguousarray(arr, dtype=np.float32))
        return out

    def _inputs(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        specs = {name: (dtype, shape) for name, dtype, shape in self.module.INPUTS}
        for name in inputs:
            if name not in specs:
                raise IrcError(f"unknown input '{name}' (the model's inputs: {', '.join(specs) or 'none'})")
        out: dict[str, np.ndarray] = {}
        for name, (dtype, shape) in specs.items():
            if name not in inputs:
                raise IrcError(f"missing input '{name}' ({dtype}[{','.join(str(d) for d in shape)}])")
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != tuple(shape):
                raise IrcError(f"input '{name}' has shape {list(arr.shape)}, the model expects {list(shape)}")
            if dtype in INT_DTYPES and not np.issubdtype(arr.dtype, np.integer):
                raise IrcError(f"input '{name}' must hold integers ({dtype}), got {arr.dtype}")
            if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
                raise IrcError(f"input '{name}' holds {arr.dtype}, not numbers")
            out[name] = _writeable(arr)
        return out


def _writeable(arr: np.ndarray) -> np.ndarray:
    """Numba types read-only arrays apart, and kernels are compiled for writeable ones only."""
    return arr if arr.flags.writeable else arr.copy()


def cached_build(directory: Path, key: str, source: str, build: Callable[[Path, Path, bool], T]) -> T:
    """``build(folder, path, rebuilt)`` under the lock of the cache entry ``key``, once its file
    ``path`` holds ``source`` (``rebuilt``: it was missing, corrupted or not what we would write,
    and was written). Where the cache folder cannot be written, the same in a fresh private one."""

    def attempt(folder: Path) -> T:
        path = entry_path(folder, key)
        with entry_lock(folder, key):  # another process compiling the same graph waits here
            rebuilt = read_entry(path, key) != source
            if rebuilt:
                write_entry(path, key, source)
            return build(folder, path, rebuilt)

    return with_fallback(directory, attempt)
