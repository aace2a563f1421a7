"""How long `irc compile` takes on the largest shipped models.

Prints a table (in-process: build + shape inference + IR printing, best of N; and the
whole `irc compile` process including interpreter start) and writes
benchmarks/RESULTS-compile.md. Run: python benchmarks/bench_compile.py
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["models/llama2_7b.arch", "models/mistral_7b.arch", "models/gpt2_small.arch", "models/t5_small.arch",
          "models/resnet18.arch"]


def in_process(path: Path, repeats: int = 5) -> tuple[float, int]:
    from irc.pipeline import load_graph
    from irc.printer import print_graph

    best = float("inf")
    nodes = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        graph = load_graph(path)
        print_graph(graph)
        best = min(best, time.perf_counter() - t0)
        nodes = len(graph.nodes)
    return best, nodes


def whole_process(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "irc.cli", "compile", str(path), "-o", "/dev/null"], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    rows = []
    for rel in MODELS:
        path = ROOT / rel
        if not path.exists():
            continue
        t_in, nodes = in_process(path)
        t_proc = whole_process(path)
        rows.append((rel, nodes, t_in, t_proc))
    header = "| model | nodes | compile in-process (best of 5) | `irc compile` whole process |\n|---|---:|---:|---:|"
    lines = [header] + [f"| {r} | {n:,} | {a * 1000:.0f} ms | {b * 1000:.0f} ms |" for r, n, a, b in rows]
    table = "\n".join(lines)
    print(table)
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    (ROOT / "benchmarks" / "RESULTS-compile.md").write_text(
        f"# Compile time\n\nMachine: {machine}, {time.strftime('%Y-%m-%d')}. Target: the 7B models in under 1 s.\n\n"
        + table + "\n"
    )


if __name__ == "__main__":
    main()
