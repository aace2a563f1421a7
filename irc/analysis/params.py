"""Exact parameter counts: each weight counted once, however many nodes use it."""

from __future__ import annotations

from irc.diagnostics import IrcError, where
from irc.dims import Dim, prod
from irc.graph import Graph, Node
from irc.ops import get_op


def node_params(node: Node, types: dict) -> tuple[dict[str, tuple[Dim, ...]], dict[str, tuple[Dim, ...]]]:
    """(parameter shapes, buffer shapes) of one node, keyed by short name."""
    opdef = get_op(node.op)
    if opdef is None or node.op == "input":
        return {}, {}
    operand_types = [types[v] for v in node.inputs]
    return opdef.param_shapes(node.attrs, operand_types), opdef.buffer_shapes(node.attrs, operand_types)


class SharedWeights:
    """The first node to use each weight key, so a later node that shares the key must agree on its shape.

    A layer instance called on inputs of two widths (``l = linear(8); l(x16); l(x32)``), or
    .ir nodes that name the same weights, would otherwise read one array with two shapes:
    the counts would take the first and a run would fail inside NumPy.
    """

    def __init__(self) -> None:
        self.first: dict[str, tuple[tuple[Dim, ...], Node]] = {}

    def seen(self, key: str, shape: tuple[Dim, ...], node: Node) -> bool:
        """True when an earlier node already uses ``key`` (with the same shape); IrcError if with another."""
        if key not in self.first:
            self.first[key] = (shape, node)
            return False
        first_shape, first = self.first[key]
        if first_shape != shape:
            notes = [f"'{first.op}' at {where(first.loc, node.loc.file if node.loc else None)} made "
                     f"'{key}' {_fmt(first_shape)}"] if first.loc else []
            if node.weights:
                why = "; a shared layer must see inputs of one size"
            else:
                why = ""
                notes.append("an .ir node without scope(...) or weights(...) shares the weights of every other "
                             "such node; give each layer a scope(\"name\")")
            raise IrcError(f"'{node.op}' shares the weights '{key}' with an earlier '{first.op}' but needs them "
                           f"as {_fmt(shape)}, not {_fmt(first_shape)}{why}", node.loc, notes=notes)
        return True


def _fmt(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def weight_table(graph: Graph) -> tuple[dict[str, tuple[Dim, ...]], dict[str, tuple[Dim, ...]]]:
    """Every parameter and buffer by full key ``scope.name``; shared instances appear once."""
    types = graph.value_types()
    params: dict[str, tuple[Dim, ...]] = {}
    buffers: dict[str, tuple[Dim, ...]] = {}
    shared = SharedWeights()
    for node in graph.nodes:
        p, b = node_params(node, types)
        for table, out in ((p, params), (b, buffers)):
            for name, shape in table.items():
                key = f"{node.weights}.{name}"
                if not shared.seen(key, tuple(shape), node):
                    out[key] = tuple(shape)
    return params, buffers


def count_params(graph: Graph) -> tuple[Dim, Dim]:
    """(parameters, buffer elements) of the whole graph."""
    params, buffers = weight_table(graph)
    total_p: Dim = 0
    for s in params.values():
        total_p = total_p + prod(s)
    total_b: Dim = 0
    for s in buffers.values():
        total_b = total_b + prod(s)
    return total_p, total_b


def owned_params(graph: Graph) -> list[tuple[int | Dim, int | Dim, bool]]:
    """Per node, in order: (parameters it owns, buffer elements it owns, whether it reuses
    weights an earlier node owns). A weight belongs to the first node that uses it, so a
    shared instance or a tied head counts zero and the per-node sum is the model total."""
    types = graph.value_types()
    shared = SharedWeights()
    out: list[tuple[int | Dim, int | Dim, bool]] = []
    for node in graph.nodes:
        p, b = node_params(node, types)
        own_p: Dim = 0
        own_b: Dim = 0
        reused = node.attrs.get("tied") is not None
        for table, is_param in ((p, True), (b, False)):
            for name, shape in table.items():
                if shared.seen(f"{node.weights}.{name}", tuple(shape), node):
                    reused = True
                    continue
                if is_param:
                    own_p = own_p + prod(shape)
                else:
                    own_b = own_b + prod(shape)
        out.append((own_p, own_b, reused))
    return out
