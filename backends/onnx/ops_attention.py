"""Attention as its MatMul/Softmax pattern (opset 17 has no Attention op; 23's is not yet read by
TensorRT or OpenVINO), with GQA, RoPE, T5 relative buckets and the sliding causal mask computed
from the run-time sequence lengths, so T and S stay symbolic."""

from __future__ import annotations

import math

import numpy as np

from irc.backends.onnx.context import Context
from irc.graph import Node
from irc.ops.attention import REL_TABLE, head_dim, kv_heads, rel_max_distance, rope_theta, score_scale


def _positions(ctx: Context, length: str) -> str:
    return ctx.op1("Range", [ctx.ints(0), length, ctx.ints(1)])


def hidden_keys(ctx: Context, t: str, s: str, window: int | None) -> str:
    """[T, S] bool, True where the causal mask hides key j from query i: j > i, or j <= i − window."""
    i = ctx.op1("Unsqueeze", [_positions(ctx, t), ctx.ints([1])])
    j = ctx.op1("Unsqueeze", [_positions(ctx, s), ctx.ints([0])])
    hidden = ctx.op1("Greater", [j, i])
    if window is not None:
        hidden = ctx.op1("Or", [hidden, ctx.op1("LessOrEqual", [j, ctx.op1("Sub", [i, ctx.ints(int(window))])])])
    return hidden


def mask_scores(ctx: Context, scores: str, t: str, s: str, window: int | None) -> str:
    return ctx.op1("Where", [hidden_keys(ctx, t, s, window), ctx.const(-np.inf), scores])


def _softmax_rows(ctx: Context, scores: str, t: str, s: str, causal: bool, window: int | None) -> str:
    """Softmax over keys; a row whose every key is hidden gives zeros, as irc's reference (not NaN)."""
    p = ctx.op1("Softmax", [scores], axis=-1)
    if causal and window is not None:  # only a sliding window can hide a whole row
        hidden = hidden_keys(ctx, t, s, window)
        every = ctx.op1("ReduceMin", [ctx.op1("Cast", [hidden], to=ctx.onnx.TensorProto.INT32)], axes=[-1], keepdims=1)
        p = ctx.op1("Where", [ctx.op1("Cast", [every], to=ctx.onnx.TensorProto.BOOL), ctx.const(0.0), p])
    return p


def sdpa(ctx: Context, q: str, k: str, v: str, heads: int, groups: int, hd: int, scale: float, bias: str | None,
         causal: bool, window: int | None, t: str, s: str) -> str:
    """softmax(q·kᵀ·scale + bias [+ mask])·v on [B, H, T, hd] / [B, G, S, hd]; head h reads kv head h // (H/G)."""
    if groups != heads:
        rep = ctx.ints([1, 1, heads // groups, 1, 1])
        k, v = (ctx.op1("Reshape", [ctx.op1("Expand", [ctx.op1("Unsqueeze", [y, ctx.ints([2])]), rep]),
                                    ctx.ints([0, heads, -1, hd])]) for y in (k, v))
    scores = ctx.op1("MatMul", [q, ctx.op1("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = ctx.op1("Mul", [scores, ctx.const(scale)])
    if bias is not None:
        scores = ctx.op1("Add", [scores, bias])
    if causal:
        scores = mask_scores(ctx, scores, t, s, window)
    return ctx.op1("MatMul", [_softmax_rows(ctx, scores, t, s, causal, window), v])


def rope(ctx: Context, x: str, hd: int, theta: float, t: str) -> str:
    """Rotate [B, H, T, hd]: pairs (x[..., i], x[..., i + hd/2]) at angle p·theta^(−2i/hd), angles in float64."""
    freq = ctx.const(theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd), np.float64)
    pos = ctx.op1("Cast", [_positions(ctx, t)], to=ctx.onnx.TensorProto.DOUBLE)
    angle = ctx.op1("Mul", [ctx.op1("Unsqueeze", [pos, ctx.ints([1])]), freq])  # [T, hd/2]
    cos, sin = (ctx.op1("Cast", [ctx.op1("Concat", [ctx.op1(f, [angle])] * 2, axis=-1)], to=ctx.onnx.TensorProto.FLOAT)
                for f in ("Cos", "Sin"))
    half = hd // 2
    lo = ctx.op1("Slice", [x, ctx.ints([0]), ctx.ints([half]), ctx.ints([3])])
    hi = ctx.op1("Slice", [x, ctx.ints([half]), ctx.ints([hd]), ctx.ints([3])])
    rotated = ctx.op1("Concat", [ctx.op1("Neg", [hi]), lo], axis=-1)
    return ctx.op1("Add", [ctx.op1("Mul", [x, cos]), ctx.op1("Mul", [rotated, sin])])


def rel_bias(ctx: Context, table: str, t: str, s: str, buckets: int, max_distance: int, bidirectional: bool) -> str:
    """[1, H, T, S]: T5's table row for the bucket of j − i, the buckets worked out in float64 as T5 does."""
    i = ctx.op1("Unsqueeze", [_positions(ctx, t), ctx.ints([1])])
    j = ctx.op1("Unsqueeze", [_positions(ctx, s), ctx.ints([0])])
    rel = ctx.op1("Sub", [j, i])  # [T, S]
    if bidirectional:
        buckets //= 2
        out = ctx.op1("Mul", [ctx.op1("Cast", [ctx.op1("Greater", [rel, ctx.ints(0)])], to=ctx.onnx.TensorProto.INT64),
                              ctx.ints(buckets)])
        n = ctx.op1("Abs", [rel])
    else:
        out = None
        n = ctx.op1("Neg", [ctx.op1("Min", [rel, ctx.ints(0)])])
    exact = buckets // 2
    safe = ctx.op1("Cast", [ctx.op1("Max", [n, ctx.ints(1)])], to=ctx.onnx.TensorProto.DOUBLE)
    ratio = ctx.op1("Div", [ctx.op1("Log", [ctx.op1("Div", [safe, ctx.const(float(exact), np.float64)])]),
                            ctx.const(math.log(max_distance / exact), np.float64)])
    scaled = ctx.op1("Mul", [ratio, ctx.const(float(buckets - exact), np.float64)])
    large = ctx.op1("Add", [ctx.ints(exact), ctx.op1("Cast", [scaled], to=ctx.onnx.TensorProto.INT64)])
    large = ctx.op1("Min", [large, ctx.ints(buckets - 1)])
    bucket = ctx.op1("Where", [ctx.op1("Less", [n, ctx.ints(exact)]), n, large])
    if out is not None:
        bucket = ctx.op1("Add", [out, bucket])
    rows = ctx.op1("Gather", [table, bucket], axis=0)  # [T, S, H]
    return ctx.op1("Unsqueeze", [ctx.op1("Transpose", [rows], perm=[2, 0, 1]), ctx.ints([0])])


def _heads(ctx: Context, x: str, n: int) -> str:
    """[B, T, n·hd] -> [B, n, T, hd]."""
    return ctx.op1("Transpose", [ctx.op1("Reshape", [x, ctx.ints([0, 0, n, -1])])], perm=[0, 2, 1, 3])


def _proj(ctx: Context, node: Node, x: str, w: str, b: str) -> str:
    return ctx.linear(x, ctx.weight(node, w), ctx.weight(node, b) if ctx.has_weight(node, b) else None)


def _attention(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    x, kv = xs[0], (xs[1] if len(xs) > 1 else xs[0])
    x_value, kv_value = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else node.inputs[0]
    heads, groups = int(a["heads"]), int(kv_heads(a))
    hd = int(head_dim(a, ctx.type_of(x_value).shape[-1]))
    q = _heads(ctx, _proj(ctx, node, x, "wq", "bq"), heads)
    k = _heads(ctx, _proj(ctx, node, kv, "wk", "bk"), groups)
    v = _heads(ctx, _proj(ctx, node, kv, "wv", "bv"), groups)
    t, s = ctx.scalar_dim(x_value, x, 1), ctx.scalar_dim(kv_value, kv, 1)
    if a.get("rope"):
        theta = rope_theta(a)
        q, k = rope(ctx, q, hd, theta, t), rope(ctx, k, hd, theta, s)
    bias = xs[2] if len(xs) > 2 else None
    if a.get("rel_buckets") is not None:
        table = rel_bias(ctx, ctx.weight(node, REL_TABLE), t, s, int(a["rel_buckets"]), rel_max_distance(a),
                         not a.get("causal"))
        bias = table if bias is None else ctx.op1("Add", [bias, table])
    out = sdpa(ctx, q, k, v, heads, groups, hd, score_scale(a, hd), bias, bool(a.get("causal")), a.get("window"), t, s)
    merged = ctx.op1("Reshape", [ctx.op1("Transpose", [out], perm=[0, 2, 1, 3]), ctx.ints([0, 0, -1])])
    return [_proj(ctx, node, merged, "wo", "bo")]


def _rel_position_bias(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    k_value, k = (node.inputs[1], xs[1]) if len(xs) > 1 else (node.inputs[0], xs[0])
    t, s = ctx.scalar_dim(node.inputs[0], xs[0], 1), ctx.scalar_dim(k_value, k, 1)
    return [rel_bias(ctx, ctx.weight(node, "weight"), t, s, int(a["buckets"]), int(a["max_distance"]),
                     bool(a["bidirectional"]))]


def _sdpa_op(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    q_t, k_t = ctx.type_of(node.inputs[0]), ctx.type_of(node.inputs[1])
    t, s = ctx.scalar_dim(node.inputs[0], xs[0], 2), ctx.scalar_dim(node.inputs[1], xs[1], 2)
    return [sdpa(ctx, xs[0], xs[1], xs[2], int(q_t.shape[1]), int(k_t.shape[1]), int(k_t.shape[3]), float(a["scale"]),
                 xs[3] if len(xs) > 3 else None, bool(a["causal"]), a.get("window"), t, s)]


def _rope_op(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    hd = int(ctx.type_of(node.inputs[0]).shape[-1])
    return [rope(ctx, xs[0], hd, rope_theta(node.attrs, "theta"), ctx.scalar_dim(node.inputs[0], xs[0], 2))]


def _causal_mask(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    t, s = ctx.scalar_dim(node.inputs[0], xs[0], -2), ctx.scalar_dim(node.inputs[0], xs[0], -1)
    return [mask_scores(ctx, xs[0], t, s, node.attrs.get("window"))]


OPS = {
    "attention": _attention,
    "rel_position_bias": _rel_position_bias,
    "sdpa": _sdpa_op,
    "rope": _rope_op,
    "causal_mask": _causal_mask,
}
