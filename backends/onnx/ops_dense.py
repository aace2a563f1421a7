"""Dense layers, embeddings and positions: linear (Gemm where 2-D), matmul, ffn, swiglu, gemm*."""

from __future__ import annotations

import numpy as np

from irc.backends.onnx.context import Context
from irc.graph import Node


def _bias(ctx: Context, node: Node, short: str) -> str | None:
    return ctx.weight(node, short) if ctx.has_weight(node, short) else None


def _linear(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    w, b = ctx.weight(node, "weight"), _bias(ctx, node, "bias")
    if ctx.type_of(node.inputs[0]).rank == 2:  # Gemm reads the [out, in] weight as stored
        return [ctx.op1("Gemm", [xs[0], w] + ([b] if b else []), transB=1)]
    return [ctx.linear(xs[0], w, b)]


def _ffn(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    h = ctx.act(node.attrs.get("act", "gelu"), ctx.linear(xs[0], ctx.weight(node, "w1"), _bias(ctx, node, "b1")))
    return [ctx.linear(h, ctx.weight(node, "w2"), _bias(ctx, node, "b2"))]


def _swiglu(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    gate = ctx.act("silu", ctx.linear(xs[0], ctx.weight(node, "w_gate"), _bias(ctx, node, "b_gate")))
    up = ctx.linear(xs[0], ctx.weight(node, "w_up"), _bias(ctx, node, "b_up"))
    return [ctx.linear(ctx.op1("Mul", [gate, up]), ctx.weight(node, "w_down"), _bias(ctx, node, "b_down"))]


def _gemm(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.act(node.attrs["act"], ctx.linear(xs[0], xs[1], xs[2] if len(xs) > 2 else None))]


def _gemm_glu(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.op1("Mul", [ctx.act(node.attrs["act"], ctx.linear(xs[0], xs[1])), ctx.linear(xs[0], xs[2])])]


def _embedding(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.op1("Gather", [ctx.weight(node, "weight"), xs[0]], axis=0)]


def _unembed(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.linear(xs[0], ctx.weight(node, "weight"), _bias(ctx, node, "bias"))]


def sinusoidal_table(ctx: Context, length: str, width: int) -> str:
    """[T, D] float32: P[p, 2i] = sin(p / 10000^(2i/D)), P[p, 2i+1] = cos(...), computed in float64
    at run time (T may be symbolic), as irc's reference does before casting."""
    pos = ctx.op1("Cast", [ctx.op1("Range", [ctx.ints(0), length, ctx.ints(1)])], to=ctx.onnx.TensorProto.DOUBLE)
    inv = ctx.const(10000.0 ** (-np.arange(0, width, 2, dtype=np.float64) / width), np.float64)  # [D/2]
    angle = ctx.op1("Mul", [ctx.op1("Unsqueeze", [pos, ctx.ints([1])]), inv])  # [T, D/2]
    pair = ctx.op1("Concat", [ctx.op1("Unsqueeze", [ctx.op1(f, [angle]), ctx.ints([2])]) for f in ("Sin", "Cos")],
                   axis=2)  # [T, D/2, 2]: sin and cos interleaved once flattened
    table = ctx.op1("Reshape", [pair, ctx.ints([-1, width])])
    return ctx.op1("Cast", [table], to=ctx.onnx.TensorProto.FLOAT)


def sinusoidal_concat(ctx: Context, length: str, width: int) -> str:
    """Whisper's [sin | cos]: P[p, i] = sin(p·e^(−i·log(10000)/(D/2 − 1))), P[p, D/2 + i] = cos(the same)."""
    half = width // 2
    inv = ctx.const(np.exp(-np.log(10000.0) / (half - 1) * np.arange(half, dtype=np.float64)), np.float64)
    pos = ctx.op1("Cast", [ctx.op1("Range", [ctx.ints(0), length, ctx.ints(1)])], to=ctx.onnx.TensorProto.DOUBLE)
    angle = ctx.op1("Mul", [ctx.op1("Unsqueeze", [pos, ctx.ints([1])]), inv])
    table = ctx.op1("Concat", [ctx.op1("Sin", [angle]), ctx.op1("Cos", [angle])], axis=1)
    return ctx.op1("Cast", [table], to=ctx.onnx.TensorProto.FLOAT)


def _positional(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    x = node.inputs[0]
    length = ctx.dim(x, xs[0], 1)
    if node.attrs.get("kind") == "learned":
        table = ctx.op1("Slice", [ctx.weight(node, "weight"), ctx.ints([0]), length, ctx.ints([0])])
    elif node.attrs.get("layout") == "concat":
        table = sinusoidal_concat(ctx, ctx.op1("Squeeze", [length, ctx.ints([0])]), int(ctx.type_of(x).shape[2]))
    else:
        table = sinusoidal_table(ctx, ctx.op1("Squeeze", [length, ctx.ints([0])]), int(ctx.type_of(x).shape[2]))
    return [ctx.op1("Add", [xs[0], table])]


OPS = {
    "linear": _linear,
    "matmul": lambda ctx, node, xs: [ctx.op1("MatMul", xs)],
    "ffn": _ffn,
    "swiglu": _swiglu,
    "gemm": _gemm,
    "gemm_glu": _gemm_glu,
    "gemm_multi": lambda ctx, node, xs: [ctx.linear(xs[0], w) for w in xs[1:]],
    "embedding": _embedding,
    "unembed": _unembed,
    "positional": _positional,
    "param": lambda ctx, node, xs: [ctx.weight(node, node.attrs["name"])],
}
