"""Passes by name. A pass is a plain function ``Graph -> Graph`` (it may return its input)."""

from __future__ import annotations

from collections.abc import Callable

from irc.graph import Graph

Pass = Callable[[Graph], Graph]
PASSES: dict[str, Pass] = {}
DESCRIPTIONS: dict[str, str] = {}


def register_pass(name: str, doc: str) -> Callable[[Pass], Pass]:
    def wrap(fn: Pass) -> Pass:
        PASSES[name] = fn
        DESCRIPTIONS[name] = doc
        return fn
    return wrap


def get_pass(name: str) -> Pass | None:
    return PASSES.get(name)
