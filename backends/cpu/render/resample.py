"""Upsampling (a Numba kernel), and the ops that only regroup or repeat elements (pixel shuffle,
pixel unshuffle, expand), which run in the driver as NumPy copies like the other shape ops:
the result gets a C-contiguous buffer of its own, so kernels can rely on its layout."""

from __future__ import annotations

from irc.backends.common.kernel import A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.conv import PLANES
from irc.backends.literals import shape_literal
from irc.ops.resample import scales

# output row oi and column oj's bilinear source taps (i0, i1 with weight lh; j0, j1 with lw), float64 coordinates
# as the reference computes them (PyTorch's align_corners rule); shared with the upsample gradient (grad_conv.py)
BILINEAR_TAPS = """\
            if align:
                src = oi * ((hi - 1) / (ho - 1)) if ho > 1 else 0.0
            else:
                src = max((oi + 0.5) / sh - 0.5, 0.0)
            i0 = min(int(np.floor(src)), hi - 1)
            i1 = min(i0 + 1, hi - 1)
            lh = np.float32(src - i0)
            for oj in range(wo):
                if align:
                    srcw = oj * ((wi - 1) / (wo - 1)) if wo > 1 else 0.0
                else:
                    srcw = max((oj + 0.5) / sw - 0.5, 0.0)
                j0 = min(int(np.floor(srcw)), wi - 1)
                j1 = min(j0 + 1, wi - 1)
                lw = np.float32(srcw - j0)
"""

UPSAMPLE = """\
{jit}
def k_upsample2d(x, out, sh, sw, bilinear, align):
    # one (sample, channel) plane per task; source coordinates in float64, as the reference's
{planes}            if bilinear == 0:
                ii = oi // sh
                for oj in range(wo):
                    out[n, c, oi, oj] = x[n, c, ii, oj // sw]
                continue
{taps}                top = x[n, c, i0, j0] * (np.float32(1.0) - lw) + x[n, c, i0, j1] * lw
                bottom = x[n, c, i1, j0] * (np.float32(1.0) - lw) + x[n, c, i1, j1] * lw
                out[n, c, oi, oj] = top * (np.float32(1.0) - lh) + bottom * lh
"""
UPSAMPLE_KERNEL = Kernel("k_upsample2d", UPSAMPLE.format(jit=jit(), planes=PLANES, taps=BILINEAR_TAPS),
                         (A4, A4) + (I64,) * 4)


def _as_4d(var: str, shape: tuple[int, ...]) -> str:
    return var if len(shape) == 4 else f"{var}.reshape({shape[0]}, {shape[1]}, 1, {shape[2]})"


def render_upsample(ctx: NodeCtx) -> None:
    xs = ctx.in_shape()
    factors = scales(ctx.node.attrs, len(xs))
    sh, sw = factors if len(factors) == 2 else (1, factors[0])
    k = ctx.kernel(UPSAMPLE_KERNEL)
    out = ctx.alloc()
    bilinear = 1 if ctx.attr("mode") == "bilinear" else 0
    align = 1 if ctx.attr("align_corners") else 0
    ctx.emit(f"{k}({_as_4d(ctx.args[0], xs)}, {_as_4d(out, ctx.out_shape())}, sh={sh}, sw={sw}, "
             f"bilinear={bilinear}, align={align})")


def _pixel_views(ctx: NodeCtx, shuffle: bool) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(source view, permutation, result view): pixel (un)shuffle as one strided copy of 5-D views."""
    r = int(ctx.attr("factor"))
    *lead, c, h, w = ctx.in_shape()
    n = 1
    for d in lead:
        n *= d
    if shuffle:  # [N, C, r, r, H, W] -> [N, C, H, r, W, r]
        return (n, c // (r * r), r, r, h, w), (0, 1, 4, 2, 5, 3), (n, c // (r * r), h, r, w, r)
    # [N, C, H/r, r, W/r, r] -> [N, C, r, r, H/r, W/r]
    return (n, c, h // r, r, w // r, r), (0, 1, 3, 5, 2, 4), (n, c, r, r, h // r, w // r)


def render_pixel(ctx: NodeCtx) -> None:
    src, perm, dst = _pixel_views(ctx, ctx.node.op == "pixel_shuffle")
    out = ctx.alloc()
    ctx.emit(f"np.copyto({out}.reshape({shape_literal(dst)}), "
             f"{ctx.args[0]}.reshape({shape_literal(src)}).transpose({shape_literal(perm)}))")


def render_expand(ctx: NodeCtx) -> None:
    out = ctx.alloc()
    ctx.emit(f"np.copyto({out}, np.broadcast_to({ctx.args[0]}, {shape_literal(ctx.out_shape())}))")


RENDERERS = {
    "upsample": render_upsample,
    "pixel_shuffle": render_pixel,
    "pixel_unshuffle": render_pixel,
    "expand": render_expand,
}
