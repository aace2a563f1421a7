"""``compile_graph``: cache lookup, code generation, import; and the runnable result."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from irc.backends.cpu.cache import cache_key, entry_lock, entry_path, prepare_dir, read_entry, write_entry
from irc.backends.cpu.emit import BACKEND_VERSION, emit_source
from irc.backends.cpu.loader import LoadStats, Progress, load
from irc.diagnostics import IrcError
from irc.graph import Graph

INT_DTYPES = ("i64", "i32", "i8", "int8")


class CompiledGraph:
    """A graph's generated module, imported and compiled: ``run(weights, inputs)``."""

    def __init__(self, module: ModuleType, path: Path, key: str, source: str, stats: LoadStats, rebuilt: bool):
        self.module = module
        self.path = path
        self.key = key
        self.source = source
        self.stats = stats
        self.rebuilt = rebuilt  # the cached source was missing or invalid and was written
        self.profile: dict[str, float] | None = None  # set to {} to collect seconds per kernel

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.module.WEIGHTS)

    def run(self, weights: dict[str, Any], inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        w = self._weights(weights)
        x = self._inputs(inputs)
        try:
            if self.profile is not None:
                return self._run_profiled(w, x, self.profile)
            return self.module.run(w, x)
        except self.module.InputError as e:
            raise IrcError(str(e)) from None

    def _run_profiled(self, w: dict, x: dict, profile: dict[str, float]) -> dict[str, np.ndarray]:
        """Run with every kernel wrapped in a timer; the rest is the driver's NumPy work."""
        names = [name for name, _ in self.module.SIGNATURES]
        originals = {name: getattr(self.module, name) for name in names}

        def timed(name: str, fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    profile[name] = profile.get(name, 0.0) + time.perf_counter() - start
            return call

        start = time.perf_counter()
        before = sum(profile.get(name, 0.0) for name in names)
        try:
            for name, fn in originals.items():
                setattr(self.module, name, timed(name, fn))
            return self.module.run(w, x)
        finally:
            for name, fn in originals.items():
                setattr(self.module, name, fn)
            in_kernels = sum(profile.get(name, 0.0) for name in names) - before
            driver = "driver (NumPy shape ops, allocation)"
            profile[driver] = profile.get(driver, 0.0) + time.perf_counter() - start - in_kernels

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
                raise IrcError(f"missing input '{name}' ({dtype}{list(shape)})")
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


def compile_graph(graph: Graph, cache_dir: str | Path | None = None,
                  progress: Progress | None = None) -> CompiledGraph:
    """Generate (or find in the cache) the graph's module, import it and compile its kernels.

    ``progress(done, total, kernel)`` is called before each kernel and once at the end.
    """
    from irc.backends.cpu.cache import default_cache_dir

    source = emit_source(graph)
    key = cache_key(graph, BACKEND_VERSION)
    directory = prepare_dir(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    path = entry_path(directory, key)
    with entry_lock(directory, key):
        rebuilt = read_entry(path, key) != source  # missing, corrupted or not what we would write
        if rebuilt:
            write_entry(path, key, source)
        module, stats = load(path, key, progress)
    return CompiledGraph(module, path, key, source, stats, rebuilt)
