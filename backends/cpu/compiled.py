"""``compile_graph``: cache lookup, code generation, import; and the runnable result."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import numpy as np

from irc.backends.common.cache import HEADER_LINES, cache_key, default_cache_dir, header, prepare_dir
from irc.backends.common.compiled import CompiledModule, cached_build
from irc.backends.cpu.aligned import aligned64
from irc.backends.cpu.emit import BACKEND_VERSION, emit_module
from irc.backends.cpu.kernel_library import KernelLibrary, kernel_texts
from irc.backends.cpu.loader import LoadStats, Progress, load
from irc.backends.cpu.threads import configured_threads, single_pool
from irc.diagnostics import IrcError
from irc.graph import Graph


class CompiledGraph(CompiledModule):
    """A graph's generated module, imported and compiled: ``run(weights, inputs)``.

    Weights the graph derives (merged Q/K/V and gate/up matrices) are computed on the first
    run with a weights dict and kept while the same arrays are passed again (by identity:
    after changing a weight array in place, call :meth:`forget_weights`).

    Each run's outputs are new arrays to the caller, but their memory may be an earlier run's: the
    buffers of the last run's outputs are kept, and the next run writes into those nothing else holds
    any more (no reference left but this object's). A large output then costs no page faults (GPT-2's
    51 MB of logits: ~5 ms of a 290 ms pass, zeroing fresh pages), and what stays allocated between
    runs is one set of outputs (:meth:`forget_outputs` frees it).
    """

    def __init__(self, module: ModuleType, path: Path, key: str, source: str, stats: LoadStats, rebuilt: bool,
                 graph: Graph | None = None, steps: dict[int, int] | None = None):
        super().__init__(module, path, key, source, stats, rebuilt)
        self.graph = graph
        self.steps = steps or {}  # driver line -> node index, for the profile
        self.node_profile: dict[int, float] | None = None  # seconds per node index, with profile
        self._prepared: tuple[tuple[int, ...], list[Any], dict[str, np.ndarray]] | None = None
        self._outputs: dict[str, np.ndarray] = {}  # the last run's output buffers, by driver variable
        self._lock = threading.Lock()

    def forget_weights(self) -> None:
        """Drop the converted and derived weights kept from the last run."""
        self._prepared = None

    def forget_outputs(self) -> None:
        """Drop the output buffers kept for reuse (see the class docstring)."""
        self._outputs = {}

    def _spare_outputs(self) -> dict[str, np.ndarray]:
        """The kept output buffers no caller holds: referenced only by the kept dict and getrefcount's
        argument (a view the caller kept holds its base, so it counts too). Taken out under the lock, so
        two threads running at once never write into the same buffer."""
        with self._lock:
            kept, self._outputs = self._outputs, {}
        return {key: kept[key] for key in [k for k in kept if sys.getrefcount(kept[k]) <= 2]}

    def prepare(self, weights: dict[str, Any]) -> None:
        """Convert ``weights`` and compute the derived ones now (packed panels: a pass over the weights),
        as the first run with them would, so that a timed or latency-bound first run does not."""
        self._prepare(weights)

    def run(self, weights: dict[str, Any], inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        w = self._prepare(weights)
        x = self._inputs(inputs)
        buffers = self._spare_outputs()
        try:
            with single_pool(configured_threads()):
                if self.profile is not None:
                    return self._run_profiled(w, x, self.profile, buffers)
                return self.module.run(w, x, buffers)
        except self.module.InputError as e:
            raise IrcError(str(e)) from None
        finally:
            self._outputs = buffers  # what this run wrote its outputs into (the spare ones and any new)

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
                derived = self.module.derive(w)
            for key in derived:  # on a cache line, as the register blocks that stream them want (aligned.py)
                derived[key] = aligned64(derived[key])
            w.update(derived)
        self._prepared = (ident, given, w)  # holding ``given`` keeps the ids from being recycled
        return w

    def _run_profiled(self, w: dict, x: dict, profile: dict[str, float],
                      buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
            return self.module.run(w, x, buffers)
        finally:
            sys.settrace(old)
            now = time.perf_counter()
            per_node[state["node"]] = per_node.get(state["node"], 0.0) + now - state["t"]
            nodes = self.graph.nodes if self.graph is not None else []
            self.node_profile = per_node
            for i, sec in per_node.items():
                op = nodes[i].op if 0 <= i < len(nodes) else "driver"  # setup and return lines
                profile[op] = profile.get(op, 0.0) + sec


def compile_graph(graph: Graph, cache_dir: str | Path | None = None,
                  progress: Progress | None = None, pack_weights: bool = True) -> CompiledGraph:
    """Generate (or find in the cache) the graph's module, import it and compile its kernels.

    ``progress(done, total, kernel)`` is called before each kernel and once at the end. When
    the cache cannot be written (a full disk) the graph is compiled in a fresh private folder
    for this run, with a note. ``pack_weights=False``: dense layers read their weights as given, with no
    packed copy (a graph run once per weights dict: a decoder's prefill).
    """
    source, steps, parts = emit_module(graph, pack_weights=pack_weights)
    key = cache_key(graph, "cpu" if pack_weights else "cpu-unpacked", BACKEND_VERSION)
    directory = prepare_dir(Path(cache_dir) if cache_dir is not None else default_cache_dir("cpu"))
    texts = kernel_texts(parts)
    text = header(key, source) + source
    steps = {line + HEADER_LINES: node for line, node in steps.items()}  # the file starts with the cache header

    def build(folder: Path, path: Path, rebuilt: bool) -> CompiledGraph:
        module, stats = load(path, key, text, progress, KernelLibrary(folder, texts))
        return CompiledGraph(module, path, key, source, stats, rebuilt, graph, steps)

    return cached_build(directory, key, source, build)
