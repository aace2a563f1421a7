"""Convolution as im2col + the batched GEMM (bias in its epilogue), and pooling.

1-D ops run as 2-D ones with a height of 1. A 1×1 convolution with unit stride and no
padding needs no im2col: the input already is the GEMM's B operand.
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A4, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx
from irc.backends.cuda.render.dense import launch_gemm
from irc.backends.cuda.render.gemm_src import GemmSpec, pick_tile
from irc.backends.numpy_ref.conv import conv_pads
from irc.ops.common import per_axis

GEOMETRY = "kh, kw, sh, sw, ph, pw, dh, dw"
GEOMETRY_KINDS = (I64,) * 8

IM2COL = f"""\
{JIT}
def k_im2col(x, cols, total, groups, cg, oh, ow, {GEOMETRY}):
    i = cuda.grid(1)
    if i < total:
        ox = i % ow
        r = i // ow
        oy = r % oh
        r //= oh
        kx = r % kw
        r //= kw
        ky = r % kh
        r //= kh
        ci = r % cg
        gb = r // cg
        b = gb // groups
        c = (gb % groups) * cg + ci
        iy = oy * sh - ph + ky * dh
        ix = ox * sw - pw + kx * dw
        inside = iy >= 0 and iy < x.shape[2] and ix >= 0 and ix < x.shape[3]
        cols[i] = x[b, c, iy, ix] if inside else np.float32(0.0)
"""
IM2COL_KERNEL = Kernel("k_im2col", IM2COL, (A4, A1, I64, I64, I64, I64, I64) + GEOMETRY_KINDS)



def _as_2d(shape: tuple[int, ...]) -> tuple[int, ...]:
    """[B, C, L] -> [B, C, 1, L]; 2-D shapes unchanged."""
    return shape if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])


def _pair(values: tuple[int, ...], fill: int) -> tuple[int, int]:
    return (values[0], values[1]) if len(values) == 2 else (fill, values[0])


def render_conv(ctx: Ctx) -> None:
    ctx.need_float()
    xs, ws = ctx.in_shape(), ctx.params["weight"]
    nd = len(xs) - 2
    kernel = ws[2:]
    stride, dilation = per_axis(ctx.attr("stride", 1), nd), per_axis(ctx.attr("dilation", 1), nd)
    pads = conv_pads(ctx.attr("padding", 0), kernel, dilation, nd)
    groups = int(ctx.attr("groups", 1))
    b, c, h, w = _as_2d(xs)
    o = ws[0]
    cg, og = c // groups, o // groups
    _, _, oh, ow = _as_2d(ctx.out_shape())
    kh, kw = _pair(tuple(kernel), 1)
    sh, sw = _pair(stride, 1)
    dh, dw = _pair(dilation, 1)
    ph, pw = _pair(tuple(p[0] for p in pads), 0)
    ck, npix, z = cg * kh * kw, oh * ow, b * groups
    direct = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)
    if direct:  # the input is already [B·G, C/G, H·W]
        cols = ctx.view(ctx.ins[0], (z, ck, npix))
    else:
        cols = ctx.temp((z, ck, npix))
        total = z * ck * npix
        grid, block = ctx.flat_grid(total)
        args = [ctx.v(ctx.view(ctx.ins[0], (b, c, h, w))), ctx.f(cols), ctx.i(total), ctx.i(groups), ctx.i(cg),
                ctx.i(oh), ctx.i(ow)] + [ctx.i(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw)]
        ctx.launch(ctx.kernel(IM2COL_KERNEL), grid, block, args)
    out = ctx.alloc()
    weight = ctx.v(ctx.view(ctx.weight("weight"), (groups, og, ck)))
    has_bias = ctx.has_weight("bias")
    spec = GemmSpec(pick_tile(og, npix, z), "nn", "row" if has_bias else "none")
    bias = ctx.f(ctx.weight("bias")) if has_bias else ctx.f(out)
    launch_gemm(ctx, spec, weight, [ctx.v(ctx.view(cols, (z, ck, npix)))], bias,
                [ctx.v(ctx.view(out, (z, og, npix)))], og, npix, ck, z, a_batch=(1, groups), b_batch=(1, z),
                bias_mod=groups)



# -- transposed convolution ------------------------------------------------------------------------
# one thread per output element: it gathers the input pixels whose scatter lands on it,
# iy = (oy + ph − ky·dh) / sh where that divides exactly (w is [in, out/groups, kh, kw])
CONV_TRANSPOSE = f"""\
{JIT}
def k_conv_transpose(x, w, bias, out, total, groups, co, oh, ow, {GEOMETRY}):
    i = cuda.grid(1)
    if i < total:
        ox = i % ow
        r = i // ow
        oy = r % oh
        r //= oh
        o = r % co
        b = r // co
        og = w.shape[1]
        cg = x.shape[1] // groups
        g = o // og
        acc = np.float32(0.0)
        for ky in range(kh):  # the taps first: only about 1/(sh·sw) of them land on this output
            ny = oy + ph - ky * dh
            iy = ny // sh
            if ny >= 0 and iy * sh == ny and iy < x.shape[2]:
                for kx in range(kw):
                    nx = ox + pw - kx * dw
                    ix = nx // sw
                    if nx >= 0 and ix * sw == nx and ix < x.shape[3]:
                        for c in range(g * cg, (g + 1) * cg):
                            acc += x[b, c, iy, ix] * w[c, o - g * og, ky, kx]
        out[i] = acc + bias[o]
"""
CONV_TRANSPOSE_KERNEL = Kernel("k_conv_transpose", CONV_TRANSPOSE, (A4, A4, A1, A1) + (I64,) * 5 + GEOMETRY_KINDS)


def render_conv_transpose(ctx: Ctx) -> None:
    """1-D runs as 2-D with a height of 1."""
    ctx.need_float()
    xs, ws = ctx.in_shape(), ctx.params["weight"]
    nd = len(xs) - 2
    b, c, h, w = _as_2d(xs)
    _, co, oh, ow = _as_2d(ctx.out_shape())
    kh, kw = _pair(tuple(ws[2:]), 1)
    sh, sw = _pair(per_axis(ctx.attr("stride"), nd), 1)
    ph, pw = _pair(per_axis(ctx.attr("padding"), nd), 0)
    dh, dw = _pair(per_axis(ctx.attr("dilation"), nd), 1)
    out = ctx.alloc()
    total = b * co * oh * ow
    grid, block = ctx.flat_grid(total)
    weight = ctx.v(ctx.view(ctx.weight("weight"), (ws[0], ws[1], kh, kw)))
    args = [ctx.v(ctx.view(ctx.ins[0], (b, c, h, w))), weight, ctx.f(ctx.weight_or_const("bias", co, 0.0)),
            ctx.f(out), ctx.i(total), ctx.i(int(ctx.attr("groups"))), ctx.i(co), ctx.i(oh), ctx.i(ow)]
    args += [ctx.i(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw)]
    ctx.launch(ctx.kernel(CONV_TRANSPOSE_KERNEL), grid, block, args)

# -- pooling ------------------------------------------------------------------------------------

# one thread per output element i of [b, c, oy, ox] (x is [B, C, H, W])
PIXEL = """\
    i = cuda.grid(1)
    if i < total:
        ox = i % ow
        r = i // ow
        oy = r % oh
        bc = r // oh
        plane = x.shape[1]
        b = bc // plane
        c = bc % plane
"""

POOL = """\
{jit}
def {name}(x, out, total, oh, ow, {geometry}, include_pad):
{pixel}\
        acc = {init}
        count = 0
        for ky in range(kh):
            iy = oy * sh - ph + ky * dh
            for kx in range(kw):
                ix = ox * sw - pw + kx * dw
                if iy >= 0 and iy < x.shape[2] and ix >= 0 and ix < x.shape[3]:
                    v = x[b, c, iy, ix]
                    {combine}
                    count += 1
        {finish}
"""
MAX = dict(init="np.float32(-np.inf)", combine="acc = v if (v > acc or v != v) else acc", finish="out[i] = acc")
AVG = dict(init="np.float32(0.0)", combine="acc += v",
           finish="out[i] = acc / np.float32(kh * kw if include_pad else max(count, 1))")
POOL_KERNELS = {
    kind: Kernel(f"k_{kind}pool", POOL.format(jit=JIT, name=f"k_{kind}pool", geometry=GEOMETRY, pixel=PIXEL, **parts),
                 (A4, A1, I64, I64, I64) + GEOMETRY_KINDS + (I64,))
    for kind, parts in (("max", MAX), ("avg", AVG))
}


def render_pool(ctx: Ctx) -> None:
    ctx.need_float()
    xs = ctx.in_shape()
    nd = len(xs) - 2
    kernel = per_axis(ctx.attr("kernel"), nd)
    stride = per_axis(ctx.attr("stride") if ctx.attr("stride") is not None else ctx.attr("kernel"), nd)
    dilation = per_axis(ctx.attr("dilation", 1), nd)
    pads = per_axis(ctx.attr("padding", 0), nd)
    b, c, h, w = _as_2d(xs)
    _, _, oh, ow = _as_2d(ctx.out_shape())
    geometry = _pair(kernel, 1) + _pair(stride, 1) + _pair(pads, 0) + _pair(dilation, 1)
    kind = "max" if ctx.node.op.startswith("max") else "avg"
    out = ctx.alloc()
    total = b * c * oh * ow
    grid, block = ctx.flat_grid(total)
    include = 1 if ctx.attr("count_include_pad", True) else 0
    args = [ctx.v(ctx.view(ctx.ins[0], (b, c, h, w))), ctx.f(out), ctx.i(total), ctx.i(oh), ctx.i(ow)]
    kh, sh, ph, dh = geometry[0], geometry[2], geometry[4], geometry[6]
    kw, sw, pw, dw = geometry[1], geometry[3], geometry[5], geometry[7]
    args += [ctx.i(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw)] + [ctx.i(include)]
    ctx.launch(ctx.kernel(POOL_KERNELS[kind]), grid, block, args)


ADAPTIVE = f"""\
{JIT}
def k_adaptive_avgpool(x, out, total, oh, ow):
{PIXEL}\
        h = x.shape[2]
        w = x.shape[3]
        r0 = (oy * h) // oh
        r1 = ((oy + 1) * h + oh - 1) // oh
        c0 = (ox * w) // ow
        c1 = ((ox + 1) * w + ow - 1) // ow
        acc = np.float32(0.0)
        for iy in range(r0, r1):
            for ix in range(c0, c1):
                acc += x[b, c, iy, ix]
        out[i] = acc / np.float32((r1 - r0) * (c1 - c0))
"""
ADAPTIVE_KERNEL = Kernel("k_adaptive_avgpool", ADAPTIVE, (A4, A1, I64, I64, I64))


def render_adaptive(ctx: Ctx) -> None:
    ctx.need_float()
    b, c, h, w = ctx.in_shape()
    _, _, oh, ow = ctx.out_shape()
    out = ctx.alloc()
    total = b * c * oh * ow
    grid, block = ctx.flat_grid(total)
    ctx.launch(ctx.kernel(ADAPTIVE_KERNEL), grid, block,
               [ctx.V(0), ctx.f(out), ctx.i(total), ctx.i(oh), ctx.i(ow)])


MEAN = f"""\
{JIT}
def k_mean_rows(x, out, rows, d):
    i = cuda.grid(1)
    if i < rows:
        acc = np.float32(0.0)
        for j in range(d):
            acc += x[i * d + j]
        out[i] = acc / np.float32(d)
"""
MEAN_KERNEL = Kernel("k_mean_rows", MEAN, (A1, A1, I64, I64))


def render_global_avgpool(ctx: Ctx) -> None:
    ctx.need_float()
    xs = ctx.in_shape()
    rows, d = xs[0] * xs[1], prod(xs[2:])
    out = ctx.alloc()
    grid, block = ctx.flat_grid(rows)
    ctx.launch(ctx.kernel(MEAN_KERNEL), grid, block, [ctx.F(0), ctx.f(out), ctx.i(rows), ctx.i(d)])


RENDERERS = {
    "conv1d": render_conv,
    "conv2d": render_conv,
    "conv_transpose1d": render_conv_transpose,
    "conv_transpose2d": render_conv_transpose,
    "maxpool1d": render_pool,
    "maxpool2d": render_pool,
    "avgpool1d": render_pool,
    "avgpool2d": render_pool,
    "adaptive_avgpool2d": render_adaptive,
    "global_avgpool": render_global_avgpool,
}
