"""What a picture of a graph shows: one box per op, the scope tree as clusters, costs per box.

A node belongs to the scope of the block call it came from: a layer whose scope is its own name
(``pre_ln_decoder.0.ln1``, holding its weights) sits in the scope above it (``pre_ln_decoder.0``).
A scope whose children are numbered 0..N-1 is a ``repeat(N)`` block. ``depth`` collapses every
scope nested deeper than it into one box with the totals of the ops inside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from irc.graph import Graph, Node
from irc.ops import get_op


@dataclass
class Cluster:
    path: str  # dotted scope path; "" for the whole graph
    depth: int
    children: dict[str, Cluster] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)  # node ids, in graph order



@dataclass
class Costs:
    params: int = 0
    flops: int = 0
    ops: int = 0


def group_of(node: Node) -> str:
    """The scope path a node is drawn in."""
    scope = node.scope or ""
    if scope and (node.weights == scope or node.outputs[0] == scope):
        return scope.rpartition(".")[0]
    return scope


def node_costs(graph: Graph) -> tuple[dict[str, Costs], str | None]:
    """Per node (by first output): its own parameters and forward FLOPs, and the bindings they assume
    ("B=1, T=1,024" when irc analyze's defaults bound the symbols); ({}, None) when no binding fits."""
    from irc.analysis.analyze import bind_for_analysis
    from irc.analysis.flops import node_cost
    from irc.analysis.params import owned_params
    from irc.diagnostics import IrcError, UsageError

    try:
        bound, bindings = bind_for_analysis(graph, dict(graph.bindings), None)
        types = bound.value_types()
        own = owned_params(bound)
        out: dict[str, Costs] = {}
        for node, (p, _, _) in zip(bound.nodes, own):
            flops = 0 if node.op == "input" else node_cost(node, [types[v] for v in node.inputs]).total
            out[node.outputs[0]] = Costs(int(p), int(flops), 1)
    except (IrcError, UsageError, TypeError):
        return {}, None
    assumed = [b for b in bindings if b.name not in graph.bindings]
    return out, ", ".join(f"{b.name}={b.value:,}" for b in assumed) or None


def shown_attrs(node: Node) -> str:
    """The attributes that differ from the op's defaults (the ones worth reading on a picture)."""
    opdef = get_op(node.op)
    items = []
    for name, value in node.attrs.items():
        attr = opdef.attr(name) if opdef else None
        if value is None or (attr is not None and not attr.required and attr.default == value):
            continue
        items.append(f"{name}={_value(value)}")
    return ", ".join(items)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    return str(v)


def repeats(graph: Graph) -> dict[str, int]:
    """Scope path -> N for every scope whose sub-scopes are exactly 0..N-1 (a repeat(N) block)."""
    kids: dict[str, set[str]] = {}
    for node in graph.nodes:
        parts = group_of(node).split(".") if group_of(node) else []
        for i in range(1, len(parts)):
            kids.setdefault(".".join(parts[:i]), set()).add(parts[i])
    out = {}
    for path, names in kids.items():
        if all(n.isdigit() for n in names) and sorted(int(n) for n in names) == list(range(len(names))):
            out[path] = len(names)
    return out


def build_tree(graph: Graph, depth: int | None) -> tuple[Cluster, dict[str, str]]:
    """The cluster tree, and for each value the id of the box that draws its producer."""
    root = Cluster("", 0)
    box_of: dict[str, str] = {}
    for node in graph.nodes:
        path = group_of(node)
        parts = path.split(".") if path else []
        cluster, box = root, node.outputs[0]
        for i, part in enumerate(parts):
            if depth is not None and i >= depth:  # collapsed: the scope at this depth is one box
                box = "scope:" + ".".join(parts[:i + 1])
                break
            cluster = cluster.children.setdefault(part, Cluster(".".join(parts[:i + 1]), i + 1))
        if box not in cluster.members:
            cluster.members.append(box)
        for v in node.outputs:
            box_of[v] = box
    return root, box_of
