"""The numpy reference's attention against PyTorch: F.scaled_dot_product_attention (causal or
not, GQA), the attention op (projections, cross-attention, RoPE) and nn.TransformerEncoderLayer
with norm_first True and False, built from .arch text.

Same float32 weights and inputs; PyTorch computes in float64. Tolerance definition
(irc.runtime.compare.rel_error): max|ours − torch| / max|torch| per output; the reference in
float32 within 1e-5, in float64 within 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from irc.backends.numpy_ref.attention import sdpa
from irc.pipeline import run_passes
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import check_weights

# ops whose numpy reference this file checks against PyTorch (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"attention", "sdpa"})
TOL32, TOL64 = 1e-5, 1e-10


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float64))


def assert_matches(graph, weights, inputs, expected: dict[str, torch.Tensor]) -> None:
    check_weights(graph, weights)
    want = {k: v.detach().numpy() for k, v in expected.items()}
    for label, (err32, err64) in reference_errors(graph, weights, inputs, want).items():
        assert err32 <= TOL32, f"{label}: float32 reference off by {err32:.2e}"
        assert err64 <= TOL64, f"{label}: float64 reference off by {err64:.2e}"


SDPA = [  # (heads, kv heads, T, S, causal, scale)
    (4, 4, 6, 6, False, None),
    (4, 4, 6, 6, True, None),
    (4, 4, 5, 8, True, None),  # top-left aligned mask, more keys than queries
    (4, 4, 8, 5, True, None),  # fewer keys than queries
    (8, 2, 6, 6, False, None),  # GQA
    (8, 2, 6, 6, True, 0.3),
    (4, 1, 7, 7, True, None),  # MQA
]


@pytest.mark.parametrize("h,g,t,s,causal,scale", SDPA)
def test_sdpa(h, g, t, s, causal, scale):
    rng = np.random.default_rng(h * 100 + g * 10 + t)
    q, k, v = f32(rng, 2, h, t, 8), f32(rng, 2, g, s, 8), f32(rng, 2, g, s, 8)
    want = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=causal, scale=scale,
                                          enable_gqa=g != h).numpy()
    assert rel_error(sdpa(q, k, v, causal, scale), want) <= TOL32
    assert rel_error(sdpa(*(a.astype(np.float64) for a in (q, k, v)), causal, scale), want) <= TOL64


@pytest.mark.parametrize("h,g,t,s,window", [(4, 4, 9, 9, 1), (4, 4, 9, 9, 3), (8, 2, 6, 10, 4), (4, 1, 7, 7, 7),
                                             (4, 4, 5, 5, 50)])
def test_sdpa_sliding_window(h, g, t, s, window):
    rng = np.random.default_rng(window * 10 + t)
    q, k, v = f32(rng, 2, h, t, 8), f32(rng, 2, g, s, 8), f32(rng, 2, g, s, 8)
    want = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=sliding_mask(t, s, window),
                                          enable_gqa=g != h).numpy()
    assert rel_error(sdpa(q, k, v, True, None, window=window), want) <= TOL32
    assert rel_error(sdpa(*(a.astype(np.float64) for a in (q, k, v)), True, None, window=window), want) <= TOL64
    if window < t:  # the window changes the result: the comparison can fail
        assert rel_error(sdpa(q, k, v, True, None), want) > 1e-3


def _projections(rng, d: int, heads: int, kv_heads: int, hd: int, bias: bool, dkv: int | None = None):
    dkv = dkv or d
    w = {"wq": f32(rng, heads * hd, d, scale=0.3), "wk": f32(rng, kv_heads * hd, dkv, scale=0.3),
         "wv": f32(rng, kv_heads * hd, dkv, scale=0.3), "wo": f32(rng, d, heads * hd, scale=0.3)}
    if bias:
        w |= {"bq": f32(rng, heads * hd), "bk": f32(rng, kv_heads * hd), "bv": f32(rng, kv_heads * hd),
              "bo": f32(rng, d)}
    return w


def sliding_mask(t: int, s: int, window: int) -> torch.Tensor:
    """Mistral's mask from torch's own tril/triu: key j is visible to query i when i − window < j <= i."""
    return torch.ones(t, s, dtype=torch.bool).tril().triu(-(window - 1))


def torch_attention(x, kv, w, heads, kv_heads, causal, rope_theta=None, window=None):
    """Projections, heads, optional rotate-half RoPE (as Llama's apply_rotary_pos_emb), F.sdpa, wo."""
    def proj(a, name, n):
        y = t64(a) @ t64(w["w" + name]).T + (t64(w["b" + name]) if "b" + name in w else 0)
        b, t, _ = y.shape
        return y.reshape(b, t, n, -1).transpose(1, 2)

    q, k, v = proj(x, "q", heads), proj(kv, "k", kv_heads), proj(kv, "v", kv_heads)
    if rope_theta is not None:
        def rot(a):
            hd, t = a.shape[-1], a.shape[-2]
            inv = 1.0 / rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv)
            emb = torch.cat([freqs, freqs], dim=-1)
            half = torch.cat([-a[..., hd // 2:], a[..., :hd // 2]], dim=-1)
            return a * emb.cos() + half * emb.sin()
        q, k = rot(q), rot(k)
    if window is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_mask(q.shape[2], k.shape[2], window),
                                           enable_gqa=heads != kv_heads)
    o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
    return o @ t64(w["wo"]).T + (t64(w["bo"]) if "bo" in w else 0)


@pytest.mark.parametrize("heads,kv_heads,causal,bias", [(4, 4, False, True), (4, 2, True, False), (4, 1, True, True)])
def test_attention_op(heads, kv_heads, causal, bias):
    rng = np.random.default_rng(heads + kv_heads)
    x = f32(rng, 2, 6, 16)
    w = _projections(rng, 16, heads, kv_heads, 4, bias)
    graph = graph_from_source(f"model m() {{ input x: f32[2, 6, 16]\n output y = attention(x, heads={heads}, "
                              f"kv_heads={kv_heads}, causal={str(causal).lower()}, bias={str(bias).lower()}) }}")
    weights = {f"y.{k}": v for k, v in w.items()}
    assert_matches(graph, weights, {"x": x}, {"y": torch_attention(x, x, w, heads, kv_heads, causal)})


def test_cross_attention():
    rng = np.random.default_rng(7)
    x, mem = f32(rng, 2, 5, 12), f32(rng, 2, 9, 10)
    w = _projections(rng, 12, 3, 3, 4, True, dkv=10)
    graph = graph_from_source("model m() { input x: f32[2, 5, 12]; input mem: f32[2, 9, 10]\n"
                              " output y = attention(x, mem, heads=3, bias=true) }")
    weights = {f"y.{k}": v for k, v in w.items()}
    assert_matches(graph, weights, {"x": x, "mem": mem}, {"y": torch_attention(x, mem, w, 3, 3, False)})


def test_attention_sliding_window_gqa_rope():
    """Mistral's layer: GQA, RoPE and a window of 3 over 8 tokens, lowered and fused as irc runs it."""
    rng = np.random.default_rng(11)
    x = f32(rng, 2, 8, 16)
    w = _projections(rng, 16, 4, 2, 4, False)
    graph = graph_from_source("model m() { input x: f32[2, 8, 16]\n"
                              " output y = attention(x, heads=4, kv_heads=2, causal=true, rope=true, window=3) }")
    weights = {f"y.{k}": v for k, v in w.items()}
    want = {"y": torch_attention(x, x, w, 4, 2, True, rope_theta=10000.0, window=3)}
    assert_matches(graph, weights, {"x": x}, want)
    assert_matches(run_passes(graph, ["fuse"]), weights, {"x": x}, want)


def test_attention_rope():
    rng = np.random.default_rng(3)
    x = f32(rng, 2, 7, 16)
    w = _projections(rng, 16, 2, 2, 8, False)
    graph = graph_from_source("model m() { input x: f32[2, 7, 16]\n"
                              " output y = attention(x, heads=2, causal=true, rope=true, rope_theta=500) }")
    weights = {f"y.{k}": v for k, v in w.items()}
    assert_matches(graph, weights, {"x": x}, {"y": torch_attention(x, x, w, 2, 2, True, rope_theta=500.0)})


ENCODER = {
    True: """
  h = x + self_attn(norm1(x))
  output y = h + ff(norm2(h))""",
    False: """
  h = norm1(x + self_attn(x))
  output y = norm2(h + ff(h))""",
}


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, act):
    torch.manual_seed(0)
    d, heads, ff = 16, 4, 40
    layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=0.0, activation=act,
                                       batch_first=True, norm_first=norm_first)
    with torch.no_grad():  # non-trivial norm parameters, rounded to float32 values
        for norm in (layer.norm1, layer.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    layer.eval().double()
    sd = {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(p.float().double())
            sd[name] = p.float().numpy().copy()
    wq, wk, wv = np.split(sd["self_attn.in_proj_weight"], 3)
    bq, bk, bv = np.split(sd["self_attn.in_proj_bias"], 3)
    weights = {
        "self_attn.wq": wq, "self_attn.wk": wk, "self_attn.wv": wv, "self_attn.bq": bq, "self_attn.bk": bk,
        "self_attn.bv": bv, "self_attn.wo": sd["self_attn.out_proj.weight"],
        "self_attn.bo": sd["self_attn.out_proj.bias"],
        "ff.w1": sd["linear1.weight"], "ff.b1": sd["linear1.bias"], "ff.w2": sd["linear2.weight"],
        "ff.b2": sd["linear2.bias"],
        "norm1.gain": sd["norm1.weight"], "norm1.bias": sd["norm1.bias"],
        "norm2.gain": sd["norm2.weight"], "norm2.bias": sd["norm2.bias"],
    }
    src = f"""model encoder_layer(B, T) {{
  input x: f32[B, T, {d}]
  norm1 = layernorm(eps=0.00001)
  norm2 = layernorm(eps=0.00001)
  self_attn = attention(heads={heads}, bias=true)
  ff = ffn(hidden={ff}, act={act})
{ENCODER[norm_first]}
}}
"""
    graph = graph_from_source(src, {"B": 2, "T": 6})
    x = np.random.default_rng(0).standard_normal((2, 6, d)).astype(np.float32)
    with torch.no_grad():
        want = layer(t64(x))
    assert_matches(graph, weights, {"x": x}, {"y": want})
