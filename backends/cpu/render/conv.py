"""Convolutions (grouped: im2col + BLAS per image and group; otherwise Winograd for 3×3 of stride 1, the tap
sum of conv_taps.py, conv_table.py's product over all taps for few channels, conv_pointwise.py's gathered
product for strided 1×1s, the exact im2col panel of conv_cols.py or conv_gemm.py's tiles, as _conv_kernel picks),
conv2d_bn (BatchNorm folded at load) and pooling; 1-D runs as 2-D with H = 1."""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import (
    conv_blas,
    conv_cols,
    conv_direct,
    conv_pointwise,
    conv_table,
    conv_taps,
    gemm_packed,
    winograd,
)
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.conv_gemm import conv_gemm_kernel
from irc.backends.cpu.render.gemm import THREADS

JIT = jit()

CONV2D = """\
{jit}
def k_conv2d(x, w, b, out, sh, sw, ph, pw, dh, dw, groups, parts):
    # tasks are (image, group, block of output pixels): each gathers its im2col block and
    # makes one single-threaded BLAS call [out channels, kk] x [kk, pixels]
    nb, _, hi, wi = x.shape
    co, cg, kh, kw = w.shape
    ho, wo = out.shape[2], out.shape[3]
    og = co // groups
    kk = cg * kh * kw
    npix = ho * wo
    w2 = w.reshape(co, kk)
    out3 = out.reshape(nb, co, npix)
    blocks = parts if nb * groups < 2 * parts else 1
    for task in prange(nb * groups * blocks):
        blk = task % blocks
        g = (task // blocks) % groups
        n = task // (blocks * groups)
        p0 = blk * npix // blocks
        p1 = (blk + 1) * npix // blocks
        m = p1 - p0
        if m == 0:
            continue
        col = np.empty((kk, m), np.float32)
        for r in range(kk):  # one row of the im2col block: (channel, ki, kj)
            c = g * cg + r // (kh * kw)
            ki = (r // kw) % kh
            kj = r % kw
            oi = p0 // wo
            oj = p0 % wo
            for p in range(m):
                ii = oi * sh - ph + ki * dh
                jj = oj * sw - pw + kj * dw
                if 0 <= ii < hi and 0 <= jj < wi:
                    col[r, p] = x[n, c, ii, jj]
                else:
                    col[r, p] = np.float32(0.0)
                oj += 1
                if oj == wo:
                    oj = 0
                    oi += 1
        res = np.dot(w2[g * og:(g + 1) * og], col)
        for o in range(og):
            bo = b[g * og + o]
            for p in range(m):
                out3[n, g * og + o, p0 + p] = res[o, p] + bo
"""
CONV2D_KERNEL = Kernel("k_conv2d", CONV2D.format(jit=JIT), (A4, A4, A1, A4) + (I64,) * 8)


def _pair(v, nd: int) -> tuple[int, ...]:
    if isinstance(v, list):
        return tuple(int(x) for x in v)
    return (int(v),) * nd


def _pads(padding, kernel: tuple[int, ...], dilation: tuple[int, ...], nd: int) -> tuple[int, ...]:
    """Padding before each spatial axis (PyTorch's 'same' puts the odd one after)."""
    if padding == "valid":
        return (0,) * nd
    if padding == "same":
        return tuple((d * (k - 1)) // 2 for k, d in zip(kernel, dilation))
    return _pair(padding, nd)


def _as_4d(var: str, shape: tuple[int, ...], nd: int) -> str:
    if nd == 2:
        return var
    return f"{var}.reshape({shape[0]}, {shape[1]}, 1, {shape[2]})"


def _spatial(nd: int, values: tuple[int, ...], one: int) -> tuple[int, int]:
    return (values[0], values[1]) if nd == 2 else (one, values[0])


def _geometry(ctx: NodeCtx, nd: int) -> tuple[int, ...]:
    """(kh, kw, sh, sw, ph, pw, dh, dw) of a conv node; 1-D is 2-D with H = 1."""
    kernel = _pair(ctx.attr("kernel"), nd)
    stride = _pair(ctx.attr("stride", 1), nd)
    dilation = _pair(ctx.attr("dilation", 1), nd)
    pads = _pads(ctx.attr("padding", 0), kernel, dilation, nd)
    return (*_spatial(nd, kernel, 1), *_spatial(nd, stride, 1), *_spatial(nd, pads, 0), *_spatial(nd, dilation, 1))


def _conv_kernel(ci: int, geometry: tuple[int, ...], nb: int, ho: int, wo: int, packed: bool) -> str:
    """Which kernel serves a convolution without groups (Winograd's 3×3s aside). With the weight known at load
    (``packed``), every kernel of more than one tap on 16 channels or more takes the direct product
    (conv_direct.py: 1.06-1.32× the packed tap sum, ResNet-18 1.06× at B = 1). Otherwise: the tap sum when each tap's
    GEMM has channels enough and the grid's extra columns are few (≤ 1/4 of a row: 3×3 of stride 2 on a
    7×7 output wastes 1/7 and still wins), the exact im2col panel otherwise (the 3-channel stem, a 3×3 of
    stride 1 on a 7×7 map, a batch of 1×1s on small maps), the im2col tiles over the tap sum's grid for few
    channels at stride 1.
    A strided 1×1, whatever its weight, takes conv_pointwise.py's gathered product (against the im2col panel on
    ResNet-18's downsamples: 1.10-1.46× at B = 8, 0.94-1.33× at B = 1; the panel was 1.27-1.35× the tap sum's).
    With the weight known at load (``packed``: register blocks on a weight packed once, their 16-column
    vectors padding the exact panel too), a larger kernel on fewer channels than the tap sum takes the table's
    product over all taps (the stem: 1.3× the panel at B = 1 and B = 8, its im2col copy gone) unless its grid
    wastes over 1/4 of a row, and otherwise the tap sum, unless its padded grid is over 1/4 wider than the
    padded panel (a 3×3 on a 7×7 map: 64 columns either way, and no im2col copy)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    if conv_pointwise.applies((kh, kw), (sh, sw)):
        return "pointwise"
    if packed and conv_direct.applies(ci, 1, kh * kw):
        return "direct"
    extra = ((kw - 1) * dw) // sw
    if nb > 1 and ho * wo < 256:  # a GEMM per image would be too narrow: one for the batch
        return "cols"
    if packed and conv_table.applies(ci, kh, kw, wo, extra):
        return "table"
    if conv_taps.applies(ci, 1) and 4 * extra <= wo:
        return "taps"
    return "gemm" if (sh, sw) == (1, 1) and not conv_taps.applies(ci, 1) else "cols"


def _gemm_conv_call(ctx: NodeCtx, nd: int, flat: Callable[[], str], w_key: str | None, w_expr: str, b: str,
                    res: str | None, act_name: str, has_bias: bool = True) -> None:
    """The convolution without groups on [B, C, H, W] views, by the kernel _conv_kernel picks. ``flat()``
    gives the weight as [out, in·kh·kw] (looked up or derived when called); the tap sum derives its
    (ki, kj, c) order from ``w_expr`` (any shape of [out, in, kh, kw]'s size) under ``w_key``, or computes
    it on every run when ``w_key`` is None (weights that are computed values)."""
    geometry = _geometry(ctx, nd)
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    co, ci = ctx.out_shape()[1], ctx.in_shape()[1]
    out_shape = ctx.out_shape()
    x_shape = ctx.in_shape() if nd == 2 else (ctx.in_shape()[0], ci, 1, ctx.in_shape()[2])
    o_shape = out_shape if nd == 2 else (out_shape[0], co, 1, out_shape[2])
    kind = _conv_kernel(ci, geometry, o_shape[0], o_shape[2], o_shape[3], packed=w_key is not None)
    # the tap sum's GEMMs (without extra grid columns) and the pointwise product write the output before reading
    # res: the output must not take res's buffer
    in_place = kind == "pointwise" or (kind == "taps" and ((kw - 1) * dw) // sw == 0)
    kk = ci * kh * kw
    # a packed weight (its strips, seen as [rows, kk] by the kernel: only their shape is read) or BLAS's
    packed = w_key is not None and kind in ("cols", "table", "direct")
    if kind == "direct":
        ap = conv_direct.packed_weight(ctx, w_key, w_expr, co, kk)
    elif packed:
        ap = ctx.derive(f"~gemm_pack6({w_key})", f"gemm_pack6({w_expr}, {co}, {kk})")
    if kind == "direct":
        w = ap
    elif packed:
        w = f"{ap}.reshape({gemm_packed.strips(co) * 6}, {kk})"
    else:
        w = conv_taps.tap_weight(ctx, w_key, w_expr, co, ci, kh, kw) if kind == "taps" and kh * kw > 1 else flat()
        ap = f"{w}.reshape(-1)"  # (unread)
    out = ctx.alloc(inplace=(len(ctx.args) - 1,) if res is not None and not in_place else ())
    rows = f"{out_shape[0]}, {out_shape[1]}, {prod(out_shape[2:])}"
    res3 = f"{res}.reshape({rows})" if res is not None else f"{out}.reshape({rows})"  # unread when has_res=0
    x4, o4 = _as_4d(ctx.args[0], ctx.in_shape(), nd), _as_4d(out, out_shape, nd)
    operands = f"{x4}, {w}, {b}, {res3}, {o4}"
    window = f"sh={sh}, sw={sw}, ph={ph}, pw={pw}, dh={dh}, dw={dw}, kh={kh}, kw={kw}"
    has_res = 0 if res is None else 1
    if kind == "direct":
        work = conv_blas.work(ctx, conv_direct.work_size(geometry, x_shape, o_shape))
        ctx.emit(f"{conv_direct.conv_direct_kernel(ctx, act_name)}({operands}, {work}, {window}, has_res={has_res}, "
                 f"parts={THREADS})")
    elif kind == "taps":
        work = conv_blas.work(ctx, conv_taps.work_size(geometry, x_shape, o_shape))
        ctx.emit(f"{conv_taps.conv_taps_kernel(ctx, act_name)}({operands}, {work}, "
                 f"{window}, has_bias={int(has_bias)}, has_res={has_res}, pb={conv_taps.block(co)}, "
                 f"parts={THREADS})")
    elif kind == "table":
        work = conv_blas.work(ctx, conv_table.work_size(geometry, x_shape, o_shape))
        ctx.emit(f"{conv_table.conv_table_kernel(ctx, act_name)}({operands}, {work}, {ap}, {window}, "
                 f"has_res={has_res}, pb={conv_table.BLOCK}, parts={THREADS})")
    elif kind == "pointwise":
        work = conv_blas.work(ctx, conv_pointwise.work_size(x_shape, o_shape))
        ctx.emit(f"{conv_pointwise.conv_pointwise_kernel(ctx, act_name)}({operands}, {work}, sh={sh}, sw={sw}, "
                 f"ph={ph}, pw={pw}, has_res={has_res}, parts={THREADS})")
    elif kind == "cols":
        ncol = o_shape[0] * o_shape[2] * o_shape[3]
        tile = conv_cols.tile(co, kk, ncol)
        work = conv_blas.work(ctx, conv_cols.work_size(geometry, x_shape, o_shape, tile))
        ctx.emit(f"{conv_cols.conv_cols_kernel(ctx, act_name)}({operands}, {work}, {ap}, packed={int(packed)}, "
                 f"{window}, has_res={has_res}, tile={tile}, parts={THREADS})")
    else:
        ctx.emit(f"{conv_gemm_kernel(ctx, act_name)}({operands}, {window}, has_res={has_res}, parts={THREADS})")


def _winograd(ctx: NodeCtx) -> winograd.Variant | None:
    """The Winograd variant serving a 2-D convolution node, if any."""
    kh, kw, sh, sw, ph, pw, dh, dw = _geometry(ctx, 2)
    nb, co, ho, wo = ctx.out_shape()
    return winograd.variant((kh, kw), (sh, sw), (dh, dw), int(ctx.attr("groups", 1)), nb, ctx.in_shape()[1], co, ho,
                            wo)


def render_conv(ctx: NodeCtx) -> None:
    nd = 2 if ctx.node.op == "conv2d" else 1
    groups = int(ctx.attr("groups", 1))
    w_shape = ctx.weight_shape("weight")
    bias = ctx.weight_or_zeros("bias", w_shape[0])
    wino = _winograd(ctx) if nd == 2 else None
    if wino is not None:
        u = winograd.packed_filter(ctx, wino, ctx.weight_key("weight"), ctx.weight("weight"), w_shape[0], w_shape[1])
        winograd.winograd_call(ctx, wino, u, bias, None, "none", *_geometry(ctx, 2)[4:6], packed=True)
        return
    if groups == 1:
        w = ctx.weight("weight")
        _gemm_conv_call(ctx, nd, lambda: f"{w}.reshape({w_shape[0]}, {prod(w_shape[1:])})", ctx.weight_key("weight"),
                        w, bias, None, "none", has_bias=ctx.has_weight("bias"))
        return
    kh, kw, sh, sw, ph, pw, dh, dw = _geometry(ctx, nd)
    k = ctx.kernel(CONV2D_KERNEL)
    out = ctx.alloc()
    w = ctx.weight("weight")
    if nd == 1:
        w = f"{w}.reshape({w_shape[0]}, {w_shape[1]}, 1, {w_shape[2]})"
    ctx.emit(f"{k}({_as_4d(ctx.args[0], ctx.in_shape(), nd)}, {w}, {bias}, {_as_4d(out, ctx.out_shape(), nd)}, "
             f"sh={sh}, sw={sw}, ph={ph}, pw={pw}, dh={dh}, dw={dw}, groups={groups}, parts={THREADS})")


# pooling and upsampling (resample.py) kernels: one (sample, channel) plane per task, then its output rows
PLANES = """\
    nb, nc, hi, wi = x.shape
    ho, wo = out.shape[2], out.shape[3]
    for bc in prange(nb * nc):
        n = bc // nc
        c = bc % nc
        for oi in range(ho):
"""

MAXPOOL = """\
{jit}
def k_maxpool2d(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    # separable, per output row: the maximum over the window's input rows, element by element along the
    # input row, into a row buffer padded with -inf on both sides (padding never wins), then each output's
    # maximum over its kw taps of that buffer, tap after tap over the whole output row. A NaN wins
    # (v > m | v != v keeps the first NaN; `|`, not `or`: a select, no branch). Flat indices cast to
    # uint64: numba adds no wraparound check, and the loops vectorise.
    nb, nc, hi, wi = x.shape
    ho, wo = out.shape[2], out.shape[3]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    U = np.uint64
    ninf = np.float32(-np.inf)
    span = max(pw + wi, (wo - 1) * sw + (kw - 1) * dw + 1)  # buffer element t is input column t - pw
    for bc in prange(nb * nc):
        row = np.full(span, ninf, np.float32)
        for oi in range(ho):
            rows = 0
            for ki in range(kh):
                ii = oi * sh - ph + ki * dh
                if 0 <= ii < hi:
                    s = (bc * hi + ii) * wi - pw
                    if rows == 0:
                        for t in range(pw, pw + wi):
                            row[U(t)] = xf[U(s + t)]
                    else:
                        for t in range(pw, pw + wi):
                            v = xf[U(s + t)]
                            m = row[U(t)]
                            row[U(t)] = v if (v > m) | (v != v) else m
                    rows += 1
            if rows == 0:  # a window of padding only
                for t in range(pw, pw + wi):
                    row[U(t)] = ninf
            d = (bc * ho + oi) * wo
            if sw == 2 and kw == 3 and dw == 1:  # ResNet's 3×3 of stride 2: the three taps in one pass
                for oj in range(wo):
                    m = row[U(2 * oj)]
                    v = row[U(2 * oj + 1)]
                    m = v if (v > m) | (v != v) else m
                    v = row[U(2 * oj + 2)]
                    of[U(d + oj)] = v if (v > m) | (v != v) else m
                continue
            if sw == 2:
                for oj in range(wo):
                    of[U(d + oj)] = row[U(2 * oj)]
            else:
                for oj in range(wo):
                    of[U(d + oj)] = row[U(oj * sw)]
            for kj in range(1, kw):
                e = kj * dw
                if sw == 2:
                    for oj in range(wo):
                        v = row[U(2 * oj + e)]
                        m = of[U(d + oj)]
                        of[U(d + oj)] = v if (v > m) | (v != v) else m
                else:
                    for oj in range(wo):
                        v = row[U(oj * sw + e)]
                        m = of[U(d + oj)]
                        of[U(d + oj)] = v if (v > m) | (v != v) else m
"""

AVGPOOL = """\
{jit}
def k_avgpool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad):
{planes}\
            h0 = oi * sh - ph
            h1 = min(h0 + kh, hi + ph)
            for oj in range(wo):
                w0 = oj * sw - pw
                w1 = min(w0 + kw, wi + pw)
                pool = (h1 - h0) * (w1 - w0)  # PyTorch: the window clipped to the padded input
                a0, a1 = max(h0, 0), min(h1, hi)
                b0, b1 = max(w0, 0), min(w1, wi)
                s = np.float32(0.0)
                for ii in range(a0, a1):
                    for jj in range(b0, b1):
                        s += x[n, c, ii, jj]
                count = pool if include_pad else (a1 - a0) * (b1 - b0)
                out[n, c, oi, oj] = s / np.float32(count)
"""


def maxpool_kernel(ctx: NodeCtx) -> str:
    """Register ``k_maxpool2d`` (x, out, kh, kw, sh, sw, ph, pw, dh, dw); its name."""
    return ctx.kernel(Kernel("k_maxpool2d", MAXPOOL.format(jit=JIT), (A4, A4) + (I64,) * 8))


def render_pool(ctx: NodeCtx) -> None:
    op = ctx.node.op
    nd = 2 if op.endswith("2d") else 1
    kernel = _pair(ctx.attr("kernel"), nd)
    stride = _pair(ctx.attr("stride", ctx.attr("kernel")), nd)
    pads = _pair(ctx.attr("padding", 0), nd)
    kh, kw = _spatial(nd, kernel, 1)
    sh, sw = _spatial(nd, stride, 1)
    ph, pw = _spatial(nd, pads, 0)
    out = ctx.alloc()
    x4, o4 = _as_4d(ctx.args[0], ctx.in_shape(), nd), _as_4d(out, ctx.out_shape(), nd)
    if op.startswith("max"):
        dh, dw = _spatial(nd, _pair(ctx.attr("dilation", 1), nd), 1)
        k = maxpool_kernel(ctx)
        ctx.emit(f"{k}({x4}, {o4}, kh={kh}, kw={kw}, sh={sh}, sw={sw}, ph={ph}, pw={pw}, dh={dh}, dw={dw})")
    else:
        include = 1 if ctx.attr("count_include_pad", True) else 0
        k = ctx.kernel(Kernel("k_avgpool2d", AVGPOOL.format(jit=JIT, planes=PLANES), (A4, A4) + (I64,) * 7))
        ctx.emit(f"{k}({x4}, {o4}, kh={kh}, kw={kw}, sh={sh}, sw={sw}, ph={ph}, pw={pw}, include_pad={include})")


ADAPTIVE = """\
{jit}
def k_adaptive_avgpool2d(x, out):
{planes}\
            a0 = (oi * hi) // ho  # PyTorch's bins: floor(i*H/o) .. ceil((i+1)*H/o)
            a1 = ((oi + 1) * hi + ho - 1) // ho
            for oj in range(wo):
                b0 = (oj * wi) // wo
                b1 = ((oj + 1) * wi + wo - 1) // wo
                s = np.float32(0.0)
                for ii in range(a0, a1):
                    for jj in range(b0, b1):
                        s += x[n, c, ii, jj]
                out[n, c, oi, oj] = s / np.float32((a1 - a0) * (b1 - b0))
"""


def render_adaptive(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_adaptive_avgpool2d", ADAPTIVE.format(jit=JIT, planes=PLANES), (A4, A4)))
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.args[0]}, {out})")


ROWMEAN = """\
{jit}
def k_rowmean(x, out):
    n, d = x.shape
    for r in prange(n):
        s = np.float32(0.0)
        for j in range(d):
            s += x[r, j]
        out[r] = s / np.float32(d)
"""


def render_global_avgpool(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    k = ctx.kernel(Kernel("k_rowmean", ROWMEAN.format(jit=JIT), (A2, A1)))
    out = ctx.alloc()
    rows = shape[0] * shape[1]
    ctx.emit(f"{k}({ctx.args[0]}.reshape({rows}, -1), {out}.reshape(-1))")



CONV_TRANSPOSE2D = """\
{jit}
def k_conv_transpose2d(x3, wt, b, out, hi, wi, kh, kw, sh, sw, ph, pw, dh, dw, parts):
    # PyTorch's way: one BLAS call per (image, group, block of output channels) makes the columns
    # [channels·kh·kw, input pixels] = wt [channels·kh·kw, in/groups] x x [in/groups, pixels], then
    # col2im adds each column into the output; a task owns its output channels, so no two tasks
    # write the same element (x3 is [B, C, H·W]; wt is the weight transposed once per weights dict)
    nb = x3.shape[0]
    groups, rows, cg = wt.shape
    kk = kh * kw
    og = rows // kk
    ho, wo = out.shape[2], out.shape[3]
    blocks = min(parts, og) if nb * groups < 2 * parts else 1
    for task in prange(nb * groups * blocks):
        blk = task % blocks
        g = (task // blocks) % groups
        n = task // (blocks * groups)
        c0 = blk * og // blocks
        c1 = (blk + 1) * og // blocks
        if c1 == c0:
            continue
        cols = np.dot(wt[g, c0 * kk:c1 * kk], x3[n, g * cg:(g + 1) * cg])
        for o in range(c0, c1):
            oc = g * og + o
            plane = out[n, oc]
            plane[:, :] = b[oc]
            for ki in range(kh):
                for kj in range(kw):
                    r = (o - c0) * kk + ki * kw + kj
                    for ii in range(hi):
                        oi = ii * sh - ph + ki * dh
                        if 0 <= oi < ho:
                            for jj in range(wi):
                                oj = jj * sw - pw + kj * dw
                                if 0 <= oj < wo:
                                    plane[oi, oj] += cols[r, ii * wi + jj]
"""
CONV_TRANSPOSE2D_KERNEL = Kernel("k_conv_transpose2d", CONV_TRANSPOSE2D.format(jit=JIT),
                                 (A3, A3, A1, A4) + (I64,) * 11)


def render_conv_transpose(ctx: NodeCtx) -> None:
    """1-D runs as 2-D with H = 1 (stride, padding and dilation 1, 0, 1 on that axis)."""
    nd = 2 if ctx.node.op == "conv_transpose2d" else 1
    stride = _spatial(nd, _pair(ctx.attr("stride"), nd), 1)
    pads = _spatial(nd, _pair(ctx.attr("padding"), nd), 0)
    dilation = _spatial(nd, _pair(ctx.attr("dilation"), nd), 1)
    groups = int(ctx.attr("groups"))
    ci, og, *ks = ctx.weight_shape("weight")
    kh, kw = _spatial(nd, tuple(ks), 1)
    xs = ctx.in_shape()
    hi, wi = _spatial(nd, tuple(xs[2:]), 1)
    # [in, out/g, k...] -> [groups, out/g·kh·kw, in/g]: the GEMM's A operand, contiguous per group
    wt = ctx.derive(f"~conv_transpose_t({ctx.weight_key('weight')},{groups})",
                    f"np.ascontiguousarray({ctx.weight('weight')}.reshape({groups}, {ci // groups}, "
                    f"{og * kh * kw}).transpose(0, 2, 1))")
    k = ctx.kernel(CONV_TRANSPOSE2D_KERNEL)
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.args[0]}.reshape({xs[0]}, {xs[1]}, {hi * wi}), {wt}, "
             f"{ctx.weight_or_zeros('bias', ctx.out_shape()[1])}, {_as_4d(out, ctx.out_shape(), nd)}, "
             f"hi={hi}, wi={wi}, kh={kh}, kw={kw}, sh={stride[0]}, sw={stride[1]}, ph={pads[0]}, pw={pads[1]}, "
             f"dh={dilation[0]}, dw={dilation[1]}, parts={THREADS})")

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
