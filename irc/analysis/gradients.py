"""Gradient flow at initialisation, measured: ``irc analyze FILE --gradients``.

The chapter's central fact is that the gradient reaching layer 1 of an L-layer stack is a product of L
Jacobians. This module measures it instead of stating it: the model's weights are initialised by the
rules of its op records (irc/runtime/init.py), a batch is drawn at random (irc/runtime/inputs.py's rule,
the batch ``irc run --seed`` draws), a loss is attached (irc/passes/grad.py: attach_loss) and the grad
pass's backward graph runs on the NumPy reference in float64 (so a gradient of 1e-30 reads as 1e-30,
not as an fp32 zero). What comes back:

- every weight key's ‖W‖, ‖∂L/∂W‖ and their ratio;
- per repeated block (``repeat(N)``; the weight-owning layers in order when nothing is repeated): the
  block's weight-gradient norm, and ‖∂L/∂h‖ of the block's output h with h's forward variance, the
  first-to-last ratio and its geometric factor per block;
- per recurrent layer: ‖∂L_T/∂x_t‖ for each step t of its input sequence, with the loss at the last step
  only (cross_entropy's ignored targets, or mse targets equal to the prediction elsewhere);
- per rectifier layer: the fraction of dead units (pre-activation ≤ 0 for every sample measured;
  irc/analysis/dead_units.py);
- a verdict: ``vanishing`` when a first-to-last ratio is below 1e-3, ``exploding`` above 1e3.

Gradients of activations are read with *probes*: a zero float input p added to a value v (v + 0 is v
exactly), whose gradient the grad pass reports as for any float input; ∂L/∂p = ∂L/∂v. Several probes
share one backward run. Norms are Frobenius norms, averaged over the batches. docs/analysis.md
("Gradients at initialisation") describes the rules.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from math import isfinite, sqrt

import numpy as np

from irc.analysis.dead_units import DeadUnitCounter, RectifierUnits, rectifier_nodes
from irc.analysis.groups import group_of
from irc.diagnostics import IrcError, UsageError
from irc.graph import Graph, Node
from irc.ops import get_op, normalize_attrs

LOSSES = ("cross_entropy", "mse")
VANISHING, EXPLODING = 1e-3, 1e3  # first-to-last ratios beyond which the verdict names the failure
PROBE = "gradprobe_"  # probe inputs are named PROBE + number (no model value is)


@dataclass
class WeightGrad:
    key: str
    shape: tuple[int, ...]
    block: str  # the owning node's block (irc.analysis.groups.group_of), "" at the model's top level
    weight_norm: float
    grad_norm: float | None  # None: the loss does not depend on it (a buffer, an unused weight)

    @property
    def ratio(self) -> float | None:
        return None if self.grad_norm is None or self.weight_norm == 0 else self.grad_norm / self.weight_norm


@dataclass
class BlockGrad:
    block: str  # "layer.3"
    weight_norm: float  # ‖all of the block's weights‖
    grad_norm: float | None  # ‖all of their gradients‖
    value: str | None  # the block's output h (the probed value)
    activation_grad_norm: float | None  # ‖∂L/∂h‖
    activation_var: float | None  # var(h) over every element, forward


@dataclass
class DepthProfile:
    stack: str  # the repeated block's name ("layer"), or "layers" for the weight-owning layers in order
    blocks: list[BlockGrad]

    @property
    def measure(self) -> str:
        """What the first-to-last ratio compares: ‖∂L/∂h‖ of the blocks' outputs (the product of Jacobians
        the chapter names) when every block has one, else their weights' gradient norms."""
        return "activation" if all(b.activation_grad_norm is not None for b in self.blocks) else "weights"

    def first_to_last(self) -> float | None:
        return self.activation_first_to_last() if self.measure == "activation" else self.weight_first_to_last()

    def activation_first_to_last(self) -> float | None:
        return _ratio([b.activation_grad_norm for b in self.blocks])

    def weight_first_to_last(self) -> float | None:
        return _ratio([b.grad_norm for b in self.blocks])

    def factor(self) -> float | None:
        return _factor(self.first_to_last(), len(self.blocks))

    def activation_factor(self) -> float | None:
        return _factor(self.activation_first_to_last(), len(self.blocks))

    def weight_factor(self) -> float | None:
        return _factor(self.weight_first_to_last(), len(self.blocks))

    def verdict(self) -> str | None:
        return verdict(self.first_to_last())


@dataclass
class TimeProfile:
    layer: str  # the recurrent node's result
    op: str
    value: str  # its input sequence x, [B, T, D]
    loss_at: str  # "last step" (the loss masked to step T) or "as written" (the loss has no time axis)
    grad_norms: list[float]  # ‖∂L/∂x_t‖ for t = 1..T

    def first_to_last(self) -> float | None:
        return _ratio(self.grad_norms)

    def factor(self) -> float | None:
        return _factor(self.first_to_last(), len(self.grad_norms))

    def verdict(self) -> str | None:
        return verdict(self.first_to_last())


@dataclass
class GradientReport:
    model: str
    loss: str
    loss_source: str  # why this loss: "the model's", "--loss", or the default rule's reason
    seed: int
    batches: int
    loss_value: float  # mean over the batches
    weights: list[WeightGrad]
    inputs: dict[str, float]  # ‖∂L/∂x‖ of each float input
    depth: list[DepthProfile]
    time: list[TimeProfile]
    probes: dict[str, tuple[float | None, float]] = field(default_factory=dict)  # asked-for v: (‖∂L/∂v‖, var v)
    rectifiers: list[RectifierUnits] = field(default_factory=list)  # dead units per rectifier layer


def verdict(ratio: float | None) -> str | None:
    if ratio is None:
        return None
    return "vanishing" if ratio < VANISHING else "exploding" if ratio > EXPLODING else None


def _ratio(norms: list[float | None]) -> float | None:
    if len(norms) < 2 or norms[0] is None or norms[-1] is None:
        return None
    if norms[-1] == 0:
        return None if norms[0] == 0 else float("inf")
    return norms[0] / norms[-1]


def _factor(ratio: float | None, count: int) -> float | None:
    """The geometric mean factor per step between the last and the first: ratio^(1/(count − 1))."""
    if ratio is None or count < 2 or not isfinite(ratio):
        return None
    return 0.0 if ratio == 0 else ratio ** (1.0 / (count - 1))


# --- the training graph -------------------------------------------------------------------------------

def loss_output(graph: Graph) -> Node | None:
    """The node computing the model's own loss output, if it has one."""
    producers = graph.producers()
    found = [producers[v] for _, v in graph.outputs if get_op(producers[v].op).has("loss")]
    return found[0] if len(found) == 1 else None


def choose_loss(graph: Graph, asked: str | None) -> tuple[str | None, str]:
    """(loss to attach, or None for the model's own; the reason). The default: cross_entropy when the
    model reads integer ids (its targets are ids too: a language model), mse otherwise."""
    if any(get_op(n.op).has("backward") for n in graph.nodes):
        raise IrcError(f"--gradients: '{graph.name}' is already a training step (it has backward ops); "
                       "give the forward model", graph.loc)
    own = loss_output(graph)
    if own is not None:
        if asked is not None and asked != own.op:
            raise UsageError(f"--loss {asked}: model '{graph.name}' computes its own loss ({own.op}); drop --loss")
        return None, "the model's"
    if asked is not None:
        return asked, "--loss"
    if any(not n.types[0].is_float for n in graph.inputs()):
        return "cross_entropy", "default: the model reads integer ids"
    return "mse", "default: the model reads no integer ids"


def with_loss(graph: Graph, loss: str | None) -> Graph:
    from irc.passes.grad import attach_loss

    if loss is None:
        return graph
    out = graph.outputs[0][1]
    t = graph.value_types()[out]
    if loss == "cross_entropy" and (not t.is_float or t.rank < 1):
        raise IrcError(f"--loss cross_entropy needs float logits [..., classes]; output '{graph.outputs[0][0]}' "
                       f"is {t}", graph.loc)
    return attach_loss(graph, loss)


def add_probes(graph: Graph, values: list[str]) -> tuple[Graph, dict[str, str]]:
    """A copy where each value v reads as ``v + p`` downstream, p a new zero float input; {v: p}."""
    out = graph.copy()
    types = out.value_types()
    taken = {v for n in out.nodes for v in n.outputs}
    probes: dict[str, str] = {}
    for i, v in enumerate(dict.fromkeys(values)):
        t = types[v]
        if not t.is_float:
            continue
        p = f"{PROBE}{i}"
        probed, k = f"{v}.probed", 1
        while probed in taken:
            probed, k = f"{v}.probed{k}", k + 1
        taken.update((p, probed))
        at = next(j for j, n in enumerate(out.nodes) if v in n.outputs)
        src = out.nodes[at]
        for n in out.nodes[at + 1:]:
            n.inputs = [probed if x == v else x for x in n.inputs]
        out.outputs = [(label, probed if x == v else x) for label, x in out.outputs]
        add = Node("add", [v, p], [probed], normalize_attrs(get_op("add"), {}), src.scope, None, src.loc, [t])
        out.nodes.insert(at + 1, add)
        out.nodes.insert(0, Node("input", [], [p], {}, "", None, src.loc, [t]))
        probes[v] = p
    return out, probes


# --- what to probe --------------------------------------------------------------------------------------

def block_outputs(graph: Graph) -> dict[str, list[tuple[str, str | None]]]:
    """{stack: [(block, its output value or None)]} for every block repeated at least twice (``layer.0``,
    ``layer.1``…), in order. A block's output is the first float value it makes that a node outside it
    reads (or the model outputs), preferring one the next copy reads."""
    groups: dict[str, list[Node]] = {}
    for node in graph.nodes:
        g = group_of(node)
        if g and g.rpartition(".")[2].isdigit():
            groups.setdefault(g, []).append(node)
    stacks: dict[str, list[str]] = {}
    for g in groups:
        stacks.setdefault(g.rpartition(".")[0], []).append(g)
    stacks = {s: sorted(gs, key=lambda g: int(g.rpartition(".")[2])) for s, gs in stacks.items() if len(gs) >= 2}
    users = graph.users()
    outputs = {v for _, v in graph.outputs}
    out: dict[str, list[tuple[str, str | None]]] = {}
    for stack, names in stacks.items():
        rows: list[tuple[str, str | None]] = []
        for i, g in enumerate(names):
            inside = {id(n) for n in groups[g]}
            following = {id(n) for n in groups[names[i + 1]]} if i + 1 < len(names) else set()
            leaving = [v for n in groups[g] for v, t in zip(n.outputs, n.types) if t.is_float and
                       (v in outputs or any(id(u) not in inside for u in users.get(v, [])))]
            nxt = [v for v in leaving if any(id(u) in following for u in users.get(v, []))]
            rows.append((g, (nxt or leaving or [None])[0]))
        out[stack] = rows
    return out


def layer_outputs(graph: Graph) -> list[tuple[str, str]]:
    """(weights scope, result) of each weight-owning node in order: the depth profile of a model that
    repeats no block. A layer whose weights several nodes use (a shared instance) is no one depth: left out."""
    from irc.runtime.weights import node_weight_keys

    types = graph.value_types()
    rows = [(n.weights, n.outputs[0]) for n in graph.nodes
            if n.weights and node_weight_keys(n, types) and n.types[0].is_float]
    uses: dict[str, int] = {}
    for scope, _ in rows:
        uses[scope] = uses.get(scope, 0) + 1
    return [(scope, v) for scope, v in rows if uses[scope] == 1]


def recurrent_inputs(graph: Graph) -> list[Node]:
    """Recurrent nodes whose input sequence is a float [B, T, D] value."""
    types = graph.value_types()
    return [n for n in graph.nodes if get_op(n.op).has("recurrent") and types[n.inputs[0]].is_float
            and types[n.inputs[0]].rank == 3]


# --- running it ----------------------------------------------------------------------------------------

@dataclass
class Step:
    """One probed backward graph, ready to run on given weights."""
    graph: Graph  # forward + loss + probes + backward
    forward: Graph  # forward + loss (what the targets are drawn for)
    probes: dict[str, str]  # value: probe input
    loss_node: Node
    targets: str  # the loss's target operand
    targets_is_input: bool  # whether it is a model input (then drawn here), not computed
    grad_labels: dict[str, str]  # weight key or input name: output label


def build_step(graph: Graph, loss: str | None, probe_values: list[str]) -> Step:
    from irc.passes.grad import grad, grad_label
    from irc.runtime.weights import expected_weights

    lossy = with_loss(graph, loss)
    probed, probes = add_probes(lossy, probe_values)
    backward = grad(probed)
    node = loss_output(lossy)
    assert node is not None
    labels = {label for label, _ in backward.outputs}
    taken = {label for label, _ in probed.outputs}
    names = [*expected_weights(graph), *(n.outputs[0] for n in probed.inputs())]
    grad_labels = {}
    for name in names:
        label = grad_label(name, taken)
        if label in labels:
            grad_labels[name] = label
    for p in probes.values():  # the forward values of the probed values come back too
        backward.outputs.append((f"value_{p}", _probed_name(probed, p)))
    is_input = any(n.outputs[0] == node.inputs[1] for n in lossy.inputs())
    return Step(backward, lossy, probes, node, node.inputs[1], is_input, grad_labels)


def _probed_name(graph: Graph, probe: str) -> str:
    return next(n.outputs[0] for n in graph.nodes if n.op == "add" and probe in n.inputs)


def batch_inputs(step: Step, seed: int, batch: int) -> dict[str, np.ndarray]:
    """Batch ``batch`` of a seed: the model's inputs by irc run's rule (irc/runtime/inputs.py) at seed +
    batch, the loss's targets drawn apart (class ids in [0, classes) for cross_entropy, N(0, 1) for mse,
    from the stream (seed + batch, crc32("targets"))), probes zero."""
    from irc.runtime.inputs import random_inputs

    types = step.graph.value_types()
    given: dict[str, np.ndarray] = {p: np.zeros(tuple(types[p].shape)) for p in step.probes.values()}
    if step.targets_is_input:
        rng = np.random.default_rng([(seed + batch) & 0xFFFFFFFF, zlib.crc32(b"targets")])
        shape = tuple(int(d) for d in types[step.targets].shape)
        if step.loss_node.op == "cross_entropy":
            classes = int(types[step.loss_node.inputs[0]].shape[-1])
            given[step.targets] = rng.integers(0, classes, shape).astype(np.int64)
        else:
            given[step.targets] = rng.standard_normal(shape).astype(np.float32)
    return random_inputs(step.forward, seed + batch, given)


def run_step(step: Step, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from irc.backends.numpy_ref import run_graph

    return run_graph(step.graph, weights, inputs, dtype=np.float64)


def _norm(a: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


def measure_gradients(graph: Graph, loss: str | None = None, seed: int = 0, batches: int = 3,
                      weights: dict[str, np.ndarray] | None = None, probes: list[str] | None = None,
                      inputs: dict[str, np.ndarray] | None = None) -> GradientReport:
    """Gradient flow at initialisation of a bound forward ``graph`` (see the module's docstring).
    ``weights`` replaces the initial weights, ``inputs`` some of the drawn inputs (in every batch);
    ``probes`` names more values to measure ‖∂L/∂v‖ and var(v) of (``GradientReport.probes``)."""
    from irc.runtime.init import init_weights
    from irc.runtime.weights import expected_weights

    if batches < 1:
        raise UsageError(f"--batches must be at least 1, got {batches}")
    attach, why = choose_loss(graph, loss)
    stacks = block_outputs(graph)
    if not stacks:
        layers = layer_outputs(graph)
        stacks = {"layers": [(scope, v) for scope, v in layers]} if len(layers) >= 2 else {}
    recurrent = recurrent_inputs(graph)
    rectifiers = rectifier_nodes(graph)
    wanted = [v for rows in stacks.values() for _, v in rows if v] + [n.inputs[0] for n in recurrent] + \
        [n.inputs[0] for n in rectifiers] + list(probes or [])
    known = graph.value_types()
    for v in probes or []:
        if v not in known:
            raise IrcError(f"model '{graph.name}' has no value '{v}' to probe", graph.loc)
    step = build_step(graph, attach, wanted)
    if weights is not None:
        from irc.runtime.weights import check_weights

        check_weights(graph, weights, "the weights given", floats_converted=True)
    w = init_weights(graph, seed) if weights is None else weights
    shapes = expected_weights(graph)
    sums: dict[str, float] = {}
    time_sums: dict[str, np.ndarray] = {}
    time_step = _time_step(step, recurrent)
    dead = DeadUnitCounter(rectifiers)
    for b in range(batches):
        batch = batch_inputs(step, seed, b) | (inputs or {})
        out = run_step(step, w, batch)
        _accumulate(sums, "loss", float(out["loss"]))
        for name, label in step.grad_labels.items():
            _accumulate(sums, f"grad:{name}", _norm(out[label]))
        for v, p in step.probes.items():
            _accumulate(sums, f"var:{v}", float(np.var(out[f"value_{p}"])))
        for node in rectifiers:  # the pre-activation's forward value, which its probe returns
            if node.inputs[0] in step.probes:
                dead.add(node, out[f"value_{step.probes[node.inputs[0]]}"])
        for node, masked in time_step:
            per = _time_norms(step, w, batch, out, node, masked)
            time_sums[node.outputs[0]] = time_sums.get(node.outputs[0], 0) + per
    mean = {k: v / batches for k, v in sums.items()}
    owner = _owners(graph)
    weight_rows = [WeightGrad(k, s, group_of(owner[k]) if k in owner else "", _norm(w[k]), mean.get(f"grad:{k}"))
                   for k, s in shapes.items()]
    inputs_grad = {n.outputs[0]: mean[f"grad:{n.outputs[0]}"] for n in graph.inputs()
                   if f"grad:{n.outputs[0]}" in mean}
    depth = [_profile(stack, rows, weight_rows, step, mean, owner) for stack, rows in stacks.items()]
    time = [TimeProfile(n.outputs[0], n.op, n.inputs[0], "last step" if masked else "as written",
                        [float(x) / batches for x in time_sums[n.outputs[0]]]) for n, masked in time_step]
    asked = {v: (mean.get(f"grad:{step.probes[v]}"), mean[f"var:{v}"]) for v in probes or [] if v in step.probes}
    return GradientReport(graph.name, step.loss_node.op, why, seed, batches, mean["loss"], weight_rows, inputs_grad,
                          depth, time, asked, dead.rows())


def _accumulate(sums: dict[str, float], key: str, value: float) -> None:
    sums[key] = sums.get(key, 0.0) + value


def _owners(graph: Graph) -> dict[str, Node]:
    """Each weight key's owning node (the one whose weights scope holds it, as init_weights does)."""
    from irc.runtime.weights import node_weight_keys

    types = graph.value_types()
    out: dict[str, Node] = {}
    for node in graph.nodes:
        for key in node_weight_keys(node, types).values():
            if node.weights and key.startswith(f"{node.weights}.") and key not in out:
                out[key] = node
    return out


def _profile(stack: str, rows: list[tuple[str, str | None]], weights: list[WeightGrad], step: Step,
             mean: dict[str, float], owner: dict[str, Node]) -> DepthProfile:
    blocks = []
    for block, value in rows:
        if stack == "layers":  # a block is one layer: its weights scope
            mine = [r for r in weights if r.key in owner and owner[r.key].weights == block]
        else:
            mine = [r for r in weights if r.block == block or r.block.startswith(block + ".")]
        with_grad = [r.grad_norm for r in mine if r.grad_norm is not None]
        probe = step.probes.get(value) if value else None
        blocks.append(BlockGrad(block, sqrt(sum(r.weight_norm ** 2 for r in mine)),
                                sqrt(sum(g * g for g in with_grad)) if with_grad else None, value,
                                mean.get(f"grad:{probe}") if probe else None,
                                mean.get(f"var:{value}") if value else None))
    return DepthProfile(stack, blocks)


def _time_step(step: Step, recurrent: list[Node]) -> list[tuple[Node, bool]]:
    """Each recurrent node with whether its time profile needs the loss masked to the last step: the
    loss's prediction runs along the same time axis ([B, T, classes] logits, an mse of [B, T, ...])."""
    types = step.graph.value_types()
    pred = types[step.loss_node.inputs[0]]
    out = []
    for node in recurrent:
        steps = types[node.inputs[0]].shape[1]
        out.append((node, pred.rank >= 3 and pred.shape[1] == steps and steps > 1 and step.targets_is_input))
    return out


def _time_norms(step: Step, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                full: dict[str, np.ndarray], node: Node, masked: bool) -> np.ndarray:
    """‖∂L_T/∂x_t‖ per step t (norm over batch and features); a second run with the loss at step T alone."""
    out = full
    if masked:
        inputs = dict(inputs)
        targets = inputs[step.targets].copy()
        if step.loss_node.op == "cross_entropy":
            targets[:, :-1] = step.loss_node.attrs.get("ignore_index", -100)
        else:  # a target equal to the prediction contributes no gradient (in float64: a float32 copy of it
            pred = _prediction(step, weights, inputs)  # would round, and leave a floor of gradient at every step)
            targets = targets.astype(np.float64)
            targets[:, :-1] = pred[:, :-1]
        inputs[step.targets] = targets
        out = run_step(step, weights, inputs)
    g = out[step.grad_labels[step.probes[node.inputs[0]]]]
    return np.sqrt(np.sum(np.square(g), axis=(0, 2)))


def _prediction(step: Step, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> np.ndarray:
    from irc.backends.numpy_ref import run_graph

    fwd = step.forward.copy()
    fwd.outputs = [("pred", step.loss_node.inputs[0])]
    keep = {n.outputs[0] for n in fwd.inputs()}
    return run_graph(fwd, weights, {k: v for k, v in inputs.items() if k in keep}, dtype=np.float64)["pred"]


def probe_arrays(graph: Graph, values: list[str], weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                 loss: str | None = None) -> tuple[float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(loss, {value: (its forward array, ∂L/∂value)}) of one batch: what the norms above are made of, for a
    caller that needs the arrays (a per-row distribution, a bound to compare with). ``inputs`` must hold
    every model input and the targets (named as attach_loss names them, ``targets`` unless taken)."""
    attach, _ = choose_loss(graph, loss)
    step = build_step(graph, attach, values)
    types = step.graph.value_types()
    feed = {**inputs, **{p: np.zeros(tuple(types[p].shape)) for p in step.probes.values()}}
    out = run_step(step, weights, feed)
    return float(out["loss"]), {v: (out[f"value_{p}"], out[step.grad_labels[p]]) for v, p in step.probes.items()
                                if p in step.grad_labels}
