"""Convolutions without groups as one GEMM over an exact im2col panel: weight [out, C·kh·kw] × panel.

For what the tap sum (conv_taps.py) does badly: few input channels (the 3-channel stem: a tap's GEMM would
have K = 3), maps so small that the tap sum's grid of wq = wo + kw − 1 columns per row wastes a large share
(a 7×7 map computes 9 columns a row for 7), and batches of small maps, where a GEMM per image is too narrow
(49 columns) and the weight would be packed once per image. The input is split into zero-padded phase
planes (conv_taps' conv_tap_planes), then the panel holds exactly the output pixels of the batch, image
after image: row (c, ki, kj) of a tile is, per output row, one contiguous run of wo elements of the tap's
plane; a 1×1's panel is gathered straight from the input. The weight stays in its own (c, ki, kj) order.

Two ways to split the work. With a large weight (≥ 1 MiB: ResNet's 256 and 512 channels) one panel of the
whole batch is built, its rows split over the threads, and each thread multiplies its block of output
channels by all of it: the weight is read once. Otherwise each thread builds and multiplies tiles of ~1 MiB
of panel with the whole weight, while they are in cache. The products are BLAS calls, or, for a weight known
at load, the register blocks of gemm_packed.py on its 6-row strips (panel rows then padded to 16 floats).
Either way the product block then goes to the NCHW output through the epilogue (bias, residual,
activation). Temporaries live in the kept work buffer.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import conv_taps, gemm_packed
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()

CONV_COLS = """\
{jit}
def {name}(x, w2, b, res, out, work, ap, packed, sh, sw, ph, pw, dh, dw, kh, kw, has_res, tile, parts):
    nb, ci, hi, wi = x.shape
    co, kk = out.shape[1], w2.shape[1]  # (w2: a packed weight's padded rows)
    ho, wo = out.shape[2], out.shape[3]
    wq, hq, nphase, nplanes = conv_taps_geometry(x.shape, ho, wo, sh, sw, ph, pw, dh, dw, kh, kw)
    pointwise = kh * kw == 1  # a 1×1's panel is gathered from the input itself: no planes
    nplanes = 0 if pointwise else nb * nphase * ci * hq * wq
    plane = hq * wq
    npix = ho * wo
    ncol = nb * npix
    whole = tile >= ncol  # one panel of the batch, output channels split; else tiles of columns, all channels
    in_strips = packed != 0  # ap: the weight in 6-row strips (gemm_packed.py); panel rows padded to 16 floats
    ldc = (ncol + 15) // 16 * 16 if in_strips else ncol  # the whole panel's row stride
    ldt = (tile + 15) // 16 * 16 if in_strips else tile  # a tile's
    strips = (co + 5) // 6
    per = (strips // parts + 1) * 6 if in_strips else co // parts + 1
    trows = strips * 6 if in_strips else co  # a tile's product rows
    need = nplanes + (kk * ldc + parts * per * ldc if whole else parts * (kk + trows) * ldt)
    if work.size < need:
        raise ValueError("conv work buffer too small")
    planes = work[:nplanes].reshape(nb if nplanes else 0, nphase, ci, plane)
    rows, cols, nrows = conv_phase_rows(sh, sw, dh, dw, kh, kw)
    if pointwise:
        nrows = 0
    cblocks = parts if nb * nrows < 2 * parts else 1
    for t in prange(cblocks * nb * nrows):
        c = t // (nb * nrows)
        n = (t // nrows) % nb
        r = t % nrows
        conv_tap_planes(x, planes, n, rows[r], c * ci // cblocks, (c + 1) * ci // cblocks, sh, sw, ph, pw, hq, wq,
                        cols[r])
    wflat = w2.reshape(-1)
    pflat = work[:nplanes]
    oflat = out.reshape(-1)
    rflat = res.reshape(-1)
    U = np.uint64
    if whole:
        cbase = nplanes
        for c in prange(parts):
            r0, r1 = c * kk // parts, (c + 1) * kk // parts
            if pointwise:
                conv_gather(x, work, cbase, ldc, r0, r1, 0, ncol, sh, sw, ph, pw, ho, wo)
            else:
                conv_cols_fill(pflat, work, cbase, ldc, r0, r1, 0, ncol, ci, nphase, plane, ho, wo, wq, sh, sw, dh,
                               dw, kh, kw)
            for r in range(r0, r1 if ldc > ncol else r0):  # the padding columns: zeros, never garbage
                work[cbase + r * ldc + ncol:cbase + (r + 1) * ldc] = np.float32(0.0)
    # numba resolves its BLAS pointer on first use, taking the GIL: do it here, on the thread that holds it
    blas_sgemm(0, 0, 1, 1, 0, wflat, 0, 1, wflat, 0, 1, np.float32(1.0), work, 0, 1)
    ntile = 1
    if not whole:  # a whole number of tiles per thread (never larger than the tile the buffer was sized for)
        ntile = ((ncol + tile - 1) // tile + parts - 1) // parts * parts
        tile = (ncol + ntile - 1) // ntile
    for c in prange(parts):
        o0, o1, t0, t1 = 0, co, c * ntile // parts, (c + 1) * ntile // parts
        s0, s1 = 0, strips
        if whole:
            o0, o1, t0, t1 = c * co // parts, (c + 1) * co // parts, 0, 1
            if in_strips:  # whole strips a thread
                s0, s1 = c * strips // parts, (c + 1) * strips // parts
                o0, o1 = min(co, 6 * s0), min(co, 6 * s1)
        cbase = nplanes if whole else nplanes + c * (kk + trows) * ldt
        pbase = nplanes + kk * ldc + c * per * ldc if whole else cbase + kk * ldt
        for t in range(t0, t1):
            if o1 == o0:
                break
            j0 = 0 if whole else t * tile
            j1 = ncol if whole else min(ncol, j0 + tile)
            m = j1 - j0
            ldm = (m + 15) // 16 * 16 if in_strips else m  # the tile's panel and product row stride
            if not whole and pointwise:
                conv_gather(x, work, cbase, ldm, 0, kk, j0, j1, sh, sw, ph, pw, ho, wo)
            elif not whole:
                conv_cols_fill(pflat, work, cbase, ldm, 0, kk, j0, j1, ci, nphase, plane, ho, wo, wq, sh, sw, dh, dw,
                               kh, kw)
            for r in range(kk if not whole and ldm > m else 0):
                work[cbase + r * ldm + m:cbase + (r + 1) * ldm] = np.float32(0.0)
            if in_strips:
                gemm_strips(ap, 0, kk, s0, s1, kk, work, cbase, ldm, ldm, work, pbase, ldm, 0)
            else:
                blas_sgemm(0, 0, o1 - o0, m, kk, wflat, o0 * kk, kk, work, cbase, ncol if whole else m,
                           np.float32(0.0), work, pbase, m)
            # the epilogue, one image's run of pixels at a time; flat indices cast to uint64 (no wraparound
            # checks, the loops vectorise)
            j = j0
            while j < j1:
                n = j // npix
                q0 = j - n * npix
                q1 = min(npix, q0 + j1 - j)
                g0 = pbase + j - j0 - q0  # pixel q of image n in the product's first row
                for o in range(o0, o1):
                    bo = b[o]
                    g = g0 + (o - o0) * ldm
                    d = (n * co + o) * npix
                    if has_res:
                        for q in range(q0, q1):
                            v = work[U(g + q)] + bo + rflat[U(d + q)]
                            oflat[U(d + q)] = {expr}
                    else:
                        for q in range(q0, q1):
                            v = work[U(g + q)] + bo
                            oflat[U(d + q)] = {expr}
                j += q1 - q0
"""

FILL = """\
{jit}
def conv_cols_fill(planes, col, cbase, ld, r0, r1, j0, j1, ci, nphase, plane, ho, wo, wq, sh, sw, dh, dw, kh, kw):
    \"\"\"Rows [r0, r1) (c, ki, kj) of the exact im2col panel of pixels [j0, j1) (image after image) into
    col[cbase + r·ld + j − j0]: per output row, one run of wo elements of the tap's phase plane. Runs are
    short on small maps: flat indices, cast to uint64 so numba adds no negative-index wraparound check.\"\"\"
    npix = ho * wo
    khw = kh * kw
    n0 = j0 // npix  # the first pixel's image, output row and column
    oi0 = (j0 - n0 * npix) // wo
    a0 = j0 - n0 * npix - oi0 * wo
    for r in range(r0, r1):
        c = r // khw
        ki = (r // kw) % kh
        kj = r % kw
        f = ((ki * dh) % sh) * sw + (kj * dw) % sw
        off = ((ki * dh) // sh) * wq + (kj * dw) // sw
        d = cbase + r * ld  # the panel element of pixel j0
        n, oi, a = n0, oi0, a0
        left = j1 - j0
        while left > 0:
            e = min(wo, a + left)
            s = ((n * nphase + f) * ci + c) * plane + off + oi * wq + a  # output (oi, a)'s plane element
            for q in range(e - a):
                col[np.uint64(d + q)] = planes[np.uint64(s + q)]
            d += e - a
            left -= e - a
            a = 0
            oi += 1
            if oi == ho:
                oi = 0
                n += 1
"""

WHOLE_WEIGHT = 524288  # floats (1 MiB): from here one panel of the batch, each thread its output channels
WHOLE_PANEL = 8 << 20  # floats (32 MiB): the largest such panel; beyond, tiles


SMALL_WEIGHT = 16384  # floats (64 KiB): packed on every call at no cost, so tiles can be small


def tile(co: int, kk: int, ncol: int) -> int:
    """Columns per tile: the whole batch (ncol) for a large weight, else ~1 MiB of panel; for a small weight
    (the 3-channel stem) ~640 KiB of panel and product together: 8% faster than 1 MiB on ResNet's stem."""
    if co * kk >= WHOLE_WEIGHT and kk * ncol <= WHOLE_PANEL:
        return ncol
    if co * kk <= SMALL_WEIGHT:
        return min(ncol, max(64, 163840 // (kk + co)))
    return min(ncol, max(64, 262144 // kk) if co * kk < WHOLE_WEIGHT else max(512, 262144 // kk))


def work_size(geometry: tuple[int, ...], x_shape: tuple[int, ...], out_shape: tuple[int, ...], cols: int) -> str:
    """The driver's expression for the elements the kernel needs (as the kernel computes it, or more)."""
    from irc.backends.cpu.render.gemm import THREADS

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    nb, ci = x_shape[0], x_shape[1]
    co, ho, wo = out_shape[1], out_shape[2], out_shape[3]
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + (1 if wq > wo else 0)
    planes = 0 if kh * kw == 1 else nb * sh * sw * ci * hq * wq
    kk, ncol = ci * kh * kw, nb * ho * wo
    if cols >= ncol:  # the panel, and a product block per thread: co // threads + 1 channels, or whole strips
        ldc = gemm_packed.padded(ncol)
        blas = f"{planes + kk * ncol + co * ncol} + {THREADS} * {ncol}"
        strips = f"{planes + kk * ldc} + {THREADS} * ({gemm_packed.strips(co)} // {THREADS} + 1) * {6 * ldc}"
        return f"max({blas}, {strips})"
    # tiles, each with its product: all channels, or all the strips' rows with rows padded to 16
    return f"{planes} + {THREADS} * {(kk + gemm_packed.strips(co) * 6) * gemm_packed.padded(cols)}"


def conv_cols_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_cols_<act>``: the im2col convolution with its epilogue (and the device functions it calls)."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    conv_taps.devices(ctx)
    ctx.parts.device("conv_cols_fill", FILL.format(jit=DEVICE_JIT))
    gemm_packed.use(ctx.parts)
    name = f"k_conv_cols_{act_name}"
    src = CONV_COLS.format(jit=JIT, name=name, expr=act(ctx.parts, act_name))
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1, A1) + (I64,) * 12))
