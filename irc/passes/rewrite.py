"""A small rewrite engine: rule tables over the graph, in the manner of tinygrad's PatternMatcher.

A rule is a function ``(ctx, node) -> Rewrite | None``; ``None`` means no match. A rewrite
inserts new nodes where the matched node stood, renames uses of old values to new ones
(``replace``), and the engine then drops nodes whose results nobody reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from irc.graph import Graph, Node
from irc.passes.names import fresh_name
from irc.passes.shape_infer import shape_infer


@dataclass
class Rewrite:
    """New nodes for the matched one; ``replace`` renames readers' operands; ``remove`` drops
    other matched nodes whose result names the new nodes take over."""

    nodes: list[Node]
    replace: dict[str, str] = field(default_factory=dict)
    remove: list[Node] = field(default_factory=list)


class Context:
    """What rules may ask of the graph while it is being rewritten."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._names = {v for n in graph.nodes for v in n.outputs}
        self.refresh()

    def refresh(self) -> None:
        self.stale: set[str] = set()
        self.producer = self.graph.producers()
        self.users = self.graph.users()
        self.types = self.graph.value_types()
        self.outputs = {v for _, v in self.graph.outputs}

    def fresh(self, base: str) -> str:
        return fresh_name(base, self._names)

    def only_user(self, value: str, node: Node) -> bool:
        """``node`` is the single reader of ``value`` and the value is not a graph output."""
        users = self.users.get(value, [])
        return len(users) == 1 and users[0] is node and value not in self.outputs

    def prod(self, value: str, op: str | Sequence[str] | None = None) -> Node | None:
        if value in self.stale:  # its producer was rewritten this round: match again next round
            return None
        n = self.producer.get(value)
        if n is None:
            return None
        if op is None or n.op == op or (not isinstance(op, str) and n.op in op):
            return n
        return None

    def node(self, op: str, inputs: list[str], attrs: dict[str, Any], like: Node, name: str | None = None,
             results: int = 1, weights: str | None = None, names: list[str] | None = None) -> Node:
        """A new node at ``like``'s scope and source location; ``names`` reuses the result names
        of the nodes it replaces, so fused IR reads like the source."""
        from irc.diagnostics import IrcError
        from irc.ops import get_op, normalize_attrs
        from irc.ops.registry import AttrError

        opdef = get_op(op)
        assert opdef is not None, op
        try:
            attrs = normalize_attrs(opdef, {k: v for k, v in attrs.items() if v is not None})
        except AttrError as e:  # a size of the layer that the lowered op cannot hold (past 2**62)
            raise IrcError(f"lowering '{like.op}': {e}", like.loc, origin=e.origin) from None
        base = name or f"{like.outputs[0]}.{op}"
        outputs = names or [self.fresh(base if i == 0 else f"{base}.{i}") for i in range(results)]
        return Node(op, inputs, outputs, attrs, like.scope, weights, like.loc)


Rule = Callable[[Context, Node], Rewrite | None]


def apply_rules(graph: Graph, rules: Sequence[Rule], max_rounds: int = 64) -> Graph:
    """Apply ``rules`` until none matches; every changed graph is re-typed and cleaned.

    Within a round, a node that reads a value rewritten earlier in the same round is left
    for the next round, so rules only ever see a consistent graph.
    """
    out = graph.copy()
    for _ in range(max_rounds):
        ctx = Context(out)
        changed = False
        new_nodes: list[Node] = []
        replace: dict[str, str] = {}
        removed: set[int] = set()
        for node in out.nodes:
            touched = any(v in replace for v in node.inputs)
            node.inputs = [replace.get(v, v) for v in node.inputs]
            rewrite = None
            if not touched:
                for rule in rules:
                    rewrite = rule(ctx, node)
                    if rewrite is not None:
                        break
            if rewrite is None:
                if touched:  # its readers see it only next round, once re-typed
                    ctx.stale.update(node.outputs)
                new_nodes.append(node)
                continue
            changed = True
            new_nodes.extend(rewrite.nodes)
            replace.update(rewrite.replace)
            removed.update(id(n) for n in rewrite.remove)
            ctx.stale.update(rewrite.replace)
            ctx.stale.update(node.outputs)
            for n in rewrite.remove:
                ctx.stale.update(n.outputs)
        out.nodes = [n for n in new_nodes if id(n) not in removed]
        out.outputs = [(label, replace.get(v, v)) for label, v in out.outputs]
        # a rewrite may replace values defined before later readers were visited
        for node in out.nodes:
            node.inputs = [replace.get(v, v) for v in node.inputs]
        out = eliminate_dead(_topological(out))
        out = shape_infer(out)
        if not changed:
            break
    return out


def _topological(graph: Graph) -> Graph:
    """Order nodes so every value is defined before use, moving as little as possible:
    a node whose operand comes later pulls that operand's producer forward, just in time."""
    producer = graph.producers()
    placed: set[int] = set()
    ordered: list[Node] = []
    for root in graph.nodes:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in placed:
                continue
            if expanded:
                placed.add(id(node))
                ordered.append(node)
                continue
            stack.append((node, True))
            for v in reversed(node.inputs):
                p = producer.get(v)
                if p is not None and id(p) not in placed and p is not node:
                    stack.append((p, False))
    graph.nodes = ordered
    return graph


def eliminate_dead(graph: Graph) -> Graph:
    """Drop nodes none of whose results is read (inputs always stay)."""
    live = {v for _, v in graph.outputs}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if node.op == "input" or any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    return graph
