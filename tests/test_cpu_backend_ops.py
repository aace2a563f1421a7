"""Every op family on the Numba cpu backend against the NumPy reference (float64) and NumPy formulas.

Each family is one graph with many outputs, compiled once per session: Numba compiles a
kernel in about a second, so sharing the module keeps this file fast.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import BINARY_OUTPUTS, ELEMENTWISE_INPUTS, UNARY_OUTPUTS
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.diagnostics import IrcError

_ = cpu_cache  # a fixture, used by name below

ELEMENTWISE = f"""
model elementwise_family(B) {{
{ELEMENTWISE_INPUTS}\
  input big: f32[3, 5]
{UNARY_OUTPUTS}\
  output y_softmax = softmax(x)
  output y_softmax_mid = softmax(x, axis=1)
  output y_softmax_big = softmax(big)
{BINARY_OUTPUTS}\
}}
"""

LAYERS = """
model layer_family(B) {
  input x: f32[B, 5, 12]
  input img: f32[B, 4, 9, 9]
  input seq: f32[B, 4, 17]
  input m: f32[3, 1, 5, 6]
  input n: f32[2, 6, 4]
  output y_linear = linear(x, 7)
  output y_linear_nobias = linear(x, 7, bias=false)
  output y_matmul = m @ n
  output y_ffn_relu = ffn(x, hidden=16, act=relu)
  output y_ffn_silu = ffn(x, hidden=16, act=silu, bias=false, out=6)
  output y_swiglu = swiglu(x, hidden=16)
  output y_swiglu_bias = swiglu(x, hidden=16, bias=true)
  output y_conv = conv2d(img, 6, 3, stride=2, padding=1, dilation=2, groups=2)
  output y_conv_same = conv2d(img, 4, [3, 2], padding=same)
  output y_conv_depthwise = conv2d(img, 4, 3, groups=4, bias=false)
  output y_conv1d = conv1d(seq, 6, 4, stride=3, padding=2, dilation=2)
  output y_conv1d_same = conv1d(seq, 6, 4, padding=same, groups=2)
  output y_maxpool = maxpool2d(img, 3, stride=2, padding=1, dilation=2)
  output y_avgpool = avgpool2d(img, 3, stride=2, padding=1)
  output y_avgpool_excl = avgpool2d(img, [3, 2], stride=[2, 1], padding=[1, 1], count_include_pad=false)
  output y_maxpool1d = maxpool1d(seq, 2, padding=1, dilation=2)
  output y_avgpool1d = avgpool1d(seq, 3, 1, 1)
  output y_adaptive = adaptive_avgpool2d(img, [4, 3])
  output y_gap = global_avgpool(img)
  output y_layernorm = layernorm(x)
  output y_layernorm_plain = layernorm(x, affine=false)
  output y_layernorm_nobias = layernorm(x, bias=false)
  output y_rmsnorm = rmsnorm(x)
  output y_rmsnorm_plain = rmsnorm(x, 1e-5, false)
  output y_batchnorm = batchnorm(img)
  output y_batchnorm_last = batchnorm(x, axis=-1)
}
"""

RECURRENT = """
model recurrent_family(B, T) {
  input x: f32[B, T, 6]
  s1, h1 = rnn(x, 5)
  s2, h2 = rnn(x, 5, act=relu, bias=false)
  s3, h3, c3 = lstm(x, 7)
  s4, h4 = gru(x, 4)
  s5, h5 = gru(x, 4, variant=torch)
  s6, h6 = gru(x, 4, bias=false)
  output y_rnn = s1
  output y_rnn_h = h1
  output y_rnn_relu = s2
  output y_rnn_relu_h = h2
  output y_lstm = s3
  output y_lstm_h = h3
  output y_lstm_c = c3
  output y_gru = s4
  output y_gru_h = h4
  output y_gru_torch = s5
  output y_gru_torch_h = h5
  output y_gru_nobias = s6
}
"""

TRANSFORMER = """
model transformer_family(B, T, S) {
  input tokens: i32[B, T]
  input mem: f32[B, S, 16]
  input pad: f32[B, 1, 1, T]
  emb = embedding(11, 16)
  e = emb(tokens)
  x = positional(e, learned, max_len=12)
  p = positional(e)
  h = x + attention(layernorm(x), heads=4, causal=true, bias=true)
  f = h + ffn(layernorm(h), hidden=32, act=gelu_tanh)
  output logits = unembed(layernorm(f), tied=emb)
  output y_sinusoidal = p
  output y_gqa_rope = attention(p, heads=4, kv_heads=2, causal=true, rope=true)
  output y_mqa_rope = attention(p, heads=4, kv_heads=1, causal=true, rope=true, rope_theta=500)
  output y_sliding = attention(p, heads=4, causal=true, window=3)
  output y_gqa_rope_sliding = attention(p, heads=4, kv_heads=2, causal=true, rope=true, window=2)
  output y_t5_sliding = attention(p, heads=4, causal=true, window=2, rel_buckets=8, attn_bias=pad)
  output y_t5 = attention(p, heads=4, rel_buckets=8, rel_max_distance=16, scale=1)
  output y_t5_causal = attention(p, heads=4, causal=true, rel_buckets=8, rel_max_distance=16)
  output y_cross = attention(p, mem, heads=2, head_dim=6, bias=true, causal=true)
  pos = rel_position_bias(p, heads=4, buckets=8, max_distance=16)
  output y_rel_position_bias = pos
  output y_t5_shared = attention(p, heads=4, scale=1, attn_bias=pos)
  output y_bias_gqa_causal = attention(p, heads=4, kv_heads=2, causal=true, attn_bias=pad)
  output y_t5_own_plus_pad = attention(p, heads=4, rel_buckets=8, rel_max_distance=16, attn_bias=pad)
  output y_cross_rel = attention(p, mem, rel_position_bias(p, mem, heads=2, buckets=8, max_distance=16), heads=2)
  r = reshape(f, [B, T, 4, 4])
  t = transpose(r, [0, 2, 1, 3])
  output y_transpose = t
  output y_flatten = flatten(t)
  a, b = split(f, [6, 10])
  output y_split_a = a
  output y_split_b = b
  output y_concat = concat(b, a, axis=-1)
  output y_select = select(f, axis=1, index=-1)
  output y_slice = slice(f, axis=1, start=1, end=3)
  output y_tokens = tokens
}
"""

FAMILIES = {
    "elementwise": (ELEMENTWISE, {"B": 2}),
    "layers": (LAYERS, {"B": 2}),
    "recurrent": (RECURRENT, {"B": 2, "T": 40}),
    "transformer": (TRANSFORMER, {"B": 2, "T": 7, "S": 5}),
}


def _special_inputs(name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if name == "elementwise":
        # softmax at logits of ±1e4 and on a row that is all −inf (defined: zeros)
        inputs["big"] = np.array([[1e4, -1e4, 0.0, 1e4 - 1.0, 5.0],
                                  [-1e4, -1e4, -1e4 + 2.0, -1e4, -1e4],
                                  [-np.inf] * 5], np.float32)
    if name == "layers":
        inputs["x"][0, 0, :] = 3.0  # a constant row: LayerNorm gives its bias, not NaN
    return inputs


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, cpu_cache):
    source, binds = FAMILIES[request.param]
    graph = build(source, **binds)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights = random_weights(graph)
    inputs = _special_inputs(request.param, random_inputs(graph))
    return request.param, graph, compiled, weights, inputs


def test_family_matches_reference(family):
    name, graph, compiled, weights, inputs = family
    got = compiled.run(weights, inputs)
    want = reference(graph, weights, inputs)
    assert len(got) == len(graph.outputs) >= 8
    assert_matches(got, want)
    for label, arr in got.items():  # float results are float32, ints keep their type
        assert arr.dtype == (np.int32 if label == "y_tokens" else np.float32), label


def test_runs_are_bit_identical(family):
    _, _, compiled, weights, inputs = family
    first = compiled.run(weights, inputs)
    second = compiled.run(weights, inputs)
    for label in first:
        assert first[label].tobytes() == second[label].tobytes(), label


# -- independent NumPy formulas ----------------------------------------------------------


def _outputs(family_name: str, cpu_cache):
    source, binds = FAMILIES[family_name]
    graph = build(source, **binds)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights = random_weights(graph)
    inputs = _special_inputs(family_name, random_inputs(graph))
    return compiled.run(weights, inputs), weights, inputs


def test_softmax_extremes_by_formula(cpu_cache):
    out, _, inputs = _outputs("elementwise", cpu_cache)
    big = inputs["big"].astype(np.float64)
    y = out["y_softmax_big"]
    for row in range(2):
        e = np.exp(big[row] - big[row].max())
        np.testing.assert_allclose(y[row], e / e.sum(), rtol=1e-6, atol=1e-30)
    assert np.array_equal(y[2], np.zeros(5, np.float32))  # all −inf: zeros, never NaN
    x = inputs["x"].astype(np.float64)
    np.testing.assert_allclose(out["y_rsub_scalar"], 2 - x, rtol=1e-6)
    np.testing.assert_allclose(out["y_add_rows"], x + inputs["v"], rtol=1e-6)


def test_layernorm_and_linear_by_formula(cpu_cache):
    out, w, inputs = _outputs("layers", cpu_cache)
    x = inputs["x"].astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    ln = (x - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(out["y_layernorm_plain"], ln, atol=2e-6)
    gain, bias = w["y_layernorm.gain"], w["y_layernorm.bias"]
    assert np.array_equal(out["y_layernorm"][0, 0], bias), "a constant row normalises to exactly the bias"
    lin = x @ w["y_linear.weight"].T.astype(np.float64) + w["y_linear.bias"]
    np.testing.assert_allclose(out["y_linear"], lin, atol=2e-6)
    assert gain.shape == (12,)


def test_embedding_rejects_ids_outside_the_table(cpu_cache):
    source, binds = FAMILIES["transformer"]
    graph = build(source, **binds)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    for bad in (11, -1):
        tokens = inputs["tokens"].copy()
        tokens[1, 3] = bad
        want = f"token id {bad} \\(at flat position 10\\) is outside its vocabulary \\[0, 11\\)"
        with pytest.raises(IrcError, match=want):
            compiled.run(weights, {**inputs, "tokens": tokens})


def test_sliding_window_attention_by_formula(cpu_cache):
    """attention(causal=true, window=3) written out: projections, heads, and the index rule
    (query i sees keys i − 3 < j <= i) in float64, against the unfused layer kernel."""
    out, w, _ = _outputs("transformer", cpu_cache)
    binds = FAMILIES["transformer"][1]
    x = out["y_sinusoidal"].astype(np.float64)  # p, the attention's input
    b, t, d = x.shape

    def proj(name: str) -> np.ndarray:
        return x @ w[f"y_sliding.{name}"].T.astype(np.float64)

    q, k, v = (proj(n).reshape(b, t, 4, 4).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    s = q @ k.transpose(0, 1, 3, 2) / 2.0  # head width 4: scale 1/√4
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    s = np.where((j > i) | (j <= i - 3), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    heads = (p / p.sum(-1, keepdims=True)) @ v
    want = heads.transpose(0, 2, 1, 3).reshape(b, t, d) @ w["y_sliding.wo"].T.astype(np.float64)
    np.testing.assert_allclose(out["y_sliding"], want, atol=2e-5)
    assert binds["T"] > 3  # the window hides keys from the later rows


def test_fully_masked_attention_rows_give_zeros(cpu_cache):
    """A T5 bias of −inf hides every key from head 0: its rows are zeros, never NaN."""
    source, binds = FAMILIES["transformer"]
    graph = build(source, **binds)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    # the same model with finite biases, where head 0's output is cut off by zero columns of wo
    zeroed = {**weights, "y_t5.wo": weights["y_t5.wo"].copy()}
    zeroed["y_t5.wo"][:, :4] = 0.0  # head 0 is the first 16/4 = 4 columns of wo
    weights["y_t5.rel_bias.weight"] = weights["y_t5.rel_bias.weight"].copy()
    weights["y_t5.rel_bias.weight"][:, 0] = -np.inf
    got = compiled.run(weights, inputs)["y_t5"]
    assert np.all(np.isfinite(got))
    assert_matches({"y_t5": got}, {"y_t5": reference(graph, zeroed, inputs)["y_t5"]})
    assert_matches({"y_t5": got}, {"y_t5": reference(graph, weights, inputs)["y_t5"]})
