"""Multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024): keys and values rebuilt from a small latent.

Per token, ``c = rmsnorm(x·W_kv_aᵀ[:d_c])`` (d_c = ``kv_lora``) and a shared RoPE key ``k_R = x·W_kv_aᵀ[d_c:]``
(d_R = ``rope_dim``, one for all heads) are what a decoder caches: d_c + d_R numbers per token and layer,
against 2·heads·d_head for multi-head attention (V2's 512 + 64 = 576 = the cache of GQA with 2.25 groups
of d_head 128). Each head's key is ``[c·W_kv_bᵀ (its nope_dim part) | RoPE(k_R)]`` and its value the
``v_dim`` part of c·W_kv_bᵀ; queries come from x directly (``wq``) or through their own latent of
``q_lora`` (``wq_a``, an RMSNorm, ``wq_b``). Scores are scaled by (nope_dim + rope_dim)^−½; RoPE pairs
adjacent features (x[2i], x[2i+1]), DeepSeek's layout. Weights (PyTorch [out, in]): ``wq [H·(n+r), d]``
or ``wq_a [q_lora, d]``, ``q_norm.gain``, ``wq_b [H·(n+r), q_lora]``; ``wkv_a [d_c + r, d]``,
``kv_norm.gain [d_c]``, ``wkv_b [H·(n+v), d_c]``, ``wo [d, H·v]``.
"""

from __future__ import annotations

from irc.ops.attention import ROPE_THETA, attention_pairs
from irc.ops.common import need_float, need_rank
from irc.ops.cost import SOFTMAX_PER_ELEMENT, CacheUse, Cost
from irc.ops.norm import rmsnorm_cost
from irc.ops.registry import LOWERED_FOR_CUDA, Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import GRAD_LOWERED
from irc.types import TensorType


def qk_dim(a) -> int:
    """Width of one head's query and key: its position-free part and its RoPE part."""
    return a["nope_dim"] + a["rope_dim"]


def mla_scale(a) -> float:
    """scale= when given, else (nope_dim + rope_dim)^−½, DeepSeek-V2's softmax scale."""
    return a["scale"] if a.get("scale") is not None else qk_dim(a) ** -0.5


def mla_theta(a) -> float:
    return a["rope_theta"] if a.get("rope_theta") is not None else ROPE_THETA


def _infer(a, ts):
    (x,) = ts
    need_rank(x, (3,), "queries [B, T, D]")
    need_float(x)
    if a["rope_dim"] % 2:
        raise ShapeError(f"rope_dim={a['rope_dim']} must be even: RoPE rotates pairs of features")
    if a["window"] is not None and not a["causal"]:
        raise ShapeError("window= slides the causal mask; it needs causal=true")
    return [x]


def _params(a, ts):
    d, h = ts[0].shape[-1], a["heads"]
    q_out = h * qk_dim(a)
    p = {}
    if a["q_lora"] is None:
        p["wq"] = (q_out, d)
    else:
        p.update({"wq_a": (a["q_lora"], d), "q_norm.gain": (a["q_lora"],), "wq_b": (q_out, a["q_lora"])})
    p.update({"wkv_a": (a["kv_lora"] + a["rope_dim"], d), "kv_norm.gain": (a["kv_lora"],),
              "wkv_b": (h * (a["nope_dim"] + a["v_dim"]), a["kv_lora"]), "wo": (d, h * a["v_dim"])})
    return p


def _pair_macs(a) -> int:
    """Multiply-adds of one (query, key) pair over all heads: the score and the value row."""
    return a["heads"] * (qk_dim(a) + a["v_dim"])


def _cost(node, ins, outs) -> Cost:
    a = node.attrs
    x = ins[0]
    b, t, d = x.shape
    n, h, r, c = b * t, a["heads"], a["rope_dim"], a["kv_lora"]
    q_out = h * qk_dim(a)
    q_macs = d * q_out if a["q_lora"] is None else a["q_lora"] * (d + q_out)
    cost = Cost().mac("linear", n * (q_macs + d * (c + r) + c * h * (a["nope_dim"] + a["v_dim"]) + h * a["v_dim"] * d))
    pairs = b * h * attention_pairs(a, ins)
    cost.mac("attention", pairs * (qk_dim(a) + a["v_dim"]))
    cost.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    cost.add("elementwise", pairs)  # the score scale
    latents = TensorType(x.dtype, (n, c + (a["q_lora"] or 0)))  # the latents' RMSNorms, as rmsnorm counts them
    cost.flops["norm"] = cost.flops.get("norm", 0) + rmsnorm_cost({"affine": True}, [], [latents]).total
    return cost.add("elementwise", 3 * n * (h * r + r))  # RoPE on each head's query and the shared key


def _kv_cache(node, ins) -> CacheUse | None:
    """The latent c (kv_lora numbers) and the shared RoPE key (rope_dim) per token: what MLA saves."""
    a = node.attrs
    if not a["causal"]:
        return None
    return CacheUse(a["kv_lora"] + a["rope_dim"], 2 * _pair_macs(a), a.get("window"))


def _internal(a, ts) -> int:
    """The latents, every head's q, k and v, the context and the full score matrix (unfused)."""
    b, t, _ = ts[0].shape
    n, h = b * t, a["heads"]
    latents = n * (a["kv_lora"] + a["rope_dim"] + (a["q_lora"] or 0))
    return latents + n * h * (2 * qk_dim(a) + 2 * a["v_dim"]) + b * h * t * t


def _init(a) -> dict[str, str]:
    """normal(0, 0.02) for the projections, ones for the latents' RMSNorm gains."""
    return {"wq": "normal", "wq_a": "normal", "wq_b": "normal", "wkv_a": "normal", "wkv_b": "normal",
            "wo": "normal", "q_norm.gain": "ones", "kv_norm.gain": "ones"}


register(OpDef(
    "mla", ("x",),
    (
        Attr("heads", "posint"),
        Attr("kv_lora", "posint", doc="d_c: the cached key/value latent's width"),
        Attr("rope_dim", "posint", 64, doc="d_R: the shared RoPE key's width (and each query's RoPE part)"),
        Attr("nope_dim", "posint", 128, doc="each head's position-free query/key width"),
        Attr("v_dim", "posint", 128, doc="each head's value width"),
        Attr("q_lora", "posint", None, doc="queries through a latent of this width (none: one projection)"),
        Attr("causal", "bool", True),
        Attr("window", "posint", None, doc="sliding window over the causal mask"),
        Attr("scale", "float", None, doc="score scale; default (nope_dim + rope_dim)^-1/2"),
        Attr("rope_theta", "float", None, doc="default 10000"),
        Attr("eps", "float", 1e-6, doc="the latents' RMSNorm epsilon"),
    ),
    _infer, _params, aliases=("latent_attention",),
    doc="DeepSeek-V2's multi-head latent attention: keys and values rebuilt per head from a cached latent",
    cost=_cost, init=_init, internal=_internal, receptive=rf_reset("mixes every position it attends to"),
    classes=frozenset({"attention", "learned"}), depth=2, kv_cache=_kv_cache,
    na={"grad": GRAD_LOWERED, "cuda": LOWERED_FOR_CUDA,
        "cpu": "the fuse pass (irc run's default for the CPU backend) lowers it through decompose to gemm, rmsnorm, "
               "rope and attention's matmuls before the CPU backend renders; with --no-fuse it has no kernel"},
))
