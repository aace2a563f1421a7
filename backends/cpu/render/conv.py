"""Convolution (im2col + BLAS per image and group) and pooling; 1-D runs as 2-D with H = 1."""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
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


def render_conv(ctx: NodeCtx) -> None:
    nd = 2 if ctx.node.op == "conv2d" else 1
    kernel = _pair(ctx.attr("kernel"), nd)
    stride = _pair(ctx.attr("stride", 1), nd)
    dilation = _pair(ctx.attr("dilation", 1), nd)
    pads = _pads(ctx.attr("padding", 0), kernel, dilation, nd)
    groups = int(ctx.attr("groups", 1))
    w_shape = ctx.weight_shape("weight")
    k = ctx.kernel(CONV2D_KERNEL)
    out = ctx.alloc()
    w = ctx.weight("weight")
    if nd == 1:
        w = f"{w}.reshape({w_shape[0]}, {w_shape[1]}, 1, {w_shape[2]})"
    sh, sw = _spatial(nd, stride, 1)
    ph, pw = _spatial(nd, pads, 0)
    dh, dw = _spatial(nd, dilation, 1)
    ctx.emit(f"{k}({_as_4d(ctx.args[0], ctx.in_shape(), nd)}, {w}, "
             f"{ctx.weight_or_zeros('bias', w_shape[0])}, {_as_4d(out, ctx.out_shape(), nd)}, "
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
{planes}\
            for oj in range(wo):
                m = np.float32(-np.inf)  # padding counts as -inf
                for ki in range(kh):
                    ii = oi * sh - ph + ki * dh
                    if 0 <= ii < hi:
                        for kj in range(kw):
                            jj = oj * sw - pw + kj * dw
                            if 0 <= jj < wi:
                                v = x[n, c, ii, jj]
                                if v > m or v != v:
                                    m = v
                out[n, c, oi, oj] = m
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
        k = ctx.kernel(Kernel("k_maxpool2d", MAXPOOL.format(jit=JIT, planes=PLANES), (A4, A4) + (I64,) * 8))
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
