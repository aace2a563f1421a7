"""The fused attention core (flash-style), RoPE and the causal mask on [B, H, T, hd] values.

``sdpa`` never holds a T×S matrix: each task takes one (batch, head, query tile), walks the
key tiles with an online softmax (running row maximum ``mx``, running denominator ``ll``,
the output accumulator rescaled when the maximum grows), and both tile products are
single-threaded BLAS calls on contiguous float32 tiles. Thread p runs tasks p, p + n, ...
(n threads), with scratch tiles allocated once per thread. Causal
attention (top-left aligned: key j is hidden from query i when j > i) stops at the
diagonal, so fully masked tiles are never computed, and masks element-wise only in the
tile that crosses it. A sliding window W (Mistral: query i also loses keys j <= i − W)
starts the key loop at the tile holding the first key of the tile's first row and masks
the tiles that cross the window's lower edge: O(T·W) work, not O(T²); W is an argument,
so one compiled kernel serves every window. Query head h reads key/value head h // (H/G)
in place (GQA, MQA). A row whose keys are all masked (a −inf bias) gives zeros, never NaN.
"""

from __future__ import annotations

from irc.backends.common.kernel import A2, A4, F32, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.literals import f32_literal, float_literal
from irc.ops.attention import rope_theta

JIT = jit(fastmath=True)
TILE_Q = 128  # query rows per task
TILE_K = 256  # keys per tile: the score tile is 128 KiB, in L2 with its K and V tiles

SDPA = """\
{jit}
def {name}(q, k, v, bias, out, scale, {window}parts):
    nb, nh, nt, hd = q.shape
    ng, ns = k.shape[1], k.shape[2]
    hv = v.shape[3]
    group = nh // ng
    kstep = 1 if k.shape[0] > 1 else 0  # one key/value batch broadcasts over the queries
    nqt = (nt + {bq} - 1) // {bq}
    tasks = nb * nh * nqt
    for part in prange(parts):
        # each thread takes every parts-th (batch, head, query tile): causal rows of keys of
        # every length land on every thread; its scratch tiles are allocated once
        qs = np.empty(({bq}, hd), np.float32)
        acc = np.empty(({bq}, hv), np.float32)
        mx = np.empty({bq}, np.float32)
        ll = np.empty({bq}, np.float32)
        sbuf = np.empty({bq} * {bk}, np.float32)
        pbuf = np.empty({bq} * hv, np.float32)
        for task in range(part, tasks, parts):
            qt = task % nqt
            h = (task // nqt) % nh
            n = task // (nqt * nh)
            kn = n * kstep
            g = h // group
            i0 = qt * {bq}
            i1 = min(i0 + {bq}, nt)
            m = i1 - i0
            for r in range(m):  # the query tile, pre-scaled
                mx[r] = np.float32(-np.inf)
                ll[r] = np.float32(0.0)
                for d in range(hd):
                    qs[r, d] = q[n, h, i0 + r, d] * scale
                for d in range(hv):
                    acc[r, d] = np.float32(0.0)
            qm = qs[:m]
            jend = {jend}
{jstart}            for j0 in range({j0}, jend, {bk}):
                j1 = min(j0 + {bk}, jend)
                kb = j1 - j0
                s = sbuf[:m * kb].reshape(m, kb)
                np.dot(qm, k[kn, g, j0:j1].T, s)
{mask}\
                for r in range(m):
                    # row maximum in eight independent lanes (one chain does not vectorise)
                    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
                    c = 0
                    while c + 8 <= kb:
                        a = s[r, c]
                        m0 = a if a > m0 else m0
                        a = s[r, c + 1]
                        m1 = a if a > m1 else m1
                        a = s[r, c + 2]
                        m2 = a if a > m2 else m2
                        a = s[r, c + 3]
                        m3 = a if a > m3 else m3
                        a = s[r, c + 4]
                        m4 = a if a > m4 else m4
                        a = s[r, c + 5]
                        m5 = a if a > m5 else m5
                        a = s[r, c + 6]
                        m6 = a if a > m6 else m6
                        a = s[r, c + 7]
                        m7 = a if a > m7 else m7
                        c += 8
                    top = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
                    for j in range(c, kb):
                        top = s[r, j] if s[r, j] > top else top
                    new = mx[r] if mx[r] > top else top
                    if new == np.float32(-np.inf):  # every key so far masked: nothing to add
                        for j in range(kb):
                            s[r, j] = np.float32(0.0)
                        continue
                    alpha = fexp(mx[r] - new)
                    total = np.float32(0.0)
                    for j in range(kb):
                        e = fexp(s[r, j] - new)
                        s[r, j] = e
                        total += e
                    ll[r] = ll[r] * alpha + total
                    mx[r] = new
                    if alpha != np.float32(1.0):
                        for d in range(hv):
                            acc[r, d] *= alpha
                p = pbuf[:m * hv].reshape(m, hv)
                np.dot(s, v[kn, g, j0:j1], p)
                for r in range(m):
                    for d in range(hv):
                        acc[r, d] += p[r, d]
            for r in range(m):
                inv = np.float32(1.0) / ll[r] if ll[r] > np.float32(0.0) else np.float32(0.0)
                for d in range(hv):
                    out[n, h, i0 + r, d] = acc[r, d] * inv
"""

CAUSAL_MASK_TILE = """\
                if j1 - 1 > i0:  # this tile crosses the diagonal: hide key j > query i
                    for r in range(m):
                        for j in range(max(i0 + r + 1 - j0, 0), kb):
                            s[r, j] = np.float32(-np.inf)
"""

WINDOW_START = """\
            # tiles start at the first key the first row (the one reaching furthest left) can see
            jstart = max(i0 - window + 1, 0)
"""

WINDOW_MASK_TILE = """\
                if j0 <= i1 - 1 - window:  # this tile crosses the window's edge: hide key j <= query i - W
                    for r in range(m):
                        for j in range(min(i0 + r - window + 1 - j0, kb)):
                            s[r, j] = np.float32(-np.inf)
"""

BIAS_TILE = """\
                bn = n if bias.shape[0] > 1 else 0
                bh = h if bias.shape[1] > 1 else 0
                for r in range(m):
                    bi = i0 + r if bias.shape[2] > 1 else 0
                    for j in range(kb):
                        s[r, j] += bias[bn, bh, bi, j0 + j if bias.shape[3] > 1 else 0]
"""


def sdpa_kernel(causal: bool, bias: bool, window: bool = False) -> Kernel:
    """The kernel of one configuration; a ``window`` kernel (causal only) takes W as an
    argument after ``scale``."""
    if window and not causal:
        raise AssertionError("a sliding window slides the causal mask")
    name = "k_sdpa" + ("_causal" if causal else "") + ("_window" if window else "") + ("_bias" if bias else "")
    mask = ((BIAS_TILE if bias else "") + (CAUSAL_MASK_TILE if causal else "")
            + (WINDOW_MASK_TILE if window else ""))
    src = SDPA.format(jit=JIT, name=name, bq=TILE_Q, bk=TILE_K, mask=mask,
                      jend="min(ns, i1)  # keys past the last query of the tile are all masked" if causal else "ns",
                      window="window, " if window else "", j0="jstart" if window else "0",
                      jstart=WINDOW_START if window else "")
    args = (A4, A4, A4, A4, A4, F32) + ((I64,) if window else ()) + (I64,)
    return Kernel(name, src, args)


def window_arg(ctx: NodeCtx) -> int | None:
    """The node's sliding window (a kernel argument), or None for none. The IR caps it below
    2**62, so i − W never overflows int64 in the kernels."""
    window = ctx.attr("window")
    return int(window) if window is not None and ctx.attr("causal", False) else None


def render_sdpa(ctx: NodeCtx) -> None:
    from irc.backends.cpu.render import mathfns

    mathfns.use(ctx.parts, "fexp")
    causal = bool(ctx.attr("causal", False))
    has_bias = len(ctx.args) > 3
    window = window_arg(ctx)
    k = ctx.kernel(sdpa_kernel(causal, has_bias, window is not None))
    if has_bias:
        bs = ctx.in_shape(3)
        bias = f"{ctx.args[3]}.reshape({', '.join(str(d) for d in (1,) * (4 - len(bs)) + bs)})"
    else:
        bias = "np.zeros((1, 1, 1, 1), np.float32)"
    out = ctx.alloc()
    scale = ctx.attr("scale")
    window_lit = "" if window is None else f"{window}, "
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.args[1]}, {ctx.args[2]}, {bias}, {out}, {f32_literal(scale)}, "
             f"{window_lit}{THREADS})")


ROPE = """\
{jit}
def k_rope(x, cos, sin, out):
    # rotate-half pairs (i, i + hd/2) of every head by the angle of their position
    nb, nh, nt, hd = x.shape
    half = hd // 2
    for bh in prange(nb * nh):
        n = bh // nh
        h = bh % nh
        for t in range(nt):
            for i in range(half):
                a = x[n, h, t, i]
                b = x[n, h, t, half + i]
                out[n, h, t, i] = a * cos[t, i] - b * sin[t, i]
                out[n, h, t, half + i] = b * cos[t, i] + a * sin[t, i]
"""

ROPE_TABLES = '''\
@functools.lru_cache(maxsize=32)
def rope_tables(positions, hd, theta):
    """cos and sin of p * theta^(-2i/hd) for p < positions, i < hd/2: float64 angles, float32 tables."""
    freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    angle = np.arange(positions, dtype=np.float64)[:, None] * freq[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
'''


def render_rope(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()  # an even head width: rope's (and attention's) shape inference checks it
    k = ctx.kernel(Kernel("k_rope", ROPE.format(jit=jit()), (A4, A2, A2, A4)))
    tables = ctx.helper("rope_tables", ROPE_TABLES)
    theta = float(rope_theta(ctx.node.attrs, key="theta"))
    out = ctx.alloc(inplace=(0,))
    cos, sin = f"{out}_cos", f"{out}_sin"
    ctx.emit(f"{cos}, {sin} = {tables}({shape[2]}, {shape[3]}, {float_literal(theta)})")
    ctx.emit(f"{k}({ctx.args[0]}, {cos}, {sin}, {out})")
    ctx.emit(f"del {cos}, {sin}")


CAUSAL_MASK = """\
{jit}
def k_causal_mask(x, out, nt):
    # rows are (..., query i); key j > i becomes -inf (top-left aligned when T != S)
    rows, ns = x.shape
    for r in prange(rows):
        i = r % nt
        for j in range(ns):
            out[r, j] = np.float32(-np.inf) if j > i else x[r, j]
"""

CAUSAL_MASK_WINDOW = """\
{jit}
def k_causal_mask_window(x, out, nt, window):
    # rows are (..., query i); key j > i or j <= i - window becomes -inf (top-left aligned)
    rows, ns = x.shape
    for r in prange(rows):
        i = r % nt
        for j in range(ns):
            out[r, j] = np.float32(-np.inf) if j > i or j <= i - window else x[r, j]
"""


def render_causal_mask(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    out = ctx.alloc(inplace=(0,))
    rows = f"{ctx.rows(ctx.args[0], shape)}, {ctx.rows(out, shape)}, {shape[-2]}"
    window = ctx.attr("window")
    if window is None:
        k = ctx.kernel(Kernel("k_causal_mask", CAUSAL_MASK.format(jit=jit()), (A2, A2, I64)))
        ctx.emit(f"{k}({rows})")
        return
    k = ctx.kernel(Kernel("k_causal_mask_window", CAUSAL_MASK_WINDOW.format(jit=jit()), (A2, A2, I64, I64)))
    ctx.emit(f"{k}({rows}, {int(window)})")


RENDERERS = {
    "sdpa": render_sdpa,
    "rope": render_rope,
    "causal_mask": render_causal_mask,
}
