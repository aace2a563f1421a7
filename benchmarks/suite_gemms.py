"""Every GEMM shape of the three benchmark models, irc's achieved GFLOP/s next to NumPy's sgemm on
the same M×N×K, in the same run.

Shapes come from the models' fused graphs (the graphs ``irc run`` executes): each ``gemm``,
``gemm_glu`` and ``gemm_multi`` (M = rows, K = features in, N = features out; a fused QKV is its
concatenated N) and each ``conv2d`` as the GEMM its im2col would make (M = B·OH·OW, N = out,
K = in/groups·kh·kw, per group). irc is timed through ``CompiledGraph.run`` on a one-op graph of that
shape, so its fixed costs (output allocation, argument checks, thread hand-offs) count, as they do
inside a model; NumPy (its BLAS, 2 threads) runs ``x @ w.T`` into a preallocated output. The ratio
is irc's share of the BLAS rate on the shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.timing import best_of

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # model file, bindings: every row of the forward-pass table (suite_models.py), B = 1 and B = 8
    "gpt2_small": ("models/gpt2_small.arch", {"B": 1, "T": 256}),
    "gpt2_small B=8": ("models/gpt2_small.arch", {"B": 8, "T": 256}),
    "gpt2_small B=8 T=1": ("models/gpt2_small.arch", {"B": 8, "T": 1}),
    "lstm_lm": ("models/lstm_lm.arch", {"B": 1, "T": 256}),
    "lstm_lm B=8": ("models/lstm_lm.arch", {"B": 8, "T": 256}),
    "resnet18": ("models/resnet18.arch", {"B": 1, "H": 224, "W": 224}),
    "resnet18 B=8": ("models/resnet18.arch", {"B": 8, "H": 224, "W": 224}),
}
QUICK = {"gpt2_small": {"layers": 2, "T": 64}, "gpt2_small B=8": {"layers": 2, "T": 64},
         "gpt2_small B=8 T=1": {"layers": 2}, "lstm_lm": {"T": 64}, "lstm_lm B=8": {"T": 64},
         "resnet18": {"H": 112, "W": 112}, "resnet18 B=8": {"H": 112, "W": 112}}


def shapes(quick: bool) -> list[dict]:
    """One entry per distinct (kind, M, N, K, groups, conv attrs) over the three fused graphs."""
    from irc.ops.common import pair
    from irc.pipeline import load_graph, run_passes

    seen: dict[tuple, dict] = {}
    for model, (path, binds) in MODELS.items():
        graph = run_passes(load_graph(ROOT / path, {**binds, **(QUICK[model] if quick else {})}), ["fuse"])
        types = graph.value_types()
        for node in graph.nodes:
            x = types[node.inputs[0]] if node.inputs else None
            if node.op in ("gemm", "gemm_glu", "gemm_multi"):
                m, k = x.numel() // x.shape[-1], x.shape[-1]
                n = sum(types[w].shape[0] for w in node.inputs[1:] if types[w].rank == 2)
                key = ("gemm", m, n, k)
                entry = {"kind": "gemm", "m": m, "n": n, "k": k}
            elif node.op == "conv2d":
                y, a = node.type, node.attrs
                kh, kw = pair(a["kernel"])
                groups = a["groups"]
                m, n, k = y.shape[0] * y.shape[2] * y.shape[3], y.shape[1], x.shape[1] // groups * kh * kw
                key = ("conv", x.shape, a["out"], a["kernel"], a["stride"], a["padding"], groups)
                entry = {"kind": "conv", "m": m, "n": n, "k": k, "groups": groups, "x": tuple(x.shape),
                         "attrs": {k_: a[k_] for k_ in ("out", "kernel", "stride", "padding", "groups")},
                         "y": tuple(y.shape)}
            else:
                continue
            if key in seen:
                seen[key]["count"] += 1
                continue
            seen[key] = {**entry, "model": model, "count": 1}
    return list(seen.values())


def label(s: dict) -> str:
    if s["kind"] == "gemm":
        return f"{s['model']} gemm {s['m']}×{s['n']}×{s['k']}"
    a = s["attrs"]
    return (f"{s['model']} conv {a['kernel']}×{a['kernel']}/{a['stride']} {s['x'][1]}→{a['out']} "
            f"@{s['x'][2]}² (GEMM {s['m']}×{s['n']}×{s['k']})")


def _ir(s: dict) -> str:
    if s["kind"] == "gemm":
        m, n, k = s["m"], s["n"], s["k"]
        return (f"graph @g() {{\n  %x = input : f32[{m},{k}]\n"
                f"  %w = param {{name=weight, shape=[{n}, {k}]}} : f32[{n},{k}] scope(\"fc\")\n"
                f"  %y = gemm %x, %w {{act=none}} : f32[{m},{n}]\n  output y = %y\n}}\n")
    a = s["attrs"]
    x, y = ",".join(map(str, s["x"])), ",".join(map(str, s["y"]))
    pad = a["padding"] if not isinstance(a["padding"], list) else f"[{a['padding'][0]}, {a['padding'][1]}]"
    return (f"graph @c() {{\n  %x = input : f32[{x}]\n  %y = conv2d %x {{out={a['out']}, kernel={a['kernel']}, "
            f"stride={a['stride']}, padding={pad}, dilation=1, groups={a['groups']}, bias=false}} : f32[{y}] "
            f"scope(\"conv\")\n  output y = %y\n}}\n")


def _row(s: dict, peer: str, seconds: float) -> dict:
    flops = 2 * s["m"] * s["n"] * s["k"] * s.get("groups", 1)
    return {"case": "gemms", "item": label(s), "peer": peer, "seconds": seconds, "value": flops / seconds / 1e9,
            "unit": "GFLOP/s", "note": f"{s['count']}× in the model"}


def peer_irc(quick: bool, repeats: int) -> list[dict]:
    from irc.backends.cpu import compile_graph
    from irc.ir_parser import parse_ir
    from irc.passes import PASSES
    from irc.runtime.weights import expected_weights

    rows = []
    rng = np.random.default_rng(0)
    for s in shapes(quick):
        graph = PASSES["shape-infer"](parse_ir(_ir(s)))
        compiled = compile_graph(graph)
        weights = {key: rng.standard_normal(shape, dtype=np.float32) * 0.05
                   for key, shape in expected_weights(graph).items()}
        x = rng.standard_normal(s["x"] if s["kind"] == "conv" else (s["m"], s["k"]), dtype=np.float32)
        rows.append(_row(s, "irc", best_of(lambda c=compiled, w=weights, x=x: c.run(w, {"x": x}), repeats,
                                           min_seconds=0.2)))
    return rows


def peer_numpy(quick: bool, repeats: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for s in shapes(quick):
        g = s.get("groups", 1)
        a = rng.standard_normal((s["m"], s["k"]), dtype=np.float32)
        b = rng.standard_normal((s["n"] // g, s["k"]), dtype=np.float32)
        out = np.empty((s["m"], s["n"] // g), np.float32)

        def run(a=a, b=b, out=out, g=g) -> None:
            for _ in range(g):  # a grouped conv is one GEMM per group
                np.matmul(a, b.T, out=out)
        rows.append(_row(s, "numpy", best_of(run, repeats, min_seconds=0.2)))
    return rows


PEERS = {"irc": peer_irc, "numpy": peer_numpy}
