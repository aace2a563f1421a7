"""Training mode for a graph, read from the op records: what a training driver applies before the grad pass.

- Every op whose record declares a ``train`` attribute gets ``train=true`` (BatchNorm: this batch's
  statistics, which it then also returns, so the driver can update the running averages).
- ``dropout(x, p)`` with p > 0 becomes ``mul(x, dropout_mask(x, p, seed))``: the mask is an ordinary value,
  so the backward multiplies by the very mask the forward drew (mul's vector-Jacobian product) and the
  training-cost analysis counts it as a saved activation. Each dropout gets its own seed, derived from the
  step's ``seed`` and its place in the graph: a new ``seed`` per step draws new masks, deterministically.
  A training loop that compiles its step once passes ``step_input`` instead: every mask then also reads
  that integer input, and the loop feeds the step number (``irc train`` does).

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


def _seed(step: int, k: int) -> int:
    """A per-dropout seed from (step, k): NumPy's SeedSequence mixes the two, 62 bits kept (an int attribute)."""
    low, high = (int(v) for v in np.random.SeedSequence([step % 2**63, k]).generate_state(2))
    return (high << 32 | low) % 2**62


def training_graph(graph: Graph, seed: int = 0, step_input: str | None = None) -> Graph:
    """A copy of ``graph`` in training mode (see the module's docstring); ``seed`` sets the dropout masks.

    With ``step_input``, the graph gets a new integer scalar input of that name (made unique: see
    :func:`step_input_name`) that every dropout mask also reads: the masks are drawn from (its seed, the
    step fed), so one graph, compiled once, draws new masks every step. A graph without dropout gets no
    such input."""
    from irc.passes.shape_infer import shape_infer

    out = graph.copy()
    taken = {v for n in out.nodes for v in n.outputs}
    step = None
    if step_input is not None and any(n.op == "dropout" and n.attrs["p"] > 0 for n in out.nodes):
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

    nodes: list[Node] = []
    drops = 0
    for node in out.nodes:
        opdef = get_op(node.op)
        if node.op == "dropout" and node.attrs["p"] > 0:
            mask = fresh(f"{node.outputs[0]}.mask")
            attrs = normalize_attrs(get_op("dropout_mask"), {"p": node.attrs["p"], "seed": _seed(seed, drops)})
            operands = [node.inputs[0]] + ([step] if step is not None else [])
            nodes.append(Node("dropout_mask", operands, [mask], attrs, node.scope, None, node.loc))
            nodes.append(Node("mul", [node.inputs[0], mask], list(node.outputs), normalize_attrs(get_op("mul"), {}),
                              node.scope, None, node.loc))
            drops += 1
            continue
        if opdef is not None and opdef.attr("train") is not None and not node.attrs.get("train"):
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
