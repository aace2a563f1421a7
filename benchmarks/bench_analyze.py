"""How long `irc analyze` takes on the 7B models (target: well under 1 s).

Three figures per model: the first in-process call (imports, grammar loading, build, shape
inference, analysis and the text report, all cold), the best of N warm in-process calls,
and the whole `irc analyze` process including interpreter start. Prints a table and writes
benchmarks/RESULTS-analyze.md. Run: python benchmarks/bench_analyze.py
"""

from __future__ import annotations

import contextlib
import io
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["models/seed/transformer_7b.arch", "models/seed/transformer_7b_gqa.arch", "models/seed/swiglu_7b.arch",
          "models/llama2_7b.arch", "models/resnet18.arch"]
REPEATS = 10


def _analyze_in_process(path: Path, json_out: bool) -> None:
    from irc.cli import main

    args = ["analyze", str(path), "--context", "8192"] + (["--json"] if json_out else [])
    with contextlib.redirect_stdout(io.StringIO()):
        if main(args) != 0:
            raise SystemExit(f"irc analyze {path} failed")


def cold_in_process(path: Path) -> float:
    """A fresh interpreter times its own first call, so imports count but interpreter start does not."""
    code = (
        "import sys, time; t0 = time.perf_counter(); sys.path.insert(0, sys.argv[2]);"
        "from bench_analyze import _analyze_in_process; from pathlib import Path;"
        "_analyze_in_process(Path(sys.argv[1]), False); print(time.perf_counter() - t0)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path), str(ROOT / "benchmarks")], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return float(out.strip().splitlines()[-1])


def warm_in_process(path: Path, json_out: bool) -> float:
    _analyze_in_process(path, json_out)
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        _analyze_in_process(path, json_out)
        best = min(best, time.perf_counter() - t0)
    return best


def whole_process(path: Path) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "irc.cli", "analyze", str(path), "--context", "8192", "-o", "/dev/null"],
                       check=True, cwd=ROOT)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    from irc.pipeline import load_graph

    rows = []
    for rel in MODELS:
        path = ROOT / rel
        if not path.exists():
            continue
        nodes = len(load_graph(path).nodes)
        rows.append((rel, nodes, cold_in_process(path), warm_in_process(path, False), warm_in_process(path, True),
                     whole_process(path)))
    header = ("| model | nodes | first call in-process (cold) | warm, table (best of 10) | warm, --json | "
              "`irc analyze` whole process (best of 3) |\n|---|---:|---:|---:|---:|---:|")
    lines = [header] + [
        f"| {r} | {n:,} | {c * 1000:.0f} ms | {t * 1000:.1f} ms | {j * 1000:.1f} ms | {p * 1000:.0f} ms |"
        for r, n, c, t, j, p in rows
    ]
    table = "\n".join(lines)
    print(table)
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    (ROOT / "benchmarks" / "RESULTS-analyze.md").write_text(
        f"# `irc analyze` time\n\nMachine: {machine}, {time.strftime('%Y-%m-%d')}. Every run at `--context 8192`. "
        "Target: the 7B models well under 1 s.\n\n" + table + "\n"
    )


if __name__ == "__main__":
    main()
