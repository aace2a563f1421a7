"""A max pool fused into conv2d_bn (the fold-bn pass's fuse_conv_pool_rule) against PyTorch in float64:
F.conv2d, F.batch_norm in eval mode, the residual add, the ReLU, then F.max_pool2d, on the same weights.

The table kernel's pooled epilogue (ResNet's stem: few input channels) across its boundaries: square,
rectangular, overlapping and disjoint pools, stride 1, padding, a residual, no activation, batches that do
and do not divide among the threads, NaN in the input; and the convolutions whose kernels run the pool on a
temporary (Winograd, the direct product, the tap sum of a 1×1 of stride 1, the gathered product of a strided
1×1, groups).
The rule itself: what it fuses and what it leaves.
The kernel called directly with 1 to 7 threads and 1 to 4 pool rows a step, on work buffers that start as NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import cpu_cache

from irc.analysis.flops import node_cost
from irc.analysis.receptive import receptive_fields
from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import conv_table
from irc.backends.numpy_ref import run_graph
from irc.pipeline import run_passes
from irc.runtime.graphs import graph_from_source

_ = cpu_cache

# name -> (input [C, H, W], conv arguments, maxpool arguments, residual, relu, the kernel that serves it)
CASES = {
    "stem": ((3, 45, 41), dict(out=16, kernel=7, stride=2, padding=3), dict(kernel=3, stride=2, padding=1),
             False, True, "k_conv_table_pool_relu"),
    "pool2": ((3, 30, 34), dict(out=7, kernel=5, stride=1, padding=2), dict(kernel=2, stride=2, padding=0),
              False, True, "k_conv_table_pool_relu"),
    "stride1": ((2, 25, 27), dict(out=9, kernel=5, stride=1, padding=2), dict(kernel=3, stride=1, padding=1),
                False, False, "k_conv_table_pool_none"),
    "rect": ((3, 33, 40), dict(out=12, kernel=[3, 5], stride=[1, 2], padding=[1, 2]),
             dict(kernel=[3, 2], stride=[2, 1], padding=[1, 0]), False, True, "k_conv_table_pool_relu"),
    "residual": ((3, 41, 39), dict(out=6, kernel=3, stride=2, padding=1), dict(kernel=3, stride=2, padding=1),
                 True, True, "k_conv_table_pool_relu"),
    "winograd": ((16, 20, 18), dict(out=8, kernel=3, stride=1, padding=1), dict(kernel=3, stride=2, padding=1),
                 False, True, "k_winograd_relu"),
    "direct": ((16, 40, 38), dict(out=10, kernel=3, stride=2, padding=1), dict(kernel=2, stride=2, padding=0),
               True, True, "k_conv_direct_relu"),
    # a 1×1 of stride 1 on 16 channels still takes the tap sum (its GEMM writes the output, the residual after)
    "taps": ((16, 20, 18), dict(out=10, kernel=1, stride=1, padding=0), dict(kernel=2, stride=2, padding=0),
             True, True, "k_conv_taps_relu"),
    "one_by_one": ((8, 24, 24), dict(out=6, kernel=1, stride=2, padding=0), dict(kernel=3, stride=2, padding=1),
                   True, True, "k_conv_pointwise_relu"),
    "grouped": ((4, 13, 15), dict(out=6, kernel=3, stride=1, padding=1, groups=2),
                dict(kernel=3, stride=2, padding=1), False, True, "k_conv2d"),
}


def _arg(v) -> str:
    return str(list(v)) if isinstance(v, list) else str(v)


def _source(c: tuple[int, ...], conv: dict, pool: dict, residual: bool, relu: bool) -> str:
    args = ", ".join(f"{k}={_arg(v)}" for k, v in conv.items() if k not in ("out", "kernel"))
    pargs = ", ".join(f"{k}={_arg(v)}" for k, v in pool.items() if k != "kernel")
    y = "bn + r" if residual else "bn"
    y = f"relu({y})" if relu else y
    return f"""
model m(B, RH, RW) {{
  input x: f32[B, {c[0]}, {c[1]}, {c[2]}]
  input r: f32[B, {conv['out']}, RH, RW]
  conv = conv2d(x, {conv['out']}, {_arg(conv['kernel'])}, {args}, bias=false)
  bn = batchnorm(conv, eps=1e-3)
  output out = maxpool2d({y}, {_arg(pool['kernel'])}, {pargs})
}}
"""


def _pair(v) -> tuple[int, int]:
    return tuple(v) if isinstance(v, list) else (v, v)


def _conv_out(c: tuple[int, ...], conv: dict) -> tuple[int, int]:
    k, s, p = _pair(conv["kernel"]), _pair(conv["stride"]), _pair(conv["padding"])
    return tuple((c[1 + i] + 2 * p[i] - k[i]) // s[i] + 1 for i in range(2))


def _weights(rng, c: tuple[int, ...], conv: dict) -> dict[str, np.ndarray]:
    co, groups = conv["out"], conv.get("groups", 1)
    k = _pair(conv["kernel"])
    return {"conv.weight": (rng.standard_normal((co, c[0] // groups, *k)) * 0.3).astype(np.float32),
            "bn.gain": rng.uniform(0.5, 1.5, co).astype(np.float32),
            "bn.bias": rng.standard_normal(co).astype(np.float32),
            "bn.running_mean": rng.standard_normal(co).astype(np.float32),
            "bn.running_var": rng.uniform(0.5, 1.5, co).astype(np.float32)}


def _torch(w, x, r, conv: dict, pool: dict, residual: bool, relu: bool) -> np.ndarray:
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    y = F.conv2d(torch.from_numpy(x).double(), t["conv.weight"], stride=_pair(conv["stride"]),
                 padding=_pair(conv["padding"]), groups=conv.get("groups", 1))
    y = F.batch_norm(y, t["bn.running_mean"], t["bn.running_var"], t["bn.gain"], t["bn.bias"], training=False,
                     eps=1e-3)
    y = y + torch.from_numpy(r).double() if residual else y
    y = torch.relu(y) if relu else y
    return F.max_pool2d(y, _pair(pool["kernel"]), _pair(pool["stride"]), _pair(pool["padding"])).numpy()


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pooled_conv2d_bn_matches_torch(name, b, cpu_cache):
    c, conv, pool, residual, relu, kernel = CASES[name]
    rh, rw = _conv_out(c, conv)
    graph = run_passes(graph_from_source(_source(c, conv, pool, residual, relu), {"B": b, "RH": rh, "RW": rw}),
                       ["fuse", "fold-bn"])
    fused = [n for n in graph.nodes if n.op not in ("input", "param")]
    assert [n.op for n in fused] == ["conv2d_bn"] and fused[0].attrs["pool"] == pool["kernel"]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((b, *c)).astype(np.float32)
    r = rng.standard_normal((b, conv["out"], rh, rw)).astype(np.float32)
    w = _weights(rng, c, conv)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert kernel in dir(compiled.module)
    got = compiled.run(w, {"x": x, "r": r})["out"]
    want = _torch(w, x, r, conv, pool, residual, relu)
    assert got.shape == want.shape
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    ref = run_graph(graph, w, {"x": x, "r": r}, np.float64)["out"]  # the NumPy reference of the fused op
    assert np.abs(ref - want).max() / np.abs(want).max() < 1e-6


def test_a_nan_in_the_input_wins_its_windows(cpu_cache):
    """NaN propagates through the convolution to every pool window it reaches, as torch's max pool keeps it."""
    c, conv, pool, residual, relu, _ = CASES["stem"]
    rh, rw = _conv_out(c, conv)
    graph = run_passes(graph_from_source(_source(c, conv, pool, residual, relu), {"B": 2, "RH": rh, "RW": rw}),
                       ["fuse", "fold-bn"])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, *c)).astype(np.float32)
    x[1, 2, 20, 17] = np.nan
    r = np.zeros((2, conv["out"], rh, rw), np.float32)
    w = _weights(rng, c, conv)
    got = compile_graph(graph, cache_dir=cpu_cache).run(w, {"x": x, "r": r})["out"]
    want = _torch(w, x, r, conv, pool, residual, relu)
    assert np.isnan(want).any() and np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.abs(got[ok] - want[ok]).max() / np.abs(want[ok]).max() < 1e-5


@pytest.mark.parametrize("b", [1, 3])
def test_every_thread_count_and_step_gives_the_same_pool(b, cpu_cache):
    """The pooled kernel called directly: 1 to 7 threads (bands of pool rows when the images do not divide
    among them, more threads than rows too), 1 to 4 pool rows a step, on work buffers that start as NaN."""
    c, conv, pool, residual, relu, _ = CASES["stem"]
    rh, rw = _conv_out(c, conv)
    graph = run_passes(graph_from_source(_source(c, conv, pool, False, True), {"B": b, "RH": rh, "RW": rw}),
                       ["fuse", "fold-bn"])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((b, *c)).astype(np.float32)
    w = _weights(rng, c, conv)
    want = _torch(w, x, x[:0], conv, pool, False, True)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    co, kk = conv["out"], c[0] * 49
    s = w["bn.gain"].astype(np.float64) / np.sqrt(w["bn.running_var"].astype(np.float64) + 1e-3)
    folded = (w["conv.weight"].reshape(co, kk) * s[:, None]).astype(np.float32)
    bias = (w["bn.bias"] - w["bn.running_mean"] * s).astype(np.float32)
    ap = module.gemm_pack6(folded, co, kk)
    strips = (co + 5) // 6
    wq = rw + 3
    for parts in range(1, 8):
        for pg in range(1, 5):
            pb = ((3 + (pg - 1) * 2) * wq + 63) // 64 * 64
            per = strips * 6 * pb + co * (3 + (pg - 1) * 2) * rw + 2 * want.shape[3] + 1
            out = np.full(want.shape, np.nan, np.float32)
            work = np.full(b * 4 * c[0] * (rh + 4) * wq + conv_table.SLACK + parts * per, np.nan, np.float32)
            module.k_conv_table_pool_relu(x, ap.reshape(strips * 6, kk), bias, out.reshape(b, co, -1), out, work,
                                          ap, 2, 2, 3, 3, 1, 1, 7, 7, 0, rh, rw, 3, 3, 2, 2, 1, 1, pg, pb, parts)
            assert np.abs(out - want).max() / np.abs(want).max() < 1e-5, (parts, pg)


RULE = """
model m(B) {
  input x: f32[B, 3, 32, 32]
  a = relu(batchnorm(conv2d(x, 8, 3, padding=1, bias=false)))
  output pooled = maxpool2d(a, 3, stride=2, padding=1)
  b = batchnorm(conv2d(x, 8, 3, padding=1, bias=false))
  output shared_2 = maxpool2d(b, 2)
  output shared_3 = maxpool2d(b, 3, stride=2, padding=1)
  c = batchnorm(conv2d(x, 8, 3, padding=1, bias=false))
  output dilated = maxpool2d(c, 3, stride=2, padding=1, dilation=2)
  d = batchnorm(conv2d(x, 8, 3, padding=1, bias=false))
  output after = relu(maxpool2d(d, 2))
}
"""


def test_the_rule_fuses_a_pool_only_where_it_is_the_convolutions_one_reader():
    """Fused: relu(conv_bn) → maxpool. Left: a conv_bn two pools read, a dilated pool, and a ReLU after the pool
    (it is not absorbed into the fused op: the pool would then run before it)."""
    graph = run_passes(graph_from_source(RULE, {"B": 1}), ["fuse", "fold-bn"])
    ops = {n.outputs[0]: n for n in graph.nodes}
    pooled = [n for n in graph.nodes if n.op == "conv2d_bn" and n.attrs["pool"] is not None]
    assert len(pooled) == 2  # pooled, and d's 2×2 pool under the ReLU
    assert {n.attrs["act"] for n in pooled} == {"relu", "none"}
    assert sum(n.op == "maxpool2d" for n in graph.nodes) == 3  # shared's two, dilated's
    assert ops["after"].op == "relu"


def test_receptive_field_and_cost_are_the_unfused_chains():
    """ResNet's stem: conv 7×7/2 then max pool 3×3/2 sees 7 + (3 − 1)·2 = 11 pixels, 4 apart, fused or not;
    the pool's compares (9 per output) are counted either way."""
    src = """
model m(B) {
  input x: f32[B, 3, 224, 224]
  output y = maxpool2d(relu(batchnorm(conv2d(x, 64, 7, stride=2, padding=3, bias=false))), 3, stride=2, padding=1)
}
"""
    graph = graph_from_source(src, {"B": 1})
    fused = run_passes(graph, ["fuse", "fold-bn"])
    assert any(n.op == "conv2d_bn" and n.attrs["pool"] == 3 for n in fused.nodes)
    for g in (graph, fused):
        out = [n for n in g.nodes if n.op not in ("input", "param")][-1].outputs[0]
        assert receptive_fields(g)[out] == ((11, 11), (4, 4))
    costs = []
    for g in (graph, fused):
        types = g.value_types()
        total: dict[str, int] = {"macs": 0}
        for n in g.nodes:
            c = node_cost(n, [types[v] for v in n.inputs])
            total["macs"] += c.macs
            for kind, f in c.flops.items():
                total[kind] = total.get(kind, 0) + f
        costs.append(total)
    assert costs[0]["macs"] == costs[1]["macs"] == 112 * 112 * 64 * 147
    assert costs[0]["pool"] == costs[1]["pool"] == 56 * 56 * 64 * 9
