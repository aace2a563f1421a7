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
from irc.backends.cpu.render import gemm_packed
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS

JIT = jit()

WINOGRAD = """\
{jit}
def {name}(x, u, ap, b, res, out, ph, pw, has_res, packed, parts):
    nb, ci, hi, wi = x.shape
    co = out.shape[1]
    in_strips = packed != 0  # ap: each element's U in 6-row strips (gemm_packed.py); V's rows padded to 16
    strips = (co + 5) // 6
    ho, wo = out.shape[2], out.shape[3]
    ty_n = (ho + 1) // 2
    tx_n = (wo + 1) // 2
    hq = 2 * ty_n + 2
    wq = 2 * tx_n + 2
    planes = np.empty((nb, 1, ci, hq * wq), np.float32)  # the padded input, every tile's patch inside
    cblocks = parts if nb < 2 * parts else 1
    for t in prange(nb * cblocks):
        c = t % cblocks
        conv_phases(x, planes, t // cblocks, 1, 1, ph, pw, hq, wq, c * ci // cblocks, (c + 1) * ci // cblocks)
    ntile = nb * ty_n * tx_n
    chunk = max(8, min(ntile, 24576 // (ci + co)))
    nchunk = (ntile + chunk - 1) // chunk
    # by chunks of tiles each thread reads all of U once a chunk: fine while U stays in L2 (≤ 1 MiB), else
    # (ResNet's 256 and 512 channels at B = 8) splitting the output channels reads U once, plus all of V
    usize = 16 * co * ci
    tiles_cost = (nchunk + parts - 1) // parts * (usize if usize > 262144 else 0)
    channels_cost = usize // parts + 16 * ci * ntile + 16 * co * ntile // parts
    by_tiles = nchunk >= 2 * parts and tiles_cost <= channels_cost
    if by_tiles:
        nchunk = (nchunk + parts - 1) // parts * parts
        chunk = (ntile + nchunk - 1) // nchunk
    else:
        nchunk, chunk = 1, ntile
    ldc = (chunk + 15) // 16 * 16 if in_strips else chunk  # V's and the product's row stride, at most
    v_all = np.empty(16 * winograd_stride(ci * ldc) if not by_tiles else 1, np.float32)
    if not by_tiles:  # one input transform of every tile, split by channels, then the products by channels out
        for c in prange(parts):
            winograd_input(planes, v_all, winograd_stride(ci * ldc), ldc, c * ci // parts, (c + 1) * ci // parts, 0,
                           ntile, ty_n, tx_n, wq)
    out3 = out.reshape(nb, co, ho * wo)
    uf = u.reshape(-1)
    U = np.uint64
    # numba resolves its BLAS pointer on first use, taking the GIL: do it here, on the thread that holds it
    blas_sgemm(0, 0, 1, 1, 0, uf, 0, 1, uf, 0, 1, np.float32(1.0), uf, 0, 1)
    for c in prange(parts):
        k0, k1, o0, o1 = 0, 1, c * co // parts, (c + 1) * co // parts
        s0, s1 = c * strips // parts, (c + 1) * strips // parts
        if by_tiles:
            k0, k1, o0, o1, s0, s1 = c * nchunk // parts, (c + 1) * nchunk // parts, 0, co, 0, strips
        elif in_strips:  # whole strips a thread
            o0, o1 = min(co, 6 * s0), min(co, 6 * s1)
        rows = (s1 - s0) * 6 if in_strips else o1 - o0  # the product's rows
        vbuf = np.empty(16 * winograd_stride(ci * ldc) if by_tiles else 1, np.float32)
        mbuf = np.empty(16 * winograd_stride(rows * ldc), np.float32)
        for k in range(k0, k1):
            if o1 == o0:
                break
            t0 = k * chunk
            t1 = min(ntile, t0 + chunk)
            if t1 <= t0:
                break
            m = t1 - t0
            ldm = (m + 15) // 16 * 16 if in_strips else m  # the row stride of V and of the product
            vs = winograd_stride(ci * ldm)  # element e of V is [in, m] at vf[e·vs:], rows ldm apart
            if by_tiles:
                vf = vbuf
                winograd_input(planes, vbuf, vs, ldm, 0, ci, t0, t1, ty_n, tx_n, wq)
            else:
                vf = v_all
            em = winograd_stride(rows * ldm)  # element e of tile column j, channel o: mf[e·em + (o − o0)·ldm + j]
            mf = mbuf
            for e in range(16):
                if in_strips:
                    gemm_strips(ap, e * strips * ci * 6, ci, s0, s1, ci, vf, e * vs, ldm, ldm, mf, e * em, ldm, 0)
                else:
                    blas_sgemm(0, 0, o1 - o0, m, ci, uf, (e * co + o0) * ci, ci, vf, e * vs, m, np.float32(0.0), mf,
                               e * em, m)
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
                    dst = out3[n, o]
                    src = res[n, o]
                    d0 = 2 * ty * wo
                    d1 = d0 + wo
                    g = (o - o0) * ldm + q  # flat indices cast to uint64: no wraparound check per access
                    for tx in range(a0, a1):
                        j = g + tx
                        p0, p1, p2, p3 = mf[U(j)], mf[U(j + em)], mf[U(j + 2 * em)], mf[U(j + 3 * em)]
                        p4, p5, p6, p7 = mf[U(j + 4 * em)], mf[U(j + 5 * em)], mf[U(j + 6 * em)], mf[U(j + 7 * em)]
                        p8, p9, p10, p11 = (mf[U(j + 8 * em)], mf[U(j + 9 * em)], mf[U(j + 10 * em)],
                                            mf[U(j + 11 * em)])
                        p12, p13, p14, p15 = (mf[U(j + 12 * em)], mf[U(j + 13 * em)], mf[U(j + 14 * em)],
                                              mf[U(j + 15 * em)])
                        s00 = p0 + p4 + p8
                        s01 = p1 + p5 + p9
                        s02 = p2 + p6 + p10
                        s03 = p3 + p7 + p11
                        s10 = p4 - p8 - p12
                        s11 = p5 - p9 - p13
                        s12 = p6 - p10 - p14
                        s13 = p7 - p11 - p15
                        y00 = s00 + s01 + s02 + bo
                        y01 = s01 - s02 - s03 + bo
                        y10 = s10 + s11 + s12 + bo
                        y11 = s11 - s12 - s13 + bo
                        c0 = 2 * tx
                        if has_res:
                            y00 += src[U(d0 + c0)]
                            if tx < full:
                                y01 += src[U(d0 + c0 + 1)]
                            if two_rows:
                                y10 += src[U(d1 + c0)]
                                if tx < full:
                                    y11 += src[U(d1 + c0 + 1)]
                        v = y00
                        dst[U(d0 + c0)] = {expr}
                        if tx < full:
                            v = y01
                            dst[U(d0 + c0 + 1)] = {expr}
                        if two_rows:
                            v = y10
                            dst[U(d1 + c0)] = {expr}
                            if tx < full:
                                v = y11
                                dst[U(d1 + c0 + 1)] = {expr}
                t += a1 - a0
"""

INPUT = """\
{jit}
def winograd_input(planes, vf, em, ld, c0, c1, t0, t1, ty_n, tx_n, wq):
    \"\"\"V = Bᵀ·d·B of channels [c0, c1) for tiles [t0, t1) into vf: element e as [in, t1 − t0] at vf[e·em:],
    rows ld apart (the columns from t1 − t0 to ld are zeros).\"\"\"
    ci = planes.shape[2]
    m = t1 - t0
    U = np.uint64
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
            # flat indices cast to uint64: numba then adds no negative-index wraparound check per access
            for tx in range(a0, a1):
                p = row + 2 * tx
                d00, d01, d02, d03 = src[U(p)], src[U(p + 1)], src[U(p + 2)], src[U(p + 3)]
                d10, d11, d12, d13 = src[U(p + wq)], src[U(p + wq + 1)], src[U(p + wq + 2)], src[U(p + wq + 3)]
                p2, p3 = p + 2 * wq, p + 3 * wq
                d20, d21, d22, d23 = src[U(p2)], src[U(p2 + 1)], src[U(p2 + 2)], src[U(p2 + 3)]
                d30, d31, d32, d33 = src[U(p3)], src[U(p3 + 1)], src[U(p3 + 2)], src[U(p3 + 3)]
                # Bᵀ·d: rows (d0 − d2, d1 + d2, d2 − d1, d1 − d3)
                r00, r01, r02, r03 = d00 - d20, d01 - d21, d02 - d22, d03 - d23
                r10, r11, r12, r13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
                r20, r21, r22, r23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
                r30, r31, r32, r33 = d10 - d30, d11 - d31, d12 - d32, d13 - d33
                j = c * ld + q + tx  # element e of the tile is vf[e·em + j]
                # (Bᵀ·d)·B: the same on columns
                vf[U(j)] = r00 - r02
                vf[U(j + em)] = r01 + r02
                vf[U(j + 2 * em)] = r02 - r01
                vf[U(j + 3 * em)] = r01 - r03
                vf[U(j + 4 * em)] = r10 - r12
                vf[U(j + 5 * em)] = r11 + r12
                vf[U(j + 6 * em)] = r12 - r11
                vf[U(j + 7 * em)] = r11 - r13
                vf[U(j + 8 * em)] = r20 - r22
                vf[U(j + 9 * em)] = r21 + r22
                vf[U(j + 10 * em)] = r22 - r21
                vf[U(j + 11 * em)] = r21 - r23
                vf[U(j + 12 * em)] = r30 - r32
                vf[U(j + 13 * em)] = r31 + r32
                vf[U(j + 14 * em)] = r32 - r31
                vf[U(j + 15 * em)] = r31 - r33
            t += a1 - a0
        for e in range(16 if ld > m else 0):
            vf[e * em + c * ld + m:e * em + (c + 1) * ld] = np.float32(0.0)
"""

# The 16 elements of V and of the products lie one stride apart, and the transforms touch all 16 at once. A
# stride of a whole number of 4 KiB pages would put the 16 in one L1 set, which holds 12 lines: ResNet's
# 128 channels at B = 8 (88-tile chunks, 11 pages apart) ran 1.7x slower than with 47-tile chunks. An odd
# number of cache lines spreads them over 16 sets.
STRIDE = """\
{jit}
def winograd_stride(count):
    \"\"\"count floats rounded up to an odd number of 64-byte lines.\"\"\"
    lines = (count + 15) // 16
    return (lines + 1 - lines % 2) * 16
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


# Fewer tiles than this (ResNet's 7×7 maps at B = 1: 16 tiles) and the products are bound by reading U, which
# is 16/9 the size of the filter itself: the im2col GEMM then wins (ResNet-18 at B = 1 1.04x as a whole, its
# layer-4 convolutions about 1.25 ms against 1.3; at B = 8, 128 tiles, Winograd wins 6.6 ms against 7.3)
MIN_TILES = 32


def applies(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], groups: int,
            tiles: int) -> bool:
    """Winograd serves 3×3 convolutions of stride 1 and dilation 1 without groups, over ``tiles`` 2×2 output
    tiles (the whole batch's) of at least MIN_TILES."""
    return kernel == (3, 3) and stride == (1, 1) and dilation == (1, 1) and groups == 1 and tiles >= MIN_TILES


def packed_filter(ctx: NodeCtx, key: str, weight_expr: str, co: int, ci: int) -> str:
    """The transformed filter with each element's [out, in] in 6-row strips (gemm_packed.py), derived once."""
    ctx.helper("winograd_filter", FILTER)
    gemm_packed.use(ctx.parts)
    return ctx.derive(f"~winograd_f23_strips({key})", f"gemm_pack6(winograd_filter({weight_expr}, {co}, {ci}), {co}, "
                      f"{ci})")


def winograd_call(ctx: NodeCtx, u: str, b: str, res: str | None, act_name: str, ph: int, pw: int,
                  packed: bool = False) -> None:
    """The call of k_winograd_<act> on the node's [B, C, H, W] input and result; its products by BLAS on
    ``u`` ([16, out, in], winograd_filter), or by register blocks when ``u`` is ``packed`` (packed_filter)."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.conv_blas import sgemm
    from irc.backends.cpu.render.conv_gemm import PHASES
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    ctx.parts.device("conv_phases", PHASES.format(jit=DEVICE_JIT))
    ctx.parts.device("winograd_input", INPUT.format(jit=DEVICE_JIT))
    ctx.parts.device("winograd_stride", STRIDE.format(jit=DEVICE_JIT))
    sgemm(ctx)
    gemm_packed.use(ctx.parts)
    name = f"k_winograd_{act_name}"
    k = ctx.kernel(Kernel(name, WINOGRAD.format(jit=JIT, name=name, expr=act(ctx.parts, act_name)),
                          (A4, A3, A1, A1, A3, A4) + (I64,) * 5))
    out_shape = ctx.out_shape()
    out = ctx.alloc(inplace=(len(ctx.args) - 1,) if res is not None else ())
    rows = f"{out_shape[0]}, {out_shape[1]}, {out_shape[2] * out_shape[3]}"
    res3 = f"{res}.reshape({rows})" if res is not None else f"{out}.reshape({rows})"  # unread when has_res=0
    if packed:  # the kernel's u: the strips seen as [16, rows, in] (only its shape is read); ap: the strips
        u, ap = f"{u}.reshape(16, {gemm_packed.strips(out_shape[1]) * 6}, {ctx.in_shape()[1]})", u
    else:
        ap = b  # (unread)
    ctx.emit(f"{k}({ctx.args[0]}, {u}, {ap}, {b}, {res3}, {out}, ph={ph}, pw={pw}, "
             f"has_res={0 if res is None else 1}, packed={int(packed)}, parts={THREADS})")
