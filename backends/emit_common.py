"""What the cpu and cuda code generators track, and write, the same way: each node's weights
with concrete shapes, where each value is read for the last time, and the generated
module's weight, input and output tables."""

from __future__ import annotations

from irc.analysis.params import node_params
from irc.backends.literals import shape_literal, str_literal, tuple_literal
from irc.graph import Graph, Node
from irc.types import TensorType


def concrete(shape: tuple) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def node_weights(node: Node, types: dict[str, TensorType]) -> dict[str, tuple[int, ...]]:
    """The node's parameters and buffers by short name, with concrete shapes."""
    params, buffers = node_params(node, types)
    return {k: concrete(s) for k, s in {**params, **buffers}.items()}


def weight_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Every parameter and buffer key the graph reads, in graph order, with its shape."""
    types = graph.value_types()
    out: dict[str, tuple[int, ...]] = {}
    for node in graph.nodes:
        for name, shape in node_weights(node, types).items():
            out.setdefault(f"{node.weights}.{name}", shape)
    return out


def last_uses(graph: Graph) -> dict[int, list[str]]:
    """Node index -> values that die there (their last reader, or their producer if nothing
    reads them), so the driver can free them early; outputs are kept."""
    keep = {v for _, v in graph.outputs}
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs + node.outputs:
            last[v] = i
    out: dict[int, list[str]] = {}
    for v, i in last.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    return out


def io_tables(graph: Graph, shapes: dict[str, tuple[int, ...]], weights_note: str) -> list[str]:
    """The module's WEIGHTS, INPUTS and OUTPUTS tables (``weights_note`` comments WEIGHTS)."""
    out = [f"WEIGHTS = (  # {weights_note}\n"]
    out += [f"    ({str_literal(k)}, {shape_literal(s)}),\n" for k, s in shapes.items()]
    out.append(")\n")
    out.append("INPUTS = (  # (name, dtype, shape)\n")
    for n in graph.inputs():
        spec = f"{str_literal(n.outputs[0])}, {str_literal(n.type.dtype)}, {shape_literal(concrete(n.type.shape))}"
        out.append(f"    ({spec}),\n")
    out.append(")\n")
    out.append(f"OUTPUTS = {tuple_literal([str_literal(label) for label, _ in graph.outputs])}\n")
    return out

