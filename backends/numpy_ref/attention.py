"""Multi-head attention: projections, GQA/MQA, RoPE, T5 relative bias, causal mask."""

from __future__ import annotations

import math

import numpy as np

from irc.backends.numpy_ref.dense import affine
from irc.backends.numpy_ref.elementwise import softmax
from irc.graph import Node
from irc.ops.attention import REL_TABLE, kv_heads, rel_max_distance, rope_theta, score_scale


def hidden_keys(t: int, s: int, window: int | None = None) -> np.ndarray:
    """[T, S] True where the causal mask hides key j from query i: j > i, or j <= i − window."""
    j, i = np.arange(s)[None, :], np.arange(t)[:, None]
    hidden = j > i
    if window is not None:
        hidden |= j <= i - window
    return hidden


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False, scale: float | None = None,
         bias: np.ndarray | None = None, window: int | None = None) -> np.ndarray:
    """softmax(q·kᵀ·scale + bias [+ mask])·v on [B, H, T, hd] / [B, G, S, hd] with G dividing H.

    Query head h reads kv head h // (H/G) (PyTorch's ``enable_gqa``). The causal mask hides
    key j > i (top-left aligned), and with a sliding ``window`` also j <= i − window; a row
    with every key hidden outputs zeros.
    """
    heads, groups = q.shape[1], k.shape[1]
    if groups != heads:
        k = np.repeat(k, heads // groups, axis=1)
        v = np.repeat(v, heads // groups, axis=1)
    scale = score_scale({"scale": scale}, q.shape[-1])  # None: the layer's default
    scores = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    if bias is not None:
        scores = scores + bias
    if causal:
        scores = np.where(hidden_keys(*scores.shape[-2:], window), -np.inf, scores)
    return softmax(scores, axis=-1) @ v


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotate [B, H, T, hd] by position: pairs (x[..., i], x[..., i + hd/2]) at angle p·theta^(−2i/hd)."""
    t, hd = x.shape[-2:]
    freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    angle = np.arange(t, dtype=np.float64)[:, None] * freq[None, :]  # [T, hd/2]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1).astype(x.dtype)
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1).astype(x.dtype)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def t5_buckets(t: int, s: int, buckets: int, max_distance: int, bidirectional: bool) -> np.ndarray:
    """T5's bucket of the relative position j − i for every (query i, key j): [T, S] ints."""
    rel = np.arange(s)[None, :] - np.arange(t)[:, None]
    out = np.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out += (rel > 0) * buckets
        n = np.abs(rel)
    else:
        n = -np.minimum(rel, 0)
    exact = buckets // 2
    safe = np.maximum(n, 1).astype(np.float64)  # log is only read where n >= exact
    large = exact + (np.log(safe / exact) / math.log(max_distance / exact) * (buckets - exact)).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    return out + np.where(n < exact, n, large)


def rel_bias(table: np.ndarray, t: int, s: int, buckets: int, max_distance: int, bidirectional: bool) -> np.ndarray:
    """[1, H, T, S]: the table's row for the bucket of j − i, for every head."""
    return np.moveaxis(table[t5_buckets(t, s, buckets, max_distance, bidirectional)], -1, 0)[None]


def rel_position_bias(node: Node, args, w):
    a = node.attrs
    k = args[1] if len(args) > 1 else args[0]
    return rel_bias(w["weight"], args[0].shape[1], k.shape[1], a["buckets"], a["max_distance"], a["bidirectional"])


def _bias_4d(bias: np.ndarray) -> np.ndarray:
    return bias.reshape((1,) * (4 - bias.ndim) + bias.shape)


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    b, t, _ = x.shape
    return x.reshape(b, t, n, -1).transpose(0, 2, 1, 3)  # [B, n, T, hd]


def attention(node: Node, args, w):
    a = node.attrs
    x = args[0]
    kv = args[1] if len(args) > 1 else x
    heads = a["heads"]
    groups = kv_heads(a)
    q = _heads(affine(x, w["wq"], w.get("bq")), heads)
    k = _heads(affine(kv, w["wk"], w.get("bk")), groups)
    v = _heads(affine(kv, w["wv"], w.get("bv")), groups)
    if a.get("rope"):
        theta = rope_theta(a)
        q, k = rope(q, theta), rope(k, theta)
    bias = _bias_4d(args[2]) if len(args) > 2 else None
    if a.get("rel_buckets") is not None:
        table = rel_bias(w[REL_TABLE], q.shape[2], k.shape[2], a["rel_buckets"], rel_max_distance(a),
                         bidirectional=not a.get("causal"))
        bias = table if bias is None else bias + table
    out = sdpa(q, k, v, bool(a.get("causal")), score_scale(a, q.shape[-1]), bias, a.get("window"))
    b, _, t, _ = out.shape
    out = out.transpose(0, 2, 1, 3).reshape(b, t, -1)
    return affine(out, w["wo"], w.get("bo"))


OPS = {"attention": attention, "rel_position_bias": rel_position_bias}
