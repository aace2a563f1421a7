"""Forward FLOPs of a node, read from its op's record (``OpDef.cost`` in ``irc/ops/``).

The counting conventions are in ``irc/ops/cost.py`` and docs/analysis-json.md. Every registered op
declares a cost (the coverage-matrix test walks the registry), so a new op can never silently count
zero; analysing a graph whose op has none is an error.
"""

from __future__ import annotations

from irc.diagnostics import IrcError
from irc.graph import Node
from irc.ops.attention import attention_pairs, flops_per_pair
from irc.ops.cost import KINDS, MATMUL_KINDS, SOFTMAX_PER_ELEMENT, Cost, causal_pairs, visible_pairs
from irc.types import TensorType

__all__ = ["KINDS", "MATMUL_KINDS", "SOFTMAX_PER_ELEMENT", "Cost", "attention_flops_per_pair", "attention_pairs",
           "causal_pairs", "node_cost", "training_flops", "visible_pairs"]


def attention_flops_per_pair(attrs: dict, d_model: int) -> int:
    """FLOPs of Q·Kᵀ and ·V for one (query, key) pair over all heads: 2·2·heads·d_head."""
    return flops_per_pair(attrs, d_model)


def node_cost(node: Node, ins: list[TensorType]) -> Cost:
    from irc.ops import get_op

    opdef = get_op(node.op)
    if opdef is None or opdef.cost is None:
        raise IrcError(f"irc analyze has no FLOP formula for op '{node.op}' (declare cost= in its record in "
                       "irc/ops/)", node.loc)
    return opdef.cost(node, ins, node.types)


def training_flops(cost: Cost) -> int:
    """Forward + backward: products cost 2× again backward (input and weight gradients), the rest 1×."""
    return sum(f * (3 if kind in MATMUL_KINDS else 2) for kind, f in cost.flops.items())
