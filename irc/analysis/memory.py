"""Activation memory: bytes per value, peak live bytes by liveness, activations saved for training.

A value is a buffer unless its op's record marks it a ``view`` (it re-views its input); a view
extends the life of the buffer it views. A ``param`` (a lowered weight) is a weight, not an
activation: it is counted with the weights, never here. Composite ops also hold intermediates of
their own (their record's ``internal``): attention's q, k, v, probabilities and context, an FFN's
hidden layer, recurrent gates. Those live while the op runs (they count toward the peak) and are
what backpropagation keeps (they count toward the saved activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.graph import Graph, Node
from irc.ops import get_op
from irc.ops.registry import ops_with
from irc.types import DTYPE_BYTES, TensorType

# ops whose result shares its input's buffer (inference-time dropout is the identity), and param,
# whose result is a weight
ALIASES = ops_with("view")


def value_bytes(t: TensorType, act_dtype: str) -> int:
    """Bytes of a value: floating-point activations at ``act_dtype``, integers at their own width."""
    per = DTYPE_BYTES[act_dtype] if t.is_float else DTYPE_BYTES[t.dtype]
    return int(t.numel() * per)


def internal_elements(node: Node, ins: list[TensorType]) -> int:
    """Elements a composite op materialises besides its result."""
    opdef = get_op(node.op)
    return opdef.internal_elements(node.attrs, ins) if opdef is not None else 0


@dataclass
class Memory:
    activation_bytes: int  # every buffer the forward pass creates, none freed
    peak_live_bytes: int  # the most held at once, freeing each buffer after its last use
    peak_node: int  # index of the node where the peak occurs
    saved_for_training_bytes: int  # buffers and intermediates backpropagation keeps


def analyse_memory(graph: Graph, act_dtype: str) -> Memory:
    nodes = graph.nodes
    n = len(nodes)
    types = graph.value_types()
    root: dict[str, str] = {}
    born: dict[str, int] = {}
    size: dict[str, int] = {}
    last: dict[str, int] = {}
    internal = [0] * n
    elem = int(DTYPE_BYTES[act_dtype])
    for i, node in enumerate(nodes):
        for v in node.inputs:
            last[root[v]] = i
        if node.op in ALIASES:
            if not node.inputs:  # a weight (param): not an activation buffer at all
                for v in node.outputs:
                    root[v] = v
                    last[v] = i
                continue
            for v in node.outputs:
                root[v] = root[node.inputs[0]]
            continue
        for v, t in zip(node.outputs, node.types):
            root[v] = v
            born[v] = i
            size[v] = value_bytes(t, act_dtype)
            last.setdefault(v, i)
        if node.op != "input":
            internal[i] = elem * internal_elements(node, [types[v] for v in node.inputs])
    for _, v in graph.outputs:
        last[root[v]] = n - 1
    # sweep: a buffer is live from the node that makes it to its last use, inclusive
    delta = [0] * (n + 1)
    for v, b in born.items():
        delta[b] += size[v]
        delta[last[v] + 1] -= size[v]
    live, peak, peak_at = 0, 0, 0
    for i in range(n):
        live += delta[i]
        if live + internal[i] > peak:
            peak, peak_at = live + internal[i], i
    act_bytes = sum(size.values())
    return Memory(act_bytes, peak, peak_at, act_bytes + sum(internal))
