"""Findings to warnings: one per source location, naming the repeated blocks it stands for."""

from __future__ import annotations

from irc.analysis.groups import block_path
from irc.graph import Node
from irc.lint.context import LintContext
from irc.lint.registry import Finding, Rule
from irc.lint.warning import LintWarning


def _where(nodes: list[Node]) -> str | None:
    scopes = list(dict.fromkeys(block_path(n) or n.scope for n in nodes))
    scopes = [s for s in scopes if s]
    if not scopes:
        return None
    if len(scopes) == 1:
        return f"in {scopes[0]}"
    listed = ", ".join(scopes) if len(scopes) <= 3 else f"{scopes[0]} … {scopes[-1]}"
    return f"in {len(scopes)} places: {listed}"


def merge(rule: Rule, ctx: LintContext, findings: list[Finding]) -> list[LintWarning]:
    """Findings at one location with one message (a repeated block) become one warning."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.node.loc, f.message), []).append(f)
    out = []
    for (loc, message), same in groups.items():
        first = same[0]
        notes = list(first.notes)
        where = _where([n for f in same for n in [f.node, *f.also]])
        from_library = loc is not None and loc.file.startswith("<lib>")
        if where and (len(same) > 1 or first.also or from_library):
            notes.insert(0, where)
        out.append(LintWarning(rule.code, rule.name, loc, message, first.mechanism, first.fix, tuple(notes),
                               ctx.index.get(first.node.outputs[0], 0)))
    return out
