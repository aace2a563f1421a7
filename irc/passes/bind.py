"""Bind symbolic dimensions to integers (``-D T=1024``) and re-infer types."""

from __future__ import annotations

from irc.diagnostics import IrcError, did_you_mean
from irc.dims import Sym, subs
from irc.graph import Graph


def bind_symbols(graph: Graph, bindings: dict[str, int]) -> Graph:
    unknown = sorted(set(bindings) - set(graph.symbols))
    if unknown:
        name = unknown[0]
        raise IrcError(f"-D {name}: graph '{graph.name}' has no symbol '{name}'{did_you_mean(name, graph.symbols)} "
                       f"(symbols: {', '.join(graph.symbols) or 'none'})", graph.loc)
    out = graph.copy()
    out.bindings.update(bindings)
    for node in out.nodes:
        if node.op == "input":
            node.types = [t.subs(bindings) for t in node.types]
        else:
            node.types = []
        for key, value in list(node.attrs.items()):
            if isinstance(value, Sym):
                node.attrs[key] = subs(value, bindings)
            elif isinstance(value, list):
                node.attrs[key] = [subs(v, bindings) if isinstance(v, Sym) else v for v in value]
    return out
