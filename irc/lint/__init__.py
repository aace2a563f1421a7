"""Architecture lints: the chapter's cheat sheet as compiler warnings (``irc lint``).

``lint_graph(graph)`` runs every rule in the table and returns ``LintWarning`` objects in
program order; ``irc.lint.cli`` renders them and applies ``-W``. docs/lints.md lists the codes.
"""

from __future__ import annotations

from irc.diagnostics import IrcError
from irc.graph import Graph
from irc.lint import rules_attention, rules_cost, rules_depth, rules_norm, rules_sizes, rules_vision  # noqa: F401
from irc.lint.context import LintContext
from irc.lint.places import merge
from irc.lint.registry import RULES, Rule
from irc.lint.warning import LintWarning

__all__ = ["RULES", "LintWarning", "Rule", "lint_graph"]


def lint_graph(graph: Graph, context: int | None = None) -> list[LintWarning]:
    """Every warning for ``graph``; symbols left unbound take the analysis defaults
    (``context`` sets the sequence length when T is unbound)."""
    ctx = LintContext(graph, context)
    out: list[LintWarning] = []
    for code in sorted(RULES):
        rule = RULES[code]
        try:
            findings = rule.check(ctx)
        except IrcError:  # the analysis a rule needs rejects this graph; other rules still run
            continue
        out.extend(merge(rule, ctx, findings))
    return sorted(out, key=LintWarning.sort_key)
