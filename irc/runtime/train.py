"""The training loop of ``irc train``: the grad pass's step graph run by an engine (the NumPy reference, or
the graph compiled by the CPU backend: irc/runtime/train_engine.py), then an optimizer update by the same
engine (irc/runtime/optim.py, or the CPU backend's generated update), step after step.

:func:`build_step` attaches the loss to the model (``attach_loss``), puts it in training mode
(``training_graph``: dropout masks, BatchNorm's batch statistics), differentiates it (the ``grad`` pass)
and keeps only the gradients of weights (the gradient of a float input is never needed here, so its
nodes are dropped) and the batch statistics the running averages take in. :func:`train_steps` runs the
steps from ``state.step`` to ``cfg.steps``: batch ``s`` (and its dropout masks) is a pure function of
``(seed, s)`` and the learning rate is the schedule's value at ``s``, so a run resumed at any step
continues exactly as the uninterrupted one (docs/training.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irc.diagnostics import IrcError
from irc.graph import Graph
from irc.ops.grad_train import RunningUpdate, apply_running_updates, running_updates, step_input_name, training_graph
from irc.passes.grad import attach_loss, grad, grad_label
from irc.passes.rewrite import eliminate_dead
from irc.runtime.optim import OptimConfig, init_state, lr_factor
from irc.runtime.train_data import Dataset
from irc.runtime.train_engine import Engine
from irc.runtime.train_memory import MemoryProbe
from irc.runtime.weights import expected_weights

# one row of the loss curve per step; NaN where a column has no value at that step
COLUMNS = ("step", "lr", "loss", "grad_norm", "eval_loss", "eval_accuracy")


@dataclass
class StepGraphs:
    """What one training run executes, built once from the bound model."""

    model: Graph            # the model as written, sizes bound
    step: Graph             # outputs: loss, then grad_<key> for each trained weight
    eval: Graph             # outputs: loss, and the output the loss reads (for the accuracy)
    grad_keys: dict[str, str]  # step output label -> weight key
    target: str             # the loss target's input name
    output: str             # the model output the loss reads
    loss: str
    ignore_index: int
    rebind: Callable[[int], Graph] | None = None  # the model at another batch size (a last, short eval chunk)
    step_input: str | None = None  # the integer input the dropout masks read: fed the step number
    updates: list[RunningUpdate] = field(default_factory=list)  # each training BatchNorm's running averages
    stats: dict[str, str] = field(default_factory=dict)  # step output label -> the batch statistic it carries
    engine: Engine = field(default_factory=Engine)  # runs the step and evaluation graphs
    _evals: dict[int, Graph] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return int(self.step.inputs()[0].types[0].shape[0])

    def eval_at(self, batch: int) -> Graph:
        if batch == self.batch:
            return self.eval
        if batch not in self._evals:
            assert self.rebind is not None, "a short evaluation chunk needs the model at another batch size"
            self._evals[batch] = eval_graph(self.rebind(batch), self.loss, self.output, self.ignore_index)[0]
        return self._evals[batch]


def _loss_attrs(loss: str, ignore_index: int) -> dict[str, Any]:
    return {"ignore_index": ignore_index} if loss == "cross_entropy" else {}


def eval_graph(model: Graph, loss: str, output: str, ignore_index: int) -> tuple[Graph, str]:
    """The model with the loss attached, keeping the output the loss reads; and the target's name."""
    before = {n.outputs[0] for n in model.inputs()}
    fwd = attach_loss(model, loss, output, **_loss_attrs(loss, ignore_index))
    target = next(n.outputs[0] for n in fwd.inputs() if n.outputs[0] not in before)
    out = fwd.copy()
    out.outputs = [*fwd.outputs, (output, dict(model.outputs)[output])]
    return out, target


def build_step(model: Graph, loss: str = "cross_entropy", output: str | None = None, ignore_index: int = -100,
               rebind: Callable[[int], Graph] | None = None, seed: int = 0,
               engine: Engine | None = None) -> StepGraphs:
    """The step and evaluation graphs of ``model`` trained on ``loss`` of output ``output`` (the first).

    The step graph is the model in training mode (``training_graph``: dropout draws masks, BatchNorm uses
    the batch's statistics), differentiated. Its dropout masks read an integer input (``step_input``) that
    :func:`train_step` feeds with the step number, so the graph is built (and compiled) once while every
    step draws new masks, from ``(seed, dropout, step)``. Each training BatchNorm's batch mean and
    variance are extra outputs (``updates``), folded into the running averages after the step. The
    evaluation graph stays in inference mode (dropout the identity, BatchNorm the running averages), as
    PyTorch's ``model.eval()``."""
    output = output or model.outputs[0][0]
    evaluate, target = eval_graph(model, loss, output, ignore_index)
    fwd = attach_loss(model, loss, output, **_loss_attrs(loss, ignore_index))
    step_name = step_input_name(fwd)
    fwd = training_graph(fwd, seed, step_input=step_name)
    has_step = any(n.op == "input" and n.outputs[0] == step_name for n in fwd.nodes)
    full = grad(fwd)
    labels = _grad_labels(model)
    step = full.copy()
    step.outputs = [(label, v) for label, v in full.outputs if label == "loss" or label in labels]
    taken = {label for label, _ in full.outputs}
    updates = running_updates(step)
    stats: dict[str, str] = {}
    for i, u in enumerate(updates):
        for what, value in (("mean", u.mean_value), ("var", u.var_value)):
            label, k = f"batch_stat_{i}_{what}", 1
            while label in taken:
                label, k = f"batch_stat_{i}_{what}_{k}", k + 1
            taken.add(label)
            step.outputs.append((label, value))
            stats[label] = value
    step = eliminate_dead(step)  # drops the backward of the float inputs
    keys = {label: labels[label] for label, _ in step.outputs if label != "loss" and label not in stats}
    if not keys:
        raise IrcError(f"model '{model.name}' has no weights that its loss depends on: nothing to train", model.loc)
    return StepGraphs(model, step, evaluate, keys, target, output, loss, ignore_index, rebind,
                      step_name if has_step else None, updates, stats, engine or Engine())


def _grad_labels(model: Graph) -> dict[str, str]:
    """``grad_<key>`` label -> weight key; two keys that would share a label are refused (the grad pass
    would number them in an order this reader cannot know)."""
    out: dict[str, str] = {}
    for key in expected_weights(model):
        label = grad_label(key, set())
        if label in out:
            raise IrcError(f"weights '{out[label]}' and '{key}' both have gradient output '{label}'; rename one "
                           "scope so the keys differ in more than '.' and '_'", model.loc)
        out[label] = key
    return out


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int
    seed: int = 0
    lr: float = 1e-3
    warmup: int = 0
    schedule: str = "constant"
    clip: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval_every: int = 0  # 0: only at the end
    save_every: int = 0  # 0: only at the end (and when stopped)
    dtype: Any = np.float32

    def lr_at(self, step: int) -> float:
        return self.lr * lr_factor(step, self.steps, self.warmup, self.schedule)


@dataclass
class State:
    """Everything a checkpoint holds: the step reached, the weights, the optimizer's state, the loss curve."""

    step: int
    params: dict[str, np.ndarray]
    optim: dict[str, dict[str, np.ndarray]]
    history: list[list[float]] = field(default_factory=list)


def fresh_state(weights: dict[str, np.ndarray], cfg: TrainConfig) -> State:
    params = {k: np.array(v, dtype=cfg.dtype) for k, v in weights.items()}  # copies: updated in place
    return State(0, params, init_state(cfg.optim, params))


@dataclass(frozen=True)
class StepInfo:
    step: int       # updates done so far
    loss: float
    lr: float
    grad_norm: float
    seconds: float  # time in the step (graph + update), for the throughput


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float | None  # classification (cross_entropy) only
    correct: int
    count: int


def evaluate(graphs: StepGraphs, params: dict[str, np.ndarray], data: Dataset, dtype: Any = np.float32) -> EvalResult:
    """The held-out loss (weighted by the rows each chunk's mean covers) and, for cross_entropy, the accuracy."""
    total, weight, correct, count = 0.0, 0, 0, 0
    for chunk in data.held_out(graphs.batch):
        n = len(chunk[graphs.target])
        out = graphs.engine.run(graphs.eval_at(n), params, chunk, dtype)
        targets = chunk[graphs.target]
        if graphs.loss == "cross_entropy":
            kept = targets != graphs.ignore_index
            rows = int(kept.sum())
            correct += int((np.argmax(out[graphs.output], axis=-1) == targets)[kept].sum())
            count += rows
        else:
            rows = int(targets.size)
        if rows:
            total += float(out["loss"]) * rows
            weight += rows
    loss = total / weight if weight else float("nan")
    accuracy = correct / count if graphs.loss == "cross_entropy" and count else None
    return EvalResult(loss, accuracy, correct, count)


class NonFinite(IrcError):
    """The loss or a gradient stopped being a finite number: the run stops, the last checkpoint stays."""


def train_step(graphs: StepGraphs, state: State, batch: dict[str, np.ndarray], cfg: TrainConfig) -> StepInfo:
    """One update: run the step graph on ``batch``, clip, step the optimizer; ``state.step`` advances."""
    start = time.perf_counter()
    feed = dict(batch)
    if graphs.step_input is not None:
        feed[graphs.step_input] = np.array(state.step, dtype=np.int64)  # new dropout masks every step
    out = graphs.engine.run(graphs.step, state.params, feed, cfg.dtype)
    loss = float(out["loss"])
    grads: dict[str, np.ndarray] = {}
    seen: set[int] = set()
    for label, key in graphs.grad_keys.items():
        g = out[label]
        if id(g) in seen or not g.flags.writeable:  # one array for two outputs: clipping must not scale it twice
            g = g.copy()
        seen.add(id(g))
        grads[key] = g
    norm = graphs.engine.clip(grads, cfg.clip)
    if not np.isfinite(loss) or not np.isfinite(norm):
        what = f"the loss is {loss}" if not np.isfinite(loss) else f"the gradient norm is {norm}"
        raise NonFinite(f"step {state.step + 1}: {what}; lower --lr, or clip the gradients with --clip "
                        "(the last saved checkpoint is kept)")
    lr = cfg.lr_at(state.step)
    graphs.engine.update(cfg.optim, state.params, grads, state.optim, lr, state.step + 1)
    _update_running(state.params, graphs, out)
    state.step += 1
    return StepInfo(state.step, loss, lr, norm, time.perf_counter() - start)


def _update_running(params: dict[str, np.ndarray], graphs: StepGraphs, out: dict[str, np.ndarray]) -> None:
    """BatchNorm's running averages from this step's batch statistics (PyTorch's momentum update), written
    into the weight arrays in place (the optimizer's arrays: a compiled step keeps reading the same ones)."""
    if not graphs.updates:
        return
    new = apply_running_updates(params, graphs.updates, {value: out[label] for label, value in graphs.stats.items()})
    for u in graphs.updates:
        for key in (u.mean_key, u.var_key):
            params[key][...] = new[key]


def train_steps(graphs: StepGraphs, state: State, data: Dataset, cfg: TrainConfig,
                on_step: Callable[[StepInfo], None] | None = None,
                on_eval: Callable[[int, EvalResult], None] | None = None,
                on_save: Callable[[State, bool], None] | None = None,
                stop: Callable[[], bool] = lambda: False, probe: MemoryProbe | None = None) -> bool:
    """Train from ``state.step`` up to ``cfg.steps``; True when finished, False when ``stop()`` said so
    (checked after each step). ``on_save(state, final)`` saves every ``cfg.save_every`` steps, and at the
    end or the stop with ``final`` true. ``probe`` traces the memory of the first steps
    (irc/runtime/train_memory.py)."""
    graphs.engine.prepare_update(cfg.optim)  # the CPU engine compiles its update before the first step
    while state.step < cfg.steps:
        batch = data.batch(state.step, cfg.seed, cfg.batch)
        if probe is not None:
            probe.begin()
        try:
            info = train_step(graphs, state, batch, cfg)
        finally:
            if probe is not None:
                probe.end()
        row = [float(info.step), info.lr, info.loss, info.grad_norm, float("nan"), float("nan")]
        state.history.append(row)
        if on_step is not None:
            on_step(info)
        last = state.step == cfg.steps
        if data.n_held and (last or (cfg.eval_every and state.step % cfg.eval_every == 0)):
            result = evaluate(graphs, state.params, data, cfg.dtype)
            row[4] = result.loss
            row[5] = result.accuracy if result.accuracy is not None else float("nan")
            if on_eval is not None:
                on_eval(state.step, result)
        if stop():
            if on_save is not None:
                on_save(state, True)
            return False
        if on_save is not None and (last or (cfg.save_every and state.step % cfg.save_every == 0)):
            on_save(state, last)
    return True
