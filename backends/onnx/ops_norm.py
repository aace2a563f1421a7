"""LayerNorm (ONNX LayerNormalization), RMSNorm (its formula: RMSNormalization is opset 23),
BatchNorm (BatchNormalization on axis 1, the formula elsewhere) and the fused add_norm."""

from __future__ import annotations

import numpy as np

from irc.backends.onnx.context import Context
from irc.graph import Node


def layernorm(ctx: Context, node: Node, x: str, value: str) -> str:
    a = node.attrs
    rank = ctx.type_of(value).rank
    if a.get("axis") is not None and a["axis"] % rank != rank - 1:
        from irc.backends.onnx.ops_more import layernorm_axis

        return layernorm_axis(ctx, node, x, a["axis"])
    width = ctx.type_of(value).shape[-1]
    if ctx.has_weight(node, "gain"):
        scale = ctx.weight(node, "gain")
    elif isinstance(width, int):
        scale = ctx.const(np.ones(width, np.float32))
    else:  # no gain over a symbolic width: the formula, as irc's reference writes it
        mean = ctx.op1("ReduceMean", [x], axes=[-1], keepdims=1)
        centred = ctx.op1("Sub", [x, mean])
        var = ctx.op1("ReduceMean", [ctx.op1("Mul", [centred, centred])], axes=[-1], keepdims=1)
        eps = ctx.const(float(a.get("eps", 1e-5)))
        return ctx.op1("Div", [centred, ctx.op1("Sqrt", [ctx.op1("Add", [var, eps])])])
    extra = [ctx.weight(node, "bias")] if ctx.has_weight(node, "bias") else []
    return ctx.op1("LayerNormalization", [x, scale, *extra], axis=-1, epsilon=float(a.get("eps", 1e-5)))


def rmsnorm(ctx: Context, node: Node, x: str) -> str:
    ms = ctx.op1("ReduceMean", [ctx.op1("Mul", [x, x])], axes=[-1], keepdims=1)
    y = ctx.op1("Div", [x, ctx.op1("Sqrt", [ctx.op1("Add", [ms, ctx.const(float(node.attrs.get("eps", 1e-6)))])])])
    return ctx.op1("Mul", [y, ctx.weight(node, "gain")]) if ctx.has_weight(node, "gain") else y


def _batchnorm(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    rank = ctx.type_of(node.inputs[0]).rank
    axis = int(a.get("axis", 1)) % rank
    w = [ctx.weight(node, k) for k in ("gain", "bias", "running_mean", "running_var")]
    eps = float(a.get("eps", 1e-5))
    if axis == 1:
        return [ctx.op1("BatchNormalization", [xs[0], *w], epsilon=eps, momentum=1.0 - float(a.get("momentum", 0.1)))]
    shape = ctx.ints([-1 if i == axis else 1 for i in range(rank)])  # per-channel vectors along `axis`
    gain, bias, mean, var = (ctx.op1("Reshape", [v, shape]) for v in w)
    inv = ctx.op1("Reciprocal", [ctx.op1("Sqrt", [ctx.op1("Add", [var, ctx.const(eps)])])])
    y = ctx.op1("Mul", [ctx.op1("Mul", [ctx.op1("Sub", [xs[0], mean]), inv]), gain])
    return [ctx.op1("Add", [y, bias])]


def _add_norm(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    s = ctx.op1("Add", xs[:2])
    if node.attrs["kind"] == "layernorm":
        return [s, layernorm(ctx, node, s, node.inputs[0])]
    return [s, rmsnorm(ctx, node, s)]


OPS = {
    "layernorm": lambda ctx, node, xs: [layernorm(ctx, node, xs[0], node.inputs[0])],
    "rmsnorm": lambda ctx, node, xs: [rmsnorm(ctx, node, xs[0])],
    "batchnorm": _batchnorm,
    "add_norm": _add_norm,
}
