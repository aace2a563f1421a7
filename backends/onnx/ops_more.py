"""Bounded activations, elementwise max/min, expand, GroupNorm/InstanceNorm, LayerNorm over another
axis, transposed convolution, upsampling and pixel (un)shuffle."""

from __future__ import annotations

from irc.backends.onnx.context import Context
from irc.diagnostics import IrcError
from irc.graph import Node
from irc.ops.common import per_axis
from irc.ops.resample import scales


def _clip(ctx: Context, x: str, lo: float | None, hi: float | None) -> str:
    """min(max(x, lo), hi) with Max/Min, which keep a NaN a NaN as irc's reference does."""
    if lo is not None:
        x = ctx.op1("Max", [x, ctx.const(float(lo))])
    if hi is not None:
        x = ctx.op1("Min", [x, ctx.const(float(hi))])
    return x


def _hardsigmoid(ctx: Context, x: str) -> str:
    return ctx.op1("Div", [_clip(ctx, ctx.op1("Add", [x, ctx.const(3.0)]), 0.0, 6.0), ctx.const(6.0)])


def _mish(ctx: Context, x: str) -> str:
    return ctx.op1("Mul", [x, ctx.op1("Tanh", [ctx.op1("Softplus", [x])])])


def _elu(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.op1("Elu", xs[:1], alpha=float(node.attrs["alpha"]))]


def _expand(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    shape = [ctx.size(d) for d in node.types[0].shape]
    bad = next((d for d, s in zip(node.types[0].shape, shape) if s is None), None)
    if bad is not None:
        raise IrcError(f"onnx export: 'expand' to {node.types[0]} needs the size {bad}, which ONNX cannot "
                       "compute from the inputs' shapes; bind its symbols with -D", node.loc)
    return [ctx.op1("Expand", [xs[0], ctx.op1("Concat", shape, axis=0)])]


def _affine_along(ctx: Context, node: Node, y: str, axis: int, rank: int) -> str:
    """y·gain + bias with the per-channel vectors laid along ``axis``."""
    shape = ctx.ints([-1 if i == axis else 1 for i in range(rank)])
    if ctx.has_weight(node, "gain"):
        y = ctx.op1("Mul", [y, ctx.op1("Reshape", [ctx.weight(node, "gain"), shape])])
    if ctx.has_weight(node, "bias"):
        y = ctx.op1("Add", [y, ctx.op1("Reshape", [ctx.weight(node, "bias"), shape])])
    return y


def normalize(ctx: Context, x: str, axes: list[int], eps: float) -> str:
    """(x − mean)/sqrt(biased var + eps) over ``axes``, as irc's reference computes it."""
    mean = ctx.op1("ReduceMean", [x], axes=axes, keepdims=1)
    centred = ctx.op1("Sub", [x, mean])
    var = ctx.op1("ReduceMean", [ctx.op1("Mul", [centred, centred])], axes=axes, keepdims=1)
    return ctx.op1("Div", [centred, ctx.op1("Sqrt", [ctx.op1("Add", [var, ctx.const(eps)])])])


def _groupnorm(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    t = ctx.type_of(node.inputs[0])
    groups = int(node.attrs["groups"]) if node.op == "groupnorm" else t.shape[1]
    if not isinstance(groups, int):
        raise IrcError(f"onnx export: 'instancenorm' over a symbolic channel count {groups}; bind it with -D",
                       node.loc)
    grouped = ctx.op1("Reshape", [xs[0], ctx.ints([0, groups, -1])])
    y = normalize(ctx, grouped, [-1], float(node.attrs["eps"]))
    y = ctx.op1("Reshape", [y, ctx.op1("Shape", [xs[0]])])
    return [_affine_along(ctx, node, y, 1, t.rank)]


def layernorm_axis(ctx: Context, node: Node, x: str, axis: int) -> str:
    """LayerNorm over one axis that is not the last (ConvNeXt's channels-first): ONNX's
    LayerNormalization would normalize over every axis from ``axis`` on."""
    rank = ctx.type_of(node.inputs[0]).rank
    y = normalize(ctx, x, [axis % rank], float(node.attrs.get("eps", 1e-5)))
    return _affine_along(ctx, node, y, axis % rank, rank)


def _conv_transpose(nd: int):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        a = node.attrs
        ins = [xs[0], ctx.weight(node, "weight")] + ([ctx.weight(node, "bias")] if ctx.has_weight(node, "bias") else [])
        kernel = per_axis(a["kernel"], nd)
        return [ctx.op1("ConvTranspose", ins, kernel_shape=kernel, strides=per_axis(a["stride"], nd),
                        pads=per_axis(a["padding"], nd) * 2, output_padding=per_axis(a["output_padding"], nd),
                        dilations=per_axis(a["dilation"], nd), group=int(a["groups"]))]
    return export


def _upsample(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    factors = [float(s) for s in scales(a, ctx.type_of(node.inputs[0]).rank)]
    scale = ctx.const([1.0, 1.0, *factors])
    if a["mode"] == "nearest":  # out[i] = x[floor(i / s)]
        return [ctx.op1("Resize", [xs[0], "", scale], mode="nearest", coordinate_transformation_mode="asymmetric",
                        nearest_mode="floor")]
    # PyTorch's bilinear: half-pixel centres clamped at 0, or corners on corners
    mode = "align_corners" if a["align_corners"] else "pytorch_half_pixel"
    return [ctx.op1("Resize", [xs[0], "", scale], mode="linear", coordinate_transformation_mode=mode)]


def _shuffle(ctx: Context, node: Node, x: str, dims: list, perm: list[int], out: list) -> str:
    sizes = [ctx.size(d) for d in dims]
    outs = [ctx.size(d) for d in out]
    if any(s is None for s in sizes + outs):
        raise IrcError(f"onnx export: '{node.op}' of {ctx.type_of(node.inputs[0])} needs sizes ONNX cannot compute "
                       "from the inputs' shapes; bind its symbols with -D", node.loc)
    y = ctx.op1("Transpose", [ctx.op1("Reshape", [x, ctx.op1("Concat", sizes, axis=0)])], perm=perm)
    return ctx.op1("Reshape", [y, ctx.op1("Concat", outs, axis=0)])


def _pixel_shuffle(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    """out[..., c, h·r + i, w·r + j] = x[..., c·r² + i·r + j, h, w] (ONNX DepthToSpace CRD, for any lead)."""
    r = int(node.attrs["factor"])
    *lead, c, h, w = ctx.type_of(node.inputs[0]).shape
    n = len(lead)
    perm = [*range(n), n, n + 3, n + 1, n + 4, n + 2]
    return [_shuffle(ctx, node, xs[0], [*lead, c // (r * r), r, r, h, w], perm, [*lead, c // (r * r), h * r, w * r])]


def _pixel_unshuffle(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    r = int(node.attrs["factor"])
    *lead, c, h, w = ctx.type_of(node.inputs[0]).shape
    n = len(lead)
    perm = [*range(n), n, n + 2, n + 4, n + 1, n + 3]
    return [_shuffle(ctx, node, xs[0], [*lead, c, h // r, r, w // r, r], perm, [*lead, c * r * r, h // r, w // r])]


def _unary(fn):
    return lambda ctx, node, xs: [fn(ctx, xs[0])]


OPS = {
    "relu6": _unary(lambda ctx, x: _clip(ctx, x, 0.0, 6.0)),
    "hardtanh": lambda ctx, node, xs: [_clip(ctx, xs[0], node.attrs["min"], node.attrs["max"])],
    "clamp": lambda ctx, node, xs: [_clip(ctx, xs[0], node.attrs["min"], node.attrs["max"])],
    "hardsigmoid": _unary(_hardsigmoid),
    "hardswish": _unary(lambda ctx, x: ctx.op1("Mul", [x, _hardsigmoid(ctx, x)])),
    "mish": _unary(_mish),
    "elu": _elu,
    "maximum": lambda ctx, node, xs: [ctx.op1("Max", xs)],
    "minimum": lambda ctx, node, xs: [ctx.op1("Min", xs)],
    "expand": _expand,
    "groupnorm": _groupnorm,
    "instancenorm": _groupnorm,
    "conv_transpose1d": _conv_transpose(1),
    "conv_transpose2d": _conv_transpose(2),
    "upsample": _upsample,
    "pixel_shuffle": _pixel_shuffle,
    "pixel_unshuffle": _pixel_unshuffle,
}
