"""The long fuzz run: the CI fuzz suite's strategies, at any number of cases, with findings recorded.

    IRC_FUZZ_EXAMPLES=100000 nice python benchmarks/fuzz_long.py [--seed N] [--json out.json]

Each case is compiled (build, shape inference, IR round trip, ``--passes fuse``) and, when
it compiles, carried through ``irc analyze`` (text, JSON, ``--context``), ``irc lint`` and
``irc run`` on the NumPy reference (small concrete graphs only), as tests/fuzz/commands.py
describes; the "commands" lines count how each of those ended.

Cases are split over the strategies in the proportions the CI suite uses, and run in
chunks of IRC_FUZZ_CHUNK (default 2,000) with a fresh random seed each, so progress is
printed as it goes and hypothesis's bookkeeping stays small. Unlike the CI test, a finding
does not stop the run: each kind is counted, and the shortest input of each new kind
(one no entry of tests/fuzz/known.py matches) is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz.runner import Tally, report, run_strategy  # noqa: E402
from fuzz.sandbox import Sandbox  # noqa: E402
from fuzz.strategies import STRATEGIES  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("IRC_FUZZ_SEED", "1")))
    ap.add_argument("--json", help="write the tallies and the new findings here")
    ap.add_argument("--only", help="comma-separated strategy names (default: all)")
    args = ap.parse_args()
    total = int(os.environ.get("IRC_FUZZ_EXAMPLES", "10000"))
    chunk = int(os.environ.get("IRC_FUZZ_CHUNK", "2000"))
    names = args.only.split(",") if args.only else list(STRATEGIES)
    weight = sum(STRATEGIES[n].cases for n in names)
    quota = {n: round(total * STRATEGIES[n].cases / weight) for n in names}
    rng = random.Random(args.seed)
    tallies = {n: Tally() for n in names}
    start = time.monotonic()
    with Sandbox() as sandbox:
        while any(tallies[n].cases < quota[n] for n in names):
            for n in names:
                left = quota[n] - tallies[n].cases
                if left <= 0:
                    continue
                run_strategy(STRATEGIES[n].factory(), min(chunk, left), sandbox, fail_fast=False, derandomize=False,
                             seed=rng.randrange(2**32), tally=tallies[n])
                done = sum(t.cases for t in tallies.values())
                print(f"[{time.monotonic() - start:6.0f} s] {done:,} cases ({n}: {tallies[n].summary()}); "
                      f"worker restarts {sandbox.restarts}", flush=True)
    elapsed = time.monotonic() - start
    cases = sum(t.cases for t in tallies.values())
    distinct = len(set().union(*(t.distinct for t in tallies.values())))
    print(f"\n{cases:,} cases ({distinct:,} distinct inputs) in {elapsed:.0f} s ({cases / elapsed:.0f}/s), "
          f"seed {args.seed}")
    for n in names:
        print(f"  {n:10s} {tallies[n].summary()}; slowest {tallies[n].slowest[0]:.2f} s")
        print(f"  {'':10s} commands: {tallies[n].stage_summary()}")
    statuses: dict[str, int] = {}
    stages: dict[str, int] = {}
    for t in tallies.values():
        for k, v in t.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in t.stages.items():
            stages[k] = stages.get(k, 0) + v
    print("outcomes:", ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items())))
    print("commands:", ", ".join(f"{k} {v:,}" for k, v in sorted(stages.items())))
    new = {sig: ex for t in tallies.values() for sig, ex in t.new.items()}
    print(f"new kinds of finding: {len(new)}")
    for sig, (case, verdict) in sorted(new.items()):
        print("=" * 100 + f"\n{sig}\n{report(case, verdict)[:3000]}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cases": cases, "distinct": distinct, "seconds": round(elapsed, 1), "seed": args.seed, "outcomes": statuses,
            "commands": stages, "per_strategy": {n: dict(t.statuses) for n, t in tallies.items()},
            "commands_per_strategy": {n: dict(t.stages) for n, t in tallies.items()},
            "new": {sig: report(case, verdict)[:3000] for sig, (case, verdict) in sorted(new.items())},
        }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 1 if new else 0


if __name__ == "__main__":
    raise SystemExit(main())
