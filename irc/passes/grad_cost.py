"""The exact cost of one training step, read off a grad graph (irc/passes/grad.py).

- FLOPs: every node's cost from its record, split at the loss into forward and backward, next to the
  analysis's 3× rule (``irc.analysis.flops.training_flops``: products 3×, the rest 2×) and the
  chapter's 6·N per token (N parameters; "tokens" are the rows the loss averages over).
- Saved activations: the forward values the backward reads, i.e. what a training step must keep
  from the forward pass until its gradient is computed (weights and inputs listed apart: they are
  held anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from irc.analysis.flops import node_cost, training_flops
from irc.analysis.params import count_params
from irc.graph import Graph
from irc.ops import get_op
from irc.ops.cost import Cost, numel
from irc.types import DTYPE_BYTES


@dataclass
class TrainingCost:
    forward_flops: int
    backward_flops: int
    rule_3x_flops: int  # the 3× rule applied to the forward part
    six_n_flops: int  # 6 · parameters · loss rows
    saved_bytes: int  # forward activations the backward reads
    saved: dict[str, int] = field(default_factory=dict)  # value -> bytes
    input_bytes: int = 0  # graph inputs the backward reads (the batch)

    @property
    def total_flops(self) -> int:
        return self.forward_flops + self.backward_flops


def _split(graph: Graph) -> int:
    """Index of the loss node: nodes up to it are the forward pass, the rest the backward."""
    for i, node in enumerate(graph.nodes):
        if get_op(node.op).has("loss"):
            return i
    # a programming error (no command line reaches it): the caller passes what the grad pass returned
    raise ValueError(f"model '{graph.name}' has no loss: run the grad pass first")


def training_cost(graph: Graph) -> TrainingCost:
    """The cost of a graph the grad pass produced (every symbol bound)."""
    cut = _split(graph)
    types = graph.value_types()
    forward, backward = Cost(), Cost()
    for i, node in enumerate(graph.nodes):
        if node.op == "input":
            continue
        c = node_cost(node, [types[v] for v in node.inputs])
        into = forward if i <= cut else backward
        into.macs += c.macs
        for kind, f in c.flops.items():
            into.add(kind, f)
    defined_by = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    kinds = {v: n.op for n in graph.nodes for v in n.outputs}
    read = {v for n in graph.nodes[cut + 1:] for v in n.inputs if defined_by[v] <= cut}
    saved: dict[str, int] = {}
    inputs = 0
    for v in sorted(read, key=lambda v: defined_by[v]):
        size = int(numel(types[v]) * DTYPE_BYTES[types[v].dtype])
        if kinds[v] == "input":
            inputs += size
        elif kinds[v] != "param":  # a weight is a model state, held for the whole step anyway
            saved[v] = size
    params, _ = count_params(graph)
    loss = graph.nodes[cut]
    pred = types[loss.inputs[0]]  # rows: the targets of a cross entropy, the vectors of an mse's prediction
    rows = numel(types[loss.inputs[1]]) if loss.op == "cross_entropy" else numel(pred) // max(1, pred.shape[-1] if
                                                                                             pred.rank else 1)
    return TrainingCost(forward.total, backward.total, training_flops(forward), 6 * int(params) * rows,
                        sum(saved.values()), saved, inputs)
