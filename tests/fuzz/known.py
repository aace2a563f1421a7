"""Findings already reported to the lead, so the fuzz tests stay green until they are fixed.

Each entry matches a verdict by its status, exception type, where in irc it happened (the
innermost frame, or any frame of a hang's stack) and a piece of its message. Each has a
minimal input in tests/fuzz/regressions.py; tests/test_fuzz.py checks it still reproduces,
so when the fix lands that test fails until the entry here is removed and the input moves
to FIXED, where a plain test keeps it fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fuzz.case import Case
from fuzz.judge import Verdict


@dataclass(frozen=True)
class KnownBug:
    id: str
    statuses: tuple[str, ...]
    summary: str
    exc_type: str = ""
    where: str = ""     # prefix of Verdict.where(): 'frontends/arch/builder.py:_expr'
    in_stack: str = ""  # prefix of any frame (hangs: the stack is a sample, its top varies)
    repeats: int = 1    # ... occurring at least this often
    message: str = ""   # a substring of the verdict's message
    text: str = ""      # a regular expression the input must match (a hang's stack says little)

    def matches(self, v: Verdict, case: Case | None = None) -> bool:
        if self.text and (case is None or not re.search(self.text, case.main_text)):
            return False
        return (v.status in self.statuses and (not self.exc_type or v.exc_type == self.exc_type)
                and v.where().startswith(self.where) and self.message in v.message
                and (not self.in_stack or v.in_stack(self.in_stack) >= self.repeats))


KNOWN: tuple[KnownBug, ...] = ()


def classify(v: Verdict, case: Case | None = None) -> KnownBug | None:
    if not v.is_finding:
        return None
    return next((k for k in KNOWN if k.matches(v, case)), None)
