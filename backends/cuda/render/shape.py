"""Shape ops: views where the memory order allows (reshape, flatten, identity), else a strided copy."""

from __future__ import annotations

from irc.backends.cuda.render.context import Ctx
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def render_view(ctx: Ctx) -> None:
    """reshape, flatten: the operand's memory with the result's shape."""
    ctx.alias(0, ctx.ins[0])


def render_transpose(ctx: Ctx) -> None:
    shape = ctx.in_shape()
    perm = [_axis(int(p), len(shape)) for p in ctx.attr("perm")]
    strides = contiguous_strides(shape)
    out = ctx.alloc()
    out_shape = ctx.out_shape()
    copy_launch(ctx, ctx.F(0), ctx.f(out), out_shape, tuple(strides[p] for p in perm), 0,
                contiguous_strides(out_shape), 0)


def _part(ctx: Ctx, out_index: int, axis: int, start: int, size: int, src_shape: tuple[int, ...]) -> None:
    """Copy ``src[..., start:start+size, ...]`` (on ``axis``) into a result of its own."""
    out = ctx.alloc(out_index)
    sub = src_shape[:axis] + (size,) + src_shape[axis + 1:]
    strides = contiguous_strides(src_shape)
    copy_launch(ctx, ctx.F(0), ctx.f(out), sub, strides, start * strides[axis], contiguous_strides(sub), 0)


def render_split(ctx: Ctx) -> None:
    shape = ctx.in_shape()
    axis = _axis(int(ctx.attr("axis", -1)), len(shape))
    start = 0
    for i in range(len(ctx.out_types)):
        size = ctx.out_shape(i)[axis]
        _part(ctx, i, axis, start, size, shape)
        start += size


def render_slice(ctx: Ctx) -> None:
    shape = ctx.in_shape()
    axis = _axis(int(ctx.attr("axis")), len(shape))
    start, stop, _ = slice(ctx.attr("start", 0), ctx.attr("end"), None).indices(shape[axis])
    _part(ctx, 0, axis, start, max(0, stop - start), shape)


def render_select(ctx: Ctx) -> None:
    shape = ctx.in_shape()
    axis = _axis(int(ctx.attr("axis")), len(shape))
    index = int(ctx.attr("index"))
    index = index + shape[axis] if index < 0 else index
    out = ctx.alloc()
    strides = contiguous_strides(shape)
    sub = shape[:axis] + shape[axis + 1:]
    sub_strides = strides[:axis] + strides[axis + 1:]
    copy_launch(ctx, ctx.F(0), ctx.f(out), sub, sub_strides, index * strides[axis], contiguous_strides(sub), 0)


def render_concat(ctx: Ctx) -> None:
    out_shape = ctx.out_shape()
    axis = _axis(int(ctx.attr("axis", -1)), len(out_shape))
    out = ctx.alloc()
    out_strides = contiguous_strides(out_shape)
    start = 0
    for i in range(len(ctx.ins)):
        shape = ctx.in_shape(i)
        copy_launch(ctx, ctx.F(i), ctx.f(out), shape, contiguous_strides(shape), 0, out_strides,
                    start * out_strides[axis])
        start += shape[axis]


RENDERERS = {
    "flatten": render_view,
    "reshape": render_view,
    "identity": render_view,
    "dropout": render_view,  # inference: the identity
    "transpose": render_transpose,
    "concat": render_concat,
    "split": render_split,
    "select": render_select,
    "slice": render_slice,
}
