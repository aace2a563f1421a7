"""Whole models, fused (``fuse`` pass) and run by the cpu backend, against the NumPy reference
on the graph as written: the passes, the kernels and the buffer schedule checked together."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph, emit_source
from irc.pipeline import run_passes

_ = cpu_cache

MODELS = {
    # GPT-2 style: pre-LN, biases everywhere, tanh GELU, learned positions, tied unembedding
    "gpt": ("""
use "transformer.arch"
model tiny_gpt(B, T) {
  input tokens: i32[B, T]
  wte = embedding(50, 32)
  x = positional(wte(tokens), learned, max_len=16)
  x = repeat(2) pre_ln_decoder(x, heads=4, ff=64, act=gelu_tanh)
  output logits = unembed(layernorm(x), tied=wte)
}
""", {"B": 2, "T": 7}, {"sdpa", "add_norm", "gemm"}),
    # Llama style: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases
    "llama": ("""
use "transformer.arch"
model tiny_llama(B, T) {
  input tokens: i32[B, T]
  emb = embedding(40, 32)
  x = repeat(2) llama_decoder(emb(tokens), heads=4, ff=48, kv_heads=2)
  output logits = linear(rmsnorm(x), 40, bias=false)
}
""", {"B": 1, "T": 9}, {"sdpa", "add_norm", "gemm_glu", "gemm_multi", "rope"}),
    # BERT style: post-LN, where the norm sits on the residual path
    "bert": ("""
use "transformer.arch"
model tiny_bert(B, T) {
  input x: f32[B, T, 24]
  output y = repeat(2) post_ln_encoder(x, heads=3, ff=40)
}
""", {"B": 2, "T": 6}, {"sdpa", "add_norm"}),
    "lstm": ("""
model tiny_lstm(B, T) {
  input tokens: i32[B, T]
  emb = embedding(30, 20)
  s1, h1, c1 = lstm(emb(tokens), 24)
  s2, h2, c2 = lstm(s1, 24)
  output logits = linear(s2, 30)
  output h = h2
  output c = c2
}
""", {"B": 3, "T": 11}, {"lstm", "gemm"}),
    "resnet": ("""
use "resnet.arch"
model tiny_resnet(B, H, W) {
  input image: f32[B, 3, H, W]
  x = basic_down(basic(stem(image, ch=8), 8), 16)
  output logits = linear(global_avgpool(x), 5)
}
""", {"B": 2, "H": 20, "W": 18}, {"conv2d", "batchnorm", "gemm"}),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def fused_model(request, cpu_cache):
    source, binds, expected_ops = MODELS[request.param]
    graph = build(source, **binds)
    fused = run_passes(graph, ["fuse"])
    assert expected_ops <= {n.op for n in fused.nodes}, request.param
    compiled = compile_graph(fused, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    return request.param, graph, fused, compiled, weights, inputs


def test_fused_model_matches_reference_on_the_unfused_graph(fused_model):
    _, graph, _, compiled, weights, inputs = fused_model
    assert_matches(compiled.run(weights, inputs), reference(graph, weights, inputs))


def test_runs_repeat_bit_for_bit(fused_model):
    """Reused buffers and cached derived weights leave nothing behind between runs."""
    _, _, _, compiled, weights, inputs = fused_model
    first = compiled.run(weights, inputs)
    second = compiled.run(weights, inputs)
    for label in first:
        assert first[label].tobytes() == second[label].tobytes(), label


def test_buffers_are_reused(fused_model):
    name, _, fused, _, _, _ = fused_model
    text = emit_source(fused)
    if name in ("gpt", "llama", "bert"):
        assert "# in place:" in text, "add_norm writes the residual stream over its dying operand"
    assert "# reuses a dead buffer" in text or "# in place:" in text
    plain = emit_source(fused, reuse=False)
    assert "# reuses a dead buffer" not in plain and "# in place:" not in plain


def test_outputs_survive_the_next_run(fused_model):
    """A result handed to the caller is never a buffer the next run writes."""
    _, _, _, compiled, weights, inputs = fused_model
    first = compiled.run(weights, inputs)
    kept = {k: v.copy() for k, v in first.items()}
    changed = {k: (v + 1 if v.dtype.kind == "f" else v) for k, v in inputs.items()}
    compiled.run(weights, changed)
    for label, arr in first.items():
        assert np.array_equal(arr, kept[label]), label
