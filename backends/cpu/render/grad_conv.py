"""Backward of the windowed layers: convolutions (and transposed ones) as GEMMs over im2col blocks, and the
pools' and upsampling's scatter-adds. 1-D layers run as 2-D with H = 1.

conv: per image and group, ``col = im2col(x)`` ([C/g·kh·kw, pixels]); the weight gradient is one BLAS call,
``dW_g += dy_g·colᵀ``, and the input gradient another, ``dcol = W_gᵀ·dy_g``, scattered back by col2im. Each
image belongs to one thread (so its dx is written by that thread alone); the weight gradient is summed over
per-thread partials. conv_transpose is the same with the roles swapped: its input gradient is a plain
convolution of dy (``dx_g = W_g·im2col(dy)``) and its weight gradient ``x_g·im2col(dy)ᵀ``, no scatter.
Pools and upsampling take one (sample, channel) plane per task and scatter each output's gradient back to
the input positions it read (max pooling: to the first maximum of the window in tap order, as the reference
and PyTorch).
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.cpu.render.mathfns import DEVICE_JIT
from irc.backends.cpu.render.resample import BILINEAR_TAPS
from irc.ops.common import per_axis
from irc.ops.resample import scales

JIT = jit()

# col[(c, ki, kj), (oi, oj)] pairs with img[c0 + c, oi·sh − ph + ki·dh, oj·sw − pw + kj·dw]: im2col reads
# that pixel (0 outside img), col2im is its adjoint and adds the column back; one loop nest serves both
_COLUMN_LOOP = """\
{jit}
def {name}(src, dst, c0, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw):
    # {what}
    col, img = {col_img}
    hi, wi = img.shape[1], img.shape[2]
    khw = kh * kw
    for r in range(col.shape[0]):
        c = c0 + r // khw
        ki = (r // kw) % kh
        kj = r % kw
        for oi in range(ho):
            ii = oi * sh - ph + ki * dh
            base = oi * wo
            if ii < 0 or ii >= hi:
{outside}                continue
            for oj in range(wo):
                jj = oj * sw - pw + kj * dw
{inside}
"""

IM2COL = _COLUMN_LOOP.format(
    jit=DEVICE_JIT, name="grad_im2col", what="col = im2col(img): src is the image, dst the columns",
    col_img="dst, src",
    outside="                for oj in range(wo):\n                    col[r, base + oj] = np.float32(0.0)\n",
    inside="                col[r, base + oj] = img[c, ii, jj] if 0 <= jj < wi else np.float32(0.0)")

COL2IM = _COLUMN_LOOP.format(
    jit=DEVICE_JIT, name="grad_col2im", what="img += col2im(col), the adjoint: src is the columns, dst the image",
    col_img="src, dst", outside="",
    inside="                if 0 <= jj < wi:\n                    img[c, ii, jj] += col[r, base + oj]")

CONV_GRAD = """\
{jit}
def k_conv2d_grad(x, w, dy, dx, dwt, db, sh, sw, ph, pw, dh, dw, groups, parts):
    nb, ci, hi, wi = x.shape
    co, cg, kh, kw = w.shape
    ho, wo = dy.shape[2], dy.shape[3]
    og = co // groups
    kk = cg * kh * kw
    npix = ho * wo
    w2 = w.reshape(co, kk)
    dy3 = dy.reshape(nb, co, npix)
    pw_ = np.zeros((parts, co, kk), np.float32)
    pb = np.zeros((parts, co), np.float64)
    for p in prange(parts):
        col = np.empty((kk, npix), np.float32)
        for n in range(p, nb, parts):  # an image's dx is written by one thread only
            dxn = dx[n]
            for i in range(ci):
                for a in range(hi):
                    for b in range(wi):
                        dxn[i, a, b] = np.float32(0.0)
            for g in range(groups):
                grad_im2col(x[n], col, g * cg, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw)
                dyg = dy3[n, g * og:(g + 1) * og]
                pw_[p, g * og:(g + 1) * og] += np.dot(dyg, col.T)
                dcol = np.dot(w2[g * og:(g + 1) * og].T, dyg)
                grad_col2im(dcol, dxn, g * cg, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw)
            for o in range(co):
                s = 0.0
                for q in range(npix):
                    s += dy3[n, o, q]
                pb[p, o] += s
    dw2 = dwt.reshape(co, kk)
    for o in prange(co):
        for r in range(kk):
            s = np.float32(0.0)
            for p in range(parts):
                s += pw_[p, o, r]
            dw2[o, r] = s
        t = 0.0
        for p in range(parts):
            t += pb[p, o]
        db[o] = np.float32(t)
"""

CONV_TRANSPOSE_GRAD = """\
{jit}
def k_conv_transpose2d_grad(x, w, dy, dx, dwt, db, sh, sw, ph, pw, dh, dw, groups, parts):
    # y = the scatter of x·W[c, o, tap] to i·s + tap·d − padding: dx = W_g·im2col(dy), dW_g = x_g·im2col(dy)ᵀ
    nb, ci, hi, wi = x.shape
    _, og, kh, kw = w.shape
    co = dy.shape[1]
    cg = ci // groups
    kk = og * kh * kw
    npix = hi * wi
    w2 = w.reshape(ci, kk)
    x3 = x.reshape(nb, ci, npix)
    dx3 = dx.reshape(nb, ci, npix)
    pw_ = np.zeros((parts, ci, kk), np.float32)
    pb = np.zeros((parts, co), np.float64)
    for p in prange(parts):
        col = np.empty((kk, npix), np.float32)
        for n in range(p, nb, parts):
            for g in range(groups):
                grad_im2col(dy[n], col, g * og, kh, kw, hi, wi, sh, sw, ph, pw, dh, dw)
                np.dot(w2[g * cg:(g + 1) * cg], col, dx3[n, g * cg:(g + 1) * cg])
                pw_[p, g * cg:(g + 1) * cg] += np.dot(x3[n, g * cg:(g + 1) * cg], col.T)
            for o in range(co):
                s = 0.0
                for a in range(dy.shape[2]):
                    for b in range(dy.shape[3]):
                        s += dy[n, o, a, b]
                pb[p, o] += s
    dw2 = dwt.reshape(ci, kk)
    for c in prange(ci):
        for r in range(kk):
            s = np.float32(0.0)
            for p in range(parts):
                s += pw_[p, c, r]
            dw2[c, r] = s
    for o in range(co):
        t = 0.0
        for p in range(parts):
            t += pb[p, o]
        db[o] = np.float32(t)
"""


def _geometry(ctx: NodeCtx, nd: int, kernel: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """(stride, pad before, dilation) per spatial axis, as 2-D (1-D gets H = 1 with no stride or padding)."""
    from irc.backends.numpy_ref.conv import conv_pads

    stride = list(per_axis(ctx.attr("stride", 1), nd))
    dilation = list(per_axis(ctx.attr("dilation", 1), nd))
    if ctx.node.op.startswith("conv_transpose"):
        pads = list(per_axis(ctx.attr("padding", 0), nd))
    else:
        pads = [p[0] for p in conv_pads(ctx.attr("padding", 0), kernel, dilation, nd)]
    if nd == 1:
        return [1] + stride, [0] + pads, [1] + dilation
    return stride, pads, dilation


def _as_2d(var: str, shape: tuple[int, ...]) -> str:
    return var if len(shape) == 4 else f"{var}.reshape({shape[0]}, {shape[1]}, 1, {shape[2]})"


def render_conv_grad(ctx: NodeCtx) -> None:
    transpose = ctx.node.op.startswith("conv_transpose")
    ctx.parts.device("grad_im2col", IM2COL)
    if transpose:
        k = ctx.kernel(Kernel("k_conv_transpose2d_grad", CONV_TRANSPOSE_GRAD.format(jit=JIT),
                              (A4, A4, A4, A4, A4, A1) + (I64,) * 8))
    else:
        ctx.parts.device("grad_col2im", COL2IM)
        k = ctx.kernel(Kernel("k_conv2d_grad", CONV_GRAD.format(jit=JIT), (A4, A4, A4, A4, A4, A1) + (I64,) * 8))
    xs, ws = ctx.in_shape(0), ctx.weight_shape("weight")
    nd = len(xs) - 2
    stride, pads, dilation = _geometry(ctx, nd, tuple(ws[2:]))
    dx, dw = ctx.alloc(0), ctx.alloc(1)
    channels = ctx.in_shape(1)[1]
    db = ctx.alloc(2) if len(ctx.outs) > 2 else f"np.empty({channels}, np.float32)"
    ctx.emit(f"{k}({_as_2d(ctx.args[0], xs)}, {_as_2d(ctx.weight('weight'), ws)}, "
             f"{_as_2d(ctx.args[1], ctx.in_shape(1))}, {_as_2d(dx, xs)}, {_as_2d(dw, ws)}, {db}, "
             f"{stride[0]}, {stride[1]}, {pads[0]}, {pads[1]}, {dilation[0]}, {dilation[1]}, "
             f"{int(ctx.attr('groups', 1))}, {THREADS})")


PLANES = """\
    nb, nc, hi, wi = x.shape
    ho, wo = dy.shape[2], dy.shape[3]
    for bc in prange(nb * nc):
        n = bc // nc
        c = bc % nc
        for a in range(hi):
            for b in range(wi):
                dx[n, c, a, b] = np.float32(0.0)
"""

MAXPOOL_GRAD = """\
{jit}
def k_maxpool2d_grad(x, dy, dx, kh, kw, sh, sw, ph, pw, dh, dw):
    # each window's dy goes to its first maximum (taps in order; padding is -inf and never wins)
{planes}\
        for oi in range(ho):
            for oj in range(wo):
                best = np.float32(-np.inf)
                bi = oi * sh - ph
                bj = oj * sw - pw
                for ki in range(kh):
                    ii = oi * sh - ph + ki * dh
                    for kj in range(kw):
                        jj = oj * sw - pw + kj * dw
                        if 0 <= ii < hi and 0 <= jj < wi and x[n, c, ii, jj] > best:
                            best = x[n, c, ii, jj]
                            bi = ii
                            bj = jj
                if 0 <= bi < hi and 0 <= bj < wi:
                    dx[n, c, bi, bj] += dy[n, c, oi, oj]
"""

AVGPOOL_GRAD = """\
{jit}
def k_avgpool2d_grad(x, dy, dx, kh, kw, sh, sw, ph, pw, dh, dw, include_pad):
    # each window's dy divided by its count (the kernel's size, or the taps inside x), added at every tap
{planes}\
        for oi in range(ho):
            for oj in range(wo):
                count = 0
                for ki in range(kh):
                    ii = oi * sh - ph + ki * dh
                    for kj in range(kw):
                        jj = oj * sw - pw + kj * dw
                        if 0 <= ii < hi and 0 <= jj < wi:
                            count += 1
                share = dy[n, c, oi, oj] / np.float32(kh * kw if include_pad else count)
                for ki in range(kh):
                    ii = oi * sh - ph + ki * dh
                    for kj in range(kw):
                        jj = oj * sw - pw + kj * dw
                        if 0 <= ii < hi and 0 <= jj < wi:
                            dx[n, c, ii, jj] += share
"""


def render_pool_grad(ctx: NodeCtx) -> None:
    xs = ctx.in_shape(0)
    nd = len(xs) - 2
    kernel = list(per_axis(ctx.attr("kernel"), nd))
    stride = list(per_axis(ctx.attr("stride", ctx.attr("kernel")), nd))
    pads = list(per_axis(ctx.attr("padding", 0), nd))
    dilation = list(per_axis(ctx.attr("dilation", 1), nd))
    if nd == 1:
        kernel, stride, pads, dilation = [1] + kernel, [1] + stride, [0] + pads, [1] + dilation
    dx = ctx.alloc()
    geometry = (f"{kernel[0]}, {kernel[1]}, {stride[0]}, {stride[1]}, {pads[0]}, {pads[1]}, {dilation[0]}, "
                f"{dilation[1]}")
    args = f"{_as_2d(ctx.args[0], xs)}, {_as_2d(ctx.args[1], ctx.in_shape(1))}, {_as_2d(dx, xs)}, {geometry}"
    if ctx.node.op.startswith("maxpool"):
        k = ctx.kernel(Kernel("k_maxpool2d_grad", MAXPOOL_GRAD.format(jit=JIT, planes=PLANES),
                              (A4, A4, A4) + (I64,) * 8))
        ctx.emit(f"{k}({args})")
        return
    k = ctx.kernel(Kernel("k_avgpool2d_grad", AVGPOOL_GRAD.format(jit=JIT, planes=PLANES), (A4, A4, A4) + (I64,) * 9))
    ctx.emit(f"{k}({args}, {1 if ctx.attr('count_include_pad', True) else 0})")


def render_global_avgpool_grad(ctx: NodeCtx) -> None:
    """dy / positions, broadcast over every position: a NumPy copy (data movement only)."""
    xs = ctx.in_shape(0)
    positions = 1
    for d in xs[2:]:
        positions *= d
    dx = ctx.alloc()
    ctx.emit(f"np.copyto({dx}.reshape({xs[0]}, {xs[1]}, {positions}), "
             f"({ctx.args[1]}.reshape({xs[0]}, {xs[1]}, 1) / np.float32({positions})))")


ADAPTIVE_GRAD = """\
{jit}
def k_adaptive_avgpool2d_grad(x, dy, dx):
    # each bin's dy over its size, added at every position of the bin (PyTorch's edges; bins may overlap)
{planes}\
        for i in range(ho):
            r0 = (i * hi) // ho
            r1 = -((-(i + 1) * hi) // ho)
            for j in range(wo):
                c0 = (j * wi) // wo
                c1 = -((-(j + 1) * wi) // wo)
                share = dy[n, c, i, j] / np.float32((r1 - r0) * (c1 - c0))
                for a in range(r0, r1):
                    for b in range(c0, c1):
                        dx[n, c, a, b] += share
"""


def render_adaptive_avgpool2d_grad(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_adaptive_avgpool2d_grad", ADAPTIVE_GRAD.format(jit=JIT, planes=PLANES), (A4, A4, A4)))
    dx = ctx.alloc()
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.args[1]}, {dx})")


UPSAMPLE_GRAD = """\
{jit}
def k_upsample2d_grad(x, dy, dx, sh, sw, bilinear, align):
    # the adjoint of k_upsample2d: each output's dy added back to the pixels it read, with their weights
{planes}\
        for oi in range(ho):
            if bilinear == 0:
                for oj in range(wo):
                    dx[n, c, oi // sh, oj // sw] += dy[n, c, oi, oj]
                continue
{taps}                g = dy[n, c, oi, oj]
                top = g * (np.float32(1.0) - lh)
                bottom = g * lh
                dx[n, c, i0, j0] += top * (np.float32(1.0) - lw)
                dx[n, c, i0, j1] += top * lw
                dx[n, c, i1, j0] += bottom * (np.float32(1.0) - lw)
                dx[n, c, i1, j1] += bottom * lw
"""


def render_upsample_grad(ctx: NodeCtx) -> None:
    xs = ctx.in_shape(0)
    factors = scales(ctx.node.attrs, len(xs))
    sh, sw = factors if len(factors) == 2 else (1, factors[0])
    k = ctx.kernel(Kernel("k_upsample2d_grad", UPSAMPLE_GRAD.format(jit=JIT, planes=PLANES, taps=BILINEAR_TAPS),
                          (A4, A4, A4) + (I64,) * 4))
    dx = ctx.alloc()
    ctx.emit(f"{k}({_as_2d(ctx.args[0], xs)}, {_as_2d(ctx.args[1], ctx.in_shape(1))}, {_as_2d(dx, xs)}, {sh}, {sw}, "
             f"{1 if ctx.attr('mode') == 'bilinear' else 0}, {1 if ctx.attr('align_corners') else 0})")


RENDERERS = {
    "conv1d_grad": render_conv_grad,
    "conv2d_grad": render_conv_grad,
    "conv_transpose1d_grad": render_conv_grad,
    "conv_transpose2d_grad": render_conv_grad,
    "maxpool1d_grad": render_pool_grad,
    "maxpool2d_grad": render_pool_grad,
    "avgpool1d_grad": render_pool_grad,
    "avgpool2d_grad": render_pool_grad,
    "global_avgpool_grad": render_global_avgpool_grad,
    "adaptive_avgpool2d_grad": render_adaptive_avgpool2d_grad,
    "upsample_grad": render_upsample_grad,
}
