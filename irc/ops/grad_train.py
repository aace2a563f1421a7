"""Training mode for a graph, read from the op records: what a training driver applies before the grad pass.

- Every op whose record declares a ``train`` attribute gets ``train=true`` (BatchNorm: this batch's
  statistics, which it then also returns, so the driver can update the running averages).
- ``dropout(x, p)`` with p > 0 becomes ``mul(x, dropout_mask(x, p, seed))``: the mask is an ordinary value,
  so the backward multiplies by the very mask the forward drew (mul's vector-Jacobian product) and the
  training-cost analysis counts it as a saved activation. Each dropout gets its own seed, derived from the
  step's ``seed`` and its place in the graph: a new ``seed`` per step draws new masks, deterministically.
  A training loop that compiles its step once passes ``step_input`` instead: every mask then also reads
  that integer input, and the loop feeds the step number (``irc train`` does).
- An op whose record names a mask rule (``extra["train_mask"]``: the stacked recurrent layers, whose
  ``dropout`` acts between layers) gets ``train=true`` and a second operand, a mask of the shape the rule
  gives, where the rule gives one (dropout > 0 and more than one layer; otherwise the node is left as it
  is). The mask is drawn as dropout's: ``dropout_mask`` of a value of that shape (x with its last axis cut
  to one and broadcast: a view, no arithmetic), with the op's ``dropout`` and a seed of its own.

The running-average update itself is not differentiated: :func:`running_updates` names, per BatchNorm,
the values to read and the buffers to update, and :func:`apply_running_updates` does PyTorch's update.
docs/autodiff.md describes both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from irc.graph import Graph, Node
from irc.ops.registry import get_op, normalize_attrs
from irc.types import TensorType


def _seed(step: int, k: int, stream: int = 0) -> int:
    """A per-dropout seed from (step, k): NumPy's SeedSequence mixes the two, 62 bits kept (an int attribute).
    ``stream`` 1 numbers the layers' own masks apart from the dropout ops, so adding one leaves the others'."""
    entropy = [step % 2**63, k] + ([stream] if stream else [])
    low, high = (int(v) for v in np.random.SeedSequence(entropy).generate_state(2))
    return (high << 32 | low) % 2**62


def _mask_shape(node: Node, types: dict[str, TensorType]) -> tuple | None:
    """The mask a layer's record asks for in training (``extra["train_mask"]``), or None."""
    opdef = get_op(node.op)
    rule = opdef.extra.get("train_mask") if opdef is not None else None
    if rule is None or node.attrs.get("train"):
        return None
    return rule(node.attrs, types[node.inputs[0]])


def training_graph(graph: Graph, seed: int = 0, step_input: str | None = None) -> Graph:
    """A copy of ``graph`` in training mode (see the module's docstring); ``seed`` sets the dropout masks.

    With ``step_input``, the graph gets a new integer scalar input of that name (made unique: see
    :func:`step_input_name`) that every dropout mask also reads: the masks are drawn from (its seed, the
    step fed), so one graph, compiled once, draws new masks every step. A graph without dropout gets no
    such input."""
    from irc.passes.shape_infer import shape_infer

    out = shape_infer(graph.copy())  # the mask rules read the operands' types
    taken = {v for n in out.nodes for v in n.outputs}
    types = out.value_types()
    shapes = {id(n): s for n in out.nodes if (s := _mask_shape(n, types)) is not None}
    step = None
    if step_input is not None and (shapes or any(n.op == "dropout" and n.attrs["p"] > 0 for n in out.nodes)):
        step = step_input
        assert step not in taken, f"the step input '{step}' is taken (use step_input_name)"
        taken.add(step)
        inputs = [i for i, n in enumerate(out.nodes) if n.op == "input"]
        out.nodes.insert(inputs[-1] + 1 if inputs else 0,
                         Node("input", [], [step], {}, "", None, graph.loc, [TensorType("i64", ())]))

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}.{i}", i + 1
        taken.add(name)
        return name

    def draw(base: str, like: str, p: float, seed_value: int, node: Node) -> str:
        """dropout_mask(like[, step]) appended to ``nodes``: the mask's value."""
        mask = fresh(f"{base}.mask")
        attrs = normalize_attrs(get_op("dropout_mask"), {"p": p, "seed": seed_value})
        operands = [like] + ([step] if step is not None else [])
        nodes.append(Node("dropout_mask", operands, [mask], attrs, node.scope, None, node.loc))
        return mask

    nodes: list[Node] = []
    drops = layer_masks = 0
    for node in out.nodes:
        opdef = get_op(node.op)
        if id(node) in shapes:
            shape = shapes[id(node)]
            x, base = node.inputs[0], node.outputs[0]
            rank = types[x].rank
            cut, like = fresh(f"{base}.mask_cut"), fresh(f"{base}.mask_shape")
            nodes.append(Node("slice", [x], [cut], normalize_attrs(get_op("slice"), {"axis": rank - 1, "end": 1}),
                              node.scope, None, node.loc))
            nodes.append(Node("expand", [cut], [like], normalize_attrs(get_op("expand"), {"shape": list(shape)}),
                              node.scope, None, node.loc))
            mask = draw(base, like, node.attrs["dropout"], _seed(seed, layer_masks, stream=1), node)
            layer_masks += 1
            node.inputs = [x, mask]
            node.attrs = {**node.attrs, "train": True}
            nodes.append(node)
            continue
        if node.op == "dropout" and node.attrs["p"] > 0:
            mask = draw(node.outputs[0], node.inputs[0], node.attrs["p"], _seed(seed, drops), node)
            nodes.append(Node("mul", [node.inputs[0], mask], list(node.outputs), normalize_attrs(get_op("mul"), {}),
                              node.scope, None, node.loc))
            drops += 1
            continue
        if (opdef is not None and opdef.attr("train") is not None and not node.attrs.get("train")
                and "train_mask" not in opdef.extra):  # a mask rule's op trains only where it draws a mask
            node.attrs = {**node.attrs, "train": True}
            extra = opdef.result_names(node.attrs)[len(node.outputs):]
            node.outputs = list(node.outputs) + [fresh(f"{node.outputs[0]}.{r}") for r in extra]
        nodes.append(node)
    out.nodes = nodes
    return shape_infer(out)


def step_input_name(graph: Graph, base: str = "dropout_step") -> str:
    """A name for :func:`training_graph`'s step input that no value of ``graph`` has."""
    taken = {v for n in graph.nodes for v in n.outputs}
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


@dataclass(frozen=True)
class RunningUpdate:
    """One BatchNorm's running averages: the buffer keys, the batch statistics' values, the momentum."""

    mean_key: str
    var_key: str
    mean_value: str
    var_value: str
    momentum: float


def running_updates(graph: Graph) -> list[RunningUpdate]:
    """The running-average updates of a training graph's BatchNorms (add their values as outputs to read them)."""
    return [RunningUpdate(f"{n.weights}.running_mean", f"{n.weights}.running_var", n.outputs[1], n.outputs[2],
                          n.attrs["momentum"])
            for n in graph.nodes if n.op == "batchnorm" and n.attrs.get("train")]


def apply_running_updates(weights: dict[str, np.ndarray], updates: list[RunningUpdate],
                          values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch's update, running ← (1 − momentum)·running + momentum·batch (the variance unbiased), on a copy."""
    out = dict(weights)
    for u in updates:
        for key, value in ((u.mean_key, u.mean_value), (u.var_key, u.var_value)):
            old = np.asarray(weights[key])
            out[key] = ((1 - u.momentum) * old + u.momentum * np.asarray(values[value])).astype(old.dtype)
    return out
