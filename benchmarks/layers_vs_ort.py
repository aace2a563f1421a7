"""Where a model's time goes, kernel by kernel in irc and node by node in ONNX Runtime, in one process.

    python -m benchmarks.layers_vs_ort resnet18 [--rounds 3] [--runs 20]

The whole-pass ratio in RESULTS.md says whether irc is behind; this says where. irc: every ``k_*``
kernel of the generated module is wrapped to time each call site of a real ``CompiledGraph.run``
(the driver's own lines are the rest). ONNX Runtime: its profiler's per-node kernel times on the
torch mirror exported by ``torch.onnx.export``, as the benchmark's peer runs it (ORT_ENABLE_ALL,
2 intra-op threads). The two are measured in alternating rounds so that a host whose speed drifts
shows in both; medians of the fastest round are printed. ORT fuses differently (Conv+Relu, NCHWc
reorders), so the two lists line up by position only where the graphs agree (ResNet's convolutions do).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.suite_models import IRC_PASSES, MODELS, _setup, export_onnx, ort_session


def irc_profile(model: str, runs: int):
    """A function that runs ``runs`` passes and returns [(call site, kernel, median ms)] and the pass's median."""
    from irc.backends.cpu import compile_graph
    from irc.pipeline import run_passes

    graph, weights, inputs = _setup(model, False)
    compiled = compile_graph(run_passes(graph, IRC_PASSES))
    module = compiled.module
    times: dict[int, list[float]] = {}
    names: dict[int, str] = {}
    site = [0]

    def wrap(name: str, kernel):
        def timed(*args, **kwargs):
            i = site[0]
            site[0] += 1
            start = time.perf_counter()
            result = kernel(*args, **kwargs)
            times.setdefault(i, []).append(time.perf_counter() - start)
            names[i] = name
            return result
        return timed

    for name in [n for n in vars(module) if n.startswith("k_")]:
        setattr(module, name, wrap(name, getattr(module, name)))
    for _ in range(3):
        site[0] = 0
        compiled.run(weights, inputs)

    def measure():
        times.clear()
        whole = []
        for _ in range(runs):
            site[0] = 0
            start = time.perf_counter()
            compiled.run(weights, inputs)
            whole.append(time.perf_counter() - start)
        rows = [(i, names[i], float(np.median(t)) * 1e3) for i, t in sorted(times.items())]
        return rows, float(np.median(whole)) * 1e3
    return measure


def ort_profile(model: str, runs: int, folder: Path):
    """A function that runs ``runs`` profiled ORT passes and returns [(node, median ms)] and their sum."""
    path = folder / "model.onnx"
    feed = export_onnx(model, False, path)

    def measure():
        session = ort_session(path, str(folder / "ort"))  # the profile under folder, never the working directory
        for _ in range(3):
            session.run(None, feed)
        for _ in range(runs):
            session.run(None, feed)
        profile = Path(session.end_profiling())
        per: dict[str, list[float]] = {}
        for event in json.loads(profile.read_text()):
            name = event.get("name", "")
            if event.get("cat") == "Node" and name.endswith("_kernel_time"):
                per.setdefault(name[: -len("_kernel_time")], []).append(event["dur"] / 1e3)
        profile.unlink()
        rows = [(name, float(np.median(t[-runs:]))) for name, t in per.items()]  # the timed runs, not warm-up
        return rows, sum(ms for _, ms in rows)
    return measure


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.layers_vs_ort", description=__doc__.split("\n")[0])
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each peer (default 3)")
    p.add_argument("--runs", type=int, default=20, help="passes a round (default 20)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        irc, ort_ = irc_profile(args.model, args.runs), ort_profile(args.model, args.runs, Path(tmp))
        best_irc = best_ort = None
        for _ in range(max(1, args.rounds)):
            a, b = irc(), ort_()
            best_irc = a if best_irc is None or a[1] < best_irc[1] else best_irc
            best_ort = b if best_ort is None or b[1] < best_ort[1] else best_ort
    (irc_rows, irc_whole), (ort_rows, ort_sum) = best_irc, best_ort
    print(f"{args.model}: irc {irc_whole:.3f} ms a pass (kernels {sum(r[2] for r in irc_rows):.3f}); "
          f"ONNX Runtime nodes {ort_sum:.3f} ms")
    print(f"{'#':>3}  {'irc kernel':24s} {'ms':>8}    {'ORT node':40s} {'ms':>8}")
    for i in range(max(len(irc_rows), len(ort_rows))):
        left = f"{irc_rows[i][0]:3d}  {irc_rows[i][1]:24s} {irc_rows[i][2]:8.3f}" if i < len(irc_rows) else " " * 38
        right = f"{ort_rows[i][0][:40]:40s} {ort_rows[i][1]:8.3f}" if i < len(ort_rows) else ""
        print(f"{left}    {right}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
