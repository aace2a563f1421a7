"""Convolutions without groups as GEMMs over phase planes, with their epilogue (bias, residual, activation)."""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()

# Convolutions without groups, as one GEMM [out, in·kh·kw] × [in·kh·kw, columns] per tile of columns.
# The input is first split into stride × stride phase planes, each zero-padded (conv_phases): then every
# tap reads, for consecutive outputs of a row, consecutive elements of one plane, and the columns are the
# positions of a grid of wq = wo + ((kw - 1)·dw) // sw columns per output row (the last few of each row
# are not outputs, and are skipped by the epilogue): an im2col row of a tile is one contiguous copy.
# Tiles hold the grid positions of the whole batch, image after image; each is copied (~1 MiB, it stays
# in L2), multiplied by one single-threaded BLAS call, and finished by the epilogue (bias, residual,
# activation) while the product is in cache. Large maps split their tiles over the threads; small maps
# (few columns, big weights: ResNet's last stages) copy every column once, split by rows over the
# threads, then split the output channels, so each thread packs only its share of the weights.
CONV_GEMM = """\
{jit}
def {name}(x, w2, b, res, out, sh, sw, ph, pw, dh, dw, kh, kw, has_res, parts):
    nb, ci, hi, wi = x.shape
    co, kk = w2.shape
    ho, wo = out.shape[2], out.shape[3]
    wq = wo + ((kw - 1) * dw) // sw
    hq = ho + ((kh - 1) * dh) // sh + 1  # one zero row more: the grid's last columns read past the map
    planes = np.empty((nb, sh * sw, ci, hq * wq), np.float32)
    for t in prange(nb * sh * sw):
        conv_phases(x, planes, t, sh, sw, ph, pw, hq, wq, 0, ci)
    npos = ho * wq
    ncol = nb * npos
    out3 = out.reshape(nb, co, ho * wo)
    ntile = max(1, (ncol * kk + 262143) // 262144)
    by_cols = ntile >= 2 * parts and ncol >= 64 * parts
    if by_cols:
        ntile = (ntile + parts - 1) // parts * parts  # whole rounds of tiles: no thread waits for a last one
    else:
        ntile = 1
    tile = (ncol + ntile - 1) // ntile
    col_all = np.empty((kk if not by_cols else 1, ncol if not by_cols else 1), np.float32)
    if not by_cols:
        for c in prange(parts):
            conv_im2col(planes, col_all, c * kk // parts, (c + 1) * kk // parts, 0, ncol, npos, wq,
                        sh, sw, dh, dw, kh, kw)
    for c in prange(parts):
        t0, t1, o0, o1 = 0, 1, c * co // parts, (c + 1) * co // parts
        if by_cols:
            t0, t1, o0, o1 = c * ntile // parts, (c + 1) * ntile // parts, 0, co
        colbuf = np.empty(kk * tile if by_cols else 1, np.float32)
        for t in range(t0, t1):
            if o1 == o0:
                break
            j0 = t * tile
            j1 = min(ncol, j0 + tile)
            if j1 <= j0:
                break
            if by_cols:
                col = colbuf[:kk * (j1 - j0)].reshape(kk, j1 - j0)
                conv_im2col(planes, col, 0, kk, j0, j1, npos, wq, sh, sw, dh, dw, kh, kw)
            else:
                col = col_all
            prod = np.dot(w2[o0:o1], col)
            j = j0
            while j < j1:  # the epilogue, one image's run of grid positions at a time
                n = j // npos
                q0 = j - n * npos
                q1 = min(npos, q0 + j1 - j)
                base = j - j0 - q0  # column of grid position 0 of image n in prod
                for o in range(o0, o1):
                    bo = b[o]
                    row = prod[o - o0]
                    dst = out3[n, o]
                    src = res[n, o]
                    for oi in range(q0 // wq, (q1 - 1) // wq + 1):
                        a = max(q0 - oi * wq, 0)
                        e = min(q1 - oi * wq, wo)
                        g = base + oi * wq
                        d = oi * wo
                        if has_res:
                            for oj in range(a, e):
                                v = row[g + oj] + bo + src[d + oj]
                                dst[d + oj] = {expr}
                        else:
                            for oj in range(a, e):
                                v = row[g + oj] + bo
                                dst[d + oj] = {expr}
                j += q1 - q0
"""

PHASES = """\
{jit}
def conv_phases(x, planes, t, sh, sw, ph, pw, hq, wq, c0, c1):
    \"\"\"Channels [c0, c1) of task t = (image, phase) of the padded phase planes: plane (pr, pc) of channel c
    holds, at (u, v), input (u·sh + pr − ph, v·sw + pc − pw), zero outside the input.\"\"\"
    nb, ci, hi, wi = x.shape
    nphase = sh * sw
    n = t // nphase
    f = t % nphase
    pr = f // sw
    pc = f % sw
    lo = max(0, (pw - pc + sw - 1) // sw)  # first v whose input column is >= 0
    top = max(lo, min(wq, (wi - 1 + pw - pc) // sw + 1))  # past the last v inside the row
    for c in range(c0, c1):
        dst = planes[n, f, c]
        for u in range(hq):
            y = u * sh + pr - ph
            row = u * wq
            if y < 0 or y >= hi:
                for v in range(wq):
                    dst[row + v] = np.float32(0.0)
                continue
            src = x[n, c, y]
            for v in range(lo):
                dst[row + v] = np.float32(0.0)
            off = pc - pw
            # indices cast to uint64: numba adds no negative-index wraparound check, and the copies vectorise
            if sw == 1:
                for v in range(lo, top):
                    dst[np.uint64(row + v)] = src[np.uint64(v + off)]
            elif sw == 2:
                for v in range(lo, top):
                    dst[np.uint64(row + v)] = src[np.uint64(2 * v + off)]
            else:
                for v in range(lo, top):
                    dst[np.uint64(row + v)] = src[np.uint64(v * sw + off)]
            for v in range(top, wq):
                dst[row + v] = np.float32(0.0)
"""

IM2COL = """\
{jit}
def conv_im2col(planes, col, r0, r1, j0, j1, npos, wq, sh, sw, dh, dw, kh, kw):
    \"\"\"Rows [r0, r1) (channel, ki, kj) of the im2col matrix of grid columns [j0, j1) into col[r, j − j0]:
    for each image the tile touches, one contiguous run of the tap's phase plane.\"\"\"
    khw = kh * kw
    for r in range(r0, r1):
        c = r // khw
        ki = (r // kw) % kh
        kj = r % kw
        f = ((ki * dh) % sh) * sw + (kj * dw) % sw  # the tap's phase plane
        off = ((ki * dh) // sh) * wq + (kj * dw) // sw  # and its offset there from the output's position
        dst = col[r]
        j = j0
        while j < j1:
            n = j // npos
            q0 = j - n * npos
            q1 = min(npos, q0 + j1 - j)
            src = planes[n, f, c]
            d = j - j0 - q0
            for q in range(q0, q1):
                dst[np.uint64(d + q)] = src[np.uint64(off + q)]
            j += q1 - q0
"""


def conv_gemm_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv2d_<act>``: the grouped-free convolution with its epilogue (and the im2col it calls)."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    ctx.parts.device("conv_phases", PHASES.format(jit=DEVICE_JIT))
    ctx.parts.device("conv_im2col", IM2COL.format(jit=DEVICE_JIT))
    name = f"k_conv2d_{act_name}"
    src = CONV_GEMM.format(jit=JIT, name=name, expr=act(ctx.parts, act_name))
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4) + (I64,) * 10))
