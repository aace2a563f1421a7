"""Convolution and pooling, channels-first: Conv, MaxPool, AveragePool, and adaptive pooling
as the row means of PyTorch's bins (each bin a Slice whose bounds are read from the input's shape)."""

from __future__ import annotations

from irc.backends.onnx.context import Context
from irc.graph import Node
from irc.ops.common import per_axis


def conv_pads(padding, kernel: list[int], dilation: list[int]) -> list[int]:
    """ONNX pads [begin..., end...]; ``same`` puts total//2 first, the rest after (PyTorch)."""
    nd = len(kernel)
    if padding == "valid":
        return [0] * (2 * nd)
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [t // 2 for t in totals] + [t - t // 2 for t in totals]
    return per_axis(padding, nd) * 2


def _conv(nd: int):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        a = node.attrs
        kernel = per_axis(a["kernel"], nd)
        dilation = per_axis(a.get("dilation", 1), nd)
        ins = [xs[0], ctx.weight(node, "weight")] + ([ctx.weight(node, "bias")] if ctx.has_weight(node, "bias") else [])
        return [ctx.op1("Conv", ins, kernel_shape=kernel, strides=per_axis(a.get("stride", 1), nd), dilations=dilation,
                        pads=conv_pads(a.get("padding", 0), kernel, dilation), group=int(a.get("groups", 1)))]
    return export


def _pool(nd: int, op_type: str):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        a = node.attrs
        kernel = per_axis(a["kernel"], nd)
        stride = per_axis(a["stride"] if a.get("stride") is not None else a["kernel"], nd)
        extra = ({"dilations": per_axis(a.get("dilation", 1), nd)} if op_type == "MaxPool"
                 else {"count_include_pad": int(bool(a.get("count_include_pad", True)))})
        pads = per_axis(a.get("padding", 0), nd) * 2
        return [ctx.op1(op_type, xs[:1], kernel_shape=kernel, strides=stride, pads=pads, **extra)]
    return export


def _global_avgpool(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    rank = ctx.type_of(node.inputs[0]).rank
    return [ctx.op1("ReduceMean", xs[:1], axes=list(range(2, rank)), keepdims=0)]


def _bins(ctx: Context, node: Node, x: str, axis: int, out: int) -> str:
    """Mean over PyTorch's bins [floor(i·n/o), ceil((i+1)·n/o)) along ``axis``, concatenated."""
    n = ctx.dim(node.inputs[0], x, axis)
    means = []
    for i in range(out):
        start = ctx.op1("Div", [ctx.op1("Mul", [n, ctx.ints([i])]), ctx.ints([out])])
        end = ctx.op1("Div", [ctx.op1("Add", [ctx.op1("Mul", [n, ctx.ints([i + 1])]), ctx.ints([out - 1])]),
                              ctx.ints([out])])
        piece = ctx.op1("Slice", [x, start, end, ctx.ints([axis])])
        means.append(ctx.op1("ReduceMean", [piece], axes=[axis], keepdims=1))
    return ctx.op1("Concat", means, axis=axis) if len(means) > 1 else means[0]


def _adaptive_avgpool2d(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    oh, ow = per_axis(node.attrs["size"], 2)
    h, w = ctx.type_of(node.inputs[0]).shape[2:]
    if isinstance(h, int) and isinstance(w, int) and h % oh == 0 and w % ow == 0:  # equal bins: one AveragePool
        k = [h // oh, w // ow]
        return [ctx.op1("AveragePool", xs[:1], kernel_shape=k, strides=k)]
    # a bin is a rectangle, so its mean is the mean over its rows of the column-bin means
    return [_bins(ctx, node, _bins(ctx, node, xs[0], 3, ow), 2, oh)]


OPS = {
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    "maxpool1d": _pool(1, "MaxPool"),
    "maxpool2d": _pool(2, "MaxPool"),
    "avgpool1d": _pool(1, "AveragePool"),
    "avgpool2d": _pool(2, "AveragePool"),
    "global_avgpool": _global_avgpool,
    "adaptive_avgpool2d": _adaptive_avgpool2d,
}
