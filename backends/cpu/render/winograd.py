"""3×3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray 2016).

Each 2×2 block of outputs (a tile) is computed from a 4×4 patch of the zero-padded input: the patch and
the filter are transformed (V = Bᵀ·d·B, U = G·g·Gᵀ), multiplied element by element and summed over the
input channels, then transformed back (Y = Aᵀ·M·A). Summed over channels, each of the 16 elements is one
GEMM M[e] = U[e] [out, in] × V[e] [in, tiles]: 16·in·out multiplies per tile instead of 36·in·out
(2.25× fewer). The filter transform runs once per weights dict (a derived weight). The transforms only
add and halve, so the result stays within float32 rounding of the direct convolution.

F(4×4, 3×3) (winograd_f43.py) does the same with 36 elements for 4×4 outputs (2.25 multiplies an output
against 4), at the cost of larger transforms: it serves wide layers (variant() says which).

Tiles of the whole batch are cut into chunks whose transformed input and product stay in L2; threads
split the chunks, or, when there are fewer chunks than threads (small maps), the output channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from irc.backends.common.kernel import A1, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import gemm_packed, winograd_f43
from irc.backends.cpu.render import winograd_transforms as transforms
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
    ty_n = (ho + {m1}) // {m}
    tx_n = (wo + {m1}) // {m}
    wp = tx_n + 1  # grid positions a row ({transforms}): the tiles and one that is none
    hp = ty_n + 2  # phase-plane rows: the tiles' patches, and a zero row the last position may read into
    g = ty_n * wp  # grid positions an image
{planes}    ntile = nb * g
    chunk = max(8, min(ntile, {chunk_floats} // (ci + co)))
    nchunk = (ntile + chunk - 1) // chunk
    # by chunks of tiles each thread reads all of U once a chunk: fine while U stays in L2 (≤ 1 MiB), else
    # (ResNet's 256 and 512 channels at B = 8) splitting the output channels reads U once, plus all of V
    usize = {e} * co * ci
    tiles_cost = (nchunk + parts - 1) // parts * (usize if usize > 262144 else 0)
    channels_cost = usize // parts + {e} * ci * ntile + {e} * co * ntile // parts
    by_tiles = nchunk >= {min_chunks} * parts and tiles_cost <= channels_cost
    if by_tiles:
        nchunk = (nchunk + parts - 1) // parts * parts
        chunk = (ntile + nchunk - 1) // nchunk
    else:
        nchunk, chunk = 1, ntile
    ldc = (chunk + 15) // 16 * 16 if in_strips else chunk  # V's and the product's row stride, at most
    v_all = np.empty({e} * winograd_stride(ci * ldc) if not by_tiles else 1, np.float32)
    if not by_tiles:  # one input transform of every tile, split by channels, then the products by channels out
        for c in prange(parts):
            {pre}_input(planes, v_all, winograd_stride(ci * ldc), ldc, c * ci // parts, (c + 1) * ci // parts, 0,
                           ntile, g, wp)
    out3 = out.reshape(nb, co, ho * wo)
    uf = u.reshape(-1)
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
        vbuf = np.empty({e} * winograd_stride(ci * ldc) if by_tiles else 1, np.float32)
        mbuf = np.empty({e} * winograd_stride(rows * ldc), np.float32)
        sbuf = np.empty(8 * ldc, np.float32)  # the output transform's row sums, then its 2×2 results
        ybuf = np.empty({m2} * ldc, np.float32)
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
                {pre}_input(planes, vbuf, vs, ldm, 0, ci, t0, t1, g, wp)
            else:
                vf = v_all
            em = winograd_stride(rows * ldm)  # element e of column j, channel o: mf[e·em + (o − o0)·ldm + j]
            mf = mbuf
            for e in range({e}):
                if in_strips:
                    gemm_strips(ap, e * strips * ci * 6, ci, s0, s1, ci, vf, e * vs, ldm, ldm, mf, e * em, ldm, 0)
                else:
                    blas_sgemm(0, 0, o1 - o0, m, ci, uf, (e * co + o0) * ci, ci, vf, e * vs, m, np.float32(0.0), mf,
                               e * em, m)
            for o in range(o0, o1):  # the output transform and the epilogue, channel after channel
                {pre}_output(mf, em, ldm, o - o0, m, sbuf, ybuf)
                t = t0
                while t < t1:  # one image's run of positions
                    n = t // g
                    q0 = t - n * g
                    q1 = min(g, q0 + t1 - t)
                    {pre}_store_{act}(ybuf[t - t0:], ldm, q0, q1, g, wp, tx_n, b[o], res[n, o], out3[n, o],
                                         has_res, wo, ho)
                    t += q1 - q0
"""


# F(2×2, 3×3)'s operand of the input transform: the input's 2×2 phase planes, zero-padded
F23_PLANES = """\
    planes = np.empty((nb, 4, ci, hp * wp), np.float32)
    cblocks = parts if 4 * nb < 2 * parts else 1
    for t in prange(nb * 4 * cblocks):
        c = t % cblocks
        conv_phases(x, planes, t // cblocks, 2, 2, ph, pw, hp, wp, c * ci // cblocks, (c + 1) * ci // cblocks)
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
# is 16/9 the size of the filter itself: a direct GEMM then wins (measured with BLAS on both sides: ResNet-18
# at B = 1 1.04x as a whole, its layer-4 convolutions about 1.25 ms against 1.3; at B = 8, 128 tiles,
# Winograd won 6.6 ms against 7.3). Those layers now take the tap sum on the packed weight (1.1 ms).
MIN_TILES = 32

# F(4×4, 3×3) against F(2×2, 3×3), the whole kernel, interleaved in one process (2 threads of an Intel Xeon,
# family 6 model 207): 128 channels on 28×28 maps 1.29× at B = 8, 1.28× at B = 2 and 1.34× at B = 1;
# 64 channels on 56×56 1.14× at B = 8, 1.19× at B = 4, 1.22× at B = 2, but 0.85× at B = 1 (196 tiles; with
# fewer channels the transforms, 36 values a tile each way, weigh more against the products they save);
# 256 on 14×14 (cut tiles: 16 of 4×4 cover 256 outputs for 196) 1.02× at B = 8 and 0.65× at B = 1. So:
# F(4×4, 3×3) from F43_CHANNELS channels on both sides, or from F43_FEWER_CHANNELS with F43_FEWER_TILES
# tiles of 4×4 or more.
F43_CHANNELS = 128
F43_FEWER_CHANNELS = 64
F43_FEWER_TILES = 256


@dataclass(frozen=True)
class Variant:
    """One of the two minimal filterings: F(m×m, 3×3) with its transforms' source and names."""
    m: int  # outputs a tile side
    prefix: str  # of the transforms' names: <prefix>_input, <prefix>_output, <prefix>_store_<act>
    transforms: ModuleType  # INPUT, OUTPUT, STORE
    filter_name: str
    filter_source: str
    planes: str  # the kernel's lines that prepare the input transform's operand, ``planes``
    chunk_floats: int  # a chunk of tiles holds about this many over the input and output channels
    min_chunks: int  # chunks a thread at least, else the work splits by channels

    @property
    def elements(self) -> int:
        return (self.m + 2) ** 2


F23 = Variant(2, "winograd", transforms, "winograd_filter", FILTER, F23_PLANES, 24576, 2)
# F(4×4, 3×3)'s chunks: 128 tiles on 64 + 64 channels (two 64-column blocks of the products), 64 on 128 + 128
F43 = Variant(4, "winograd_f43", winograd_f43, "winograd_f43_filter", winograd_f43.FILTER, winograd_f43.PLANES,
              16384, 1)


def variant(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], groups: int,
            batch: int, ci: int, co: int, ho: int, wo: int) -> Variant | None:
    """The Winograd variant serving a convolution, or None: 3×3 convolutions of stride 1 and dilation 1
    without groups, over at least MIN_TILES 2×2 output tiles (the whole batch's). F(4×4, 3×3) where its
    products save more than its larger transforms cost: channels enough on both sides (fewer with more
    tiles), maps whose sides are multiples of 4 (else its cut tiles waste products), MIN_TILES 4×4 tiles."""
    if kernel != (3, 3) or stride != (1, 1) or dilation != (1, 1) or groups != 1:
        return None
    if batch * ((ho + 1) // 2) * ((wo + 1) // 2) < MIN_TILES:
        return None
    tiles = batch * (ho // 4) * (wo // 4)
    channels = min(ci, co)
    if ho % 4 or wo % 4 or tiles < MIN_TILES:
        return F23
    if channels >= F43_CHANNELS or (channels >= F43_FEWER_CHANNELS and tiles >= F43_FEWER_TILES):
        return F43
    return F23


def filter_expr(ctx: NodeCtx, v: Variant, weight_expr: str, co: int, ci: int) -> str:
    """The transformed filter ([elements, out, in]) as an expression evaluated on every run."""
    ctx.helper(v.filter_name, v.filter_source)
    return f"{v.filter_name}({weight_expr}, {co}, {ci})"


def packed_filter(ctx: NodeCtx, v: Variant, key: str, weight_expr: str, co: int, ci: int) -> str:
    """The transformed filter with each element's [out, in] in 6-row strips (gemm_packed.py), derived once."""
    gemm_packed.use(ctx.parts)
    return ctx.derive(f"~winograd_f{v.m}3_strips({key})",
                      f"gemm_pack6({filter_expr(ctx, v, weight_expr, co, ci)}, {co}, {ci})")


def winograd_call(ctx: NodeCtx, v: Variant, u: str, b: str, res: str | None, act_name: str, ph: int, pw: int,
                  packed: bool = False) -> None:
    """The call of k_<prefix>_<act> on the node's [B, C, H, W] input and result; its products by BLAS on
    ``u`` ([elements, out, in], filter_expr), or by register blocks when ``u`` is ``packed`` (packed_filter)."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.conv_blas import sgemm
    from irc.backends.cpu.render.conv_gemm import PHASES
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    ctx.parts.device("conv_phases", PHASES.format(jit=DEVICE_JIT))
    for fn, source in getattr(v.transforms, "DEVICE", {}).items():
        ctx.parts.device(fn, source.format(jit=DEVICE_JIT))
    ctx.parts.device(f"{v.prefix}_input", v.transforms.INPUT.format(jit=DEVICE_JIT))
    ctx.parts.device(f"{v.prefix}_output", v.transforms.OUTPUT.format(jit=DEVICE_JIT))
    ctx.parts.device(f"{v.prefix}_store_{act_name}", v.transforms.STORE.format(jit=DEVICE_JIT, act=act_name,
                                                                              expr=act(ctx.parts, act_name)))
    ctx.parts.device("winograd_stride", STRIDE.format(jit=DEVICE_JIT))
    sgemm(ctx)
    gemm_packed.use(ctx.parts)
    name = f"k_{v.prefix}_{act_name}"
    e = v.elements
    source = WINOGRAD.format(jit=JIT, name=name, act=act_name, m=v.m, m1=v.m - 1, m2=v.m * v.m, planes=v.planes,
                             e=e, pre=v.prefix, transforms=v.transforms.__name__.rsplit(".", 1)[1] + ".py",
                             chunk_floats=v.chunk_floats, min_chunks=v.min_chunks)
    k = ctx.kernel(Kernel(name, source, (A4, A3, A1, A1, A3, A4) + (I64,) * 5))
    out_shape = ctx.out_shape()
    out = ctx.alloc(inplace=(len(ctx.args) - 1,) if res is not None else ())
    rows = f"{out_shape[0]}, {out_shape[1]}, {out_shape[2] * out_shape[3]}"
    res3 = f"{res}.reshape({rows})" if res is not None else f"{out}.reshape({rows})"  # unread when has_res=0
    if packed:  # the kernel's u: the strips seen as [elements, rows, in] (only its shape is read); ap: the strips
        u, ap = f"{u}.reshape({e}, {gemm_packed.strips(out_shape[1]) * 6}, {ctx.in_shape()[1]})", u
    else:
        ap = b  # (unread)
    ctx.emit(f"{k}({ctx.args[0]}, {u}, {ap}, {b}, {res3}, {out}, ph={ph}, pw={pw}, "
             f"has_res={0 if res is None else 1}, packed={int(packed)}, parts={THREADS})")
