"""Findings already reported to the lead, so the fuzz tests stay green until they are fixed.

Each entry matches a verdict by its status, exception type, where in irc it happened (the
innermost frame, or any frame of a hang's stack) and a piece of its message. Each has a
minimal input in tests/fuzz/regressions.py and a test in tests/test_fuzz.py marked
xfail(strict=True): when the fix lands that test passes, the strict marker turns it into
a failure, and the marker, the entry here and the regression's entry are removed together.
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


KNOWN: tuple[KnownBug, ...] = (
    KnownBug("use-path-with-nul", ("crash",), "crash: use \"a\\x00b.arch\" raises ValueError (embedded null byte)",
             "ValueError", "frontends/arch/builder.py", message="null byte"),
    KnownBug("use-path-too-long", ("crash",), "crash: use of a 300-character file name raises OSError ENAMETOOLONG",
             "OSError", "frontends/arch/builder.py", message="too long"),
    KnownBug("use-device-file", ("hang", "crash"),
             "hang: use \"/dev/zero\" reads until the memory limit (MemoryError) or the time limit; no check for a "
             "regular file", text=r'use\s+"/dev/'),
    KnownBug("ir-input-without-type", ("crash",), "crash: an IR line '%x = input' without a type: IndexError",
             "IndexError", "irc/passes/shape_infer.py"),
    KnownBug("ir-input-nonpositive-size", ("impossible-type",),
             "impossible type: the IR parser accepts '%x = input : f32[0,4]' (or f32[-1], f32[-B]) as a model input",
             message="'input' gives"),
    KnownBug("lowered-value-names", ("roundtrip",),
             "round trip: decompose names params '<weights>.<name>'; an IR scope that is empty, 'é' or 'a b' "
             "gives '%.weight', '%é.weight', which the IR parser rejects", message="after --passes fuse: printed IR"),
    KnownBug("ir-string-attr-unescaped", ("roundtrip",),
             "round trip: printer.format_attr writes tied=\"a\"b\" without escaping the quote",
             message="printed IR does not parse"),
)


def classify(v: Verdict, case: Case | None = None) -> KnownBug | None:
    if not v.is_finding:
        return None
    return next((k for k in KNOWN if k.matches(v, case)), None)
