"""moe's gradient (irc/ops/grad_moe.py: the ``moe_grad`` primitive its vjp emits) against torch.autograd.

Oracles: Hugging Face's MixtralSparseMoeBlock (renormalised top-k, SwiGLU experts) and DeepseekV2Moe
(unnormalised, scaled top-k, shared experts) differentiated by torch.autograd in float32, every gradient
(x, the router, each expert matrix, the shared ones, the target) within 1e-5 of its largest entry. Their
routers compute in float32 whatever the module's dtype, so the float64 oracle (1e-10) is torch.autograd
through a float64 transcription of the same equations, itself checked against the modules' gradients and
against tests/test_ops_experts.py's forward. Then central differences of irc's own float64 forward, a
shared (tied) layer whose gradient sums its two uses, the CPU backend's kernel against the NumPy reference,
and two Mixtral decoder blocks of the standard library against torch.autograd.

Routing ties: top-k has no gradient but flips at a tie, so each case checks that no token's k-th and
(k+1)-th router probabilities lie within 1e-4 of each other, relatively (float32 and float64 then choose alike).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import cpu_cache
from test_grad_ops import central_differences
from test_ops_experts import ACTS, f32, model, moe_weights, t64, torch_moe, unprefix

import irc.ops.grad_moe  # noqa: F401  (registers moe_grad)
from irc.backends.numpy_ref import run_graph
from irc.ops import OPS
from irc.passes.grad import attach_loss, grad_label
from irc.pipeline import load_graph, run_passes
from irc.runtime.compare import rel_error
from irc.runtime.weights import expected_weights

# the backward primitive this file checks against torch.autograd (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"moe_grad"})
TOL32, TOL64 = 1e-5, 1e-10
_ = cpu_cache  # a fixture, used by name below
TORCH_ACTS = {**ACTS, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}


def no_near_ties(x: np.ndarray, router: np.ndarray, k: int, gap: float = 1e-4) -> None:
    """Every token's k-th and (k+1)-th router probabilities differ by more than ``gap`` of the k-th (float32's
    softmax is good to about 1e-7 of each probability)."""
    p = torch.softmax(t64(x).reshape(-1, x.shape[-1]) @ t64(router).T, dim=-1)
    s = torch.sort(p, dim=-1, descending=True).values
    if k < s.shape[1]:
        gaps = (s[:, k - 1] - s[:, k]) / s[:, k - 1]
        assert float(gaps.min()) > gap, "a near tie in the routing: pick another seed"


def moe64(x: torch.Tensor, w: dict[str, torch.Tensor], k: int, norm_topk: bool = True, scale: float = 1.0,
          act: str = "silu", gated: bool = True) -> torch.Tensor:
    """Mixtral's / DeepSeekMoE's equations, differentiable: softmax over every expert, the top k (no gradient
    through the choice), every expert on every token, the chosen k gathered and weighted, the shared FFN."""
    d = x.shape[-1]
    xs = x.reshape(-1, d)
    top, idx = torch.topk(torch.softmax(xs @ w["router"].T, dim=-1), k, dim=-1)
    if norm_topk:
        top = top / top.sum(-1, keepdim=True)
    top = top * scale
    f = TORCH_ACTS[act]
    if gated:
        hid = f(torch.einsum("nd,ehd->neh", xs, w["w_gate"])) * torch.einsum("nd,ehd->neh", xs, w["w_up"])
        outs = torch.einsum("neh,edh->ned", hid, w["w_down"])
    else:
        outs = torch.einsum("neh,edh->ned", f(torch.einsum("nd,ehd->neh", xs, w["w1"])), w["w2"])
    y = (top[..., None] * torch.gather(outs, 1, idx[..., None].expand(-1, -1, d))).sum(1)
    if "shared_gate" in w:
        y = y + (f(xs @ w["shared_gate"].T) * (xs @ w["shared_up"].T)) @ w["shared_down"].T
    if "shared_w1" in w:
        y = y + f(xs @ w["shared_w1"].T) @ w["shared_w2"].T
    return y.reshape(x.shape)


def leaf(a: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=True)


def torch_grads(fn, x: np.ndarray, target: np.ndarray, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """torch.autograd of mse(fn(x, w), target) in float64: {"x", "target", each weight name: gradient}."""
    tx, tt = leaf(x), leaf(target)
    tw = {k: leaf(v) for k, v in w.items()}
    F.mse_loss(fn(tx, tw), tt).backward()
    return {"x": tx.grad.numpy(), "target": tt.grad.numpy(), **{k: v.grad.numpy() for k, v in tw.items()}}


def irc_grads(body: str, d: int, w: dict[str, np.ndarray], x: np.ndarray, target: np.ndarray, dtype,
              t: int = 5, b: int = 2) -> dict[str, np.ndarray]:
    """The grad pass on ``output y = body`` under mse, run by the NumPy reference; keyed as torch_grads."""
    graph = run_passes(attach_loss(model(body, d, t=t, b=b), "mse"), ["grad"])
    assert "moe_grad" in {n.op for n in graph.nodes}
    out = run_graph(graph, {f"y.{k}": v for k, v in w.items()}, {"x": x, "targets": target}, dtype=dtype)
    grads = {"x": out["grad_x"], "target": out["grad_targets"]}
    return grads | {k: out[f"grad_y_{k}"] for k in w}


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float, what: str) -> None:
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    errors = {k: rel_error(got[k], want[k]) for k in want}
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, f"{what}: gradients off (relative to the largest entry) by {bad}"
    assert all(np.abs(v).max() > 0 for v in want.values()), "a zero gradient checks nothing"


def check_both(body: str, d: int, w: dict[str, np.ndarray], x: np.ndarray, target: np.ndarray, fn) -> None:
    """irc's float64 gradients against torch.autograd through ``fn`` in float64 (1e-10), float32 ones at 1e-5."""
    want = torch_grads(fn, x, target, w)
    assert_close(irc_grads(body, d, w, x, target, np.float64), want, TOL64, "float64")
    assert_close(irc_grads(body, d, w, x, target, np.float32), want, TOL32, "float32")


def test_moe64_is_the_forward_of_test_ops_experts():
    """The differentiable transcription computes what the forward's oracle (checked against HF) computes."""
    d, e, k, h = 10, 5, 2, 7
    rng = np.random.default_rng(10)
    for kw, hs in (({}, 0), ({"norm_topk": False, "scale": 2.0}, 2 * h)):
        w = unprefix(moe_weights(rng, "y", d, e, h, hs=hs), "y")
        x = f32(rng, 2, 3, d, scale=1.0)
        got = moe64(t64(x), {n: t64(v) for n, v in w.items()}, k, **kw)
        assert rel_error(torch_moe(x, w, k, **kw).numpy(), got.detach().numpy()) <= 1e-14


def test_mixtral_sparse_moe_block_gradients():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    d, e, k, h = 16, 4, 2, 24
    rng = np.random.default_rng(0)
    w = unprefix(moe_weights(rng, "y", d, e, h), "y")
    x, target = f32(rng, 2, 5, d, scale=1.0), f32(rng, 2, 5, d)
    no_near_ties(x, w["router"], k)
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=d, intermediate_size=h, num_local_experts=e,
                                                num_experts_per_tok=k)).eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["w_down"]))
    tx, tt = leaf(x, torch.float32), leaf(target, torch.float32)
    F.mse_loss(block(tx), tt).backward()
    gate_up = block.experts.gate_up_proj.grad.numpy()
    hf = {"x": tx.grad.numpy(), "target": tt.grad.numpy(), "router": block.gate.weight.grad.numpy(),
          "w_gate": gate_up[:, :h], "w_up": gate_up[:, h:], "w_down": block.experts.down_proj.grad.numpy()}
    body = f"moe(x, experts={e}, top_k={k}, hidden={h})"
    assert_close(irc_grads(body, d, w, x, target, np.float32), hf, TOL32, "float32 against HF")
    fn = lambda tx, tw: moe64(tx, tw, k)  # noqa: E731
    assert_close(torch_grads(fn, x, target, w), hf, TOL32, "the float64 transcription against HF")
    check_both(body, d, w, x, target, fn)


def test_deepseek_v2_moe_gradients():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    d, e, k, h, shared, scale = 16, 6, 3, 8, 2, 1.5
    rng = np.random.default_rng(1)
    w = unprefix(moe_weights(rng, "y", d, e, h, hs=shared * h), "y")
    x, target = f32(rng, 2, 5, d, scale=1.0), f32(rng, 2, 5, d)
    no_near_ties(x, w["router"], k)
    cfg = DeepseekV2Config(hidden_size=d, num_attention_heads=2, num_key_value_heads=2, moe_intermediate_size=h,
                           n_routed_experts=e, num_experts_per_tok=k,
                           n_shared_experts=shared, routed_scaling_factor=scale, topk_method="greedy")
    block = DeepseekV2Moe(cfg).eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["w_down"]))
        for ours, theirs in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"), ("shared_down", "down_proj")):
            getattr(block.shared_experts, theirs).weight.copy_(torch.from_numpy(w[ours]))
    tx, tt = leaf(x, torch.float32), leaf(target, torch.float32)
    F.mse_loss(block(tx), tt).backward()
    gate_up = block.experts.gate_up_proj.grad.numpy()
    hf = {"x": tx.grad.numpy(), "target": tt.grad.numpy(), "router": block.gate.weight.grad.numpy(),
          "w_gate": gate_up[:, :h], "w_up": gate_up[:, h:], "w_down": block.experts.down_proj.grad.numpy()}
    hf |= {ours: getattr(block.shared_experts, theirs).weight.grad.numpy()
           for ours, theirs in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"), ("shared_down", "down_proj"))}
    body = f"moe(x, experts={e}, top_k={k}, hidden={h}, shared={shared}, norm_topk=false, scale={scale})"
    assert_close(irc_grads(body, d, w, x, target, np.float32), hf, TOL32, "float32 against HF")
    fn = lambda tx, tw: moe64(tx, tw, k, norm_topk=False, scale=scale)  # noqa: E731
    assert_close(torch_grads(fn, x, target, w), hf, TOL32, "the float64 transcription against HF")
    check_both(body, d, w, x, target, fn)


def _plain_weights(rng, d: int, e: int, h: int, hs: int) -> dict[str, np.ndarray]:
    w = unprefix(moe_weights(rng, "y", d, e, h, gated=False), "y")
    return w | ({"shared_w1": f32(rng, hs, d), "shared_w2": f32(rng, d, hs)} if hs else {})


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_ungated_experts(act):
    """Plain two-matrix experts, Switch-style top 1 (its renormalised weight is exactly 1: the router gets no
    gradient through it) and top 2 with a shared FFN of its own width, renormalised and scaled."""
    d, e, h = 12, 5, 10
    rng = np.random.default_rng(2)
    x, target = f32(rng, 2, 5, d, scale=1.0), f32(rng, 2, 5, d)
    w = _plain_weights(rng, d, e, h, 0)
    no_near_ties(x, w["router"], 1)
    body = f"moe(x, experts={e}, top_k=1, hidden={h}, gated=false, act={act})"
    got = irc_grads(body, d, w, x, target, np.float64)
    assert np.abs(got["router"]).max() <= 1e-12  # d(p/p)/dp = 0: top 1 renormalised passes nothing to the router
    want = torch_grads(lambda tx, tw: moe64(tx, tw, 1, act=act, gated=False), x, target, w)
    want_router = want.pop("router")
    assert np.abs(want_router).max() <= 1e-12
    assert_close({k: v for k, v in got.items() if k != "router"}, want, TOL64, "top 1")
    w = _plain_weights(rng, d, e, h, 12)
    no_near_ties(x, w["router"], 2)
    body = f"moe(x, experts={e}, top_k=2, hidden={h}, gated=false, act={act}, shared=1, shared_hidden=12, scale=0.7)"
    check_both(body, d, w, x, target, lambda tx, tw: moe64(tx, tw, 2, scale=0.7, act=act, gated=False))


def test_an_expert_no_token_chooses():
    """Three tokens, top 2 of 8 experts: at least two experts get no token, and zero gradients; the others'
    are still exact."""
    d, e, k, h = 8, 8, 2, 5
    rng = np.random.default_rng(3)
    w = unprefix(moe_weights(rng, "y", d, e, h), "y")
    x, target = f32(rng, 1, 3, d, scale=1.0), f32(rng, 1, 3, d)
    no_near_ties(x, w["router"], k)
    chosen = torch.topk(t64(x).reshape(-1, d) @ t64(w["router"]).T, k, dim=-1).indices
    unused = sorted(set(range(e)) - set(chosen.flatten().tolist()))
    assert len(unused) >= 2
    got = irc_grads(f"moe(x, experts={e}, top_k={k}, hidden={h})", d, w, x, target, np.float64, t=3, b=1)
    for name in ("w_gate", "w_up", "w_down"):
        assert not got[name][unused].any() and got[name][chosen[0, 0].item()].any()
    assert_close(got, torch_grads(lambda tx, tw: moe64(tx, tw, k), x, target, w), TOL64, "unused experts")


def _source(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.arch"
    path.write_text(text, encoding="utf-8")
    return path


def test_central_differences(tmp_path: Path):
    """(L(θ + h) − L(θ − h))/2h of irc's own float64 forward on a tiny layer with every part: renormalised
    and scaled top 2, a shared FFN."""
    graph = load_graph(_source(tmp_path, "model m() {\n  input x: f32[1, 3, 6]\n"
                                         "  output y = moe(x, experts=4, top_k=2, hidden=5, shared=1, scale=1.3)\n}\n"))
    assert central_differences(attach_loss(graph, "mse"), 4) >= 4 * 7


def test_a_shared_layer_accumulates_both_uses(tmp_path: Path):
    """One moe instance applied twice (e(e(x))): one gradient per weight, the sum of both uses'."""
    d, e, k, h = 8, 4, 2, 6
    graph = load_graph(_source(tmp_path, f"model m() {{\n  input x: f32[2, 3, {d}]\n"
                                         f"  e = moe(experts={e}, top_k={k}, hidden={h})\n  output y = e(e(x))\n}}\n"))
    step = run_passes(attach_loss(graph, "mse"), ["grad"])
    assert sum(n.op == "moe_grad" for n in step.nodes) == 2
    rng = np.random.default_rng(4)
    w = unprefix(moe_weights(rng, "e", d, e, h), "e")
    x, target = f32(rng, 2, 3, d, scale=1.0), f32(rng, 2, 3, d)
    no_near_ties(x, w["router"], k)
    out = run_graph(step, {f"e.{n}": v for n, v in w.items()}, {"x": x, "targets": target}, dtype=np.float64)
    want = torch_grads(lambda tx, tw: moe64(moe64(tx, tw, k), tw, k), x, target, w)
    got = {"x": out["grad_x"], "target": out["grad_targets"]} | {n: out[grad_label(f"e.{n}", set())] for n in w}
    assert_close(got, want, TOL64, "a shared layer")


def test_moe_grad_cost_counts_the_routed_experts_twice():
    """The backward's MACs: each product of the router, the k routed experts and the shared ones twice, and
    k·h per token for the routed weights' gradients; against the forward's own count."""
    d, e, k, h, hs = 16, 6, 3, 8, 16
    graph = run_passes(attach_loss(model(f"moe(x, experts={e}, top_k={k}, hidden={h}, shared=2)", d), "mse"),
                       ["grad"])
    types = graph.value_types()
    (node,) = [n for n in graph.nodes if n.op == "moe_grad"]
    (fwd,) = [n for n in graph.nodes if n.op == "moe"]
    ins = [types[v] for v in node.inputs]
    cost = OPS["moe_grad"].cost(node, ins, [types[v] for v in node.outputs])
    forward = OPS["moe"].cost(fwd, ins[:1], [types[fwd.outputs[0]]])
    n = 2 * 5
    assert forward.macs == n * (e * d + (k * h + hs) * 3 * d)
    assert cost.macs == 2 * forward.macs + n * k * h


# -- the CPU backend's moe_grad against the NumPy reference -------------------------------------------------

CPU_CASES = {
    "mixtral": "moe(x, experts=4, top_k=2, hidden=24)",
    "deepseek": "moe(x, experts=6, top_k=3, hidden=8, shared=2, norm_topk=false, scale=1.5)",
    "switch_shared_plain": "moe(x, experts=5, top_k=1, hidden=16, gated=false, act=relu, shared=1, shared_hidden=12, "
                           "norm_topk=false)",  # Switch: the top probability as it is (renormalised it is 1)
    "plain_gelu_tanh": "moe(x, experts=5, top_k=2, hidden=16, gated=false, act=gelu_tanh, scale=0.7)",
    "gated_gelu_shared": "moe(x, experts=8, top_k=3, hidden=12, act=gelu, shared=1, shared_hidden=20)",
}


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_cpu_backend_moe_grad_matches_reference(cpu_cache, case: str):
    """The training step (forward, moe_grad) compiled by the CPU backend, float32, against the NumPy reference
    in float64: the loss and every gradient within 1e-5 of its largest entry."""
    from test_cpu_backend_helpers import build, random_inputs, random_weights, reference

    from irc.backends.cpu import compile_graph

    source = f"model m() {{\n  input x: f32[3, 7, 32]\n  y = {CPU_CASES[case]}\n  output loss = mse(y * y, y)\n}}\n"
    step = run_passes(build(source), ["grad"])
    assert "moe_grad" in {n.op for n in step.nodes}
    weights = {k: v * 4 if v.ndim == 3 else v for k, v in random_weights(step).items()}  # experts near unit size
    inputs = random_inputs(step)
    key = next(k for k in weights if k.endswith(".router"))
    no_near_ties(inputs["x"], weights[key], int(step.nodes[1].attrs["top_k"]))
    want = reference(step, weights, inputs)
    got = compile_graph(step, cache_dir=cpu_cache).run(weights, inputs)
    assert sorted(got) == sorted(want)
    errors = {label: rel_error(got[label], want[label]) for label in want}
    assert not {k: e for k, e in errors.items() if not e <= TOL32}, errors
    assert all(np.abs(v).max() > 1e-6 for v in want.values()), "a zero gradient checks nothing"


# -- a whole model: two Mixtral decoder blocks of the standard library against HF's MixtralForCausalLM ---------

TINY_MIXTRAL = """use "transformer.arch"
model tiny_mixtral(B, T) {
  input tokens: i32[B, T]
  embed_tokens = embedding(50, 16)
  x = repeat(2) mixtral_decoder(embed_tokens(tokens), heads=4, kv_heads=2, ff=24, experts=4, top_k=2, eps=1e-5,
                                rope_theta=10000)
  norm = rmsnorm(x, eps=1e-5)
  lm_head = unembed(norm, 50)
  output logits = lm_head
}
"""


def _hf_name(key: str) -> str:
    """irc's weight key -> MixtralForCausalLM's parameter (the expert matrices are handled by the caller)."""
    if key.startswith("mixtral_decoder."):
        _, i, rest = key.split(".", 2)
        rest = {"attn_norm.gain": "input_layernorm.weight", "ffn_norm.gain": "post_attention_layernorm.weight",
                "moe.router": "mlp.gate.weight"}.get(rest) or f"self_attn.{rest[-1]}_proj.weight"
        return f"model.layers.{i}.{rest}"
    return {"embed_tokens.weight": "model.embed_tokens.weight", "norm.gain": "model.norm.weight",
            "lm_head.weight": "lm_head.weight"}[key]


def test_two_mixtral_blocks_against_hf_mixtral(tmp_path: Path):
    """Cross-entropy of a 2-layer MixtralForCausalLM (GQA attention with RoPE, RMSNorm, 4 experts top 2): every
    weight's gradient from the grad pass (float64 and float32 NumPy reference) against torch.autograd through
    HF's model in float64 (its router in float32: 1e-5)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    graph = load_graph(_source(tmp_path, TINY_MIXTRAL), {"B": 2, "T": 6})
    step = run_passes(attach_loss(graph, "cross_entropy"), ["grad"])
    assert sum(n.op == "moe_grad" for n in step.nodes) == 2
    rng = np.random.default_rng(6)
    weights = {k: ((1 + 0.1 * rng.standard_normal(shape)) if k.endswith("gain") else 0.3 * rng.standard_normal(shape))
               .astype(np.float32) for k, shape in expected_weights(graph).items()}
    tokens, targets = rng.integers(0, 50, (2, 6)), rng.integers(0, 50, (2, 6))
    cfg = MixtralConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the loop over experts (grouped_mm takes no float64)
    hf = MixtralForCausalLM(cfg).double().eval()
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for key, value in weights.items():
            if key.endswith((".w_gate", ".w_up", ".w_down")):
                continue
            params[_hf_name(key)].copy_(torch.from_numpy(value))
        for i in range(2):
            w = {n: weights[f"mixtral_decoder.{i}.moe.{n}"] for n in ("w_gate", "w_up", "w_down")}
            experts = hf.model.layers[i].mlp.experts
            experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
            experts.down_proj.copy_(torch.from_numpy(w["w_down"]))
    out = hf(torch.from_numpy(tokens), output_router_logits=True)
    for logits in out.router_logits:  # no near ties in either layer's routing
        p = torch.softmax(logits.detach().double(), dim=-1).sort(dim=-1, descending=True).values
        assert float(((p[:, 1] - p[:, 2]) / p[:, 1]).min()) > 1e-4
    F.cross_entropy(out.logits.reshape(-1, 50), torch.from_numpy(targets).reshape(-1)).backward()
    want = {}
    for key in weights:
        if key.endswith((".w_gate", ".w_up", ".w_down")):
            i, h = key.split(".")[1], 24
            experts = hf.model.layers[int(i)].mlp.experts
            g = experts.down_proj.grad if key.endswith("w_down") else experts.gate_up_proj.grad
            want[key] = (g if key.endswith("w_down") else g[:, :h] if key.endswith("w_gate") else g[:, h:]).numpy()
        else:
            want[key] = params[_hf_name(key)].grad.numpy()
    for dtype in (np.float64, np.float32):
        got = run_graph(step, weights, {"tokens": tokens, "targets": targets}, dtype=dtype)
        assert_close({k: got[grad_label(k, set())] for k in weights}, want, TOL32, f"{np.dtype(dtype)} tiny Mixtral")
