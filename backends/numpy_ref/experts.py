"""Mixture of experts and multi-head latent attention (irc/ops/moe.py, irc/ops/mla.py), as written there.

Both follow Hugging Face's Mixtral / DeepSeek-V2 modules, the tests' oracles: the router's softmax is taken
over every expert before the top k are chosen, and MLA's RoPE pairs adjacent features.
"""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.attention import sdpa
from irc.backends.numpy_ref.dense import affine
from irc.backends.numpy_ref.elementwise import ACT, softmax
from irc.backends.numpy_ref.norm import rmsnorm
from irc.graph import Node
from irc.ops.mla import mla_scale, mla_theta, qk_dim


def route(x2: np.ndarray, router: np.ndarray, top_k: int, norm_topk: bool, scale: float
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per token row: the indices of its top_k experts (the largest router probabilities; the lower index
    first on a tie) and their weights."""
    probs = softmax(affine(x2, router), axis=-1)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if norm_topk:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen, weights * weights.dtype.type(scale)


def expert_weight(w: dict, name: str, e: int | None) -> np.ndarray:
    """Matrix ``name`` (gate, up, down, w1 or w2) of routed expert ``e``, or of the shared experts (None)."""
    if e is None:
        return w[f"shared_{name}"]
    return w[name if name in ("w1", "w2") else f"w_{name}"][e]


def _expert(x: np.ndarray, a: dict, w: dict, e: int | None) -> np.ndarray:
    """One expert's FFN on the rows x."""
    act = ACT[a["act"]]
    if a["gated"]:
        hidden = act(affine(x, expert_weight(w, "gate", e))) * affine(x, expert_weight(w, "up", e))
        return affine(hidden, expert_weight(w, "down", e))
    return affine(act(affine(x, expert_weight(w, "w1", e))), expert_weight(w, "w2", e))


def moe(node: Node, args, w):
    a = node.attrs
    x = args[0]
    x2 = x.reshape(-1, x.shape[-1])
    chosen, weights = route(x2, w["router"], a["top_k"], a["norm_topk"], a["scale"])
    out = np.zeros_like(x2)
    for e in range(a["experts"]):
        rows, slot = np.nonzero(chosen == e)  # the tokens routed to e, and where e sits in their top k
        if rows.size:
            out[rows] += weights[rows, slot, None] * _expert(x2[rows], a, w, e)
    if any(k.startswith("shared_") for k in w):
        out += _expert(x2, a, w, None)
    return out.reshape(x.shape)


def rope_pairs(x: np.ndarray, theta: float) -> np.ndarray:
    """RoPE on [..., T, r] rotating adjacent pairs (x[2i], x[2i+1]) by p·theta^(−2i/r): DeepSeek's layout."""
    t, r = x.shape[-2:]
    freq = theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    angle = np.arange(t, dtype=np.float64)[:, None] * freq[None, :]  # [T, r/2]
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def mla(node: Node, args, w):
    a = node.attrs
    x = args[0]
    b, t, _ = x.shape
    h, n, r, c, v = a["heads"], a["nope_dim"], a["rope_dim"], a["kv_lora"], a["v_dim"]
    if a["q_lora"] is None:
        q = affine(x, w["wq"])
    else:
        q = affine(rmsnorm(affine(x, w["wq_a"]), w["q_norm.gain"], a["eps"]), w["wq_b"])
    q = q.reshape(b, t, h, qk_dim(a)).transpose(0, 2, 1, 3)  # [B, H, T, n + r]
    latent = affine(x, w["wkv_a"])
    ckv = rmsnorm(latent[..., :c], w["kv_norm.gain"], a["eps"])
    k_rope = rope_pairs(latent[:, None, :, c:], mla_theta(a))  # [B, 1, T, r]
    kv = affine(ckv, w["wkv_b"]).reshape(b, t, h, n + v).transpose(0, 2, 1, 3)
    q = np.concatenate([q[..., :n], rope_pairs(q[..., n:], mla_theta(a))], axis=-1)
    k = np.concatenate([kv[..., :n], np.broadcast_to(k_rope, (b, h, t, r))], axis=-1)
    ctx = sdpa(q, k, kv[..., n:], causal=a["causal"], scale=mla_scale(a), window=a["window"])
    return affine(ctx.transpose(0, 2, 1, 3).reshape(b, t, h * v), w["wo"])


OPS = {"moe": moe, "mla": mla}
