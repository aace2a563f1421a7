"""The fused attention core (flash-style), RoPE and the causal mask on [B, H, T, hd] values.

``sdpa`` never holds a T×S matrix: each task takes one (batch, head, query tile) and walks
blocks of its keys with an online softmax. A row's terms are 2**(s − mx) for a reference
``mx`` within 2**8 of its running maximum, summed into ``ll`` and the accumulator; ``mx``
moves (and the old terms are rescaled) only when the maximum outgrows it, which after a
row's first block it almost never does. A block's two products are the register-blocked
intrinsics of :mod:`.sdpa_simd`, straight on the kernel's own buffers: the scores land
transposed (sᵀ[j, i]: key j, query i), so the softmax's maxima, exponentials and sums run
down the key axis, elementwise across queries, on whole vectors. The query tile is scaled by
scale·log2(e) once, so scores are in log2 units and every exponential is a 2**x
(``sdpa_exp2row``: a polynomial and an exponent shift, no libm call). After a row's first
block, an unmasked block's score blocks (``sdpa_qk…e``) store that 2**x, its column sums and the
column maxima themselves, while the scores are in registers (1.05×, causal 1.08× at T = 4,096);
a block with a score that outgrew its row's reference is redone the plain way.

A task is 128 queries against tiles of 256 keys (larger query tiles read the keys and
values fewer times but measured no faster: every tile stays in L2). The tasks go row by row
(batch, head), so a row's keys and values stay in cache from one query tile to the next,
each thread taking one contiguous run of them of about equal cost (queries × keys seen):
the halves of a causal attention land evenly too.
Causal attention (top-left aligned: key j is hidden from query i when j > i) runs the keys
left of a tile's first row as whole tiles, unmasked, and the tile's own diagonal block in
blocks of ``bd`` rows that stop at their last row's key: fully masked work is never
computed, and only the blocks on the diagonal are masked element-wise. A sliding window W
(Mistral: query i also loses keys j <= i − W) starts every block at the first key its first
row can see and masks the blocks that cross the window's lower edge: O(T·W) work, not
O(T²); W is an argument, so one compiled kernel serves every window. Query head h reads
key/value head h // (H/G) in place (GQA, MQA). A row whose keys are all masked (a −inf
bias) gives zeros, never NaN; a NaN score poisons its row. Each output row is one thread's
fixed sequence of operations: results do not depend on the number of threads.
"""

from __future__ import annotations

from irc.backends.common.kernel import A2, A4, F32, I64, Kernel
from irc.backends.cpu.aligned import EMPTY64_DEVICE
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import sdpa_simd
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.literals import f32_literal, float_literal
from irc.ops.attention import rope_theta

JIT = jit(fastmath=True)
TILE_Q = 128  # query rows per task
TILE_K = 256  # keys per tile: with TILE_Q, a 128 KiB score tile, in L2 beside its key and value tiles
TILE_D = 64  # rows per diagonal block (a multiple of 32, the score blocks' queries)
LOG2E = 1.4426950408889634
REBASE = 8.0  # log2 units: a row's terms stay below 2**8 times its maximum's, its sums far from overflow


SDPA = """\
{jit}
def {name}(q, k, v, bias, out, scale2, {window}bq, bk, bd, parts):
    nb, nh, nt, hd = q.shape
    ng, ns = k.shape[1], k.shape[2]
    hv = v.shape[3]
    group = nh // ng
    kstep = 1 if k.shape[0] > 1 else 0  # one key/value batch broadcasts over the queries
    nqt = (nt + bq - 1) // bq
    rows = nb * nh
    tasks = rows * nqt
    bqp = (bq + 31) // 32 * 32  # query columns, padded to whole 32-query blocks
    hvp = (hv + 15) // 16 * 16  # value columns, padded to whole 16-column blocks
    kcap = max(bk, bq)  # keys in one block at most (a diagonal block's last rows see bq)
    vpad = hvp != hv  # value rows are then copied into padded rows (the blocks read whole vectors)
    vflat = v.reshape(v.size)
    # the tasks go row by row (batch, head), so a row's keys and values stay in cache from one
    # query tile to the next, in one contiguous run per thread of about equal cost: queries ×
    # keys seen, plus a share for the tile's setup (a queue the threads draw tasks from
    # measured slower, at T = 1,024 causal, on a machine other programs share)
    cost = np.empty(tasks, np.int64)
    for u in range(tasks):
        i0 = (u % nqt) * bq
        cost[u] = (min(i0 + bq, nt) - i0) * ({keys} + 64)
    ends = np.cumsum(cost)
    total = ends[tasks - 1] if tasks > 0 else 0
    for part in prange(parts):
        # scratch, once per thread, on cache lines (the blocks' vectors then never straddle two)
        qt = empty64_device(hd * bqp)  # the query tile, scaled and transposed: qt[d·bqp + i]
        qt[:] = np.float32(0.0)
        st = empty64_device(kcap * bqp)  # a block's scores, transposed: st[j·w + i]
        acc = empty64_device(bqp * hvp)  # acc[i·hvp + c]
        acc[:] = np.float32(0.0)
        vt = np.zeros(kcap * hvp if vpad else 1, np.float32)
        mx = np.empty(bqp, np.float32)
        ll = np.empty(bqp, np.float32)
        top = np.empty(bqp, np.float32)
        base = np.empty(bqp, np.float32)
        tot = np.empty(bqp, np.float32)
        first, last = total * part // parts, total * (part + 1) // parts
        for u in range(tasks):
            if not first <= ends[u] - cost[u] < last:  # a task is the thread's whose run it starts in
                continue
            qtile = u % nqt
            n = (u // nqt) // nh
            h = (u // nqt) % nh
            kn = n * kstep
            g = h // group
            i0 = qtile * bq
            m = min(i0 + bq, nt) - i0
            mp = (m + 31) // 32 * 32
            for i in range(m):  # scaled by scale·log2(e): scores in log2 units; q read in order
                for d in range(hd):
                    qt[d * bqp + i] = q[n, h, i0 + i, d] * scale2
            for d in range(hd):  # padding queries: zero, so their scores stay finite
                for i in range(m, mp):
                    qt[d * bqp + i] = np.float32(0.0)
            for i in range(mp):
                mx[i] = np.float32(-np.inf)
                ll[i] = np.float32(0.0)
                for c in range(hvp):
                    acc[i * hvp + c] = np.float32(0.0)
            koff = (kn * ng + g) * ns * hd  # k[kn, g, 0, 0], flat
            voff = (kn * ng + g) * ns * hv
{chunks}\
            for c in range(nbulk + ndiag):
                if c < nbulk:  # all rows of the tile against a tile of keys
                    r0, r1 = 0, m
                    j0 = lo + c * bk
                    j1 = min(j0 + bk, bend)
                else:  # a block of rows against the keys up to its last row's own
                    r0 = (c - nbulk) * bd
                    r1 = min(r0 + bd, m)
                    j0 = {diag_j0}
                    j1 = min(i0 + r1, ns)
                if j1 <= j0:
                    continue
                mr = r1 - r0
                w = (mr + 31) // 32 * 32
                kb = j1 - j0
{scores}{mask}                if not fused:  # the block's maxima, a moved reference, its 2**x and their sums
                    # column maxima: down the keys, elementwise across the queries, so the loop vectorises
                    for i in range(mr):
                        top[i] = mx[r0 + i]
                    for j in range(kb):
                        for i in range(mr):
                            a = st[j * w + i]
                            top[i] = a if a > top[i] else top[i]
                    for i in range(mr):
                        # a row's terms are relative to its reference mx (exponents up to REBASE above
                        # it): moved, and the old terms rescaled, only when the maximum outgrows it
                        if top[i] > mx[r0 + i] + np.float32({rebase}):  # (always at a row's first score)
                            a = sdpa_exp2(mx[r0 + i] - top[i])
                            if ll[r0 + i] > np.float32(0.0):  # (else nothing to rescale: every term was 0)
                                ll[r0 + i] *= a
                                for c2 in range(hvp):
                                    acc[(r0 + i) * hvp + c2] *= a
                            mx[r0 + i] = top[i]
                        base[i] = mx[r0 + i] if mx[r0 + i] > np.float32(-np.inf) else np.float32(0.0)  # all masked: 0
                        tot[i] = np.float32(0.0)
                    for i in range(mr, w):  # the padding columns go along, never read out
                        base[i] = np.float32(0.0)
                        tot[i] = np.float32(0.0)
                    for j in range(kb):  # st = 2**(st - base), tot = its column sums
                        sdpa_exp2row(st, j * w, base, tot, w // 16)
                    for i in range(mr):
                        ll[r0 + i] += tot[i]
                if vpad:
                    for j in range(kb):
                        for c2 in range(hv):
                            vt[j * hvp + c2] = vflat[voff + (j0 + j) * hv + c2]
                    vsrc, vo, ldv = vt, 0, hvp
                else:
                    vsrc, vo, ldv = vflat, voff + j0 * hv, hv
                # acc[i] += Σ_j st[j, i]·v[j0 + j] in blocks of 6 queries × 64 columns (2 queries for
                # the last 2 or 4, 16 columns for the last ones), over 128-key chunks: a chunk of
                # values stays in L1 while every query block passes over it
                for jc in range(0, kb, 128):
                    nk = min(128, kb - jc)
                    i = 0
                    while i < w:
                        six = i + 6 <= w
                        c0 = 0
                        while c0 < hvp:
                            po, vat, at = jc * w + i, vo + jc * ldv + c0, (r0 + i) * hvp + c0
                            if c0 + 64 <= hvp:
                                if six:
                                    sdpa_pv6x64(st, po, w, vsrc, vat, ldv, acc, at, hvp, nk)
                                else:
                                    sdpa_pv2x64(st, po, w, vsrc, vat, ldv, acc, at, hvp, nk)
                                c0 += 64
                            else:
                                if six:
                                    sdpa_pv6x16(st, po, w, vsrc, vat, ldv, acc, at, hvp, nk)
                                else:
                                    sdpa_pv2x16(st, po, w, vsrc, vat, ldv, acc, at, hvp, nk)
                                c0 += 16
                        i += 6 if six else 2
            for i in range(m):
                inv = np.float32(1.0) / ll[i] if ll[i] > np.float32(0.0) else np.float32(0.0)
                for c2 in range(hv):
                    out[n, h, i0 + i, c2] = acc[i * hvp + c2] * inv
"""


FUSED = """\
                # after a row's first block, unmasked blocks take their 2**x in the score blocks themselves
                # (sdpa_qk…e): st is written once, instead of written, read for the maxima, then read and written
                # again; if a score outgrew its row's reference by more than REBASE, the block is redone the plain way
                fused = {fusable} and 1 <= c < nbulk
                if fused:
                    for i in range(w):
                        base[i] = mx[r0 + i] if i < mr and mx[r0 + i] > np.float32(-np.inf) else np.float32(0.0)
                        tot[i] = np.float32(0.0)
                        top[i] = np.float32(-np.inf)
{loop}\
                    for i in range(mr):
                        if top[i] > mx[r0 + i] + np.float32({rebase}):
                            fused = False
                    if fused:
                        for i in range(mr):
                            ll[r0 + i] += tot[i]
                if not fused:
{plain}\
"""

SCORE_LOOP = """\
                # scores st[j·w + i] = k[j0 + j] · q[i0 + r0 + i], in blocks of 6 keys × 64 queries
                # (× 32 for the block's last 32 queries; the last keys one by one)
                for i in range(0, w, 64):
                    wide = i + 64 <= w
                    j = 0
                    while j < kb:
                        at, kat = j * w + i, koff + (j0 + j) * hd
                        if j + 6 <= kb:
                            if wide:
                                sdpa_qk6x64(qt, r0 + i, bqp, k, kat, hd, st, at, w, hd)
                            else:
                                sdpa_qk6x32(qt, r0 + i, bqp, k, kat, hd, st, at, w, hd)
                            j += 6
                        else:
                            if wide:
                                sdpa_qk1x64(qt, r0 + i, bqp, k, kat, hd, st, at, w, hd)
                            else:
                                sdpa_qk1x32(qt, r0 + i, bqp, k, kat, hd, st, at, w, hd)
                            j += 1
"""


def _score_loop(fused: bool) -> str:
    """The block's score loop, 4 spaces in (under an ``if``): plain, or with the 2**x (the four blocks' ``e`` forms)."""
    text = SCORE_LOOP
    if fused:
        for block in ("sdpa_qk6x64", "sdpa_qk6x32", "sdpa_qk1x64", "sdpa_qk1x32"):
            text = text.replace(block + "(", block + "e(")
        text = text.replace("st, at, w, hd)", "st, at, w, hd, base, tot, top, i)")
    return "".join("    " + line if line.strip() else line for line in text.splitlines(True))

FULL_CHUNKS = """\
            lo, bend = 0, ns  # every row sees every key: whole tiles only
            nbulk = (ns + bk - 1) // bk
            ndiag = 0
"""

CAUSAL_CHUNKS = """\
            # keys left of the tile's first row are seen by all its rows: whole tiles; the tile's
            # own diagonal block goes in blocks of bd rows, each stopping at its last row's key
            lo = {lo}
            bend = min(i0, ns)
            nbulk = (bend - lo + bk - 1) // bk if bend > lo else 0
            ndiag = (m + bd - 1) // bd
"""

CAUSAL_MASK_TILE = """\
                if j1 - 1 > i0 + r0:  # the block crosses the diagonal: hide key j > query i
                    for j in range(kb):
                        for i in range(min(max(j0 + j - i0 - r0, 0), mr)):
                            st[j * w + i] = np.float32(-np.inf)
"""

WINDOW_MASK_TILE = """\
                if j0 <= i0 + r1 - 1 - window:  # the block crosses the window's edge: hide key j <= query i - W
                    for j in range(kb):
                        for i in range(max(j0 + j + window - i0 - r0, 0), mr):
                            st[j * w + i] = np.float32(-np.inf)
"""

BIAS_TILE = """\
                bn = n if bias.shape[0] > 1 else 0
                bh = h if bias.shape[1] > 1 else 0
                for i in range(mr):  # the bias in log2 units too
                    bi = i0 + r0 + i if bias.shape[2] > 1 else 0
                    for j in range(kb):
                        st[j * w + i] += bias[bn, bh, bi, j0 + j if bias.shape[3] > 1 else 0] * np.float32({log2e})
"""


def sdpa_kernel(causal: bool, bias: bool, window: bool = False) -> Kernel:
    """The kernel of one configuration; a ``window`` kernel (causal only) takes W as an
    argument after ``scale2`` (scale·log2 e). The tiles (bq, bk, bd: TILE_Q, TILE_K, TILE_D)
    are arguments too, so one compiled kernel serves any tiling."""
    if window and not causal:
        raise AssertionError("a sliding window slides the causal mask")
    name = "k_sdpa" + ("_causal" if causal else "") + ("_window" if window else "") + ("_bias" if bias else "")
    mask = ((BIAS_TILE.format(log2e=f32_literal(LOG2E)) if bias else "") + (CAUSAL_MASK_TILE if causal else "")
            + (WINDOW_MASK_TILE if window else ""))
    if causal:
        lo = "max(i0 - window + 1, 0)  # the first key the tile's first row sees" if window else "0"
        chunks = CAUSAL_CHUNKS.format(lo=lo)
    else:
        chunks = FULL_CHUNKS
    keys = ("max(min(i0 + bq, nt, ns) - " + ("max(i0 - window + 1, 0)" if window else "0") + ", 0)") if causal else "ns"
    # a bias or a window's edge may hide scores of any block: those kernels keep the plain blocks
    scores = FUSED.format(fusable=not bias and not window, loop=_score_loop(True), plain=_score_loop(False),
                          rebase=REBASE)
    src = SDPA.format(jit=JIT, name=name, mask=mask, scores=scores, chunks=chunks, window="window, " if window else "",
                      keys=keys,
                      diag_j0="max(i0, i0 + r0 - window + 1)" if window else "i0", rebase=REBASE)
    args = (A4, A4, A4, A4, A4, F32) + ((I64,) if window else ()) + (I64, I64, I64, I64)
    return Kernel(name, src, args)


def window_arg(ctx: NodeCtx) -> int | None:
    """The node's sliding window (a kernel argument), or None for none. The IR caps it below
    2**62, so i − W never overflows int64 in the kernels."""
    window = ctx.attr("window")
    return int(window) if window is not None and ctx.attr("causal", False) else None


def render_sdpa(ctx: NodeCtx) -> None:
    sdpa_simd.use(ctx.parts)
    ctx.parts.device("empty64_device", EMPTY64_DEVICE)
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
    scale2 = float(ctx.attr("scale")) * LOG2E  # rounded once, to float32
    window_lit = "" if window is None else f"{window}, "
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.args[1]}, {ctx.args[2]}, {bias}, {out}, {f32_literal(scale2)}, "
             f"{window_lit}{TILE_Q}, {TILE_K}, {TILE_D}, {THREADS})")


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
