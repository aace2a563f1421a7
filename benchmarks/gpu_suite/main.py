"""The command line of benchmarks/gpu.py: which groups run, the budget, where results go."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from gpu_suite.cases_matmul import case_attention, case_attention_sweep, case_gemm, case_gemm_sweep
from gpu_suite.cases_rows import case_ceilings, case_launch, case_norms, case_small_ops, case_softmax
from gpu_suite.cases_zoo import case_zoo
from gpu_suite.device import ROOT, SIM
from gpu_suite.gpt2 import case_gpt2
from gpu_suite.harness import Report, guarded, log
from gpu_suite.report import environment, table, targets, write_report

DESCRIPTION = "The CUDA backend on a GPU: every kernel checked against torch, then timed against it."

CASES: dict[str, Callable[[Report, argparse.Namespace], None]] = {
    "ceiling": case_ceilings,
    "norm": case_norms,
    "attention": case_attention,
    "gemm": case_gemm,
    "gpt2": case_gpt2,
    "zoo": case_zoo,
    "softmax": case_softmax,
    "small": case_small_ops,
    "launch": case_launch,
    "attention-sweep": case_attention_sweep,
    "gemm-sweep": case_gemm_sweep,
}
SWEEPS = ("attention-sweep", "gemm-sweep")


def main() -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--only", help=f"comma-separated groups: {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help="no sweeps, no CPU-backend run, fewer repeats")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU-backend GPT-2 run")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes: a smoke test (with the simulator)")
    parser.add_argument("--reps", type=int, default=7, help="timed batches per case (median)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; later cases are skipped past it")
    parser.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "RESULTS-gpu.md"))
    args = parser.parse_args()
    if args.quick:
        args.reps = min(args.reps, 5)
    if SIM and not args.dry_run:
        print("gpu.py: numba's simulator is on (NUMBA_ENABLE_CUDASIM=1): use --dry-run for a smoke test",
              file=sys.stderr)
        return 2
    if not SIM and not torch.cuda.is_available():
        print("gpu.py: no CUDA GPU visible to torch; nothing to measure", file=sys.stderr)
        return 1
    if not SIM:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the comparison is FMA against FMA
        torch.backends.cudnn.allow_tf32 = False
    report = Report()
    report.env = environment()
    report.facts["budget"] = args.budget
    cache = tempfile.mkdtemp(prefix="irc-gpu-cache-")  # cold: compile times are first compiles
    os.chmod(cache, 0o700)
    report.facts["cache_dir"] = cache
    log(f"gpu.py: {report.env['card']}; cache {cache}")
    chosen = [c.strip() for c in args.only.split(",")] if args.only else list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        print(f"gpu.py: unknown group(s) {', '.join(unknown)} (known: {', '.join(CASES)})", file=sys.stderr)
        return 2
    for name in chosen:
        if args.quick and name in SWEEPS and not args.only:
            continue
        guarded(report, name, "(case setup)", lambda name=name: CASES[name](report, args))
    text = write_report(report, Path(args.output))
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "RESULTS-gpu.md").write_text(text)
        Path(out_dir, "gpu.json").write_text(json.dumps({"env": report.env, "facts": report.facts,
                                                          "rows": [asdict(r) for r in report.rows],
                                                          "compile_s": report.compile_s,
                                                          "resources": report.resources}, indent=1, default=str))
    print("\n" + "\n".join(["## Targets"] + targets(report) + [""] + table(report.rows)))
    failed = [r for r in report.rows if r.status == "FAIL"]
    print(f"\n{len(report.rows)} rows, {len(failed)} FAIL; report written to {args.output}"
          + (" and $OUT" if out_dir else ""))
    return 1 if failed else 0
