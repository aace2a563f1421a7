"""``irc train``'s memory line: the peak memory a training step measured, next to ``irc analyze --train``'s
prediction for the same model, batch, optimizer and dtype (docs/training.md, "Memory").

**Measured** (one method: ``tracemalloc``). NumPy reports every array buffer it allocates to Python's
``tracemalloc`` (domain 389047), so tracing the first :data:`TRACED_STEPS` steps of a run and taking the
peak of the traced memory above its level when each step began (the worst step after the first, which
also fills one-time caches) gives the bytes a step allocates at its worst moment: the forward values the
backward still needs, the activation gradients in flight, the weight gradients, the optimizer update's
temporaries (plus the few small Python objects a step makes). The weights and the optimizer state exist
before the loop and are updated in place: they are measured as the arrays' ``nbytes``. Only the first
steps are traced (tracing slows Python down); every step runs the same graph on a batch of the same
shape, so the steady-state steps have the same peak. Limits: memory NumPy does not allocate is not seen
(BLAS's own scratch, a Numba kernel's internal buffers under ``--backend cpu``; the cpu driver's buffers
are ``np.empty`` and are seen), nor the interpreter, the data set or the compiled code.

``ru_maxrss`` was not used: it is the whole process's peak since it started (129 MiB before the loop for
the digits CNN: Python, NumPy, the data), so its growth over the loop reads 0 whenever an earlier phase
(imports, compiling, loading) peaked higher, and otherwise mixes in the evaluation and the allocator's
reuse of freed pages (4.8 MiB over 20 steps of the digits CNN at batch 64, against 3.1 MiB traced).

**Predicted**: the rows of :func:`irc.analysis.training_memory.training_report` (one device, no
recompute, the precision of the run's dtype), called on the bound model, never re-derived here.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irc.graph import Graph

TRACED_STEPS = 3  # the first, then two in the steady state
MIB = 1024 * 1024


@dataclass(frozen=True)
class Predicted:
    """``irc analyze --train`` rows, in bytes. ``scale`` is 2 for a float64 run (below)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    temporary: int
    scale: int = 1

    @property
    def step(self) -> int:
        """What a step allocates on top of the weights and the optimizer state."""
        return self.gradients + self.activations + self.temporary

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.step


def predict(model: Graph, optimizer: str, dtype: Any) -> Predicted:
    """The ``--train <optimizer>`` analysis of ``model`` (sizes bound) at fp32. ``training_report`` has no
    float64 precision: a ``--dtype f64`` run holds every float buffer at twice fp32's bytes, so the fp32
    figures are doubled (the integer inputs, a token batch, are the one thing this over-counts)."""
    from irc.analysis.groups import group_of
    from irc.analysis.parallel import Plan
    from irc.analysis.training_memory import training_report

    report = training_report(model, [group_of(n) for n in model.nodes], Plan(), optimizer, "fp32", "none", False)
    rows = {r["name"]: int(r["bytes"]) for r in report["rows"]}
    k = 2 if np.dtype(dtype) == np.float64 else 1
    return Predicted(k * (rows["weights"] + rows["fp32 master weights"]), k * rows["gradients"],
                     k * rows["optimizer states"], k * rows["activations"], k * rows["temporary peak"], k)


@dataclass
class MemoryProbe:
    """Traces the first ``steps`` training steps of a run: :meth:`begin` before a step, :meth:`end` after."""

    steps: int = TRACED_STEPS
    peaks: list[int] = field(default_factory=list)  # per traced step: bytes above the level at its start
    _started: bool = False
    _base: int = 0

    @property
    def traced(self) -> int:
        return len(self.peaks)

    @property
    def step_peak(self) -> int:
        """The worst step after the first (whose peak also holds the caches a first run of a graph fills:
        the interpreter's, NumPy's, a momentum buffer made at step 1), or the first when it is the only one."""
        return max(self.peaks[1:]) if len(self.peaks) > 1 else self.peaks[0] if self.peaks else 0

    def begin(self) -> None:
        if self.traced >= self.steps:
            return
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started = True
        self._base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()

    def end(self) -> None:
        if self.traced >= self.steps or not tracemalloc.is_tracing():
            return
        self.peaks.append(tracemalloc.get_traced_memory()[1] - self._base)
        if self.traced >= self.steps:
            self.close()

    def close(self) -> None:
        """Stop tracing if this probe started it (an interrupted run, the last traced step)."""
        if self._started and tracemalloc.is_tracing():
            tracemalloc.stop()
        self._started = False


def state_bytes(params: dict[str, np.ndarray], optim: dict[str, dict[str, np.ndarray]]) -> tuple[int, int]:
    """(weights, optimizer state) bytes of the arrays the run holds."""
    return (sum(int(a.nbytes) for a in params.values()),
            sum(int(a.nbytes) for slot in optim.values() for a in slot.values()))


@dataclass(frozen=True)
class MemoryReport:
    weights: int        # measured: the weight arrays
    optimizer: int      # measured: the optimizer state arrays
    step_peak: int      # measured: traced peak of a step above its start
    steps_traced: int
    predicted: Predicted
    optimizer_name: str

    @property
    def measured(self) -> int:
        return self.weights + self.optimizer + self.step_peak

    def line(self) -> str:
        p = self.predicted
        name = {"adam": "Adam", "adamw": "AdamW", "momentum": "momentum", "sgd": "SGD"}[self.optimizer_name]
        parts = [f"weights {p.weights / MIB:.2f}", f"grads {p.gradients / MIB:.2f}"]
        if p.optimizer:
            parts.append(f"{name} {p.optimizer / MIB:.2f}")
        parts += [f"activations {p.activations / MIB:.2f}", f"temporary {p.temporary / MIB:.2f}"]
        doubled = ", fp32 figures x2 for f64" if p.scale == 2 else ""
        ratio = f"; step measured/predicted {self.step_peak / p.step:.2f}" if p.step else ""
        return (f"memory: peak {self.measured / MIB:.2f} MiB measured (arrays: weights+state "
                f"{(self.weights + self.optimizer) / MIB:.2f}, step {self.step_peak / MIB:.2f}), "
                f"{p.total / MIB:.2f} MiB predicted ({', '.join(parts)}{doubled}){ratio}")

    def to_json(self) -> dict[str, Any]:
        p = self.predicted
        return {"method": "tracemalloc", "steps_traced": self.steps_traced,
                "measured_bytes": {"weights": self.weights, "optimizer_state": self.optimizer,
                                   "step_peak": self.step_peak, "total": self.measured},
                "predicted_bytes": {"weights": p.weights, "gradients": p.gradients, "optimizer_state": p.optimizer,
                                    "activations": p.activations, "temporary_peak": p.temporary,
                                    "step": p.step, "total": p.total, "f64_scale": p.scale}}


def memory_report(probe: MemoryProbe, model: Graph, optimizer: str, dtype: Any, params: dict[str, np.ndarray],
                  optim: dict[str, dict[str, np.ndarray]]) -> MemoryReport | None:
    """The report once a step was traced (None when the run trained no step)."""
    if not probe.traced:
        return None
    w, o = state_bytes(params, optim)
    return MemoryReport(w, o, probe.step_peak, probe.traced, predict(model, optimizer, dtype), optimizer)
