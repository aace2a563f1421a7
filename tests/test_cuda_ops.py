"""Every op family through the cuda backend's generated module, in the simulator, against the
NumPy reference (float64). Each family is one small graph with many outputs."""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import BINARY_OUTPUTS, ELEMENTWISE_INPUTS, UNARY_OUTPUTS
from test_cuda_helpers import check_graph, cuda_cache, random_inputs, random_weights, reference

from irc.backends.cuda import compile_graph
from irc.backends.cuda.emit import fuse
from irc.runtime.graphs import graph_from_source

_ = cuda_cache

ROWS = """
model rows_family(B) {
  input x: f32[B, 3, 40]
  input y: f32[B, 3, 40]
  input w: f32[2, 96]
  input z: f32[2, 96]
  input big: f32[3, 5]
  output ln = layernorm(x)
  output ln_plain = layernorm(x, affine=false)
  output ln_nobias = layernorm(x, bias=false)
  output rms = rmsnorm(x)
  output rms_plain = rmsnorm(x, 1e-5, false)
  h = x + y
  output residual = h
  output add_ln = layernorm(h)
  output add_rms_exact = rmsnorm(w + z)
  output sm = softmax(x)
  output sm_exact = softmax(w)
  output sm_mid = softmax(x, axis=1)
  output sm_small = softmax(big)
}
"""

ELEMENTWISE = f"""
model elementwise_family(B) {{
{ELEMENTWISE_INPUTS}{UNARY_OUTPUTS}{BINARY_OUTPUTS}}}
"""

SHAPES = """
model shape_family(B) {
  input a: f32[B, 3, 4]
  input b: f32[B, 3, 2]
  input f: f32[B, 4, 3]
  output y_reshape = reshape(a, [B, 12])
  output y_flatten = flatten(a)
  output y_transpose = transpose(a, [2, 0, 1])
  output y_concat = concat(b, a, axis=-1)
  output y_select = select(f, axis=1, index=-1)
  output y_slice = slice(f, axis=1, start=1, end=3)
  p, q = split(f, 2, axis=1)
  output y_split_p = p
  output y_split_q = q
  output y_matmul = a @ f
}
"""

LAYERS = """
model layer_family(B) {
  input x: f32[B, 5, 12]
  input img: f32[B, 4, 7, 7]
  input seq: f32[B, 3, 9]
  input m: f32[3, 1, 5, 6]
  input n: f32[2, 6, 4]
  input ids: i32[B, 5]
  output y_linear = linear(x, 7)
  output y_ffn = ffn(x, hidden=16, act=relu)
  output y_swiglu = swiglu(x, hidden=16)
  output y_matmul_broadcast = m @ n
  output y_conv = conv2d(img, 6, 3, stride=2, padding=1, dilation=2, groups=2)
  output y_conv_same = conv2d(img, 4, [3, 2], padding=same, bias=false)
  output y_conv_1x1 = conv2d(img, 5, 1)
  output y_conv1d = conv1d(seq, 4, 3, stride=2, padding=1)
  output y_maxpool = maxpool2d(img, 3, stride=2, padding=1)
  output y_avgpool_excl = avgpool2d(img, [3, 2], stride=[2, 1], padding=[1, 1], count_include_pad=false)
  output y_avgpool1d = avgpool1d(seq, 3, 1, 1)
  output y_maxpool1d = maxpool1d(seq, 2, padding=1, dilation=2)
  output y_adaptive = adaptive_avgpool2d(img, [3, 2])
  output y_gap = global_avgpool(img)
  output y_batchnorm = batchnorm(img)
  output y_batchnorm_last = batchnorm(x, axis=-1)
  output y_emb = embedding(ids, 30, 8)
  output y_sin = positional(x, sinusoidal)
}
"""

RECURRENT = """
model recurrent_family(B) {
  input x: f32[B, 4, 6]
  s1, h1, c1 = lstm(x, 5)
  s2, h2 = gru(x, 4)
  s3, h3 = gru(x, 4, variant=torch)
  s4, h4 = rnn(x, 3, act=relu)
  s5, h5 = rnn(x, 3, bias=false)
  output lstm_seq = s1
  output lstm_h = h1
  output lstm_c = c1
  output gru_seq = s2
  output gru_h = h2
  output gru_torch_seq = s3
  output gru_torch_h = h3
  output rnn_seq = s4
  output rnn_tanh_h = h5
}
"""

ATTENTION = """
model attention_family(B) {
  input x: f32[B, 6, 16]
  input mem: f32[B, 5, 12]
  input pad: f32[B, 1, 1, 6]
  input scores: f32[B, 3, 7, 5]
  output self_causal = attention(x, heads=2, causal=true)
  output gqa_rope = attention(x, heads=4, kv_heads=2, rope=true, causal=true)
  output mqa = attention(x, heads=4, kv_heads=1, bias=false)
  output cross = attention(x, mem, heads=2)
  output t5_rel = attention(x, heads=2, rel_buckets=8, rel_max_distance=16)
  output t5_rel_causal = attention(x, heads=2, rel_buckets=8, causal=true)
  pos = rel_position_bias(x, heads=2, buckets=8, max_distance=16)
  output rel_position_bias = pos
  output t5_shared = attention(x, heads=2, scale=1, attn_bias=pos)
  output gqa_pad_causal = attention(x, heads=4, kv_heads=2, causal=true, attn_bias=pad)
  output t5_own_plus_pad = attention(x, heads=2, rel_buckets=8, attn_bias=pad)
  output sliding = attention(x, heads=2, causal=true, window=3)
  output gqa_rope_sliding = attention(x, heads=4, kv_heads=2, rope=true, causal=true, window=2)
  output t5_rel_sliding = attention(x, heads=2, rel_buckets=8, causal=true, window=2)
  output sliding_mask_softmax = softmax(causal_mask(scores, window=2))
}
"""


def _compile(source: str, cache, reduction: str | None = None, bindings: dict[str, int] | None = None):
    graph = graph_from_source(source, {"B": 2} if bindings is None else bindings)
    return graph, compile_graph(graph, cache_dir=cache, reduction=reduction)


@pytest.mark.parametrize("path", ["shared", "shuffle"])
def test_norms_and_softmax(cuda_cache, path):
    """Rows in registers: exact splits (96 = 3 warps × 1) and guarded ones (40), in both paths."""
    graph, compiled = _compile(ROWS, cuda_cache, reduction=path)
    assert compiled.reduction == path
    assert "k_add_layernorm_g_b_d40" in compiled.module.REDUCING  # the residual add is fused
    check_graph(compiled, graph)


def test_reduction_path_defaults_to_shared_memory_in_the_simulator(cuda_cache):
    """The simulator has no warp shuffles: without a choice, the shared-memory tree runs."""
    graph, compiled = _compile(ROWS, cuda_cache)
    assert compiled.simulator and compiled.reduction == "shared"
    k = compiled.module.REDUCING[0]
    assert getattr(compiled.module, k) is getattr(compiled.module, f"{k}__shared")


def test_elementwise(cuda_cache):
    graph, compiled = _compile(ELEMENTWISE, cuda_cache)
    check_graph(compiled, graph)


def test_shape_ops(cuda_cache):
    graph, compiled = _compile(SHAPES, cuda_cache)
    check_graph(compiled, graph)


def test_layers(cuda_cache):
    graph, compiled = _compile(LAYERS, cuda_cache)
    check_graph(compiled, graph, id_bound=30)


def test_recurrent(cuda_cache):
    graph, compiled = _compile(RECURRENT, cuda_cache)
    check_graph(compiled, graph)


def test_attention_layers(cuda_cache):
    """Fused (sdpa) where fusion applies; the T5 relative bias through the layer op; sliding
    windows (Mistral) in both, and on the causal_mask primitive."""
    graph, compiled = _compile(ATTENTION, cuda_cache)
    fused = [n.op for n in fuse(graph).nodes]
    # a table of its own (rel_buckets) keeps the layer op; an attn_bias operand fuses into sdpa's bias
    assert fused.count("sdpa") == 8 and fused.count("attention") == 4
    text = compiled.source
    assert "k_sdpa_d8_16x8x4x8_causal_bias" in text and "k_rope" in text
    assert "k_sdpa_d8_16x8x4x8_causal_window_bias" in text and "k_causal_mask_window" in text
    check_graph(compiled, graph)


def test_sliding_causal_mask_by_index_rule(cuda_cache):
    """causal_mask(window=W) hides key j from query i unless i − W < j <= i (T=7 > S=5)."""
    graph, compiled = _compile("model m() { input x: f32[2, 7, 5]\n output y = causal_mask(x, window=2) }",
                               cuda_cache, bindings={})
    x = np.random.default_rng(1).standard_normal((2, 7, 5)).astype(np.float32)
    got = compiled.run({}, {"x": x})["y"]
    i, j = np.arange(7)[:, None], np.arange(5)[None, :]
    want = np.where((j > i) | (j <= i - 2), -np.inf, x)
    assert np.array_equal(got, want)


def test_masked_scores_softmax_is_zero_not_nan(cuda_cache):
    """softmax of a row that is all −∞ gives zeros (the reference's rule), not NaN."""
    graph, compiled = _compile("model m() { input x: f32[3, 33]\n output y = softmax(x) }", cuda_cache, bindings={})
    x = np.random.default_rng(0).standard_normal((3, 33)).astype(np.float32)
    x[1] = -np.inf
    x[2, 5:] = -np.inf
    got = compiled.run({}, {"x": x})["y"]
    want = reference(graph, {}, {"x": x})["y"]
    assert np.array_equal(got[1], np.zeros(33, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_weights_are_uploaded_once_and_replaced_when_new(cuda_cache):
    graph, compiled = _compile("model m() { input x: f32[2, 8]\n output y = linear(x, 3) }", cuda_cache, bindings={})
    w, x = random_weights(graph), random_inputs(graph)
    first = compiled.run(w, x)["y"]
    device = compiled.upload(w)
    assert compiled.upload(w) is device  # the same arrays: nothing copied again
    w2 = {k: v * 2 for k, v in w.items()}
    assert compiled.upload(w2) is not device
    np.testing.assert_allclose(compiled.run(w2, x)["y"], reference(graph, w2, x)["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(compiled.run(w, x)["y"], first, rtol=0, atol=0)
