"""Convolutions without groups as a direct product: output positions broadcast, output channels in vectors.

The tap sum (conv_taps.py) puts positions in the vector lanes, so it runs on a grid of wq = wo + ((kw − 1)·dw)
// sw columns a row and needs stride × stride phase planes: on ResNet's 7×7 maps 2 of every 9 grid columns are
thrown away, and a stride of 2 costs a de-interleaving copy of the input (73 µs of a 0.53 ms convolution at
64→128 channels to 28×28). Here the roles swap, as ONNX Runtime's NCHWc kernels do:

    tile[position r, channel c] = Σ_j x[base(r) + tab[j]] · panel[j, c],  j = (input channel, ki, kj)

A register block (``simd_conv``) holds 7 consecutive output positions of one output row × 48 output channels
(21 AVX-512 accumulators): each step of K broadcasts 7 input elements (stride sw apart: any stride reads the
input itself) and loads 3 vectors of the weight panel. The weight is packed once (``conv_direct_pack``) as
panels of 48 output channels, each [C·kh·kw, 48] (the last panel 16, 32 or 48 wide), so a panel streams
contiguously. The input is copied once into a zero-padded plane per channel (rows and columns of padding,
and columns past the last row block's reach), which is a plain row copy; ``tab`` holds where row j of K
reads, relative to the block's first position.

K runs in chunks of CHUNK input channels (CHUNK·kh·kw rows: 27 KB of a 3×3 panel, in L1) over every row block
of a unit, so a chunk of the panel is read from L2 once per unit, not once per block; the blocks'
accumulators go to the unit's tile between chunks. A unit is (image, panel, a band of output rows of at most
BAND_POSITIONS positions); bands shrink until the units divide among the threads or are many. The epilogue
(bias, residual, activation) copies the tile into the NCHW output, channel by channel. Positions past the
end of a row (a row of 9 takes two blocks of 7) are computed on padding and not copied. Every sum runs over K
in a fixed order: results do not depend on the thread count.

Each step of K also prefetches the panel row ``ahead`` steps on into L2: in a whole pass the weights come
from memory (a cold 512→512 on 7×7: 1.12 ms without, 0.90 with; into L1 it was slower).

Measured on 2 threads, interleaved against the packed tap sum it replaces (ResNet-18 layers, B = 1 unless
said): 64→128 stride 2 1.06× (B = 8: 1.17×), 128→24 stride 2 1.11×, 64→48 stride 2 1.28×, 16→16 stride 2
1.30×, 32→32 dilation 2 on 56×56 1.23×, 256→256 dilation 2 on 14×14 1.32×; ResNet-18 whole 12.66 against
13.39 ms (B = 8: 89.5 against 91.6). One loss: 64→64 dilation 2 on 28×28, 0.81× (a 48 + 16 panel split).
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()
ROWS = 7  # positions a register block: 7 × 3 vectors of 16 channels are 21 accumulators
WIDTH = 48  # output channels a panel
CHUNK = 16  # input channels a step of K's chunks
BAND_POSITIONS = 56  # a unit's output rows hold at most this many row blocks' positions (the tile: 10.5 KB)
MIN_CHANNELS = 16  # below this the table's one load a step of K costs more than the layout saves

SIMD_CONV = '''\
def simd_conv(name, rows, width, fresh=False, ahead=64):
    """The block acc[ao + r·lda + c] (+)= Σ_j x[xo + tab[j] + r·xs] · w[wo + j·ldw + c] for r < ``rows``
    positions, c < ``width`` channels, j < depth (>= 1): one broadcast a position and one vector load per 16
    channels each step of j. ``fresh``: acc = the sum (acc is not read)."""
    def typer(typingctx, x, xo, xs, tab, w, wo, ldw, acc, ao, lda, depth):
        def codegen(context, builder, sig, args):
            i64 = llvm_ir.IntType(64)
            lanes, budget = vec_shape(context)
            x_, tab_, w_, acc_ = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 3, 4, 7))
            xo_, xs_, wo_, ldw_, ao_, lda_, depth_ = (args[a] for a in (1, 2, 5, 6, 8, 9, 10))
            homes = [builder.add(ao_, builder.mul(llvm_ir.Constant(i64, r), lda_)) for r in range(rows)]
            steps = [builder.mul(llvm_ir.Constant(i64, r), xs_) for r in range(rows)]
            vectors = width // lanes
            per = max(1, min(vectors, budget // rows))
            for first in range(0, vectors, per):
                cols = range(first, min(first + per, vectors))
                ats = [[builder.add(homes[r], llvm_ir.Constant(i64, lanes * c)) for c in cols] for r in range(rows)]

                def step(j, accs, cols=cols):
                    at = builder.add(wo_, builder.mul(j, ldw_))
                    vv = [vec_load(builder, lanes, w_, builder.add(at, llvm_ir.Constant(i64, lanes * c))) for c in cols]
                    on = builder.add(at, builder.mul(llvm_ir.Constant(i64, ahead), ldw_))
                    for c in cols:  # the panel's row ``ahead`` steps on, into L2
                        vec_prefetch(builder, w_, builder.add(on, llvm_ir.Constant(i64, lanes * c)), 2)
                    xj = builder.add(xo_, builder.load(builder.gep(tab_, [j])))
                    out = []
                    for r in range(rows):
                        xr = vec_splat(builder, lanes, x_, builder.add(xj, steps[r]))
                        out += [vec_fma(builder, v, xr, accs[r * len(vv) + a]) for a, v in enumerate(vv)]
                    return out

                zero = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.FloatType(), lanes), [0.0] * lanes)
                inits = [zero if fresh else vec_load(builder, lanes, acc_, at) for row in ats for at in row]
                accs = vec_loop(builder, depth_, inits, step)
                for value, at in zip(accs, [at for row in ats for at in row]):
                    vec_store(builder, value, acc_, at)
            return context.get_dummy_value()
        n = numba_types.intp
        return numba_types.void(x, n, n, tab, w, n, n, acc, n, n, n), codegen
    typer.__name__ = name
    return intrinsic(typer)
'''

# conv_d<rows>x<width>[_new]: the panels' widths (a last panel of 16 or 32 channels takes a narrower block)
BLOCKS = {f"conv_d{ROWS}x{w}{new}": (w, new == "_new") for w in (48, 32, 16) for new in ("", "_new")}

PACK = f'''\
def conv_direct_pack(w, co, kk):
    """A convolution weight [co, kk] (kk = C·kh·kw in the weight's own (c, ki, kj) order) as panels of
    {WIDTH} output channels, each [kk, width] (the last one {WIDTH}, 32 or 16 wide, its missing channels
    zeros), flat."""
    w = w.reshape(co, kk)
    parts = []
    for o0 in range(0, co, {WIDTH}):
        width = min({WIDTH}, (co - o0 + 15) // 16 * 16)
        p = np.zeros((kk, width), np.float32)
        p[:, :min(width, co - o0)] = w[o0:o0 + width].T
        parts.append(p.reshape(-1))
    return np.ascontiguousarray(np.concatenate(parts))
'''

GEOMETRY = f"""\
{{jit}}
def conv_direct_geometry(nb, ci, co, ho, wo, sh, sw, dh, dw, kh, kw, parts):
    \"\"\"(plane rows, plane columns, row blocks a row, bands of output rows, tile floats a thread) of the
    direct convolution: the padded planes hold every input row and column some block reads (past a row's end
    too), bands shrink until the units divide among the threads or are many.\"\"\"
    rb = (wo + {ROWS} - 1) // {ROWS}
    hp = (ho - 1) * sh + (kh - 1) * dh + 1
    wp = (rb * {ROWS} - 1) * sw + (kw - 1) * dw + 1
    band = max(1, min(ho, {BAND_POSITIONS} // (rb * {ROWS})))
    bands = (ho + band - 1) // band
    units = nb * ((co + {WIDTH} - 1) // {WIDTH})
    while bands < ho and (units * bands) % parts != 0 and units * bands < 8 * parts:
        bands += 1
    band = (ho + bands - 1) // bands
    return hp, wp, rb, bands, band * rb * {ROWS} * {WIDTH}
"""

CONV_DIRECT = f"""\
{{jit}}
def {{name}}(x, wp, b, res, out, work, sh, sw, ph, pw, dh, dw, kh, kw, has_res, parts):
    nb, ci, hi, wi = x.shape
    co, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    hp, wq, rb, bands, tile = conv_direct_geometry(nb, ci, co, ho, wo, sh, sw, dh, dw, kh, kw, parts)
    plane = hp * wq
    nplanes = nb * ci * plane
    khw = kh * kw
    kk = ci * khw
    npan = (co + {WIDTH} - 1) // {WIDTH}
    if work.size < nplanes + parts * tile or wp.size < kk * co:
        raise ValueError("conv work buffer too small")
    xf = x.reshape(-1)
    U = np.uint64
    zero = np.float32(0.0)
    # the padded planes: plane (n, c) row u, column v is input (u − ph, v − pw), zero outside it
    y0, y1 = min(hp, ph), min(hp, max(ph, ph + hi))  # plane rows holding input rows: [y0, y1)
    v0, v1 = min(wq, pw), min(wq, max(pw, pw + wi))  # and columns: [v0, v1)
    for t in prange(nb * ci):
        d0 = t * plane
        for u in range(hp):
            d = d0 + u * wq
            if u < y0 or u >= y1:
                for v in range(wq):
                    work[U(d + v)] = zero
                continue
            for v in range(v0):
                work[U(d + v)] = zero
            s = (t * hi + u - ph) * wi - pw  # input column v − pw of the row
            for v in range(v0, v1):
                work[U(d + v)] = xf[U(s + v)]
            for v in range(v1, wq):
                work[U(d + v)] = zero
    tab = np.empty(kk, np.int64)  # where row j = (c, ki, kj) of K reads, from the block's first position
    for j in range(kk):
        c = j // khw
        ki = (j // kw) % kh
        kj = j % kw
        tab[j] = c * plane + ki * dh * wq + kj * dw
    oflat = out.reshape(-1)
    rflat = res.reshape(-1)
    units = nb * npan * bands
    for t in prange(parts):
        tb = nplanes + t * tile
        for u in range(t * units // parts, (t + 1) * units // parts):
            n = u // (npan * bands)
            p = (u // bands) % npan
            r0 = (u % bands) * ho // bands
            r1 = (u % bands + 1) * ho // bands
            o0 = p * {WIDTH}
            width = min({WIDTH}, (co - o0 + 15) // 16 * 16)
            pbase = o0 * kk  # every panel before this one is {WIDTH} wide
            for c0 in range(0, ci, {CHUNK}):
                j0 = c0 * khw
                depth = (min(ci, c0 + {CHUNK}) - c0) * khw
                for oi in range(r0, r1):
                    for q in range(rb):
                        a = tb + ((oi - r0) * rb + q) * {ROWS} * width
                        xo = n * ci * plane + oi * sh * wq + q * {ROWS} * sw
                        wo_ = pbase + j0 * width
                        if width == {WIDTH}:
                            if c0 == 0:
                                conv_d{ROWS}x{WIDTH}_new(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
                            else:
                                conv_d{ROWS}x{WIDTH}(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
                        elif width == 32:
                            if c0 == 0:
                                conv_d{ROWS}x32_new(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
                            else:
                                conv_d{ROWS}x32(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
                        elif c0 == 0:
                            conv_d{ROWS}x16_new(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
                        else:
                            conv_d{ROWS}x16(work, xo, sw, tab[j0:], wp, wo_, width, work, a, width, depth)
            # the epilogue: channel by channel, each output row's positions from its blocks' tile rows
            for c in range(min(width, co - o0)):
                o = o0 + c
                bo = b[o]
                for oi in range(r0, r1):
                    d = ((n * co + o) * ho + oi) * wo
                    g = tb + (oi - r0) * rb * {ROWS} * width + c  # position oj of the row is tile row oj
                    if has_res:
                        for oj in range(wo):
                            v = work[U(g + oj * width)] + bo + rflat[U(d + oj)]
                            oflat[U(d + oj)] = {{expr}}
                    else:
                        for oj in range(wo):
                            v = work[U(g + oj * width)] + bo
                            oflat[U(d + oj)] = {{expr}}
"""


def applies(channels: int, groups: int, taps: int) -> bool:
    """The direct product serves convolutions without groups of more than one tap and enough input channels."""
    return groups == 1 and taps > 1 and channels >= MIN_CHANNELS


def work_size(geo: tuple[int, ...], x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str:
    """The driver's expression for the work buffer: the padded planes and a tile per thread (the thread count
    is the module's, known when it runs)."""
    from irc.backends.cpu.render.gemm import THREADS

    nb, ci = x_shape[0], x_shape[1]
    ho, wo = out_shape[2], out_shape[3]
    kh, kw, sh, sw, ph, pw, dh, dw = geo
    rb = (wo + ROWS - 1) // ROWS
    hp = (ho - 1) * sh + (kh - 1) * dh + 1
    wq = (rb * ROWS - 1) * sw + (kw - 1) * dw + 1
    # the largest tile any thread count picks: a band of at most BAND_POSITIONS // (rb·ROWS) rows (or one)
    band = max(1, min(ho, BAND_POSITIONS // (rb * ROWS)))
    return f"{nb * ci * hp * wq} + {THREADS} * {band * rb * ROWS * WIDTH}"


def packed_weight(ctx: NodeCtx, key: str, weight_expr: str, co: int, kk: int) -> str:
    """``weight_expr`` ([co, kk] in any shape of its size) in panels, derived once per weights dict."""
    ctx.helper("conv_direct_pack", PACK)
    return ctx.derive(f"~conv_direct_pack({key})", f"conv_direct_pack({weight_expr}, {co}, {kk})")


def conv_direct_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_direct_<act>``: the direct convolution with its epilogue (and the blocks it calls)."""
    from irc.backends.cpu.render import sdpa_simd
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    for part in ("vec_ptr", "vec_shape", "vec_load", "vec_store", "vec_splat", "vec_fma", "vec_prefetch", "vec_loop"):
        ctx.parts.device(part, sdpa_simd.SOURCES[part])
    ctx.parts.device("simd_conv", SIMD_CONV)
    for block, (width, fresh) in BLOCKS.items():
        ctx.parts.device(block, f'{block} = simd_conv("{block}", {ROWS}, {width}, fresh={fresh})\n')
    ctx.parts.device("conv_direct_geometry", GEOMETRY.format(jit=DEVICE_JIT))
    name = f"k_conv_direct_{act_name}"
    src = CONV_DIRECT.format(jit=JIT, name=name, expr=act(ctx.parts, act_name))
    return ctx.kernel(Kernel(name, src, (A4, A1, A1, A3, A4, A1) + (I64,) * 10))
