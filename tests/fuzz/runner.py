"""Run a strategy for N cases through the sandbox and tally the endings.

The same code serves the CI test (a few thousand derandomized cases; an unknown finding
fails the test at once, and hypothesis shrinks it) and the long run (benchmarks/fuzz_long.py:
findings are recorded and the run goes on).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.case import Case
from fuzz.judge import Verdict
from fuzz.known import KnownBug, classify
from fuzz.sandbox import Sandbox


@dataclass
class Tally:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)  # ok / error / known:<id> / <finding>
    origins: Counter = field(default_factory=Counter)
    cpu_s: float = 0.0
    slowest: tuple[float, str] = (0.0, "")
    new: dict[str, tuple[Case, Verdict]] = field(default_factory=dict)  # signature -> first example
    distinct: set[bytes] = field(default_factory=set)  # digests of the inputs: how many differed
    stages: Counter = field(default_factory=Counter)  # '<command>:<ending>' of the cases that compiled

    def add(self, case: Case, verdict: Verdict, known: KnownBug | None) -> str:
        self.cases += 1
        key = repr((case.files, case.defines, case.model)).encode("utf-8", "surrogatepass")
        self.distinct.add(hashlib.blake2b(key, digest_size=12).digest())
        self.origins[case.origin] += 1
        self.cpu_s += verdict.cpu_s
        self.stages.update(f"{command}:{ending}" for command, ending in verdict.stages.items())
        if verdict.cpu_s > self.slowest[0]:
            self.slowest = (verdict.cpu_s, case.origin + " " + " ".join(case.notes))
        if not verdict.is_finding:
            label = verdict.status
        elif known is not None:
            label = f"known:{known.id}"
        else:
            label = verdict.status
            sig = signature(verdict)
            if sig not in self.new or len(case.main_text) < len(self.new[sig][0].main_text):
                self.new[sig] = (case, verdict)
        self.statuses[label] += 1
        return label

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        return f"{self.cases} cases, {len(self.distinct)} distinct ({parts}); {self.cpu_s:.1f} s CPU in the worker"

    def stage_summary(self) -> str:
        """How the commands after compile ended: 'analyze:ok 34, run:skipped (too large) 3, ...'."""
        return ", ".join(f"{k} {v}" for k, v in sorted(self.stages.items()))


def signature(v: Verdict) -> str:
    return f"{v.status}:{v.exc_type}:{v.where()}" if v.status in ("crash", "hang") else f"{v.status}:{v.message[:60]}"


def report(case: Case, verdict: Verdict) -> str:
    frames = "\n".join(f"  {f}:{line} in {fn}" for f, fn, line in verdict.frames[-8:])
    return (f"{verdict.status}: {verdict.exc_type} {verdict.message}\nat {verdict.where()}\n{frames}\n"
            f"origin: {case.origin} {' '.join(case.notes)}\n{case.describe()}")


def run_strategy(strategy: st.SearchStrategy[Case], examples: int, sandbox: Sandbox, *, fail_fast: bool,
                 derandomize: bool = True, seed: int | None = None, tally: Tally | None = None) -> Tally:
    """Draw ``examples`` cases and judge each; with ``fail_fast`` an unknown finding raises (and shrinks)."""
    tally = tally or Tally()

    @settings(max_examples=examples, derandomize=derandomize, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy)
    def prop(case: Case) -> None:
        verdict = sandbox.run(case)
        known = classify(verdict, case)
        tally.add(case, verdict, known)
        if fail_fast and verdict.is_finding and known is None:
            raise AssertionError(report(case, verdict))

    if seed is not None:
        from hypothesis import seed as with_seed

        prop = with_seed(seed)(prop)
    prop()
    return tally


def run_distinct(strategy: st.SearchStrategy[Case], distinct: int, sandbox: Sandbox, *, fail_fast: bool,
                 max_rounds: int = 8) -> Tally:
    """Run until ``distinct`` different inputs have been judged.

    The first round is derandomized; hypothesis repeats some inputs, so further rounds with
    the fixed seeds 1, 2, ... top the count up. Every round is deterministic.
    """
    tally = Tally()
    for round_no in range(max_rounds):
        missing = distinct - len(tally.distinct)
        if missing <= 0:
            break
        run_strategy(strategy, missing + missing // 4 + 5, sandbox, fail_fast=fail_fast, derandomize=round_no == 0,
                     seed=round_no or None, tally=tally)
    return tally
