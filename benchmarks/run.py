"""irc's benchmark suite, one command: ``python -m benchmarks`` (or ``python benchmarks/run.py``).

Runs every peer of every case in a process of its own (Numba's and PyTorch's thread pools
slow each other in one), all in this one run, so the ratios compare measurements taken side
by side; prints the tables and writes benchmarks/RESULTS.md with the machine's description.

Cases: norms (LayerNorm, RMSNorm, add+LayerNorm at 65,536×1,024 fp32: GB/s vs a streaming
copy, PyTorch and NumPy; fused add+norm vs the unfused pair), attention (8 heads, d 64,
T 1,024 and 4,096, causal and not: GFLOP/s vs sgemm, PyTorch SDPA and NumPy; peak memory),
gemms (every GEMM shape of the three models, irc vs NumPy's
2-thread sgemm), models (GPT-2 small, the LSTM LM, ResNet-18 forward passes at B = 1 and 8, and GPT-2 at
B = 8, T = 1, vs PyTorch eager and ONNX Runtime on the same weights and threads; and the LSTM's time a step against
reading W_hh once),
compile (cold and cached) and decode (irc generate's KV-cache decoding on the CPU backend and
the numpy reference vs Hugging Face generate, GPT-2 small and a 2-layer Llama at B = 1 and 8:
benchmarks/suite_decode.py). Times are the best of several calls.

The peers of the norms, attention, GEMM and model cases run in rounds (``--rounds``, 3 by default), every peer
once a round, the order reversed every other round, and each figure is a peer's fastest round: on a host whose
speed drifts (a VM whose neighbours come and go: the same ResNet-18 pass took 9.1 and 11.4 ms minutes apart) a
single pass per peer, one after the other, put a drift into the ratios; side by side in rounds it shows in every
peer alike.

The peers run without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (machine.PEER_ENV_DROPPED says why); RESULTS.md
lists what was removed.

Options: --quick (smaller sizes, for a smoke test), --only CASE[,CASE], --repeats N, --rounds N,
--no-write (print only), --out FILE (instead of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # python benchmarks/run.py
    sys.path.insert(0, str(ROOT))

from benchmarks import report, suite_decode  # noqa: E402
from benchmarks.machine import describe, load_average, peer_env  # noqa: E402

CASES = ("norms", "attention", "gemms", "models", "compile", "decode")
MODEL_PEERS = ("irc", "torch", "ort")
PEER_TIMEOUT_S = 600
def fastest(rows: list[dict]) -> list[dict]:
    """One row per (case, item, peer): the one with the fewest seconds (a peer's best round), in the order
    the rows first came."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["case"], r["item"], r["peer"])
        if key not in best or r["seconds"] < best[key]["seconds"]:
            best[key] = r
    return list(best.values())


def _peer(work: Path, case: str, peer: str, *extra: str) -> list[dict]:
    """Run one peer in a fresh process; its rows, or none (and a note) when it failed."""
    out = work / f"{case}-{peer}-{len(list(work.iterdir()))}.json"
    cmd = [sys.executable, "-m", "benchmarks.peer", str(out), case, peer, *extra]
    start = time.perf_counter()
    print(f"  {case}: {peer} {' '.join(extra)}".rstrip(), end="", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=peer_env())
    except subprocess.TimeoutExpired:
        print(f"  timed out after {PEER_TIMEOUT_S} s")
        return []
    print(f"  ({time.perf_counter() - start:.0f} s)")
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print("    failed: " + " / ".join(tail))
        return []
    return json.loads(out.read_text())


def _agreement(work: Path) -> dict[str, dict[str, float]]:
    """Per model, max |irc − peer| / max |peer| for each peer whose logits were saved."""
    import numpy as np

    from benchmarks.suite_models import MODELS, file_stem

    out: dict[str, dict[str, float]] = {}
    for model in MODELS:
        mine = work / f"{file_stem(model)}-irc.npy"
        for peer in MODEL_PEERS[1:]:
            theirs = work / f"{file_stem(model)}-{peer}.npy"
            if mine.exists() and theirs.exists():
                x, y = np.load(mine).astype(np.float64), np.load(theirs).astype(np.float64)
                err = float(np.abs(x - y).max() / np.abs(y).max()) if x.shape == y.shape else float("inf")
                out.setdefault(model, {})[peer] = err
    return out


def _in_rounds(rounds: int, peers: tuple[str, ...]) -> list[tuple[int, str]]:
    """(round, peer) in the order they run: every peer once a round, reversed every other round."""
    return [(r, p) for r in range(rounds) for p in (peers if r % 2 == 0 else peers[::-1])]


def run(cases: list[str], quick: bool, repeats: int, rounds: int = 1) -> tuple[list[dict], dict[str, dict[str, float]]]:
    rows: list[dict] = []
    common = ["--repeats", str(repeats)] + (["--quick"] if quick else [])
    with tempfile.TemporaryDirectory(prefix="irc-bench-") as tmp:
        work = Path(tmp)
        if "norms" in cases:
            for _, peer in _in_rounds(rounds, ("copy", "irc", "torch", "numpy")):
                rows += _peer(work, "norms", peer, *common)
        if "attention" in cases:
            for _, peer in _in_rounds(rounds, ("sgemm", "irc", "torch", "numpy")):
                rows += _peer(work, "attention", peer, *common)
        if "gemms" in cases:
            for _, peer in _in_rounds(rounds, ("numpy", "irc")):
                rows += _peer(work, "gemms", peer, *common)
        if "models" in cases:
            from benchmarks.suite_models import MODELS

            for r in range(rounds):
                for model in MODELS:
                    for peer in MODEL_PEERS if r % 2 == 0 else MODEL_PEERS[::-1]:
                        rows += _peer(work, "models", peer, *common, "--model", model, "--out-dir", str(work))
        if "compile" in cases:
            for model in ("gpt2_small", "lstm_lm", "resnet18"):
                cache = work / f"cache-{model}"
                cache.mkdir(mode=0o700)
                for label in ("cold", "cached"):
                    rows += _peer(work, "compile", label, *common, "--model", model, "--cache-dir", str(cache))
        if "decode" in cases:  # its peers are spawned by the suite itself (each in its own process too)
            rows += suite_decode.run_case(work, quick, max(1, min(repeats, 3)))
        agreement = _agreement(work)
    return fastest(rows), agreement


def render(rows: list[dict], agreement: dict[str, dict[str, float]], machine: dict[str, str], loads: tuple[str, str],
           command: str, seconds: float, cases: tuple[str, ...] = CASES) -> str:
    parts, targets = [], []
    sections = [("norms", "Norms", lambda: report.norms(rows)),
                ("attention", "Attention", lambda: report.attention(rows)),
                ("gemms", "GEMMs of the models (M×N×K), irc vs NumPy's sgemm on the same shape",
                 lambda: report.gemms(rows)),
                ("models", "Forward passes", lambda: report.models(rows, agreement)),
                ("compile", "Compile time (fuse + generate + compile, in a fresh process)",
                 lambda: report.compile_times(rows)),
                ("decode", "Decoding with a KV cache (irc generate vs Hugging Face generate), tokens/s",
                 lambda: suite_decode.render([r for r in rows if r["case"] == "decode"]))]
    for case, title, make in sections:
        if case not in cases:  # a case not run has no table
            continue
        text, t = make()
        parts.append(f"## {title}\n\n{text}\n")
        targets += t
    head = ["# irc benchmarks", "",
            f"`{command}` — every peer in its own process, all in this one run ({seconds / 60:.1f} min). "
            "Times are the best of several calls after a warm-up; the peers of the norms, attention, GEMM and "
            "model cases run in rounds, each figure its peer's fastest round.", "",
            "## Machine", "", report.table(["", ""], [[k, v] for k, v in machine.items()]), "",
            f"Load average (1, 5, 15 min) before the run: {loads[0]}; after: {loads[1]} "
            "(other programs share these cores; ratios are measured side by side).", "",
            "## Targets (issues 5, 16 and 20)", "", report.targets_table(targets), ""]
    return "\n".join(head + parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the suite")
    p.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases ({', '.join(CASES)})")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the norms, attention, gemms and models peers "
                   "(each figure its peer's best)")
    p.add_argument("--no-write", action="store_true", help="print the tables, leave RESULTS.md alone")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md", help="where the tables go")
    a = p.parse_args(argv)
    cases = [c.strip() for c in a.only.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    command = "python -m benchmarks" + (" --quick" if a.quick else "") + (f" --only {a.only}" if a.only != ",".join(
        CASES) else "") + (f" --rounds {a.rounds}" if a.rounds != 3 else "")
    before = load_average()
    start = time.perf_counter()
    print(f"irc benchmarks ({', '.join(cases)}); load average {before}")
    rows, agreement = run(cases, a.quick, a.repeats, a.rounds)
    seconds = time.perf_counter() - start
    text = render(rows, agreement, describe(), (before, load_average()), command, seconds, tuple(cases))
    print("\n" + text)
    if not a.no_write:
        a.out.write_text(text)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
