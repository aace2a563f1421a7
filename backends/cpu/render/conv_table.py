"""Convolutions of few input channels (the 3-channel stem) as one register-blocked product over all their taps,
each row of K read where it lies in the phase planes: no im2col copy.

The tap sum (conv_taps.py) runs one GEMM per tap with K = channels: at 3 channels its register blocks would
load and store their accumulators every 3 steps of K. The exact im2col panel (conv_cols.py) has K =
channels·kh·kw, but it copies each input element kh·kw / (sh·sw) times into the panel: that copy was a quarter
of ResNet-18's stem at B = 8 (2.2 of 8.5 ms). Here the product runs on the tap sum's grid (wq = wo + ((kw −
1)·dw) // sw positions a row, on conv_taps' phase planes), with K over (c, ki, kj), the weight's own order:
row (c, ki, kj) of the would-be panel is plane f(ki, kj)[c] from offset off(ki, kj), so a table of those
offsets stands in for the im2col (simd_pv's ``table`` blocks: one more load a step of K).

Work is split into blocks of ``pb`` grid positions (images × blocks, contiguous runs a thread). A block runs
64 positions at a time through every 6-row strip of the packed weight (gemm_packed.py): the 64 floats of each
of the C·kh·kw rows stay in L1 while the strips pass. The product block [strips·6, pb] then goes to the
output rows through the epilogue (bias, residual, activation), skipping the grid's wq − wo extra columns.

With a max pool fused after it (conv2d_bn's ``pool``: ResNet's stem), ``k_conv_table_pool_<act>`` writes only
the pool's output: at B = 8 the stem's activation is 25.7 MB, written out and read back by the pool, against 6.4
MB pooled. A unit is a band of pool rows of one image; each pool row computes the convolution rows its window
adds (a product block of at most pool-kernel rows), their epilogue goes into a ring of pool-kernel rows a
channel (L1/L2), and the window's maximum is taken there. Bands split an image only when the images do not
divide among the threads; a band's first window recomputes the rows it shares with the band above.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import conv_taps, gemm_packed
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.mathfns import DEVICE_JIT

JIT = jit()
SLACK = 64  # floats after the planes: the last block's last 64 positions may read up to 63 past the grid

# both kernels' first steps: the phase planes (a task per image and row phase, or per channel block when there
# are few), the slack after them zeroed, and the table: where in image 0's planes row (c, ki, kj) of K reads
# grid position 0
PLANES = """\
    planes = work[:nplanes].reshape(nb, nphase, ci, plane)
    for i in range(nplanes, nplanes + SLACK):  # read past the last plane into product columns never used
        work[i] = np.float32(0.0)
    rows, cols, nrows = conv_phase_rows(sh, sw, dh, dw, kh, kw)
    cblocks = parts if nb * nrows < 2 * parts else 1
    for t in prange(cblocks * nb * nrows):
        c = t // (nb * nrows)
        n = (t // nrows) % nb
        r = t % nrows
        conv_tap_planes(x, planes, n, rows[r], c * ci // cblocks, (c + 1) * ci // cblocks, sh, sw, ph, pw, hq, wq,
                        cols[r])
    tab = np.empty(kk, np.int64)
    khw = kh * kw
    for r in range(kk):
        c = r // khw
        ki = (r // kw) % kh
        kj = r % kw
        f = ((ki * dh) % sh) * sw + (kj * dw) % sw
        tab[r] = (f * ci + c) * plane + ((ki * dh) // sh) * wq + (kj * dw) // sw
"""

CONV_TABLE = """\
{jit}
def {name}(x, w2, b, res, out, work, ap, sh, sw, ph, pw, dh, dw, kh, kw, has_res, pb, parts):
    nb, ci, hi, wi = x.shape
    co, kk = out.shape[1], w2.shape[1]  # (w2: the packed weight's padded rows)
    ho, wo = out.shape[2], out.shape[3]
    wq, hq, nphase, nplanes = conv_taps_geometry(x.shape, ho, wo, sh, sw, ph, pw, dh, dw, kh, kw)
    plane = hq * wq
    npos = ho * wq
    strips = (co + 5) // 6
    block = strips * 6 * pb  # a thread's product block: every strip's rows × pb positions
    if work.size < nplanes + {slack} + parts * block or pb % 64 != 0:
        raise ValueError("conv work buffer too small")
{planes}    nblk = (npos + pb - 1) // pb
    units = nb * nblk
    oflat = out.reshape(-1)
    rflat = res.reshape(-1)
    U = np.uint64
    for t in prange(parts):
        pbase = nplanes + {slack} + t * block
        for u in range(t * units // parts, (t + 1) * units // parts):
            n = u // nblk
            q0 = (u - n * nblk) * pb
            q1 = min(npos, q0 + pb)
            vo = n * nphase * ci * plane + q0
            for c0 in range(0, q1 - q0, 64):
                for s in range(strips):
                    gemm_tab6x64(ap, s * kk * 6, 6, work, vo + c0, tab, work, pbase + s * 6 * pb + c0, pb, kk)
            # the epilogue: output channel o is product row o; only the block's grid positions that are outputs
            for o in range(co):
                bo = b[o]
                g0 = pbase + o * pb - q0  # grid position q of the block is work[g0 + q]
                for oi in range(q0 // wq, (q1 - 1) // wq + 1):
                    a = max(q0 - oi * wq, 0)
                    e = min(q1 - oi * wq, wo)
                    gr = g0 + oi * wq
                    d = (n * co + o) * ho * wo + oi * wo
                    if has_res:
                        for oj in range(a, e):
                            v = work[U(gr + oj)] + bo + rflat[U(d + oj)]
                            oflat[U(d + oj)] = {expr}
                    else:
                        for oj in range(a, e):
                            v = work[U(gr + oj)] + bo
                            oflat[U(d + oj)] = {expr}
"""

CONV_TABLE_POOL = """\
{jit}
def {name}(x, w2, b, res, out, work, ap, sh, sw, ph, pw, dh, dw, kh, kw, has_res, ho, wo, pk, pl, ps, pt, pp, pq,
           pg, pb, parts):
    # ho × wo: the convolution's result; pk × pl, ps × pt, pp × pq: the max pool's kernel, stride, padding;
    # pg pool rows a step, whose conv rows (at most nr) are one product block
    nb, ci, hi, wi = x.shape
    co, kk = b.shape[0], w2.shape[1]
    mo, no = out.shape[2], out.shape[3]
    wq, hq, nphase, nplanes = conv_taps_geometry(x.shape, ho, wo, sh, sw, ph, pw, dh, dw, kh, kw)
    plane = hq * wq
    strips = (co + 5) // 6
    block = strips * 6 * pb
    nr = pk + (pg - 1) * ps
    ring = co * nr * wo  # channel o's conv row r at ring[(o·nr + r % nr)·wo]
    span = max(pq + wo, (no - 1) * pt + pl)  # the row buffer: element t is conv column t − pq
    per = block + ring + span
    if work.size < nplanes + {slack} + parts * per or pb % 64 != 0 or pb < nr * wq:
        raise ValueError("conv work buffer too small")
{planes}    bands = 1 if nb % parts == 0 else parts
    units = nb * bands
    oflat = out.reshape(-1)
    rflat = res.reshape(-1)
    U = np.uint64
    ninf = np.float32(-np.inf)
    for t in prange(parts):
        pbase = nplanes + {slack} + t * per
        rbase = pbase + block
        bbase = rbase + ring
        for i in range(span):  # padding never wins; only [pq, pq + wo) is written below
            work[U(bbase + i)] = ninf
        for u in range(t * units // parts, (t + 1) * units // parts):
            n = u // bands
            p0 = (u % bands) * mo // bands
            p1 = (u % bands + 1) * mo // bands
            nxt = 0  # the next conv row to compute (windows only move down)
            for pa in range(p0, p1, pg):
                pe = min(p1, pa + pg)
                nxt = max(nxt, pa * ps - pp)
                a1 = min(ho, (pe - 1) * ps - pp + pk)
                if a1 > nxt:  # the rows the step's windows add, as one product block of grid positions
                    q0 = nxt * wq
                    vo = n * nphase * ci * plane + q0
                    for c0 in range(0, (a1 - nxt) * wq, 64):
                        for s in range(strips):
                            gemm_tab6x64(ap, s * kk * 6, 6, work, vo + c0, tab, work, pbase + s * 6 * pb + c0, pb, kk)
                    for o in range(co):
                        bo = b[o]
                        for r in range(nxt, a1):
                            g = pbase + o * pb + (r - nxt) * wq
                            d = rbase + (o * nr + r % nr) * wo
                            if has_res:
                                e = ((n * co + o) * ho + r) * wo
                                for oj in range(wo):
                                    v = work[U(g + oj)] + bo + rflat[U(e + oj)]
                                    work[U(d + oj)] = {expr}
                            else:
                                for oj in range(wo):
                                    v = work[U(g + oj)] + bo
                                    work[U(d + oj)] = {expr}
                    nxt = a1
                for po in range(pa, pe):
                    for o in range(co):
                        pool_row(work, rbase + o * nr * wo, bbase, oflat, ((n * co + o) * mo + po) * no, po, nr, wo,
                                 ho, no, pk, pl, ps, pt, pp, pq)
"""

POOL_ROW = """\
{jit}
def pool_row(work, ring, buf, out, at, po, nr, wo, ho, no, pk, pl, ps, pt, pp, pq):
    \"\"\"Pool row po of one channel into out[at : at + no], from its window's conv rows in the channel's ring
    (conv row r at work[ring + (r % nr)·wo]): their maximum column by column into the row buffer at
    work[buf + pq], −inf around it (padding never wins), then each output's maximum over its pl columns. A
    NaN wins, as in k_maxpool2d: v > m | v != v keeps the first.\"\"\"
    U = np.uint64
    a0 = max(0, po * ps - pp)
    a1 = min(ho, po * ps - pp + pk)
    e = buf + pq
    if a1 <= a0:  # a window of padding only
        for oj in range(wo):
            work[U(e + oj)] = np.float32(-np.inf)
    for r in range(a0, a1):
        d = ring + (r % nr) * wo
        if r == a0:
            for oj in range(wo):
                work[U(e + oj)] = work[U(d + oj)]
        else:
            for oj in range(wo):
                v = work[U(d + oj)]
                m = work[U(e + oj)]
                work[U(e + oj)] = v if (v > m) | (v != v) else m
    if pl == 3 and pt == 2:  # ResNet's 3 × 3 of stride 2: the three taps in one pass
        for oj in range(no):
            m = work[U(buf + 2 * oj)]
            v = work[U(buf + 2 * oj + 1)]
            m = v if (v > m) | (v != v) else m
            v = work[U(buf + 2 * oj + 2)]
            out[U(at + oj)] = v if (v > m) | (v != v) else m
    else:
        for oj in range(no):
            m = work[U(buf + oj * pt)]
            for j in range(1, pl):
                v = work[U(buf + oj * pt + j)]
                m = v if (v > m) | (v != v) else m
            out[U(at + oj)] = m
"""

BLOCK = 256  # grid positions a block: its product (stem: 66 × 256 floats) and rows stay in L2


def applies(ci: int, kh: int, kw: int, wo: int, extra: int) -> bool:
    """For a weight known at load: convolutions whose tap GEMMs would be too thin (fewer channels than the tap
    sum takes) and whose grid wastes at most 1/4 of a row (``extra`` columns beyond ``wo``)."""
    return kh * kw > 1 and not conv_taps.applies(ci, 1) and 4 * extra <= wo


def work_size(geometry: tuple[int, ...], x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str:
    """The driver's expression for the elements the kernel needs: its planes, the slack, a product block a
    thread (the same formulas as conv_taps_geometry and the kernel)."""
    from irc.backends.cpu.render.gemm import THREADS

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    nb, ci = x_shape[0], x_shape[1]
    co, ho, wo = out_shape[1], out_shape[2], out_shape[3]
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + (1 if wq > wo else 0)
    planes = nb * sh * sw * ci * hq * wq
    return f"{planes + SLACK} + {THREADS} * {gemm_packed.strips(co) * 6 * BLOCK}"


POOL_POSITIONS = 1024  # grid positions a step of the pooled kernel aims at: whole 64s waste little of them


def pool_group(pk: int, ps: int, wq: int) -> int:
    """Pool rows a step of the pooled kernel: as many as keep their conv rows near POOL_POSITIONS (a step of one
    pool row, two new conv rows of the stem, padded 230 positions to 256)."""
    return max(1, (POOL_POSITIONS // wq - pk) // ps + 1)


def pool_block(pk: int, ps: int, wq: int) -> int:
    """The pooled kernel's product block: a step's conv rows of wq grid positions, in whole 64s."""
    return ((pk + (pool_group(pk, ps, wq) - 1) * ps) * wq + 63) // 64 * 64


def pool_work_size(geometry: tuple[int, ...], x_shape: tuple[int, ...], conv_shape: tuple[int, ...],
                   pool: tuple[int, int, int, int, int], out_w: int) -> str:
    """The driver's expression for the pooled kernel's elements: planes, slack, and a thread's product block,
    ring of a step's conv rows a channel and row buffer (the same formulas as the kernel). ``pool``: the pool's
    kernel rows and columns, row and column strides, column padding; ``out_w`` its output's width."""
    from irc.backends.cpu.render.gemm import THREADS

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    nb, ci = x_shape[0], x_shape[1]
    co, ho, wo = conv_shape[1], conv_shape[2], conv_shape[3]
    pk, pl, ps, pt, pq = pool
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + (1 if wq > wo else 0)
    planes = nb * sh * sw * ci * hq * wq
    nr = pk + (pool_group(pk, ps, wq) - 1) * ps
    per = gemm_packed.strips(co) * 6 * pool_block(pk, ps, wq) + co * nr * wo + max(pq + wo, (out_w - 1) * pt + pl)
    return f"{planes + SLACK} + {THREADS} * {per}"


def conv_table_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_table_<act>``: the table-driven convolution with its epilogue (and the device functions it
    calls)."""
    from irc.backends.cpu.render import sdpa_simd
    from irc.backends.cpu.render.activations import act

    conv_taps.devices(ctx)
    gemm_packed.use(ctx.parts)  # the weight's 6-row strips (gemm_pack6)
    sdpa_simd.use_pv(ctx.parts, "gemm_tab6x64", 6, 64, fresh=True, table=True)
    name = f"k_conv_table_{act_name}"
    src = CONV_TABLE.format(jit=JIT, name=name, expr=act(ctx.parts, act_name), slack=SLACK,
                            planes=PLANES.replace("SLACK", str(SLACK)))
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1, A1) + (I64,) * 11))


def conv_table_pool_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_table_pool_<act>``: the table-driven convolution, its epilogue and a max pool after it."""
    from irc.backends.cpu.render import sdpa_simd
    from irc.backends.cpu.render.activations import act

    conv_taps.devices(ctx)
    gemm_packed.use(ctx.parts)  # the weight's 6-row strips (gemm_pack6)
    sdpa_simd.use_pv(ctx.parts, "gemm_tab6x64", 6, 64, fresh=True, table=True)
    ctx.parts.device("pool_row", POOL_ROW.format(jit=DEVICE_JIT))
    name = f"k_conv_table_pool_{act_name}"
    src = CONV_TABLE_POOL.format(jit=JIT, name=name, expr=act(ctx.parts, act_name), slack=SLACK,
                                 planes=PLANES.replace("SLACK", str(SLACK)))
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1, A1) + (I64,) * 20))
