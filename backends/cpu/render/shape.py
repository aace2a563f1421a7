"""Ops that only move data run in the driver as NumPy views and copies.

Every driver value stays C-contiguous (kernels rely on it): reshape and flatten are views;
transpose, select, slice and split copy into a buffer of their own (``np.copyto`` into an
allocated result), so the schedule knows exactly which values share memory.
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A4, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.literals import int_literal, shape_literal


def _axis(ctx: NodeCtx, axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _index(rank: int, axis: int, item: str) -> str:
    """``[:, :, item]`` with ``item`` on ``axis``."""
    return "[" + ", ".join([":"] * axis + [item]) + "]" if rank else "[...]"


def render_reshape(ctx: NodeCtx) -> None:
    """flatten and reshape: a view with the result's (concrete) shape."""
    ctx.emit(f"{ctx.outs[0]} = {ctx.args[0]}.reshape({shape_literal(ctx.out_shape())})")


# The two axes before the last swapped (attention's heads split off and merged back, [T, B, D] <-> [B, T, D]):
# rows of the last axis copied by both threads with unsigned flat indices. np.copyto of the transposed view
# runs on one thread: GPT-2's 48 a forward pass took 3.7 ms at B = 1, 39 ms at B = 8.
SWAP = """\
{jit}
def k_swap_middle(x, out):
    # x [a, b, c, d] -> out [a, c, b, d]: (i, j) of x sends its c rows of d to out[i, :, j]
    a, b, c, d = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    U = np.uint64
    for r in prange(a * b):
        i = r // b
        j = r - i * b
        for k in range(c):
            s = (r * c + k) * d
            t = ((i * c + k) * b + j) * d
            for e in range(d):
                of[U(t + e)] = xf[U(s + e)]
"""


def render_transpose(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    rank = len(shape)
    perm = tuple(_axis(ctx, int(p), rank) for p in ctx.attr("perm"))
    out = ctx.alloc()
    if rank >= 3 and perm == (*range(rank - 3), rank - 2, rank - 3, rank - 1):
        k = ctx.kernel(Kernel("k_swap_middle", SWAP.format(jit=jit()), (A4, A4)))
        four = f"{prod(shape[:-3])}, {shape[-3]}, {shape[-2]}, {shape[-1]}"
        lead = f"{prod(shape[:-3])}, {shape[-2]}, {shape[-3]}, {shape[-1]}"
        ctx.emit(f"{k}({ctx.args[0]}.reshape({four}), {out}.reshape({lead}))")
        return
    ctx.emit(f"np.copyto({out}, {ctx.args[0]}.transpose({shape_literal(perm)}))")


def render_concat(ctx: NodeCtx) -> None:
    axis = _axis(ctx, int(ctx.attr("axis", -1)), len(ctx.out_shape()))
    ctx.emit(f"{ctx.outs[0]} = np.concatenate([{', '.join(ctx.args)}], axis={int_literal(axis)})")


def render_split(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = _axis(ctx, int(ctx.attr("axis", -1)), len(shape))
    start = 0
    for i, out in enumerate(ctx.outs):
        size = ctx.out_shape(i)[axis]
        item = f"{start}:{start + size}"
        ctx.alloc(i)
        ctx.emit(f"np.copyto({out}, {ctx.args[0]}{_index(len(shape), axis, item)})")
        start += size


def render_select(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = _axis(ctx, int(ctx.attr("axis")), len(shape))
    index = int(ctx.attr("index"))
    index = index + shape[axis] if index < 0 else index
    out = ctx.alloc()
    ctx.emit(f"np.copyto({out}, {ctx.args[0]}{_index(len(shape), axis, str(index))})")


def render_slice(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = _axis(ctx, int(ctx.attr("axis")), len(shape))
    start, stop, _ = slice(ctx.attr("start", 0), ctx.attr("end"), None).indices(shape[axis])
    item = f"{int_literal(start)}:{int_literal(stop)}"
    out = ctx.alloc()
    ctx.emit(f"np.copyto({out}, {ctx.args[0]}{_index(len(shape), axis, item)})")


RENDERERS = {
    "flatten": render_reshape,
    "reshape": render_reshape,
    "transpose": render_transpose,
    "concat": render_concat,
    "split": render_split,
    "select": render_select,
    "slice": render_slice,
}
