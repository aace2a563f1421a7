"""Incremental decoding on the reference: attention over a KV cache kept in place, positions at
an offset, and the executor that runs a decode graph without copying its caches.

``cached_attention`` writes the new keys and values into the cache arrays it is given and
returns those same arrays, so a cache lives in one buffer for the whole generation. A row's
attention reads only its filled slots: positions 0 .. pos−1 (a view of the first pos slots),
or for a sliding window the last W − 1 positions of the rolling buffer, plus its new tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from irc.backends.numpy_ref.attention import _bias_4d, _heads, t5_buckets
from irc.backends.numpy_ref.dense import affine
from irc.backends.numpy_ref.elementwise import softmax
from irc.backends.numpy_ref.embedding import sinusoidal, sinusoidal_concat
from irc.graph import Graph, Node
from irc.ops.attention import kv_heads, rope_theta, score_scale


def rope_at(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """RoPE of [B, H, T, hd] with token t of row b at absolute position positions[b, t] (the
    rotation of numpy_ref.attention.rope, read at an offset)."""
    hd = x.shape[-1]
    freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    angle = positions.astype(np.float64)[:, None, :, None] * freq  # [B, 1, T, hd/2]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1).astype(x.dtype)
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1).astype(x.dtype)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _rows(arr: np.ndarray | None, batch: int, default: int) -> list[int]:
    if arr is None:
        return [default] * batch
    return [int(v) for v in np.broadcast_to(arr, (batch,))]


def past_positions(pos: int, slots: int, window: int | None) -> np.ndarray:
    """Positions a row's new tokens may read from the cache: all of 0..pos−1, or for a window the
    last min(pos, W − 1) of them (a query sees the W positions up to and including its own)."""
    first = 0 if window is None else max(0, pos - (window - 1))
    assert window is not None or pos <= slots, "the runtime checks the context before a step"
    return np.arange(first, pos)


def cached_attention(node: Node, args, w):
    a = node.attrs
    x, kc, vc = args[0], args[1], args[2]
    batch, t, _ = x.shape
    heads, groups = a["heads"], kv_heads(a)
    starts = _rows(args[3], batch, 0)
    counts = _rows(args[4], batch, t)
    bias = np.broadcast_to(_bias_4d(args[5]), (batch, heads, t, kc.shape[2])) if len(args) > 5 else None
    q = _heads(affine(x, w["wq"], w.get("bq")), heads)  # [B, H, T, hd]
    k = _heads(affine(x, w["wk"], w.get("bk")), groups)  # [B, G, T, hd]
    v = _heads(affine(x, w["wv"], w.get("bv")), groups)
    new_pos = np.asarray(starts)[:, None] + np.arange(t)[None, :]  # [B, T] absolute positions
    if a.get("rope"):
        theta = rope_theta(a)
        q, k = rope_at(q, new_pos, theta), rope_at(k, new_pos, theta)
    scale = q.dtype.type(score_scale(a, q.shape[-1]))
    window, slots = a.get("window"), kc.shape[2]
    out = np.empty_like(q)
    for b in range(batch):
        p, n = starts[b], counts[b]
        past = past_positions(p, slots, window)
        at = past % slots if window is not None else past  # a rolling buffer keeps p in slot p mod W
        past_k = kc[b, :, : p] if window is None else kc[b][:, at]  # a view of the filled part
        past_v = vc[b, :, : p] if window is None else vc[b][:, at]
        keys = np.concatenate([past_k.astype(q.dtype), k[b]], axis=1)  # [G, S, hd]
        values = np.concatenate([past_v.astype(q.dtype), v[b]], axis=1)
        key_pos = np.concatenate([past, new_pos[b]])
        seen = (key_pos[None, :] <= new_pos[b][:, None]) & (np.arange(len(key_pos)) < len(past) + n)[None, :]
        if window is not None:
            seen &= key_pos[None, :] > new_pos[b][:, None] - window
        per = heads // groups  # query head h reads kv head h // per
        qg = q[b].reshape(groups, per, t, -1)
        scores = (qg @ np.swapaxes(keys, -1, -2)[:, None]) * scale  # [G, per, T, S]
        if bias is not None:  # its columns are absolute key positions
            scores = scores + bias[b][:, :, key_pos].reshape(groups, per, t, -1)
        scores = np.where(seen, scores, -np.inf)
        probs = softmax(scores, axis=-1)
        probs = np.where(seen.any(axis=-1)[:, None], probs, 0)  # a query with no key (a padded row) reads nothing
        out[b] = (probs @ values[:, None]).reshape(heads, t, -1)
        _write(kc[b], vc[b], k[b], v[b], p, n, slots, window)
    ctx = out.transpose(0, 2, 1, 3).reshape(batch, t, -1)
    return affine(ctx, w["wo"], w.get("bo")), kc, vc


def _write(kc: np.ndarray, vc: np.ndarray, k: np.ndarray, v: np.ndarray, p: int, n: int, slots: int,
           window: int | None) -> None:
    """Store the first n new keys and values of a row at positions p..p+n−1 (in place)."""
    if window is None:
        kc[:, p: p + n] = k[:, :n]
        vc[:, p: p + n] = v[:, :n]
        return
    keep = min(n, slots)  # of a chunk longer than the buffer only the last W positions stay
    at = np.arange(p + n - keep, p + n) % slots
    kc[:, at] = k[:, n - keep: n]
    vc[:, at] = v[:, n - keep: n]


def positional_at(node: Node, args, w):
    x, pos = args
    batch, t, d = x.shape
    idx = np.asarray(_rows(pos, batch, 0))[:, None] + np.arange(t)[None, :]  # [B, T]
    if node.attrs.get("kind") == "learned":
        table = w["weight"]
        assert idx.max(initial=0) < table.shape[0], "the runtime checks the context against max_len"
        return x + table[idx]
    make = sinusoidal_concat if node.attrs.get("layout") == "concat" else sinusoidal
    return x + make(int(idx.max(initial=0)) + 1, d, x.dtype)[idx]


def cross_kv(node: Node, args, w):
    a = node.attrs
    mem = args[0]
    k = _heads(affine(mem, w["wk"], w.get("bk")), kv_heads(a))
    v = _heads(affine(mem, w["wv"], w.get("bv")), kv_heads(a))
    store = np.float16 if a["dtype"] == "f16" else np.float32
    return k.astype(store), v.astype(store)


def cached_cross_attention(node: Node, args, w):
    a = node.attrs
    x, k, v = args[:3]
    batch, t, _ = x.shape
    heads, groups = a["heads"], kv_heads(a)
    q = _heads(affine(x, w["wq"], w.get("bq")), heads).reshape(batch, groups, heads // groups, t, -1)
    k, v = k.astype(q.dtype)[:, :, None], v.astype(q.dtype)[:, :, None]  # [B, G, 1, S, hd]
    scores = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(score_scale(a, q.shape[-1]))
    if len(args) > 3:  # the source's padding mask (or another additive bias), by query head
        s = scores.shape[-1]
        bias = np.broadcast_to(_bias_4d(args[3]), (batch, heads, t, s)).astype(q.dtype)
        scores = scores + bias.reshape(batch, groups, heads // groups, t, s)
    out = (softmax(scores, axis=-1) @ v).reshape(batch, heads, t, -1)
    return affine(out.transpose(0, 2, 1, 3).reshape(batch, t, -1), w["wo"], w.get("bo"))


def rel_position_bias_at(node: Node, args, w):
    """[B, H, T, keys]: T5's table at the bucket of j − (pos[b] + t) for key positions j < keys."""
    a = node.attrs
    x, pos = args
    batch, t = x.shape[0], x.shape[1]
    out = np.empty((batch, a["heads"], t, a["keys"]), w["weight"].dtype)
    for b, p in enumerate(_rows(pos, batch, 0)):
        # t5_buckets(p + t, keys) buckets j − i for queries i = 0 .. p+t−1: keep the last t of them
        idx = t5_buckets(p + t, a["keys"], a["buckets"], a["max_distance"], a["bidirectional"])[p:]
        out[b] = np.moveaxis(w["weight"][idx], -1, 0)
    return out


OPS = {"cached_attention": cached_attention, "positional_at": positional_at, "cross_kv": cross_kv,
       "cached_cross_attention": cached_cross_attention, "rel_position_bias_at": rel_position_bias_at}


def run_decode(graph: Graph, weights: dict[str, np.ndarray], feeds: dict[str, np.ndarray],
               fns: dict[str, Any], dtype: Any = np.float32, stored: frozenset[str] = frozenset()
               ) -> dict[str, np.ndarray]:
    """Run a decode graph on the reference, passing float inputs of the compute dtype and every
    cache by reference (no copy): ``weights`` are already cast to ``dtype`` by the caller, once.

    ``fns`` is the reference's op table (interpreter.OPS); ``stored`` names results kept in the
    dtype their op stores them in (the encoder's keys and values, at the cache dtype). Inputs are
    taken as given: the decoding runtime builds them with the right shapes and dtypes."""
    from irc.runtime.weights import node_weight_keys

    dtype = np.dtype(dtype)
    types = graph.value_types()
    env: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        if node.op == "input":
            env[node.outputs[0]] = feeds[node.outputs[0]]
            continue
        w = {short: weights[key] for short, key in node_weight_keys(node, types).items()}
        args = [env[v] for v in node.inputs]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            result = fns[node.op](node, args, w)
        results = result if isinstance(result, tuple) else (result,)
        for v, arr in zip(node.outputs, results):
            aliased = any(arr is x for x in args)  # a cache updated in place stays the caller's buffer
            keep = aliased or v in stored or arr.dtype.kind in "iu"
            env[v] = arr if keep else arr.astype(dtype, copy=False)
    return {label: env[v] for label, v in graph.outputs}
