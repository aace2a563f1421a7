"""Typed graphs from ``.arch`` text in memory (tests, notebooks), the way ``load_graph`` builds files."""

from __future__ import annotations

from irc.graph import Graph, verify
from irc.passes import PASSES


def graph_from_source(text: str, bindings: dict[str, int] | None = None, model: str | None = None,
                      file: str = "<input>") -> Graph:
    from irc.frontends.arch import build_source

    graph = build_source(text, file, bindings, model)
    verify(graph)
    return PASSES["shape-infer"](graph)
