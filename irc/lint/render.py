"""Warnings as a compiler prints them: ``file:line:col: warning: message [CODE]``, the source
line with a caret, then ``note:`` (the mechanism and any extra notes) and ``help:`` (the fix);
and as machine-readable reports: irc's own JSON and SARIF 2.1.0 (code-scanning tools read it)."""

from __future__ import annotations

from typing import Any

from irc.diagnostics import _message, _paint, excerpt, quote
from irc.lint.warning import LintWarning

LINT_JSON_VERSION = 1
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render_warning(w: LintWarning, severity: str = "warning", color: bool = False) -> str:
    """The warning as irc's errors render (irc.diagnostics.render): what is quoted from the user's file
    escaped and windowed for the terminal, labels coloured when ``color``."""
    where = f"{_paint(quote(str(w.loc)) + ':', 'bold', color)} " if w.loc is not None else "irc: "
    lines = [f"{where}{_paint(severity + ':', severity, color)} {_message(w.message)} [{w.code}]"]
    if w.loc is not None:  # the source line, its span underlined (^~~~), as errors show it
        lines.extend(excerpt(w.loc, color))
    lines.append(f"{_paint('note:', 'note', color)} {_message(w.mechanism)}")
    if w.measured is not None:  # --measure: the figure right after the claim it checks
        lines.append(f"{_paint('note:', 'note', color)} {_message(w.measured.text)}")
    lines.extend(f"{_paint('note:', 'note', color)} {_message(n)}" for n in w.notes)
    lines.append(f"{_paint('help:', 'note', color)} {_message(w.fix)}")
    return "\n".join(lines)


def summary(warnings: int, errors: int) -> str:
    parts = []
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    return " and ".join(parts) + " generated." if parts else ""


def _measured_json(w: LintWarning) -> dict[str, Any]:
    """``{"measured": {...}}`` under --measure, else nothing: the report without it is unchanged."""
    return {} if w.measured is None else {"measured": {"text": w.measured.text, **w.measured.fields}}


def _warning_json(w: LintWarning, severity: str) -> dict[str, Any]:
    return {"code": w.code, "name": w.name, "severity": severity,
            "file": w.loc.file if w.loc else None, "line": w.loc.line if w.loc else None,
            "column": w.loc.col if w.loc else None, "message": w.message, "mechanism": w.mechanism,
            "notes": list(w.notes), "fix": w.fix, **_measured_json(w)}


def lint_json(model: str, file: str, warnings: list[LintWarning], severities: list[str]) -> dict[str, Any]:
    return {"irc_lint_version": LINT_JSON_VERSION, "model": model, "file": file,
            "warnings": [_warning_json(w, s) for w, s in zip(warnings, severities)],
            "counts": {"warnings": severities.count("warning"), "errors": severities.count("error")}}


def lint_sarif(warnings: list[LintWarning], severities: list[str]) -> dict[str, Any]:
    """One SARIF 2.1.0 run: the rule table (every code) and one result per warning."""
    from irc import __version__
    from irc.lint.registry import RULES

    codes = sorted(RULES)
    rules = [{"id": c, "name": RULES[c].name, "shortDescription": {"text": RULES[c].summary},
              "helpUri": f"docs/lints.md#{c.lower()}-{RULES[c].name}"} for c in codes]
    results = []
    for w, severity in zip(warnings, severities):
        result: dict[str, Any] = {
            "ruleId": w.code, "ruleIndex": codes.index(w.code), "level": severity,
            "message": {"text": f"{w.message}. {w.mechanism}. Fix: {w.fix}"},
            "properties": {"mechanism": w.mechanism, "fix": w.fix, "notes": list(w.notes), **_measured_json(w)},
        }
        if w.loc is not None:
            region = {"startLine": w.loc.line, "startColumn": w.loc.col}
            if w.loc.end_line is not None and w.loc.end_col is not None:  # SARIF's endColumn is exclusive too
                region |= {"endLine": w.loc.end_line, "endColumn": w.loc.end_col}
            result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": w.loc.file},
                                                         "region": region}}]
        results.append(result)
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "irc", "version": __version__, "rules": rules}},
                      "results": results}]}
