"""``-W`` flags, applied in order as GCC does: ``-W no-CODE`` silences a warning,
``-W error=CODE`` makes it an error, ``-W error`` makes every warning one; ``-W CODE``,
``-W no-error=CODE`` and ``-W no-error`` undo those; ``-W no-all`` silences every warning and
``-W all`` shows them all again. CODE is ``IRC-W101``, ``W101`` or the
rule's name (``attention-no-position``), in any case."""

from __future__ import annotations

from dataclasses import dataclass, field

from irc.diagnostics import UsageError, did_you_mean
from irc.lint.registry import RULES


@dataclass
class Policy:
    silenced: set[str] = field(default_factory=set)
    errors: set[str] = field(default_factory=set)
    all_errors: bool = False
    not_errors: set[str] = field(default_factory=set)

    def shown(self, code: str) -> bool:
        return code not in self.silenced

    def is_error(self, code: str) -> bool:
        return code in self.errors or (self.all_errors and code not in self.not_errors)


def resolve_code(text: str) -> str:
    key = text.strip().upper()
    for rule in RULES.values():
        if key in (rule.code, rule.code.removeprefix("IRC-"), rule.name.upper()):
            return rule.code
    names = [n for r in RULES.values() for n in (r.code, r.code.removeprefix("IRC-"), r.name)]
    raise UsageError(f"-W: unknown warning '{text}'{did_you_mean(text.strip(), names)} ({_known()})")


def _known() -> str:
    """The codes, as a range when they run without a gap, and where the names are listed."""
    codes = sorted(RULES)
    numbers = [int(c.removeprefix("IRC-W")) for c in codes]
    span = f"{codes[0]} to {codes[-1]}" if numbers == list(range(numbers[0], numbers[-1] + 1)) else ", ".join(codes)
    return f"known: {span}, or a rule's name such as '{RULES[codes[0]].name}'; docs/lints.md lists them"


def parse_flags(flags: list[str] | None) -> Policy:
    policy = Policy()
    for flag in flags or []:
        f = flag.strip()
        low = f.lower()
        if low == "error":
            policy.all_errors, policy.not_errors = True, set()
        elif low == "no-error":
            policy.all_errors, policy.errors = False, set()
        elif low.startswith("error="):
            code = resolve_code(f[6:])
            policy.errors.add(code)
            policy.not_errors.discard(code)
        elif low.startswith("no-error="):
            code = resolve_code(f[9:])
            policy.errors.discard(code)
            policy.not_errors.add(code)
        elif low == "no-all":
            policy.silenced = set(RULES)
        elif low == "all":
            policy.silenced = set()
        elif low.startswith("no-"):
            policy.silenced.add(resolve_code(f[3:]))
        else:
            policy.silenced.discard(resolve_code(f))
    return policy
