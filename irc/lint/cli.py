"""``irc lint FILE [-D ...] [-W ...]``: print the architecture warnings; exit 1 only if ``-W error``
turned one into an error. ``print_lints`` lets ``compile`` and ``analyze`` print the same."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from irc.graph import Graph
from irc.lint import lint_graph
from irc.lint.options import parse_flags
from irc.lint.render import render_warning, summary


def print_lints(graph: Graph, flags: list[str] | None, stream: TextIO, context: int | None = None) -> int:
    """Render ``graph``'s warnings to ``stream`` under the ``-W`` flags; 1 if any is an error."""
    policy = parse_flags(flags)
    shown = [w for w in lint_graph(graph, context) if policy.shown(w.code)]
    errors = 0
    for w in shown:
        error = policy.is_error(w.code)
        errors += error
        stream.write(render_warning(w, "error" if error else "warning") + "\n")
    if shown:
        stream.write(summary(len(shown) - errors, errors) + "\n")
    return 1 if errors else 0


def cmd_lint(args: argparse.Namespace) -> int:
    from irc.pipeline import load_graph, parse_defines

    policy_flags = list(getattr(args, "warnings", []) or [])
    parse_flags(policy_flags)  # a bad -W is a usage error before any work
    graph = load_graph(args.file, parse_defines(args.defines), args.model)
    return print_lints(graph, policy_flags, sys.stdout)
