"""One architecture warning: a stable code, where it is, what is wrong, why, and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field

from irc.diagnostics import Loc


@dataclass(frozen=True)
class LintWarning:
    code: str  # stable, e.g. IRC-W101
    name: str  # the rule's slug, e.g. attention-no-position
    loc: Loc | None
    message: str  # one line: what the graph shows
    mechanism: str  # one sentence: why it hurts, with this model's numbers
    fix: str  # what to write instead
    notes: tuple[str, ...] = field(default=())  # where else (repeated blocks), which sizes were defaulted
    order: int = 0  # index of the anchor node, so output follows the program

    def sort_key(self) -> tuple[int, str]:
        return self.order, self.code
