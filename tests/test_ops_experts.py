"""moe and mla against Hugging Face's Mixtral and DeepSeek-V2 modules, and against PyTorch written from the papers.

Hugging Face computes the router softmax and DeepSeek's RoPE in float32 whatever the module's dtype, so
its modules are the oracle of the semantics at the float32 tolerance (1e-5), and a float64 PyTorch
transcription of the same equations (checked against those modules here) is the oracle at 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.pipeline import run_passes
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import check_weights

# ops whose numpy reference this file checks against PyTorch / Hugging Face (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"moe", "mla"})
TOL32, TOL64 = 1e-5, 1e-10
ACTS = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu}


def f32(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float64))


def model(body: str, d: int, t: int = 5, b: int = 2):
    src = f"model m(B, T) {{\n  input x: f32[B, T, {d}]\n  output y = {body}\n}}\n"
    return run_passes(graph_from_source(src, {"B": b, "T": t}), ["shape-infer"])


def check(graph, weights, x, want: np.ndarray) -> None:
    check_weights(graph, weights)
    (err32, err64), = reference_errors(graph, weights, {"x": x}, {"y": want}).values()
    assert err32 <= TOL32, f"float32 reference off by {err32:.2e}"
    assert err64 <= TOL64, f"float64 reference off by {err64:.2e}"


# -- mixture of experts --------------------------------------------------------------------------------


def torch_moe(x, w, top_k, norm_topk=True, scale=1.0, act="silu", gated=True):
    """The routed FFN from Shazeer et al. / Mixtral / DeepSeekMoE in float64: softmax over every expert,
    the k largest, their probabilities (renormalised or not, scaled), a weighted sum of those experts."""
    xs = t64(x).reshape(-1, x.shape[-1])
    probs = torch.softmax(xs @ t64(w["router"]).T, dim=-1)
    top, idx = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        top = top / top.sum(-1, keepdim=True)
    top = top * scale
    f = ACTS[act]

    def ffn(rows, g, u, dn):
        return (f(rows @ g.T) * (rows @ u.T)) @ dn.T if u is not None else f(rows @ g.T) @ dn.T

    out = torch.zeros_like(xs)
    for i in range(xs.shape[0]):
        for j in range(top_k):
            e = int(idx[i, j])
            if gated:
                y = ffn(xs[i:i + 1], t64(w["w_gate"][e]), t64(w["w_up"][e]), t64(w["w_down"][e]))
            else:
                y = ffn(xs[i:i + 1], t64(w["w1"][e]), None, t64(w["w2"][e]))
            out[i] += top[i, j] * y[0]
    if "shared_gate" in w:
        out += ffn(xs, t64(w["shared_gate"]), t64(w["shared_up"]), t64(w["shared_down"]))
    return out.reshape(x.shape)


def moe_weights(rng, prefix: str, d: int, e: int, h: int, hs: int = 0, gated: bool = True) -> dict:
    w = {"router": f32(rng, e, d, scale=1.0)}
    if gated:
        w |= {"w_gate": f32(rng, e, h, d), "w_up": f32(rng, e, h, d), "w_down": f32(rng, e, d, h)}
    else:
        w |= {"w1": f32(rng, e, h, d), "w2": f32(rng, e, d, h)}
    if hs:
        w |= {"shared_gate": f32(rng, hs, d), "shared_up": f32(rng, hs, d), "shared_down": f32(rng, d, hs)}
    return {f"{prefix}.{k}": v for k, v in w.items()}


def unprefix(w: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1:]: v for k, v in w.items()}


def test_moe_matches_mixtral_sparse_moe_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    d, e, k, h = 16, 4, 2, 24
    rng = np.random.default_rng(0)
    w = moe_weights(rng, "y", d, e, h)
    x = f32(rng, 2, 5, d, scale=1.0)
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=d, intermediate_size=h, num_local_experts=e,
                                                num_experts_per_tok=k)).eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["y.router"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["y.w_gate"], w["y.w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["y.w_down"]))
        hf = block(torch.from_numpy(x)).numpy()
    ours = torch_moe(x, unprefix(w, "y"), k).numpy()
    assert rel_error(hf, ours) <= TOL32  # the float64 transcription is Mixtral's block
    graph = model(f"moe(x, experts={e}, top_k={k}, hidden={h})", d)
    check(graph, w, x, ours)


def test_moe_matches_deepseek_v2_moe():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    d, e, k, h, shared, scale = 16, 6, 3, 8, 2, 1.5
    rng = np.random.default_rng(1)
    w = moe_weights(rng, "y", d, e, h, hs=shared * h)
    x = f32(rng, 2, 5, d, scale=1.0)
    cfg = DeepseekV2Config(hidden_size=d, num_attention_heads=2, num_key_value_heads=2, moe_intermediate_size=h,
                           n_routed_experts=e, num_experts_per_tok=k,
                           n_shared_experts=shared, routed_scaling_factor=scale, topk_method="greedy")
    block = DeepseekV2Moe(cfg).eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["y.router"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["y.w_gate"], w["y.w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["y.w_down"]))
        for ours_name, theirs in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"),
                                  ("shared_down", "down_proj")):
            getattr(block.shared_experts, theirs).weight.copy_(torch.from_numpy(w[f"y.{ours_name}"]))
        hf = block(torch.from_numpy(x)).numpy()
    ours = torch_moe(x, unprefix(w, "y"), k, norm_topk=False, scale=scale).numpy()
    assert rel_error(hf, ours) <= TOL32
    graph = model(f"moe(x, experts={e}, top_k={k}, hidden={h}, shared={shared}, norm_topk=false, scale={scale})", d)
    check(graph, w, x, ours)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_moe_ungated_top1(act):
    """Switch-Transformer-style routing: one expert per token, plain two-matrix FFN experts."""
    d, e, h = 12, 5, 20
    rng = np.random.default_rng(2)
    w = moe_weights(rng, "y", d, e, h, gated=False)
    x = f32(rng, 2, 6, d, scale=1.0)
    graph = model(f"moe(x, experts={e}, top_k=1, hidden={h}, gated=false, act={act})", d, t=6)
    want = torch_moe(x, unprefix(w, "y"), 1, act=act, gated=False).numpy()
    check(graph, w, x, want)
    # with top_k=1 and renormalisation the weight is exactly 1: the output is the chosen expert's FFN alone
    probs = x.reshape(-1, d) @ w["y.router"].T
    assert len(set(np.argmax(probs, axis=-1).tolist())) > 1, "the case must route tokens to several experts"


# -- multi-head latent attention ---------------------------------------------------------------------------


def rope_pairs64(a: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on adjacent pairs, as DeepSeek's apply_rotary_emb (view_as_complex over the last axis)."""
    t, r = a.shape[-2:]
    inv = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    z = torch.view_as_complex(a.reshape(*a.shape[:-1], r // 2, 2).contiguous()) * torch.polar(torch.ones_like(ang), ang)
    return torch.view_as_real(z).flatten(-2)


def rms64(a, g, eps=1e-6):
    return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps) * g


def torch_mla(x, w, heads, kv_lora, rope, nope, v, q_lora=None, theta=10000.0, causal=True):
    """DeepSeek-V2's equations (section 2.1) in float64."""
    xt = t64(x)
    b, t, _ = xt.shape
    if q_lora is None:
        q = xt @ t64(w["wq"]).T
    else:
        q = rms64(xt @ t64(w["wq_a"]).T, t64(w["q_norm.gain"])) @ t64(w["wq_b"]).T
    q = q.view(b, t, heads, nope + rope).transpose(1, 2)
    lat = xt @ t64(w["wkv_a"]).T
    c, k_r = rms64(lat[..., :kv_lora], t64(w["kv_norm.gain"])), lat[..., kv_lora:]
    kv = (c @ t64(w["wkv_b"]).T).view(b, t, heads, nope + v).transpose(1, 2)
    k_r = rope_pairs64(k_r[:, None], theta).expand(b, heads, t, rope)
    qq = torch.cat([q[..., :nope], rope_pairs64(q[..., nope:], theta)], -1)
    kk = torch.cat([kv[..., :nope], k_r], -1)
    out = F.scaled_dot_product_attention(qq, kk, kv[..., nope:], is_causal=causal, scale=(nope + rope) ** -0.5)
    return out.transpose(1, 2).reshape(b, t, heads * v) @ t64(w["wo"]).T


def mla_weights(rng, d, heads, kv_lora, rope, nope, v, q_lora=None) -> dict:
    w = {"wkv_a": f32(rng, kv_lora + rope, d), "kv_norm.gain": 1 + f32(rng, kv_lora, scale=0.1),
         "wkv_b": f32(rng, heads * (nope + v), kv_lora), "wo": f32(rng, d, heads * v)}
    if q_lora is None:
        w["wq"] = f32(rng, heads * (nope + rope), d)
    else:
        w |= {"wq_a": f32(rng, q_lora, d), "q_norm.gain": 1 + f32(rng, q_lora, scale=0.1),
              "wq_b": f32(rng, heads * (nope + rope), q_lora)}
    return w


@pytest.mark.parametrize("q_lora", [None, 24])
def test_mla_matches_deepseek_v2_attention(q_lora):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding

    d, heads, kv_lora, rope, nope, v, t = 32, 4, 16, 8, 6, 10, 7
    rng = np.random.default_rng(3 if q_lora is None else 4)
    w = mla_weights(rng, d, heads, kv_lora, rope, nope, v, q_lora)
    x = f32(rng, 2, t, d, scale=1.0)
    cfg = DeepseekV2Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=heads, kv_lora_rank=kv_lora,
                           q_lora_rank=q_lora, qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v,
                           head_dim=rope, attention_bias=False)
    cfg._attn_implementation = "eager"
    attn = DeepseekV2Attention(cfg, 0).eval()
    names = {"wq": "q_proj", "wq_a": "q_a_proj", "wq_b": "q_b_proj", "wkv_a": "kv_a_proj_with_mqa",
             "wkv_b": "kv_b_proj", "wo": "o_proj", "q_norm.gain": "q_a_layernorm", "kv_norm.gain": "kv_a_layernorm"}
    with torch.no_grad():
        for ours_name, arr in w.items():
            getattr(attn, names[ours_name]).weight.copy_(torch.from_numpy(arr))
        xt = torch.from_numpy(x)
        freqs = DeepseekV2RotaryEmbedding(cfg)(xt, torch.arange(t)[None])
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        hf = attn(xt, attention_mask=mask, position_embeddings=freqs)[0].numpy()
    want = torch_mla(x, w, heads, kv_lora, rope, nope, v, q_lora).numpy()
    assert rel_error(hf, want) <= TOL32  # the float64 transcription is DeepSeek-V2's attention
    q = f", q_lora={q_lora}" if q_lora else ""
    graph = model(f"mla(x, heads={heads}, kv_lora={kv_lora}, rope_dim={rope}, nope_dim={nope}, v_dim={v}{q})", d, t=t)
    check(graph, {f"y.{k}": a for k, a in w.items()}, x, want)


def test_mla_bidirectional_differs_from_causal():
    d, heads, kv_lora, rope, nope, v = 16, 2, 8, 4, 4, 6
    rng = np.random.default_rng(5)
    w = mla_weights(rng, d, heads, kv_lora, rope, nope, v)
    x = f32(rng, 1, 6, d, scale=1.0)
    want = torch_mla(x, w, heads, kv_lora, rope, nope, v, causal=False).numpy()
    graph = model(f"mla(x, heads={heads}, kv_lora={kv_lora}, rope_dim={rope}, nope_dim={nope}, v_dim={v}, "
                  "causal=false)", d, t=6, b=1)
    check(graph, {f"y.{k}": a for k, a in w.items()}, x, want)
    assert rel_error(torch_mla(x, w, heads, kv_lora, rope, nope, v).numpy(), want) > 1e-3


# -- the CPU backend: moe's own kernels, mla through decompose -------------------------------------------

CPU_FAMILY = """
model experts_family(B, T) {
  input x: f32[B, T, 32]
  output y_mla = mla(x, heads=4, kv_lora=16, rope_dim=8, nope_dim=6, v_dim=10)
  output y_mla_q = mla(x, heads=2, kv_lora=12, rope_dim=4, nope_dim=8, v_dim=6, q_lora=20, window=3)
  output y_mixtral = moe(x, experts=4, top_k=2, hidden=24)
  output y_deepseek = moe(x, experts=6, top_k=3, hidden=8, shared=2, norm_topk=false, scale=1.5)
  output y_switch = moe(x, experts=5, top_k=1, hidden=16, gated=false, act=relu, shared=1, shared_hidden=12)
}
"""


def test_cpu_backend_matches_reference(tmp_path):
    from test_cpu_backend_helpers import assert_matches, build, random_inputs, random_weights, reference

    from irc.backends.cpu import compile_graph

    graph = build(CPU_FAMILY, B=2, T=9)
    weights = {k: v * 4 if v.ndim == 3 else v for k, v in random_weights(graph).items()}  # experts near unit size
    inputs = random_inputs(graph)
    fused = run_passes(graph, ["fuse"])  # as irc run --backend cpu does: decompose lowers mla
    assert {n.op for n in fused.nodes} >= {"moe", "rope"} and "mla" not in {n.op for n in fused.nodes}
    got = compile_graph(fused, cache_dir=tmp_path).run(weights, inputs)
    want = reference(graph, weights, inputs)
    assert_matches(got, want)
    assert all(np.abs(v).max() > 1e-2 for v in want.values())  # not a comparison of zeros
