"""From a file on disk to a verified, typed graph, and through a list of passes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from irc.analysis.params import weight_table
from irc.diagnostics import IrcError, UsageError, did_you_mean, quote, read_source
from irc.graph import Graph, verify
from irc.passes import PASSES, get_pass
from irc.printer import print_graph

DEFAULT_PASSES = ["shape-infer"]


_SIZE = re.compile(r"([-+]?[0-9][0-9_]*)([kKmM]?)")
_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?")
_SUFFIX = {"": 1, "k": 2**10, "m": 2**20}


def parse_defines(defines: list[str] | None) -> dict[str, int | Fraction]:
    """``-D NAME=VALUE`` flags to a dict; conflicts and bad values are usage errors.

    A whole number is a size (positive, below 2**62, with an optional k = 1024 or M = 1024**2
    suffix: ``-D T=4k``); a decimal number (``-D eps=1e-6``, ``-D theta=5e5``) can only
    override a model constant that is a number, kept exact as a fraction.
    """
    out: dict[str, int | Fraction] = {}
    for item in defines or []:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"-D expects NAME=VALUE, got '{quote(item)}'")
        size = _SIZE.fullmatch(value)
        number: int | Fraction
        if size:
            number = int(size.group(1).replace("_", "")) * _SUFFIX[size.group(2).lower()]
            if number <= 0:
                raise UsageError(f"-D {name}: a size must be positive, got {number}")
            if number >= 2**62:
                raise UsageError(f"-D {name}: {number} is too large (sizes must stay below 2**62)")
        elif _NUMBER.fullmatch(value) and len(value) <= 40 and any(c.isdigit() for c in value):
            number = Fraction(value.replace("_", ""))
            if number.denominator == 1 and number > 0 and "." not in value and "e" not in value.lower():
                number = int(number)
        else:
            raise UsageError(f"-D {name}: '{quote(value)}' is not a number (sizes are whole numbers such as 64 or "
                             "4k; a constant may be a decimal such as 1e-6)")
        if name in out and out[name] != number:
            raise UsageError(f"-D {name} is given twice with different values ({out[name]} and {number})")
        out[name] = number
    return out


def load_graph(path: str | Path, bindings: dict[str, int] | None = None, model: str | None = None) -> Graph:
    """Build the model in an ``.arch`` file (or read an ``.ir`` dump) and infer its types."""
    path = Path(path)
    if not path.exists():
        raise IrcError(f"no such file: '{quote(str(path))}'")
    if path.is_file():
        from irc.file_kinds import ONNX, file_kind, not_a_model

        kind = file_kind(path)
        if kind == ONNX:  # the ONNX frontend reads it (docs/import-onnx.md)
            from irc.frontends.onnx.importer import load_onnx

            return _typed(load_onnx(path, bindings))
        problem = not_a_model(path, kind)
        if problem:
            raise IrcError(problem)
    if bindings and path.suffix == ".ir" and any(not isinstance(v, int) for v in bindings.values()):
        name = next(k for k, v in bindings.items() if not isinstance(v, int))
        raise UsageError(f"-D {name}: an IR dump has no constants to override, and its sizes are whole numbers")
    if path.suffix == ".ir":
        from irc.ir_parser import parse_ir

        graph = parse_ir(read_source(path, str(path), "an IR file"), str(path))
        if bindings:
            from irc.passes.bind import bind_symbols

            graph = bind_symbols(graph, bindings)
    else:
        from irc.frontends.arch import build_file

        graph = build_file(path, bindings, model)
    return _typed(graph)


def _typed(graph: Graph) -> Graph:
    verify(graph)
    graph = PASSES["shape-infer"](graph)
    _check_overflow(graph)
    weight_table(graph)  # a shared layer (or .ir weight key) used at two shapes is an error here
    return graph


def load_with_defaults(path: str | Path, bindings: dict[str, int] | None = None, model: str | None = None,
                       context: int | None = None) -> tuple[Graph, list]:
    """``load_graph`` with every unbound symbol given its default, by the one rule ``analyze`` uses
    (irc.analysis.bindings.default_bindings: batch 1, sequence ``context`` / the position table /
    1,024, image side 224; any other symbol is an error naming it). Returns the graph and the
    defaulted bindings, for the caller to say which it chose."""
    from irc.analysis.bindings import default_bindings

    given = dict(bindings or {})
    graph = load_graph(path, given, model)
    if all(s in graph.bindings for s in graph.symbols):
        return graph, []
    chosen = default_bindings(graph, given, context)
    defaulted = [b for b in chosen if b.source not in ("-D", "bound")]
    return load_graph(path, {**given, **{b.name: b.value for b in defaulted}}, model), defaulted


def defaults_note(defaulted: list) -> str:
    """``T=1,024 (default sequence), B=1 (default batch); bind them with -D to choose`` for a note."""
    them = "it" if len(defaulted) == 1 else "them"
    return f"unbound sizes take their defaults: {', '.join(b.describe() for b in defaulted)}; bind {them} with -D"


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
