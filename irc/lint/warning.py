"""One architecture warning: a stable code, where it is, what is wrong, why, and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from irc.diagnostics import Loc


@dataclass(frozen=True)
class Measured:
    """What ``irc lint --measure`` measured for a warning (irc/lint/measure.py): a note for the text
    output, and the same numbers as fields for ``--format json|sarif``."""

    text: str  # "measured at init (seed 0, 3 batches, mse loss): …" or "not measured: …"
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


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
    measured: Measured | None = None  # only under --measure, for the rules irc/lint/measure.py reads a figure for

    def sort_key(self) -> tuple[int, str]:
        return self.order, self.code
