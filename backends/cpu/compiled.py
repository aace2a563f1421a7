"""``compile_graph``: cache lookup, code generation, import; and the runnable result."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import numpy as np

from irc.backends.cpu.cache import (
    HEADER_LINES,
    cache_key,
    entry_lock,
    entry_path,
    prepare_dir,
    read_entry,
    write_entry,
)
from irc.backends.cpu.emit import BACKEND_VERSION, emit_module
from irc.backends.cpu.kernel_library import KernelLibrary, kernel_texts
from irc.backends.cpu.loader import LoadStats, Progress, load
from irc.backends.cpu.threads import configured_threads, single_pool
from irc.diagnostics import IrcError
from irc.graph import Graph

INT_DTYPES = ("i64", "i32", "i8", "int8")


class CompiledGraph:
    """A graph's generated module, imported and compiled: ``run(weights, inputs)``.

    Weights the graph derives (merged Q/K/V and gate/up matrices) are computed on the first
    run with a weights dict and kept while the same arrays are passed again (by identity:
    after changing a weight array in place, call :meth:`forget_weights`).
    """

    def __init__(self, module: ModuleType, path: Path, key: str, source: str, stats: LoadStats, rebuilt: bool,
                 graph: Graph | None = None, steps: dict[int, int] | None = None):
        self.module = module
        self.path = path
        self.key = key
        self.source = source
        self.stats = stats
        self.rebuilt = rebuilt  # the cached source was missing or invalid and was written
        self.graph = graph
        self.steps = steps or {}  # driver line -> node index, for the profile
        self.profile: dict[str, float] | None = None  # set to {} to collect seconds per op
        self.node_profile: dict[int, float] | None = None  # seconds per node index, with profile
        self._prepared: tuple[tuple[int, ...], list[Any], dict[str, np.ndarray]] | None = None

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.module.WEIGHTS)

    def forget_weights(self) -> None:
        """Drop the converted and derived weights kept from the last run."""
        self._prepared = None

    def run(self, weights: dict[str, Any], inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        w = self._prepare(weights)
        x = self._inputs(inputs)
        try:
            with single_pool(configured_threads()):
                if self.profile is not None:
                    return self._run_profiled(w, x, self.profile)
                return self.module.run(w, x)
        except self.module.InputError as e:
            raise IrcError(str(e)) from None

    def _prepare(self, weights: dict[str, Any]) -> dict[str, np.ndarray]:
        """float32 C-contiguous weights plus the derived ones, reused while the arrays are the same."""
        keys = [k for k, _ in self.module.WEIGHTS]
        given = [weights.get(k) for k in keys]
        ident = tuple(id(a) for a in given)
        if self._prepared is not None and self._prepared[0] == ident:
            return self._prepared[2]
        w = self._weights(weights)
        if self.module.DERIVED:
            with single_pool():
                w.update(self.module.derive(w))
        self._prepared = (ident, given, w)  # holding ``given`` keeps the ids from being recycled
        return w

    def _run_profiled(self, w: dict, x: dict, profile: dict[str, float]) -> dict[str, np.ndarray]:
        """Run with a line tracer on the driver: the time between two of its lines goes to the
        node that wrote the first (kernels are compiled code, so only driver lines are traced)."""
        code = self.module.run.__code__
        steps = self.steps
        per_node: dict[int, float] = {}
        state = {"node": -1, "t": time.perf_counter()}

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            now = time.perf_counter()
            node = state["node"]
            per_node[node] = per_node.get(node, 0.0) + now - state["t"]
            state["node"] = steps.get(frame.f_lineno, -1) if event == "line" else -1
            state["t"] = time.perf_counter()
            return local

        def glob(frame: FrameType, event: str, arg: Any) -> Any:
            return local if frame.f_code is code else None

        old = sys.gettrace()
        sys.settrace(glob)
        try:
            return self.module.run(w, x)
        finally:
            sys.settrace(old)
            now = time.perf_counter()
            per_node[state["node"]] = per_node.get(state["node"], 0.0) + now - state["t"]
            nodes = self.graph.nodes if self.graph is not None else []
            self.node_profile = per_node
            for i, sec in per_node.items():
                op = nodes[i].op if 0 <= i < len(nodes) else "driver"  # setup and return lines
                profile[op] = profile.get(op, 0.0) + sec

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


def compile_graph(graph: Graph, cache_dir: str | Path | None = None,
                  progress: Progress | None = None) -> CompiledGraph:
    """Generate (or find in the cache) the graph's module, import it and compile its kernels.

    ``progress(done, total, kernel)`` is called before each kernel and once at the end.
    """
    from irc.backends.cpu.cache import default_cache_dir

    source, steps, parts = emit_module(graph)
    key = cache_key(graph, BACKEND_VERSION)
    directory = prepare_dir(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    path = entry_path(directory, key)
    library = KernelLibrary(directory, kernel_texts(parts))
    with entry_lock(directory, key):
        rebuilt = read_entry(path, key) != source  # missing, corrupted or not what we would write
        if rebuilt:
            write_entry(path, key, source)
        module, stats = load(path, key, progress, library)
    steps = {line + HEADER_LINES: node for line, node in steps.items()}  # the file starts with the cache header
    return CompiledGraph(module, path, key, source, stats, rebuilt, graph, steps)
