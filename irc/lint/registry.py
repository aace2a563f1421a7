"""The rule table: each rule a small function from the lint context to findings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from irc.graph import Node

if TYPE_CHECKING:
    from irc.lint.context import LintContext


@dataclass
class Finding:
    """What a rule saw at one node; the runner adds the code, location and order."""

    node: Node
    message: str
    mechanism: str
    fix: str
    notes: list[str] = field(default_factory=list)
    also: list[Node] = field(default_factory=list)  # other nodes this one finding stands for


RuleFn = Callable[["LintContext"], list[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    summary: str
    check: RuleFn


RULES: dict[str, Rule] = {}


def rule(code: str, name: str, summary: str) -> Callable[[RuleFn], RuleFn]:
    """Register ``check`` under a stable ``code`` (never reuse or renumber one)."""

    def register(check: RuleFn) -> RuleFn:
        assert code not in RULES, f"lint code {code} registered twice"
        RULES[code] = Rule(code, name, summary, check)
        return check

    return register
