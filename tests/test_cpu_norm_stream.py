"""The norms' streaming-store kernels (stream_stores.py), which outputs of STREAM_BYTES or more take, against
NumPy in float64: LayerNorm, RMSNorm and the fused add + norms, rows of 77 floats (so each row has plain
stores before its first 64-byte line, whole lines by streaming stores, and plain ones after), outputs
misaligned by one float (the add + norms' sums as the norm, so streamed too, or not), 1 to 4 threads, and in
place."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, cpu_cache

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import stream_stores
from irc.pipeline import run_passes
from irc.runtime.graphs import graph_from_source

_ = cpu_cache
N, D, EPS = 13, 77, 1e-5
GRAPH = """
model norms(N, D) {
  input x: f32[N, D]
  input r: f32[N, D]
  output ln = layernorm(x)
  output rms = rmsnorm(x)
  s = x + r
  output s_out = s
  output sln = layernorm(s)
  t = x + r
  output t_out = t
  output trms = rmsnorm(t)
}
"""


def _layernorm(v: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    mean = v.mean(-1, keepdims=True)
    return (v - mean) / np.sqrt(v.var(-1, keepdims=True) + EPS) * g + b


def _rmsnorm(v: np.ndarray, g: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * g


def _module(cache):
    graph = run_passes(graph_from_source(GRAPH, {"N": N, "D": D}), ["fuse"])
    return compile_graph(graph, cache_dir=cache)


def _data():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((N, D)) * 3 + 5).astype(np.float32)
    r = rng.standard_normal((N, D)).astype(np.float32)
    g = rng.standard_normal(D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    return x, r, g, b


def _misaligned(by: int = 1) -> np.ndarray:
    """A [N, D] float32 array starting ``by`` floats past a 64-byte boundary, filled with NaN."""
    raw = np.full(N * D + 32, np.nan, np.float32)
    skip = (-raw.ctypes.data // 4) % 16 + by
    return raw[skip:skip + N * D].reshape(N, D)


def test_streaming_kernels_match_numpy_on_every_split(cpu_cache, monkeypatch):
    monkeypatch.setattr(stream_stores, "STREAM_BYTES", 0)
    module = _module(cpu_cache).module
    x, r, g, b = _data()
    for parts, by in zip(range(1, 5), (1, 3, 1, 0)):  # the sum aligned as the norm (streamed too), or not
        out = _misaligned()
        module.k_layernorm_stream(x, g, b, out, np.float32(EPS), parts)
        assert_matches({"ln": out}, {"ln": _layernorm(x, g, b)})
        module.k_rmsnorm_stream(x, g, out, np.float32(EPS), parts)
        assert_matches({"rms": out}, {"rms": _rmsnorm(x, g)})
        total = _misaligned(by)
        module.k_add_layernorm_stream(x, r, g, b, total, out, np.float32(EPS), parts)
        assert_matches({"s": total, "ln": out}, {"s": x.astype(np.float64) + r, "ln": _layernorm(x + r, g, b)})
        module.k_add_rmsnorm_stream(x, r, g, total, out, np.float32(EPS), parts)
        assert_matches({"s": total, "rms": out}, {"s": x.astype(np.float64) + r, "rms": _rmsnorm(x + r, g)})
    # outputs over their own inputs, as the schedule may place them (plain stores then)
    inplace = x.copy()
    module.k_layernorm_stream(inplace, g, b, inplace, np.float32(EPS), 3)
    assert_matches({"ln": inplace}, {"ln": _layernorm(x, g, b)})
    inplace = x.copy()
    module.k_rmsnorm_stream(inplace, g, inplace, np.float32(EPS), 2)
    assert_matches({"rms": inplace}, {"rms": _rmsnorm(x, g)})
    xi, ri = x.copy(), r.copy()
    module.k_add_layernorm_stream(xi, ri, g, b, xi, ri, np.float32(EPS), 3)
    assert_matches({"s": xi, "ln": ri}, {"s": x.astype(np.float64) + r, "ln": _layernorm(x + r, g, b)})
    xi, ri = x.copy(), r.copy()
    module.k_add_rmsnorm_stream(xi, ri, g, xi, ri, np.float32(EPS), 2)
    assert_matches({"s": xi, "rms": ri}, {"s": x.astype(np.float64) + r, "rms": _rmsnorm(x + r, g)})


def test_graph_streams_only_large_outputs(cpu_cache, monkeypatch):
    """At the default threshold these small outputs keep plain stores; past it the driver calls the streaming
    kernels, and the whole graph still matches."""
    assert "_stream(" not in _module(cpu_cache).source
    monkeypatch.setattr(stream_stores, "STREAM_BYTES", 0)
    compiled = _module(cpu_cache)
    for name in ("k_layernorm_stream(", "k_rmsnorm_stream(", "k_add_layernorm_stream(", "k_add_rmsnorm_stream("):
        assert name in compiled.source
    x, r, g, b = _data()
    weights = {k: (g if k.endswith("gain") else b) for k, _ in compiled.module.WEIGHTS}
    got = compiled.run(weights, {"x": x, "r": r})
    want = {"ln": _layernorm(x, g, b), "rms": _rmsnorm(x, g), "s_out": x.astype(np.float64) + r,
            "sln": _layernorm(x + r, g, b), "t_out": x.astype(np.float64) + r, "trms": _rmsnorm(x + r, g)}
    assert_matches(got, want)


@pytest.mark.parametrize("nbytes, streams", [(stream_stores.STREAM_BYTES - 4, False),
                                             (stream_stores.STREAM_BYTES, True)])
def test_the_threshold(nbytes, streams):
    assert stream_stores.streams(nbytes) is streams
