"""Where ``irc train`` runs its graphs: the NumPy reference, or the CPU backend's generated code.

``Engine("numpy")`` interprets each graph with the reference (in the run's dtype). ``Engine("cpu")``
compiles each graph once with the Numba CPU backend (the step graph: forward and backward in one
generated module, its attention cores first rewritten into the flash-style ``sdpa`` + ``sdpa_grad``
pair, :func:`irc.passes.grad_flash.flash_attention_grad`) and runs the compiled module every step.

The optimizer update is the engine's too (:meth:`Engine.update`, :meth:`Engine.clip`): the reference runs
irc/runtime/optim.py (NumPy, PyTorch's formulas); the CPU engine runs generated code
(:mod:`irc.backends.cpu.optim`: per weight one fused parallel loop, weight decay, moments and update in
PyTorch's operation order, the step's learning rate and bias corrections as arguments; the gradient norm as
float64 block sums), compiled once and cached as the step graph is. Both keep the optimizer state in the
same arrays under the same names (``optim.SLOTS``), so a checkpoint of one engine resumes in the other. The
CPU backend computes in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from irc.graph import Graph
from irc.runtime.optim import OptimConfig, apply_update, clip_grad_norm, global_norm

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
        self._updates: dict[OptimConfig, Any] = {}  # optimizer settings -> its compiled update
        self._clip: Any = None  # the compiled gradient norm

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

    def prepare_update(self, cfg: OptimConfig) -> Any:
        """Compile the update of ``cfg`` and the gradient norm now (the CPU engine; nothing for the reference).
        Only the optimizer's kind and whether it decays weights make a new module (the numbers are arguments):
        settings that differ in numbers only share the cached kernels."""
        if self.name == "numpy":
            return None
        from irc.backends.cpu.optim import compile_clip, compile_optimizer

        if self._clip is None:
            self._clip = compile_clip(cache_dir=self.cache_dir, progress=self.progress)
        if cfg not in self._updates:
            self._updates[cfg] = compile_optimizer(cfg, cache_dir=self.cache_dir, progress=self.progress)
        return self._updates[cfg]

    def clip(self, grads: dict[str, np.ndarray], max_norm: float | None) -> float:
        """The 2-norm of all gradients together; with ``max_norm``, the gradients scaled in place to it when
        above (``clip_grad_norm_``). The norm before clipping."""
        if self.name == "numpy":
            return clip_grad_norm(grads, max_norm) if max_norm is not None else global_norm(grads.values())
        if self._clip is None:
            from irc.backends.cpu.optim import compile_clip

            self._clip = compile_clip(cache_dir=self.cache_dir, progress=self.progress)
        return self._clip.clip(grads, max_norm) if max_norm is not None else self._clip.norm(grads.values())

    def update(self, cfg: OptimConfig, params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
               state: dict[str, dict[str, np.ndarray]], lr: float, step: int) -> None:
        """Update every weight that has a gradient, in place; ``step`` is the 1-based number of this update."""
        if self.name == "numpy":
            apply_update(cfg, params, grads, state, lr, step)
            return
        update = self.prepare_update(cfg)
        update.update(params, grads, state, lr, step)
