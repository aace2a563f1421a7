"""Convolutions without groups as a sum over the kernel's taps of GEMMs read in place: no im2col.

The input is split into stride × stride zero-padded phase planes (conv_tap_planes; a 1×1 convolution
gathers its one plane block by block inside its units, conv_gather, and one of stride 1 without padding
reads the input itself). On the grid of wq = wo + ((kw − 1)·dw) // sw columns per output row,
tap (ki, kj) sees, for consecutive grid positions, consecutive elements of one phase plane: the whole tap is
the matrix plane[:, off : off + positions] (rows one plane apart), and the convolution is

    grid[out, positions] = Σ_taps weight[:, tap's C columns] · plane_f(tap)[C, off(tap) + positions]

kh·kw BLAS calls adding into one product block (blas_sgemm with leading dimensions and beta = 1): each input
element is copied once (the planes), not kh·kw times, and each GEMM's K is the channel count. (A weight known at
load takes conv_direct.py's product for kernels of more than one tap, which beat these calls and the register
blocks on 6-row strips this kernel once also ran, so it serves weights computed at run time and 1×1s.) The
weight is in (ki, kj, c) order, [out, kh·kw·C], so a tap's columns are contiguous (a derived weight; a
1×1 weight is already in that order). A 1×1 convolution has wq = wo: its grid is the output itself, the
GEMMs write the output rows directly and the epilogue (bias, residual, activation) runs in place; otherwise
the epilogue copies each product block's outputs (the last wq − wo columns of each row are not outputs).

Work is split over (image, positions, output channels) units, a whole number per thread: whole images
when the batch divides among the threads, else each image's positions, or its output channels when the map
is too small to give each thread 64 positions. Each unit runs blocks of positions whose product stays in
L2 through the kh·kw GEMMs. Temporaries live in the module's kept work buffer (conv_blas.conv_work).
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import conv_blas
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()

CONV_TAPS = """\
{jit}
def {name}(x, wt, b, res, out, work, sh, sw, ph, pw, dh, dw, kh, kw, has_bias, has_res, pb, parts):
    nb, ci, hi, wi = x.shape
    co, kk = out.shape[1], wt.shape[1]
    ho, wo = out.shape[2], out.shape[3]
    wq, hq, nphase, nplanes = conv_taps_geometry(x.shape, ho, wo, sh, sw, ph, pw, dh, dw, kh, kw)
    plane = hq * wq
    npos = ho * wq
    in_place = wq == wo
    grid_size = 0 if in_place else co * pb
    if work.size < nplanes + parts * grid_size:
        raise ValueError("conv work buffer too small")
    wflat = wt.reshape(-1)
    oflat = out.reshape(-1)
    rflat = res.reshape(-1)
    U = np.uint64
    # units: a whole number per thread (images; else chunks of each image's positions or output channels)
    g = parts // math.gcd(nb, parts)
    chunks = g if npos >= 64 * g else 1
    oblocks = g // chunks
    units = nb * chunks * oblocks
    # a 1×1's units own disjoint positions of its one plane, each gathers its own (in cache for its GEMM,
    # and no wait between the two); unless units share positions, split by output channels
    gather = kh * kw == 1 and nplanes > 0 and oblocks == 1
    if nplanes == 0:  # a 1×1 convolution of stride 1 without padding: the input is its only plane
        src = x.reshape(-1)
    else:
        src = work[:nplanes]
    planes = src.reshape(nb, nphase, ci, plane) if nplanes > 0 else work[:0].reshape(0, 1, 1, 1)
    if nplanes > 0 and not gather:
        rows, cols, nrows = conv_phase_rows(sh, sw, dh, dw, kh, kw)
        cblocks = parts if nb * nrows < 2 * parts else 1  # tasks: channel blocks outermost, so threads share
        for t in prange(cblocks * nb * nrows):
            c = t // (nb * nrows)
            n = (t // nrows) % nb
            r = t % nrows
            conv_tap_planes(x, planes, n, rows[r], c * ci // cblocks, (c + 1) * ci // cblocks, sh, sw, ph, pw, hq, wq,
                            cols[r])
    # numba resolves its BLAS pointer on first use, taking the GIL: do it here, on the thread that holds it
    blas_sgemm(0, 0, 1, 1, 0, wflat, 0, 1, wflat, 0, 1, np.float32(1.0), work, 0, 1)
    for c in prange(parts):
        gbase = nplanes + c * grid_size
        for u in range(c * units // parts, (c + 1) * units // parts):
            n = u // (chunks * oblocks)
            r = u - n * chunks * oblocks
            p0 = (r // oblocks) * npos // chunks
            p1 = (r // oblocks + 1) * npos // chunks
            o0 = (r % oblocks) * co // oblocks
            o1 = (r % oblocks + 1) * co // oblocks
            for q0 in range(p0, p1, pb):
                q1 = min(p1, q0 + pb)
                m = q1 - q0
                if gather:
                    conv_gather(x, src, n * nphase * ci * plane + q0, plane, 0, ci, n * npos + q0, n * npos + q1, sh,
                                sw, ph, pw, ho, wo)
                for tap in range(kh * kw):  # BLAS: one call a tap, all the block's positions
                    ki = tap // kw
                    kj = tap - ki * kw
                    f = ((ki * dh) % sh) * sw + (kj * dw) % sw
                    off = ((ki * dh) // sh) * wq + (kj * dw) // sw
                    b0 = ((n * nphase + f) * ci) * plane + off + q0
                    beta = np.float32(0.0) if tap == 0 else np.float32(1.0)
                    if in_place:
                        blas_sgemm(0, 0, o1 - o0, m, ci, wflat, o0 * kk + tap * ci, kk, src, b0, plane, beta,
                                   oflat, (n * co + o0) * npos + q0, npos)
                    else:
                        blas_sgemm(0, 0, o1 - o0, m, ci, wflat, o0 * kk + tap * ci, kk, src, b0, plane, beta,
                                   work, gbase, m)
                # the epilogue, on flat indices cast to uint64: an index numba cannot prove non-negative costs a
                # wraparound check per element, and the loop no longer vectorises
                if in_place:
                    if has_bias or has_res or not {identity}:
                        for o in range(o0, o1):
                            bo = b[o]
                            d = (n * co + o) * npos + q0
                            if has_res:
                                for q in range(m):
                                    v = oflat[U(d + q)] + bo + rflat[U(d + q)]
                                    oflat[U(d + q)] = {expr}
                            else:
                                for q in range(m):
                                    v = oflat[U(d + q)] + bo
                                    oflat[U(d + q)] = {expr}
                    continue
                for o in range(o0, o1):  # only the block's grid positions that are outputs
                    bo = b[o]
                    g0 = gbase + (o - o0) * m - q0  # grid position q of the block is work[g0 + q]
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

GEOMETRY = """\
{jit}
def conv_taps_geometry(shape, ho, wo, sh, sw, ph, pw, dh, dw, kh, kw):
    \"\"\"(wq, hq, phases, plane elements) of the tap-sum convolution: grid columns per output row, plane rows
    (one more when the grid's last columns read past the map), phase count, and the planes' size in the work
    buffer (0 when the input is its own plane).\"\"\"
    nb, ci, hi, wi = shape
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + (1 if wq > wo else 0)
    direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
    return wq, hq, sh * sw, 0 if direct else nb * sh * sw * ci * hq * wq
"""

PHASE_USED = """\
{jit}
def conv_tap_phase_used(f, sh, sw, dh, dw, kh, kw):
    \"\"\"Whether some tap reads phase plane f (a 1×1 convolution of stride 2 reads one plane of four).\"\"\"
    rows = False
    for ki in range(kh):
        rows = rows or (ki * dh) % sh == f // sw
    cols = False
    for kj in range(kw):
        cols = cols or (kj * dw) % sw == f % sw
    return rows and cols
"""

PHASE_ROWS = """\
{jit}
def conv_phase_rows(sh, sw, dh, dw, kh, kw):
    \"\"\"(rows, cols, count): the row phases some tap reads, and for each a bit mask of the column phases
    read, as conv_tap_planes takes them (a task per image and row phase fills that row's planes).\"\"\"
    rows = np.empty(sh, np.int64)
    cols = np.zeros(sh, np.int64)
    count = 0
    for pr in range(sh):
        for pc in range(sw):
            if conv_tap_phase_used(pr * sw + pc, sh, sw, dh, dw, kh, kw):
                cols[count] |= 1 << pc
        if cols[count]:
            rows[count] = pr
            count += 1
    return rows, cols, count
"""

PLANES = """\
{jit}
def conv_tap_planes(x, planes, n, pr, c0, c1, sh, sw, ph, pw, hq, wq, cols):
    \"\"\"Channels [c0, c1) of image n's phase planes of row phase pr, for the column phases pc in bit mask
    ``cols``: plane (pr, pc) holds, at (u, v), input (u·sh + pr − ph, v·sw + pc − pw), zero outside it. Rows
    are short on small maps: flat indices, cast to uint64 so numba adds no negative-index wraparound check
    (which also keeps the loops from vectorising); a stride of 2 with both column phases fills them in one
    pass over each input row.\"\"\"
    nb, ci, hi, wi = x.shape
    xf = x.reshape(-1)
    pf = planes.reshape(-1)
    plane = hq * wq
    lo = min(wq, (pw + sw - 1) // sw)  # columns v inside the row for every phase: [lo, top)
    top = max(lo, min(wq, (wi - sw + pw) // sw + 1))
    pair = sw == 2 and cols == 3
    zero = np.float32(0.0)
    for c in range(c0, c1):
        for pc in range(sw):
            if not (cols >> pc) & 1 or (pair and pc == 1):
                continue
            d0 = (((n * sh + pr) * sw + pc) * ci + c) * plane
            d1 = d0 + ci * plane  # phase pc + 1, filled in the same pass when pair
            for u in range(hq):
                y = u * sh + pr - ph
                d = d0 + u * wq
                e = d1 + u * wq
                if y < 0 or y >= hi:
                    for v in range(wq):
                        pf[np.uint64(d + v)] = zero
                        if pair:
                            pf[np.uint64(e + v)] = zero
                    continue
                s = ((n * ci + c) * hi + y) * wi + pc - pw  # the input element of column v is s + v·sw
                for v in range(lo):
                    j = v * sw + pc - pw
                    pf[np.uint64(d + v)] = xf[np.uint64(s + v * sw)] if 0 <= j < wi else zero
                    if pair:
                        pf[np.uint64(e + v)] = xf[np.uint64(s + v * sw + 1)] if 0 <= j + 1 < wi else zero
                for v in range(top, wq):
                    j = v * sw + pc - pw
                    pf[np.uint64(d + v)] = xf[np.uint64(s + v * sw)] if 0 <= j < wi else zero
                    if pair:
                        pf[np.uint64(e + v)] = xf[np.uint64(s + v * sw + 1)] if 0 <= j + 1 < wi else zero
                if pair:
                    for v in range(lo, top):
                        pf[np.uint64(d + v)] = xf[np.uint64(s + 2 * v)]
                        pf[np.uint64(e + v)] = xf[np.uint64(s + 2 * v + 1)]
                elif sw == 1:
                    for v in range(lo, top):
                        pf[np.uint64(d + v)] = xf[np.uint64(s + v)]
                elif sw == 2:
                    for v in range(lo, top):
                        pf[np.uint64(d + v)] = xf[np.uint64(s + 2 * v)]
                else:
                    for v in range(lo, top):
                        pf[np.uint64(d + v)] = xf[np.uint64(s + v * sw)]
"""

GATHER = """\
{jit}
def conv_gather(x, col, cbase, ld, r0, r1, j0, j1, sh, sw, ph, pw, ho, wo):
    \"\"\"Rows (channels) [r0, r1) of a 1×1 convolution's panel of pixels [j0, j1) (image after image) into
    col[cbase + c·ld + j − j0] = x[n, c, oi·sh − ph, oj·sw − pw], zero outside the input. One output row's
    run at a time, its position stepped, not divided out (runs are as short as 7 elements); flat indices,
    cast to uint64: no wraparound checks.\"\"\"
    nb, ci, hi, wi = x.shape
    xf = x.reshape(-1)
    npix = ho * wo
    lo = min(wo, (pw + sw - 1) // sw)  # output columns whose input column is inside the row: [lo, top)
    top = max(lo, min(wo, (wi - 1 + pw) // sw + 1))
    n0 = j0 // npix  # pixel j0's image, output row and column
    oi0 = (j0 - n0 * npix) // wo
    a0 = j0 - n0 * npix - oi0 * wo
    zero = np.float32(0.0)
    for c in range(r0, r1):
        n, oi, a = n0, oi0, a0
        d = cbase + c * ld - a  # the panel element of output column 0 of the current row
        left = j1 - j0
        while left > 0:
            e = min(wo, a + left)
            y = oi * sh - ph
            s0, s1 = max(a, lo), min(e, top)
            if y < 0 or y >= hi:
                s0 = s1 = e
            for v in range(a, s0):
                col[np.uint64(d + v)] = zero
            for v in range(max(s1, a), e):
                col[np.uint64(d + v)] = zero
            s = ((n * ci + c) * hi + y) * wi - pw  # input column v·sw − pw of row y
            if sw == 1:
                for v in range(s0, s1):
                    col[np.uint64(d + v)] = xf[np.uint64(s + v)]
            elif sw == 2:
                for v in range(s0, s1):
                    col[np.uint64(d + v)] = xf[np.uint64(s + 2 * v)]
            else:
                for v in range(s0, s1):
                    col[np.uint64(d + v)] = xf[np.uint64(s + v * sw)]
            left -= e - a
            d += wo
            a = 0
            oi += 1
            if oi == ho:
                oi = 0
                n += 1
"""

# the weight [out, in, kh, kw] (or a folded [out, in·kh·kw]) with a tap's channels contiguous
HWC_WEIGHT = '''\
def conv_hwc_weight(w, co, ci, kh, kw):
    """A convolution weight as [out, kh·kw·in], taps outer and channels inner (a tap's GEMM columns)."""
    return np.ascontiguousarray(w.reshape(co, ci, kh, kw).transpose(0, 2, 3, 1).reshape(co, kh * kw * ci))
'''

MIN_CHANNELS = 16  # below this, each tap's GEMM (K = channels) is too thin: im2col (K = channels·kh·kw) wins


def applies(channels: int, groups: int) -> bool:
    """The tap sum serves convolutions without groups of at least MIN_CHANNELS input channels."""
    return groups == 1 and channels >= MIN_CHANNELS


def block(co: int) -> int:
    """Grid positions per product block: [out, block] floats stay in L2 (≤ 256 KiB) through the taps."""
    return max(64, 65536 // co)


def work_size(geometry: tuple[int, ...], x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str:
    """The driver's expression for the elements the kernel needs: its planes, and a product block per thread
    unless the grid is the output itself (the same formula as conv_taps_geometry and the kernel)."""
    from irc.backends.cpu.render.gemm import THREADS

    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    nb, ci = x_shape[0], x_shape[1]
    co, ho, wo = out_shape[1], out_shape[2], out_shape[3]
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + (1 if wq > wo else 0)
    direct = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)
    planes = 0 if direct else nb * sh * sw * ci * hq * wq
    if wq == wo:  # the grid is the output
        return str(planes)
    return f"{planes} + {THREADS} * {co * block(co)}"  # and a product block per thread


def tap_weight(ctx: NodeCtx, key: str | None, weight_expr: str, co: int, ci: int, kh: int, kw: int) -> str:
    """``weight_expr`` in (ki, kj, c) order: derived once per weights dict under ``key``, else on every run."""
    ctx.helper("conv_hwc_weight", HWC_WEIGHT)
    expr = f"conv_hwc_weight({weight_expr}, {co}, {ci}, {kh}, {kw})"
    return ctx.derive(f"~conv_hwc({key})", expr) if key is not None else expr


def devices(ctx: NodeCtx) -> None:
    """Register the device functions the tap sum (and conv_cols.py) call: BLAS, geometry, phase planes."""
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    conv_blas.sgemm(ctx)
    ctx.parts.device("conv_tap_planes", PLANES.format(jit=DEVICE_JIT))
    ctx.parts.device("conv_gather", GATHER.format(jit=DEVICE_JIT))
    ctx.parts.device("conv_taps_geometry", GEOMETRY.format(jit=DEVICE_JIT))
    ctx.parts.device("conv_tap_phase_used", PHASE_USED.format(jit=DEVICE_JIT))
    ctx.parts.device("conv_phase_rows", PHASE_ROWS.format(jit=DEVICE_JIT))


def conv_taps_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_taps_<act>``: the tap-sum convolution with its epilogue (and the device functions it calls)."""
    from irc.backends.cpu.render.activations import act

    devices(ctx)
    name = f"k_conv_taps_{act_name}"
    src = CONV_TAPS.format(jit=JIT, name=name, expr=act(ctx.parts, act_name),
                           identity="True" if act_name == "none" else "False")
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1) + (I64,) * 12))

