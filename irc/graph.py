"""The typed graph IR: values, nodes and the graph that orders them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from irc.diagnostics import IrcError, Loc, plural, where
from irc.types import TensorType


@dataclass
class Node:
    """One operation. ``outputs`` name the SSA values it defines.

    ``scope`` is the dotted path of the block call it came from (``decoder.3.attention``)
    and is what reports group by; ``weights`` is the scope its parameters live under,
    which differs from ``scope`` for shared instances.
    """

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    weights: str | None = None
    loc: Loc | None = None
    types: list[TensorType] = field(default_factory=list)

    @property
    def type(self) -> TensorType:
        return self.types[0]


@dataclass
class Graph:
    name: str
    symbols: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (label, value)
    bindings: dict[str, int] = field(default_factory=dict)
    loc: Loc | None = None  # the model's (or IR graph's) name, for errors about the whole graph

    def producers(self) -> dict[str, Node]:
        return {v: n for n in self.nodes for v in n.outputs}

    def value_types(self) -> dict[str, TensorType]:
        out: dict[str, TensorType] = {}
        for n in self.nodes:
            for v, t in zip(n.outputs, n.types):
                out[v] = t
        return out

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "input"]

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v, []).append(n)
        return out

    def copy(self) -> Graph:
        return Graph(
            self.name,
            list(self.symbols),
            [
                Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.scope, n.weights, n.loc, list(n.types))
                for n in self.nodes
            ],
            list(self.outputs),
            dict(self.bindings),
            self.loc,
        )


MAX_RANK = 64  # NumPy's limit on an array's axes


def verify(graph: Graph) -> None:
    """Check SSA form, operand order and typing; raise IrcError on the first problem.

    The builder and the IR parser already guarantee SSA form (the parser reports its
    errors at the operand); here it guards the passes, which rewrite the graph.
    """
    from irc.ops import get_op

    defined: dict[str, Node] = {}
    for node in graph.nodes:
        opdef = get_op(node.op)
        if opdef is None:
            raise IrcError(f"unknown op '{node.op}'", node.loc)
        for v in node.inputs:
            if v not in defined:
                raise IrcError(f"'{node.op}' uses %{v} before it is defined", node.loc)
        for v in node.outputs:
            if v in defined:
                first = defined[v].loc
                notes = [f"first defined at {where(first, node.loc.file if node.loc else None)}"] if first else []
                raise IrcError(f"value %{v} is defined twice", node.loc, notes=notes)
            defined[v] = node
        if node.types and len(node.types) != len(node.outputs):
            raise IrcError(f"'{node.op}' has {plural(len(node.outputs), 'result')} but "
                           f"{plural(len(node.types), 'type')}", node.loc)
        for t in node.types:
            if t.rank > MAX_RANK:  # every backend holds values as NumPy arrays
                raise IrcError(f"'{node.outputs[0]}' has {t.rank:,} axes; irc's backends hold a value as a NumPy "
                               f"array, which has at most {MAX_RANK}", node.loc)
    for label, v in graph.outputs:
        if v not in defined:
            raise IrcError(f"output {label} = %{v} is not defined", graph.loc)
    if not graph.outputs:
        raise IrcError(f"graph '{graph.name}' has no outputs", graph.loc)
