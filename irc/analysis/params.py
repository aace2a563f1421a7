"""Exact parameter counts: each weight counted once, however many nodes use it."""

from __future__ import annotations

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


def weight_table(graph: Graph) -> tuple[dict[str, tuple[Dim, ...]], dict[str, tuple[Dim, ...]]]:
    """Every parameter and buffer by full key ``scope.name``; shared instances appear once."""
    types = graph.value_types()
    params: dict[str, tuple[Dim, ...]] = {}
    buffers: dict[str, tuple[Dim, ...]] = {}
    for node in graph.nodes:
        p, b = node_params(node, types)
        for name, shape in p.items():
            params.setdefault(f"{node.weights}.{name}", tuple(shape))
        for name, shape in b.items():
            buffers.setdefault(f"{node.weights}.{name}", tuple(shape))
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
    seen: set[str] = set()
    out: list[tuple[int | Dim, int | Dim, bool]] = []
    for node in graph.nodes:
        p, b = node_params(node, types)
        own_p: Dim = 0
        own_b: Dim = 0
        reused = node.attrs.get("tied") is not None
        for table, is_param in ((p, True), (b, False)):
            for name, shape in table.items():
                key = f"{node.weights}.{name}"
                if key in seen:
                    reused = True
                    continue
                seen.add(key)
                if is_param:
                    own_p = own_p + prod(shape)
                else:
                    own_b = own_b + prod(shape)
        out.append((own_p, own_b, reused))
    return out
