"""The fused ops' kernels on the cpu backend against the NumPy reference (float64) and formulas.

Sizes cross the kernels' block boundaries: sdpa's query tiles (128 rows) and key tiles (256
keys) with T not a multiple of either, causal attention with T ≠ S both ways, GQA and MQA,
rows whose every key a −inf bias hides, sliding windows (Mistral) of 1, 100, T and more than
T keys, with a bias, and with too few keys for the last rows; gemm products with enough rows to split by rows
and with few rows (split by columns). Each family is one graph, compiled once.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render.sdpa import TILE_K, TILE_Q
from irc.pipeline import run_passes

_ = cpu_cache

SDPA = """
model sdpa_family(B) {
  input q: f32[B, 4, 300, 16]
  input k: f32[B, 2, 300, 16]
  input v: f32[B, 2, 300, 12]
  input k1: f32[B, 1, 130, 16]
  input v1: f32[B, 1, 130, 16]
  input q_short: f32[B, 4, 200, 16]
  input q_one: f32[B, 4, 1, 16]
  input bias: f32[1, 4, 300, 300]
  input k_shared: f32[1, 2, 300, 16]
  input v_shared: f32[1, 2, 300, 12]
  output y_full = sdpa(q, k, v, scale=0.25)
  output y_causal = sdpa(q, k, v, scale=0.25, causal=true)
  output y_mqa_causal_few_keys = sdpa(q, k1, v1, scale=0.3, causal=true)
  output y_causal_few_queries = sdpa(q_short, k, v, scale=0.25, causal=true)
  output y_one_query = sdpa(q_one, k, v, scale=0.25, causal=true)
  output y_bias = sdpa(q, k, v, bias, scale=0.25)
  output y_bias_causal = sdpa(q, k, v, bias, scale=0.25, causal=true)
  output y_shared_kv = sdpa(q, k_shared, v_shared, scale=0.25, causal=true)
  output y_window_1 = sdpa(q, k, v, scale=0.25, causal=true, window=1)
  output y_window_100 = sdpa(q, k, v, scale=0.25, causal=true, window=100)
  output y_window_t = sdpa(q, k, v, scale=0.25, causal=true, window=300)
  output y_window_long = sdpa(q, k, v, scale=0.25, causal=true, window=1000)
  output y_window_bias = sdpa(q, k, v, bias, scale=0.25, causal=true, window=37)
  output y_window_few_keys = sdpa(q, k1, v1, scale=0.3, causal=true, window=100)
  output y_window_few_queries = sdpa(q_short, k, v, scale=0.25, causal=true, window=50)
}
"""

PRIMITIVES = """
model primitive_family(B) {
  input x: f32[B, 9, 40]
  input r: f32[B, 9, 40]
  input heads: f32[B, 3, 7, 10]
  input scores: f32[B, 3, 7, 5]
  s1, n1 = add_norm(x, r)
  s2, n2 = add_norm(x, r, kind=rmsnorm, eps=1e-6)
  s3, n3 = add_norm(x, r, affine=false)
  s4, n4 = add_norm(x, r, bias=false)
  s5, n5 = add_norm(x, r, kind=rmsnorm, affine=false)
  output y_sum = s1
  output y_layernorm = n1
  output y_sum_rms = s2
  output y_rmsnorm = n2
  output y_layernorm_plain = n3
  output y_layernorm_nobias = n4
  output y_rmsnorm_plain = n5
  output y_rope = rope(heads)
  output y_rope_theta = rope(heads, theta=500)
  output y_mask = causal_mask(scores)
  output y_softmax_masked = softmax(causal_mask(scores))
  output y_mask_window = causal_mask(scores, window=2)
  output y_softmax_window = softmax(causal_mask(scores, window=2))
}
"""

# layers whose fused form is gemm{act}, gemm_glu and gemm_multi; B·T rows = 70 split by rows,
# 3 rows (few) split by columns (every product here is at least 128 wide: 2 threads × 64)
DENSE = """
model dense_family(B, T) {
  input x: f32[B, T, 24]
  input a: f32[B, T, 64]
  input c: f32[B, T, 64]
  output y_relu = relu(linear(x, 130))
  output y_gelu = gelu(linear(x, 130))
  output y_gelu_tanh = gelu(linear(x, 130, bias=false), approx=tanh)
  output y_silu = silu(linear(x, 130))
  output y_tanh = tanh(linear(x, 130))
  output y_plain = linear(x, 130)
  output y_swiglu = swiglu(x, hidden=136)
  output y_gqa = attention(a, heads=4, kv_heads=2, causal=true, bias=false)
  output y_mqa_rope = attention(c, heads=4, kv_heads=1, rope=true, bias=false)
  output y_gqa_rope_window = attention(c, heads=4, kv_heads=2, rope=true, causal=true, window=5, bias=false)
}
"""


def _special(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "bias" in inputs:
        bias = inputs["bias"]
        bias[0, 1] = -np.inf  # head 1: every key hidden from every query -> zeros
        bias[0, 2, 5:40, :] = -np.inf  # head 2: some rows hidden
        bias[0, 3, :, ::3] = -np.inf  # head 3: every third key hidden
    if "r" in inputs:
        inputs["x"][0, 0] = 3.0
        inputs["r"][0, 0] = -1.0  # a constant sum row: its LayerNorm is exactly the bias
        inputs["x"][1, 1] += 1000.0  # a large mean: the variance must not cancel away
    return inputs


def _family(source: str, binds: dict[str, int], cache, fuse: bool = False):
    graph = build(source, **binds)
    if fuse:
        graph = run_passes(graph, ["fuse"])
    compiled = compile_graph(graph, cache_dir=cache)
    weights = random_weights(graph)
    inputs = _special(random_inputs(graph))
    return graph, compiled, weights, inputs


@pytest.fixture(scope="module")
def sdpa_family(cpu_cache):
    return _family(SDPA, {"B": 2}, cpu_cache)


@pytest.fixture(scope="module")
def primitive_family(cpu_cache):
    return _family(PRIMITIVES, {"B": 2}, cpu_cache)


@pytest.fixture(scope="module", params=[(2, 35), (1, 3)], ids=["rows", "columns"])
def dense_family(request, cpu_cache):
    b, t = request.param
    return _family(DENSE, {"B": b, "T": t}, cpu_cache, fuse=True)


def test_sizes_cross_the_tiles():
    assert 300 % TILE_Q and 300 > 2 * TILE_Q and 300 % TILE_K and 300 > TILE_K and 130 < TILE_K < 200 + TILE_Q
    # window 1: the last query tile (rows 256..) starts at the second key tile, skipping the first;
    # windows 37 and 100 reach back over a query-tile edge into the keys of the tile before
    assert (2 * TILE_Q - 1 + 1) // TILE_K == 1 and 37 < TILE_Q and 100 < TILE_Q


def test_sdpa_matches_reference(sdpa_family):
    graph, compiled, weights, inputs = sdpa_family
    got = compiled.run(weights, inputs)
    assert_matches(got, reference(graph, weights, inputs))


def test_sdpa_hidden_rows_are_zeros(sdpa_family):
    _, compiled, weights, inputs = sdpa_family
    got = compiled.run(weights, inputs)
    for label in ("y_bias", "y_bias_causal"):
        y = got[label]
        assert np.all(np.isfinite(y))
        assert not y[0, 1].any() and not y[1, 1].any(), "every key hidden: zeros"
        assert not y[:, 2, 5:40].any() and y[:, 2, 40:].any()


def test_sdpa_by_formula(sdpa_family):
    """Causal attention with fewer keys than queries, written out for one head (MQA)."""
    _, compiled, weights, inputs = sdpa_family
    y = compiled.run(weights, inputs)["y_mqa_causal_few_keys"]
    q = inputs["q"][1, 3].astype(np.float64)
    k, v = inputs["k1"][1, 0].astype(np.float64), inputs["v1"][1, 0].astype(np.float64)
    s = q @ k.T * 0.3
    s[np.arange(130)[None, :] > np.arange(300)[:, None]] = -np.inf  # key j hidden from query i < j
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(y[1, 3], want, atol=2e-5)
    np.testing.assert_allclose(y[1, 3, 0], v[0], atol=1e-6)  # the first query sees only key 0


def _windowed(q, k, v, scale: float, window: int) -> np.ndarray:
    """softmax(q·kᵀ·scale) · v in float64, query i seeing keys i − window < j <= i (index rule,
    written here); GQA by repeating key/value heads; a row with no visible key gives zeros."""
    heads, groups = q.shape[1], k.shape[1]
    k = np.repeat(k.astype(np.float64), heads // groups, axis=1)
    v = np.repeat(v.astype(np.float64), heads // groups, axis=1)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    i, j = np.arange(s.shape[-2])[:, None], np.arange(s.shape[-1])[None, :]
    s = np.where((j > i) | (j <= i - window), -np.inf, s)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v


def test_sdpa_window_by_index_rule(sdpa_family):
    """Every window output against the index rule written out here (not the reference's)."""
    _, compiled, weights, inputs = sdpa_family
    got = compiled.run(weights, inputs)
    q, k, v, k1, v1 = (inputs[n] for n in ("q", "k", "v", "k1", "v1"))
    full = _windowed(q, k, v, 0.25, 300)
    for label, want in (("y_window_1", _windowed(q, k, v, 0.25, 1)), ("y_window_100", _windowed(q, k, v, 0.25, 100)),
                        ("y_window_t", full), ("y_window_long", full),
                        ("y_window_few_keys", _windowed(q, k1, v1, 0.3, 100)),
                        ("y_window_few_queries", _windowed(inputs["q_short"], k, v, 0.25, 50))):
        np.testing.assert_allclose(got[label], want, atol=3e-5, err_msg=label)
    np.testing.assert_allclose(got["y_window_1"], np.repeat(v, 2, axis=1), atol=1e-6)  # only its own key
    np.testing.assert_array_equal(got["y_window_t"], got["y_causal"])  # a window of T hides nothing more
    assert not got["y_window_few_keys"][:, :, 229:].any()  # i − 100 >= 129: no key left in the window
    assert got["y_window_few_keys"][:, :, :229].all()


def test_sdpa_window_matches_torch(sdpa_family):
    """PyTorch's scaled_dot_product_attention with a boolean mask from the index rule (GQA)."""
    import torch
    import torch.nn.functional as F

    _, compiled, weights, inputs = sdpa_family
    got = compiled.run(weights, inputs)["y_window_100"]
    q, k, v = (torch.from_numpy(inputs[n]).double() for n in ("q", "k", "v"))
    i, j = torch.arange(300)[:, None], torch.arange(300)[None, :]
    visible = (j <= i) & (j > i - 100)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                          attn_mask=visible, scale=0.25)
    np.testing.assert_allclose(got, want.numpy(), atol=3e-5)


def test_sdpa_window_skips_key_tiles_left_of_it(sdpa_family):
    """Keys and values 0..255 (the first key tile) are NaN: with a window of 1, the query tile of
    rows 256..299 starts its key loop at key 256, so those rows stay exact; the rest do not."""
    _, compiled, weights, inputs = sdpa_family
    k, v = inputs["k"].copy(), inputs["v"].copy()
    k[:, :, :TILE_K] = np.nan
    v[:, :, :TILE_K] = np.nan
    got = compiled.run(weights, {**inputs, "k": k, "v": v})["y_window_1"]
    np.testing.assert_allclose(got[:, :, 2 * TILE_Q:], np.repeat(inputs["v"], 2, axis=1)[:, :, 2 * TILE_Q:], atol=1e-6)
    assert np.isnan(got[:, :, :TILE_Q]).all()  # the first query tile reads them (and is poisoned)


def test_primitives_match_reference(primitive_family):
    graph, compiled, weights, inputs = primitive_family
    got, want = compiled.run(weights, inputs), reference(graph, weights, inputs)
    for label in ("y_mask", "y_mask_window"):  # hold -inf on purpose: checked by formula below
        del got[label], want[label]
    assert_matches(got, want)


def test_add_norm_by_formula(primitive_family):
    _, compiled, weights, inputs = primitive_family
    out = compiled.run(weights, inputs)
    s = (inputs["x"] + inputs["r"]).astype(np.float64)  # the float32 sum, as the kernel stores it
    assert np.array_equal(out["y_sum"], inputs["x"] + inputs["r"])
    mean = s.mean(-1, keepdims=True)
    ln = (s - mean) / np.sqrt(((s - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out["y_layernorm_plain"], ln, atol=1e-5)
    bias = next(v for k, v in weights.items() if k.endswith(".bias") and v.shape == (40,))
    assert np.array_equal(out["y_layernorm"][0, 0], bias), "a constant row normalises to exactly the bias"
    rms = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-5)  # add_norm's default eps
    np.testing.assert_allclose(out["y_rmsnorm_plain"], rms, rtol=1e-5)


def test_causal_mask_by_formula(primitive_family):
    _, compiled, weights, inputs = primitive_family
    out = compiled.run(weights, inputs)["y_mask"]
    sc = inputs["scores"]
    hidden = np.arange(5)[None, :] > np.arange(7)[:, None]  # top-left aligned, T=7 > S=5
    assert np.all(np.isneginf(out[..., hidden]))
    assert np.array_equal(out[..., ~hidden], sc[..., ~hidden])
    i, j = np.arange(7)[:, None], np.arange(5)[None, :]
    window = compiled.run(weights, inputs)["y_mask_window"]
    assert np.array_equal(window, np.where((j > i) | (j <= i - 2), -np.inf, sc))  # keys i − 2 < j <= i


def test_dense_fused_ops_match_reference(dense_family):
    graph, compiled, weights, inputs = dense_family
    ops = {n.op for n in graph.nodes}
    assert {"gemm", "gemm_glu", "gemm_multi", "sdpa", "rope"} <= ops
    assert {n.attrs["act"] for n in graph.nodes if n.op == "gemm"} >= {"relu", "gelu", "gelu_tanh", "silu", "tanh"}
    assert_matches(compiled.run(weights, inputs), reference(graph, weights, inputs))
