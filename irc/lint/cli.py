"""``irc lint FILE [-D ...] [-W ...] [--format text|json|sarif]``, ``irc lint --list``, ``irc lint --explain CODE``.

One stream convention for every command: diagnostics (warnings, errors) go to stderr as text;
the thing the command was asked for goes to stdout (or ``-o``): the IR for ``compile``, the
table for ``analyze``, and for ``lint`` the ``--format json|sarif`` report or the ``--list`` /
``--explain`` text. The exit status is 1 only when ``-W error`` made a warning an error.
``print_lints`` lets ``compile --lint`` and ``analyze --lint`` print the same text.

``--measure`` (irc/lint/measure.py) adds to each warning that states a claim about gradients at
initialisation the figure ``irc analyze --gradients`` measures for it, as one more note (text) or a
``measured`` field (json, sarif); without it the output is what it always was.

A warning located inside the standard library (``<lib>/transformer.arch``) is not the user's to
fix there: it is moved to the user's call of that library block, with the library line as a note.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from irc.diagnostics import SOURCES, Loc, UsageError, use_color
from irc.graph import Graph
from irc.lint import RULES, lint_graph
from irc.lint.options import Policy, parse_flags, resolve_code
from irc.lint.render import lint_json, lint_sarif, render_warning, summary
from irc.lint.warning import LintWarning

if TYPE_CHECKING:  # irc.lint.measure loads the gradient analysis: only under --measure
    from irc.lint.measure import MeasureOptions

DOCS = Path(__file__).resolve().parents[2] / "docs" / "lints.md"


def _call_site(graph: Graph, w: LintWarning) -> Loc | None:
    """Where the user's file calls the library block the warning sits in (its first scope part)."""
    if graph.loc is None or not 0 <= w.order < len(graph.nodes):
        return None
    text = SOURCES.get(graph.loc.file)
    block = graph.nodes[w.order].scope.split(".")[0]
    if text is None or not block:
        return None
    m = re.search(rf"\b{re.escape(block)}\s*\(", text)
    if m is None:
        return None
    line = text.count("\n", 0, m.start()) + 1
    col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return Loc(graph.loc.file, line, col, line, col + len(block))  # the block's name underlined


def user_facing(graph: Graph, warnings: list[LintWarning]) -> list[LintWarning]:
    """Warnings from library files pointed at the user's call site (the library line kept as a note)."""
    out = []
    for w in warnings:
        site = _call_site(graph, w) if w.loc is not None and w.loc.file.startswith("<lib>") else None
        if site is not None:
            block = graph.nodes[w.order].scope.split(".")[0]
            w = replace(w, loc=site, notes=(f"inside the library block '{block}' at {w.loc}", *w.notes))
        out.append(w)
    return out


def shown_warnings(graph: Graph, policy: Policy, context: int | None = None,
                   measure: MeasureOptions | None = None) -> list[LintWarning]:
    """The warnings ``policy`` shows, at the user's call sites; with ``measure``, their measured figures
    too (a silenced warning is not measured, so -W no-CODE also saves the run)."""
    shown = user_facing(graph, [w for w in lint_graph(graph, context) if policy.shown(w.code)])
    if measure is None:
        return shown
    from irc.lint.measure import attach_measurements

    return attach_measurements(graph, shown, measure, context)


def print_lints(graph: Graph, flags: list[str] | None, stream: TextIO, context: int | None = None,
                measure: MeasureOptions | None = None) -> int:
    """Render ``graph``'s warnings to ``stream`` under the ``-W`` flags; 1 if any is an error."""
    policy = parse_flags(flags)
    shown = shown_warnings(graph, policy, context, measure)
    errors = 0
    for w in shown:
        error = policy.is_error(w.code)
        errors += error
        stream.write(render_warning(w, "error" if error else "warning", use_color(stream)) + "\n")
    if shown:
        stream.write(summary(len(shown) - errors, errors) + "\n")
    return 1 if errors else 0


def list_rules() -> str:
    width = max(len(r.name) for r in RULES.values())
    return "".join(f"{code}  {RULES[code].name.ljust(width)}  {RULES[code].summary}\n" for code in sorted(RULES))


def explain(text: str) -> str:
    """The rule's code, name and summary, then its section of docs/lints.md (fires, mechanism, fix, limits)."""
    code = resolve_code(text)
    rule = RULES[code]
    out = f"{code} {rule.name}: {rule.summary}\n"
    doc = DOCS.read_text(encoding="utf-8") if DOCS.is_file() else ""
    m = re.search(rf"^## {re.escape(code)} .*?\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    if m:
        return out + "\n" + m.group(1).strip() + "\n"
    return out + f"(the full explanation is in docs/lints.md, section '{code} {rule.name}')\n"


def _measure_options(args: argparse.Namespace) -> MeasureOptions | None:
    """--measure's options; --seed and --batches without it are a usage error, as analyze's are without
    --gradients."""
    seed, batches = getattr(args, "seed", None), getattr(args, "batches", None)
    if not getattr(args, "measure", False):
        if seed is not None or batches is not None:
            raise UsageError("--seed and --batches describe the gradient measurement: add --measure")
        return None
    if args.list or args.explain:
        raise UsageError("--measure measures a model's warnings; --list and --explain describe the rules and "
                         "measure nothing: drop one")
    from irc.lint.measure import MeasureOptions

    return MeasureOptions(seed, batches)


def cmd_lint(args: argparse.Namespace) -> int:
    from irc.cli import write_output
    from irc.pipeline import load_graph, parse_defines

    policy_flags = list(getattr(args, "warnings", []) or [])
    policy = parse_flags(policy_flags)  # a bad -W is a usage error before any work
    measure = _measure_options(args)
    about_rules = bool(args.list or args.explain)
    if (args.file is None) != about_rules:
        raise UsageError("lint takes a model file, or --list, or --explain CODE (--list and --explain describe "
                         "the rules and take no file)")
    if about_rules:
        write_output(args.output, list_rules() if args.list else explain(args.explain))
        return 0
    graph = load_graph(args.file, parse_defines(args.defines), args.model)
    if args.format == "text":
        if args.output:
            raise UsageError("-o writes the --format json|sarif report; text diagnostics go to stderr")
        return print_lints(graph, policy_flags, sys.stderr, measure=measure)
    shown = shown_warnings(graph, policy, measure=measure)
    severities = ["error" if policy.is_error(w.code) else "warning" for w in shown]
    report = (lint_json(graph.name, args.file, shown, severities) if args.format == "json"
              else lint_sarif(shown, severities))
    write_output(args.output, json.dumps(report, indent=2) + "\n")
    return 1 if "error" in severities else 0
