"""3×3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray 2016).

Each 2×2 block of outputs (a tile) is computed from a 4×4 patch of the zero-padded input: the patch and
the filter are transformed (V = Bᵀ·d·B, U = G·g·Gᵀ), multiplied element by element and summed over the
input channels, then transformed back (Y = Aᵀ·M·A). Summed over channels, each of the 16 elements is one
GEMM M[e] = U[e] [out, in] × V[e] [in, tiles]: 16·in·out multiplies per tile instead of 36·in·out
(2.25× fewer). The filter transform runs once per weights dict (a derived weight). The transforms only
add and halve, so the result stays within float32 rounding of the direct convolution.

Tiles of the whole batch are cut into chunks whose transformed input and product stay in L2; threads
split the chunks, or, when there are fewer chunks than threads (small maps), the output channels.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS

JIT = jit()

WINOGRAD = """\
{jit}
def {name}(x, u, b, res, out, ph, pw, has_res, parts):
    nb, ci, hi, wi = x.shape
    co = u.shape[1]
    ho, wo = out.shape[2], out.shape[3]
    ty_n = (ho + 1) // 2
    tx_n = (wo + 1) // 2
    hq = 2 * ty_n + 2
    wq = 2 * tx_n + 2
    planes = np.empty((nb, 1, ci, hq * wq), np.float32)  # the padded input, every tile's patch inside
    for t in prange(nb):
        conv_phases(x, planes, t, 1, 1, ph, pw, hq, wq)
    ntile = nb * ty_n * tx_n
    chunk = max(8, min(ntile, 24576 // (ci + co)))
    nchunk = (ntile + chunk - 1) // chunk
    by_tiles = nchunk >= 2 * parts
    if by_tiles:
        nchunk = (nchunk + parts - 1) // parts * parts
        chunk = (ntile + nchunk - 1) // nchunk
    else:
        nchunk, chunk = 1, ntile
    v_all = np.empty(16 * ci * chunk if not by_tiles else 1, np.float32)
    if not by_tiles:  # one input transform of every tile, split by channels, then the products by channels out
        for c in prange(parts):
            winograd_input(planes, v_all, c * ci // parts, (c + 1) * ci // parts, 0, ntile, ty_n, tx_n, wq)
    out3 = out.reshape(nb, co, ho * wo)
    for c in prange(parts):
        k0, k1, o0, o1 = 0, 1, c * co // parts, (c + 1) * co // parts
        if by_tiles:
            k0, k1, o0, o1 = c * nchunk // parts, (c + 1) * nchunk // parts, 0, co
        vbuf = np.empty(16 * ci * chunk if by_tiles else 1, np.float32)
        mbuf = np.empty(16 * (o1 - o0) * chunk, np.float32)
        for k in range(k0, k1):
            if o1 == o0:
                break
            t0 = k * chunk
            t1 = min(ntile, t0 + chunk)
            if t1 <= t0:
                break
            m = t1 - t0
            if by_tiles:
                v = vbuf[:16 * ci * m].reshape(16, ci, m)
                winograd_input(planes, vbuf, 0, ci, t0, t1, ty_n, tx_n, wq)
            else:
                v = v_all.reshape(16, ci, m)
            prod = mbuf[:16 * (o1 - o0) * m].reshape(16, o1 - o0, m)
            for e in range(16):
                np.dot(u[e, o0:o1], v[e], prod[e])
            # the output transform and the epilogue, one row of tiles at a time
            t = t0
            while t < t1:
                n = t // (ty_n * tx_n)
                r = t - n * ty_n * tx_n
                ty = r // tx_n
                a0 = r - ty * tx_n
                a1 = min(tx_n, a0 + t1 - t)
                full = min(a1, wo // 2)  # tiles whose two columns are both outputs
                two_rows = 2 * ty + 1 < ho
                q = t - t0 - a0
                for o in range(o0, o1):
                    bo = b[o]
                    pm = prod[:, o - o0]
                    dst = out3[n, o]
                    src = res[n, o]
                    d0 = 2 * ty * wo
                    d1 = d0 + wo
                    for tx in range(a0, a1):
                        j = q + tx
                        s00 = pm[0, j] + pm[4, j] + pm[8, j]
                        s01 = pm[1, j] + pm[5, j] + pm[9, j]
                        s02 = pm[2, j] + pm[6, j] + pm[10, j]
                        s03 = pm[3, j] + pm[7, j] + pm[11, j]
                        s10 = pm[4, j] - pm[8, j] - pm[12, j]
                        s11 = pm[5, j] - pm[9, j] - pm[13, j]
                        s12 = pm[6, j] - pm[10, j] - pm[14, j]
                        s13 = pm[7, j] - pm[11, j] - pm[15, j]
                        y00 = s00 + s01 + s02 + bo
                        y01 = s01 - s02 - s03 + bo
                        y10 = s10 + s11 + s12 + bo
                        y11 = s11 - s12 - s13 + bo
                        c0 = 2 * tx
                        if has_res:
                            y00 += src[d0 + c0]
                            if tx < full:
                                y01 += src[d0 + c0 + 1]
                            if two_rows:
                                y10 += src[d1 + c0]
                                if tx < full:
                                    y11 += src[d1 + c0 + 1]
                        v = y00
                        dst[d0 + c0] = {expr}
                        if tx < full:
                            v = y01
                            dst[d0 + c0 + 1] = {expr}
                        if two_rows:
                            v = y10
                            dst[d1 + c0] = {expr}
                            if tx < full:
                                v = y11
                                dst[d1 + c0 + 1] = {expr}
                t += a1 - a0
"""

INPUT = """\
{jit}
def winograd_input(planes, vbuf, c0, c1, t0, t1, ty_n, tx_n, wq):
    \"\"\"V = Bᵀ·d·B of channels [c0, c1) for tiles [t0, t1) into vbuf as [16, in, t1 − t0].\"\"\"
    ci = planes.shape[2]
    m = t1 - t0
    v = vbuf[:16 * ci * m].reshape(16, ci, m)
    per = ty_n * tx_n
    for c in range(c0, c1):
        t = t0
        while t < t1:
            n = t // per
            r = t - n * per
            ty = r // tx_n
            a0 = r - ty * tx_n
            a1 = min(tx_n, a0 + t1 - t)
            src = planes[n, 0, c]
            q = t - t0 - a0
            row = 2 * ty * wq
            for tx in range(a0, a1):
                p = row + 2 * tx
                d00 = src[p]
                d01 = src[p + 1]
                d02 = src[p + 2]
                d03 = src[p + 3]
                d10 = src[p + wq]
                d11 = src[p + wq + 1]
                d12 = src[p + wq + 2]
                d13 = src[p + wq + 3]
                d20 = src[p + 2 * wq]
                d21 = src[p + 2 * wq + 1]
                d22 = src[p + 2 * wq + 2]
                d23 = src[p + 2 * wq + 3]
                d30 = src[p + 3 * wq]
                d31 = src[p + 3 * wq + 1]
                d32 = src[p + 3 * wq + 2]
                d33 = src[p + 3 * wq + 3]
                # Bᵀ·d: rows (d0 − d2, d1 + d2, d2 − d1, d1 − d3)
                r00, r01, r02, r03 = d00 - d20, d01 - d21, d02 - d22, d03 - d23
                r10, r11, r12, r13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
                r20, r21, r22, r23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
                r30, r31, r32, r33 = d10 - d30, d11 - d31, d12 - d32, d13 - d33
                j = q + tx
                # (Bᵀ·d)·B: the same on columns
                v[0, c, j] = r00 - r02
                v[1, c, j] = r01 + r02
                v[2, c, j] = r02 - r01
                v[3, c, j] = r01 - r03
                v[4, c, j] = r10 - r12
                v[5, c, j] = r11 + r12
                v[6, c, j] = r12 - r11
                v[7, c, j] = r11 - r13
                v[8, c, j] = r20 - r22
                v[9, c, j] = r21 + r22
                v[10, c, j] = r22 - r21
                v[11, c, j] = r21 - r23
                v[12, c, j] = r30 - r32
                v[13, c, j] = r31 + r32
                v[14, c, j] = r32 - r31
                v[15, c, j] = r31 - r33
            t += a1 - a0
"""

# U = G·g·Gᵀ for every (out, in) pair, in float64, as [16, out, in] (element 4ξ + ν)
FILTER = '''\
def winograd_filter(w, co, ci):
    """F(2×2, 3×3)'s transformed filter of a 3×3 weight (any shape holding [out, in, 3, 3]) as [16, out, in]."""
    g = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
    k = w.reshape(co, ci, 3, 3).astype(np.float64)
    u = np.einsum("xa,oiab,yb->xyoi", g, k, g)
    return np.ascontiguousarray(u.reshape(16, co, ci).astype(np.float32))
'''


def applies(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], groups: int) -> bool:
    """Winograd serves 3×3 convolutions of stride 1 and dilation 1 without groups."""
    return kernel == (3, 3) and stride == (1, 1) and dilation == (1, 1) and groups == 1


def filter_weight(ctx: NodeCtx, key: str, weight_expr: str, co: int, ci: int) -> str:
    """The transformed filter of ``weight_expr``, derived once per weights dict under ``key``."""
    ctx.helper("winograd_filter", FILTER)
    return ctx.derive(f"~winograd_f23({key})", f"winograd_filter({weight_expr}, {co}, {ci})")


def winograd_call(ctx: NodeCtx, u: str, b: str, res: str | None, act_name: str, ph: int, pw: int) -> None:
    """The call of k_winograd_<act> on the node's [B, C, H, W] input and result."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.conv_gemm import PHASES
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    ctx.parts.device("conv_phases", PHASES.format(jit=DEVICE_JIT))
    ctx.parts.device("winograd_input", INPUT.format(jit=DEVICE_JIT))
    name = f"k_winograd_{act_name}"
    k = ctx.kernel(Kernel(name, WINOGRAD.format(jit=JIT, name=name, expr=act(ctx.parts, act_name)),
                          (A4, A3, A1, A3, A4) + (I64,) * 4))
    out_shape = ctx.out_shape()
    out = ctx.alloc(inplace=(len(ctx.args) - 1,) if res is not None else ())
    rows = f"{out_shape[0]}, {out_shape[1]}, {out_shape[2] * out_shape[3]}"
    res3 = f"{res}.reshape({rows})" if res is not None else f"{out}.reshape({rows})"  # unread when has_res=0
    ctx.emit(f"{k}({ctx.args[0]}, {u}, {b}, {res3}, {out}, ph={ph}, pw={pw}, has_res={0 if res is None else 1}, "
             f"parts={THREADS})")
