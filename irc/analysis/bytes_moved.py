"""Bytes each op reads and writes, the memory side of the roofline.

An op reads its operands and its weights and writes its results, each once: the traffic of
a kernel that keeps its own intermediates on chip (a fused attention keeps its scores in
registers and shared memory, as FlashAttention does). An op that only re-views its input's
buffer (reshape, flatten, select, slice, split, identity, dropout at inference) moves
nothing. Weights are read by every node that uses them (a tied head reads the embedding's
table again); the KV cache a decode step reads is added by the caller (``irc.analysis.roofline``),
which knows the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from irc.analysis.memory import value_bytes
from irc.analysis.params import node_params
from irc.graph import Graph, Node
from irc.ops import get_op
from irc.types import DTYPE_BYTES, TensorType


def is_view(op: str) -> bool:
    """True when the op's record marks it a ``view`` (its result re-views its input): no bytes moved."""
    opdef = get_op(op)
    return opdef is not None and opdef.has("view")


@dataclass(frozen=True)
class Traffic:
    weights: int  # bytes of parameters and buffers read
    activations_read: int  # bytes of operands read
    written: int  # bytes of results written

    @property
    def read(self) -> int:
        return self.weights + self.activations_read

    @property
    def total(self) -> int:
        return self.read + self.written


def weight_elements(node: Node, types: dict[str, TensorType]) -> int:
    """Elements of every parameter and buffer the node reads, shared ones included."""
    params, buffers = node_params(node, types)
    return sum(int(math.prod(s)) for s in [*params.values(), *buffers.values()])


def weight_tables(graph: Graph) -> dict[str, int]:
    """Elements of the weights under each scope, for ops that read another op's weights by reference
    (a tied head's ``tied=`` names the embedding whose table it multiplies by)."""
    types = graph.value_types()
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.weights and node.weights not in out:
            out[node.weights] = weight_elements(node, types)
    return out


def _referenced(node: Node, tables: dict[str, int]) -> int:
    opdef = get_op(node.op)
    refs = [a.name for a in opdef.attrs if a.kind == "ref"] if opdef is not None else []
    return sum(tables.get(node.attrs.get(name), 0) for name in refs if node.attrs.get(name) is not None)


def weight_values(graph: Graph) -> set[str]:
    """Values that are weights, not activations: the results of a lowered graph's ``param`` ops
    (a view of nothing: it names a weight)."""
    return {v for n in graph.nodes if not n.inputs and n.op != "input" and is_view(n.op) for v in n.outputs}


def op_traffic(node: Node, types: dict[str, TensorType], weight_dtype: str, act_dtype: str,
               tables: dict[str, int] | None = None, weights_in: set[str] | None = None) -> Traffic:
    """Bytes ``node`` reads (operands + weights, + weights it references from ``tables``) and writes
    (results); an operand in ``weights_in`` (a lowered ``param``) is read as a weight, at ``weight_dtype``."""
    if node.op == "input" or is_view(node.op):
        return Traffic(0, 0, 0)
    weights_in = weights_in or set()
    elements = weight_elements(node, types) + (_referenced(node, tables) if tables else 0)
    opdef = get_op(node.op)
    if opdef is not None and opdef.inactive is not None and node.inputs:  # a mixture of experts reads only the
        x = types[node.inputs[0]]                                         # experts its tokens are routed to
        elements -= round(opdef.inactive_params(node.attrs, [types[v] for v in node.inputs],
                                                int(x.numel()) // int(x.shape[-1])))
    elements += sum(int(types[v].numel()) for v in node.inputs if v in weights_in)
    weights = int(elements * DTYPE_BYTES[weight_dtype])
    read = sum(value_bytes(types[v], act_dtype) for v in node.inputs if v not in weights_in)
    written = sum(value_bytes(t, act_dtype) for t in node.types)
    return Traffic(weights, read, written)
