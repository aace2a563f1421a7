"""The errors a code generator reports about a graph it cannot write code for, shared by the
cpu and cuda backends. Each message is raised in one place, named for the backend that
reports it (``cpu backend: ...``, ``cuda backend: ...``), so each has one origin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from irc.backends.export_reasons import TRAINING_MODE_REASON, training_mode
from irc.diagnostics import IrcError
from irc.graph import Graph, Node

R = TypeVar("R")


def check_concrete(graph: Graph, backend: str) -> None:
    """Kernels are written for concrete sizes: every node is typed and every symbol bound."""
    for node in graph.nodes:
        if not node.types:
            raise IrcError(f"{backend} backend: '{node.op}' has no type; run shape inference first", node.loc)
        for t in node.types:
            syms = t.symbols()
            if syms:
                names = ", ".join(sorted(syms))
                raise IrcError(f"{backend} backend: '{node.op}' result {t} has unbound sizes ({names}); "
                               "bind them with -D NAME=VALUE", node.loc)


def renderer(renderers: Mapping[str, R], op: str, node: Node, backend: str) -> R:
    """The backend's renderer for ``op`` (``node``'s op, perhaps under its canonical name)."""
    render = renderers.get(op)
    if render is None:
        raise IrcError(f"{backend} backend: no kernel for op '{node.op}'", node.loc)
    if training_mode(node) and not getattr(render, "trains", False):  # a renderer says it computes batch statistics
        raise IrcError(f"{backend} backend: '{node.op}' {TRAINING_MODE_REASON}", node.loc)
    return render


def check_derived_keys(derived: Iterable[str], weight_keys: Mapping[str, object], backend: str) -> None:
    """A weight the module derives must not shadow a weight the graph declares."""
    for key in derived:
        if key in weight_keys:
            raise IrcError(f"{backend} backend: derived weight key {key!r} collides with a weight of the graph")
