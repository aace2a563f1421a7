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
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import conv_taps, gemm_packed
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()
SLACK = 64  # floats after the planes: the last block's last 64 positions may read up to 63 past the grid

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
    planes = work[:nplanes].reshape(nb, nphase, ci, plane)
    for i in range(nplanes, nplanes + {slack}):  # read past the last plane into product columns never used
        work[i] = np.float32(0.0)
    rows, cols, nrows = conv_phase_rows(sh, sw, dh, dw, kh, kw)
    cblocks = parts if nb * nrows < 2 * parts else 1
    for t in prange(cblocks * nb * nrows):
        c = t // (nb * nrows)
        n = (t // nrows) % nb
        r = t % nrows
        conv_tap_planes(x, planes, n, rows[r], c * ci // cblocks, (c + 1) * ci // cblocks, sh, sw, ph, pw, hq, wq,
                        cols[r])
    # row (c, ki, kj) of K: where in image 0's planes its grid position 0 is
    tab = np.empty(kk, np.int64)
    khw = kh * kw
    for r in range(kk):
        c = r // khw
        ki = (r // kw) % kh
        kj = r % kw
        f = ((ki * dh) % sh) * sw + (kj * dw) % sw
        tab[r] = (f * ci + c) * plane + ((ki * dh) // sh) * wq + (kj * dw) // sw
    nblk = (npos + pb - 1) // pb
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


def conv_table_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_table_<act>``: the table-driven convolution with its epilogue (and the device functions it
    calls)."""
    from irc.backends.cpu.render import sdpa_simd
    from irc.backends.cpu.render.activations import act

    conv_taps.devices(ctx)
    sdpa_simd.use_pv(ctx.parts, "gemm_tab6x64", 6, 64, fresh=True, table=True)
    name = f"k_conv_table_{act_name}"
    src = CONV_TABLE.format(jit=JIT, name=name, expr=act(ctx.parts, act_name), slack=SLACK)
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1, A1) + (I64,) * 11))
