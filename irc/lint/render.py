"""Warnings as a compiler prints them: ``file:line:col: warning: message [CODE]``, the source
line with a caret, then ``note:`` (the mechanism and any extra notes) and ``help:`` (the fix)."""

from __future__ import annotations

from irc.diagnostics import SOURCES
from irc.lint.warning import LintWarning


def render_warning(w: LintWarning, severity: str = "warning") -> str:
    where = f"{w.loc}: " if w.loc is not None else "irc: "
    lines = [f"{where}{severity}: {w.message} [{w.code}]"]
    text = SOURCES.get(w.loc.file) if w.loc is not None else None
    if text is not None:
        src_lines = text.splitlines()
        if 1 <= w.loc.line <= len(src_lines):
            lines.append(f"  {w.loc.line:>4} | {src_lines[w.loc.line - 1].expandtabs(1)}")
            lines.append(f"       | {' ' * max(w.loc.col - 1, 0)}^")
    lines.append(f"note: {w.mechanism}")
    lines.extend(f"note: {n}" for n in w.notes)
    lines.append(f"help: {w.fix}")
    return "\n".join(lines)


def summary(warnings: int, errors: int) -> str:
    parts = []
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    return " and ".join(parts) + " generated." if parts else ""
