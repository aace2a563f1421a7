"""From a file on disk to a verified, typed graph, and through a list of passes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from irc.analysis.params import weight_table
from irc.diagnostics import IrcError, UsageError, did_you_mean, read_source
from irc.graph import Graph, verify
from irc.passes import PASSES, get_pass
from irc.printer import print_graph

DEFAULT_PASSES = ["shape-infer"]


def parse_defines(defines: list[str] | None) -> dict[str, int]:
    """``-D NAME=VALUE`` flags to a dict; conflicts and bad values are usage errors."""
    out: dict[str, int] = {}
    for item in defines or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"-D expects NAME=VALUE, got '{item}'")
        try:
            number = int(value.replace("_", ""))
        except ValueError:
            raise UsageError(f"-D {name}: '{value}' is not an integer") from None
        if number <= 0:
            raise UsageError(f"-D {name}: a size must be positive, got {number}")
        if number >= 2**62:
            raise UsageError(f"-D {name}: {number} is too large (sizes must stay below 2**62)")
        if name in out and out[name] != number:
            raise UsageError(f"-D {name} is given twice with different values ({out[name]} and {number})")
        out[name] = number
    return out


def load_graph(path: str | Path, bindings: dict[str, int] | None = None, model: str | None = None) -> Graph:
    """Build the model in an ``.arch`` file (or read an ``.ir`` dump) and infer its types."""
    path = Path(path)
    if not path.exists():
        raise IrcError(f"no such file: '{path}'")
    if path.suffix == ".ir":
        from irc.ir_parser import parse_ir

        graph = parse_ir(read_source(path, str(path), "an IR file"), str(path))
        if bindings:
            from irc.passes.bind import bind_symbols

            graph = bind_symbols(graph, bindings)
    else:
        from irc.frontends.arch import build_file

        graph = build_file(path, bindings, model)
    verify(graph)
    graph = PASSES["shape-infer"](graph)
    _check_overflow(graph)
    weight_table(graph)  # a shared layer (or .ir weight key) used at two shapes is an error here
    return graph


def _check_overflow(graph: Graph) -> None:
    for node in graph.nodes:
        for t in node.types:
            if not all(isinstance(d, int) for d in t.shape):
                continue  # symbolic: checked once the symbols are bound
            n = math.prod(t.shape)
            if n >= 2**62:
                raise IrcError(f"'{node.op}' result {t} has {n:,} elements, which overflows int64 arithmetic",
                               node.loc)


def run_passes(graph: Graph, names: list[str], dump: Callable[[str, str], None] | None = None,
               only_changed: bool = False) -> Graph:
    for name in names:
        fn = get_pass(name)
        if fn is None:
            known = ", ".join(sorted(PASSES))
            raise UsageError(f"unknown pass '{name}'{did_you_mean(name, PASSES)} (known passes: {known})")
        before = print_graph(graph) if (dump and only_changed) else None
        graph = fn(graph)
        verify(graph)
        if dump is not None:
            after = print_graph(graph)
            if not only_changed or after != before:
                dump(name, after)
    return graph
