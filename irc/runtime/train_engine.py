"""Where ``irc train`` runs its graphs: the NumPy reference, or the CPU backend's generated code.

``Engine("numpy")`` interprets each graph with the reference (in the run's dtype). ``Engine("cpu")``
compiles each graph once with the Numba CPU backend (the step graph: forward and backward in one
generated module, its attention cores first rewritten into the flash-style ``sdpa`` + ``sdpa_grad``
pair, :func:`irc.passes.grad_flash.flash_attention_grad`) and runs the compiled module every step; the
optimizer update stays in NumPy (irc/runtime/optim.py, PyTorch's formulas), so both engines update the
weights with the same code. The CPU backend computes in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from irc.graph import Graph

ENGINES = ("numpy", "cpu")


class Engine:
    """Runs a graph on a batch: ``run(graph, weights, inputs, dtype) -> {output label: array}``."""

    def __init__(self, name: str = "numpy", cache_dir: Any = None,
                 progress: Callable[[int, int, str], None] | None = None):
        assert name in ENGINES, name
        self.name = name
        self.cache_dir = cache_dir
        self.progress = progress
        self._compiled: dict[int, tuple[Graph, Any]] = {}  # id(graph) -> (graph, its compiled module)

    def prepare(self, graph: Graph) -> Any:
        """Compile ``graph`` now (the CPU engine; nothing for the reference), so the first step is not slow."""
        if self.name == "numpy":
            return None
        hit = self._compiled.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        from irc.backends.cpu import compile_graph
        from irc.passes.grad_flash import flash_attention_grad

        compiled = compile_graph(flash_attention_grad(graph), cache_dir=self.cache_dir, progress=self.progress)
        self._compiled[id(graph)] = (graph, compiled)  # the graph is held, so its id is never reused
        return compiled

    def run(self, graph: Graph, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
            dtype: Any = np.float32) -> dict[str, np.ndarray]:
        if self.name == "numpy":
            from irc.backends.numpy_ref import run_graph

            return run_graph(graph, weights, inputs, dtype)
        compiled = self.prepare(graph)
        compiled.forget_weights()  # the optimizer changed the arrays in place since the last step
        return compiled.run(weights, inputs)
