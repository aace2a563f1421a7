"""Upsampling, pixel (un)shuffle and expand. Every one but bilinear upsampling only moves
elements, so it is the strided copy of ``copy.py`` with the right strides: a repeat is a stride
of 0 (nearest upsampling, expand), a regrouping is a permuted stride (pixel shuffle)."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A4, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch
from irc.ops.resample import scales

# one thread per output element i of [b, c, oy, ox]; source coordinates in float64, as the reference's
BILINEAR = f"""\
{JIT}
def k_upsample_bilinear(x, out, total, oh, ow, sh, sw, align):
    i = cuda.grid(1)
    if i < total:
        ox = i % ow
        r = i // ow
        oy = r % oh
        bc = r // oh
        b = bc // x.shape[1]
        c = bc % x.shape[1]
        h = x.shape[2]
        w = x.shape[3]
        if align:
            sy = oy * ((h - 1) / (oh - 1)) if oh > 1 else 0.0
            sx = ox * ((w - 1) / (ow - 1)) if ow > 1 else 0.0
        else:
            sy = max((oy + 0.5) / sh - 0.5, 0.0)
            sx = max((ox + 0.5) / sw - 0.5, 0.0)
        y0 = min(int(math.floor(sy)), h - 1)
        x0 = min(int(math.floor(sx)), w - 1)
        y1 = min(y0 + 1, h - 1)
        x1 = min(x0 + 1, w - 1)
        ly = np.float32(sy - y0)
        lx = np.float32(sx - x0)
        one = np.float32(1.0)
        top = x[b, c, y0, x0] * (one - lx) + x[b, c, y0, x1] * lx
        bottom = x[b, c, y1, x0] * (one - lx) + x[b, c, y1, x1] * lx
        out[i] = top * (one - ly) + bottom * ly
"""
BILINEAR_KERNEL = Kernel("k_upsample_bilinear", BILINEAR, (A4, A1) + (I64,) * 6)


def render_upsample(ctx: Ctx) -> None:
    ctx.need_float()
    xs = ctx.in_shape()
    factors = scales(ctx.node.attrs, len(xs))
    out = ctx.alloc()
    if ctx.attr("mode") == "nearest":  # out viewed as [B, C, H, sh, W, sw] reads x[b, c, h, w] at every (i, j)
        strides = contiguous_strides(xs)
        shape: tuple[int, ...] = xs[:2]
        src: tuple[int, ...] = strides[:2]
        for d, st, s in zip(xs[2:], strides[2:], factors):
            shape, src = shape + (d, s), src + (st, 0)
        copy_launch(ctx, ctx.F(0), ctx.f(out), shape, src, 0, contiguous_strides(shape), 0)
        return
    b, c, oh, ow = ctx.out_shape()
    total = b * c * oh * ow
    grid, block = ctx.flat_grid(total)
    args = [ctx.V(0), ctx.f(out), ctx.i(total), ctx.i(oh), ctx.i(ow), ctx.i(factors[0]), ctx.i(factors[1]),
            ctx.i(1 if ctx.attr("align_corners") else 0)]
    ctx.launch(ctx.kernel(BILINEAR_KERNEL), grid, block, args)


def render_pixel(ctx: Ctx) -> None:
    """One strided copy of 6-D views (see backends/cpu/render/resample.py for the index maps)."""
    r = int(ctx.attr("factor"))
    *lead, c, h, w = ctx.in_shape()
    n = prod(lead)
    if ctx.node.op == "pixel_shuffle":  # [N, C, r, r, H, W] -> [N, C, H, r, W, r]
        src, perm = (n, c // (r * r), r, r, h, w), (0, 1, 4, 2, 5, 3)
    else:  # [N, C, H/r, r, W/r, r] -> [N, C, r, r, H/r, W/r]
        src, perm = (n, c, h // r, r, w // r, r), (0, 1, 3, 5, 2, 4)
    strides = contiguous_strides(src)
    dst = tuple(src[p] for p in perm)
    out = ctx.alloc()
    copy_launch(ctx, ctx.F(0), ctx.f(out), dst, tuple(strides[p] for p in perm), 0, contiguous_strides(dst), 0)


def render_expand(ctx: Ctx) -> None:
    xs, ys = ctx.in_shape(), ctx.out_shape()
    lead = len(ys) - len(xs)
    strides = contiguous_strides(xs)
    # a new leading axis, or an axis of size 1 that grows, reads the same element again: stride 0
    src = tuple(0 if i < lead or (xs[i - lead] == 1 and d != 1) else strides[i - lead] for i, d in enumerate(ys))
    out = ctx.alloc()
    copy_launch(ctx, ctx.F(0), ctx.f(out), ys, src, 0, contiguous_strides(ys), 0)


RENDERERS = {
    "upsample": render_upsample,
    "pixel_shuffle": render_pixel,
    "pixel_unshuffle": render_pixel,
    "expand": render_expand,
}
