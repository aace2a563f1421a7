"""sdpa_grad (irc/ops/grad_attention.py) in float64-exact NumPy: the attention core's backward with the whole
score matrix (the reference may hold it; the CPU kernel recomputes it tile by tile)."""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.attention import hidden_keys
from irc.backends.numpy_ref.elementwise import softmax
from irc.graph import Node


def sdpa_grad(node: Node, args, w):
    """P = softmax(q·kᵀ·scale [causal]); dv = Pᵀ·dy, dS = P·(dy·vᵀ − Σ_j P·dy·vᵀ), dq = scale·dS·k,
    dk = scale·dSᵀ·q; query head h reads kv head h // (H/G), so a kv head's gradients sum over its group."""
    q, k, v, o, dy = args
    a = node.attrs
    heads, groups = q.shape[1], k.shape[1]
    rep = heads // groups
    kk, vv = (np.repeat(t, rep, axis=1) if rep > 1 else t for t in (k, v))
    scale = q.dtype.type(a["scale"])
    scores = (q @ np.swapaxes(kk, -1, -2)) * scale
    if a["causal"]:
        scores = np.where(hidden_keys(*scores.shape[-2:], a.get("window")), -np.inf, scores)
    p = softmax(scores, axis=-1)
    dp = dy @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dq = (ds @ kk) * scale
    dk = (np.swapaxes(ds, -1, -2) @ q) * scale
    dv = np.swapaxes(p, -1, -2) @ dy

    def fold(g: np.ndarray, like: np.ndarray) -> np.ndarray:
        """Sum each kv head's group of query heads, and the query batches one kv batch serves."""
        g = g.reshape(g.shape[0], groups, rep, *g.shape[2:]).sum(axis=2)
        return g.sum(axis=0, keepdims=True) if like.shape[0] == 1 and g.shape[0] > 1 else g

    return dq, fold(dk, k).astype(k.dtype), fold(dv, v).astype(v.dtype)


OPS = {"sdpa_grad": sdpa_grad}
