"""Dense layers, ``act(x @ w.T + b)``, of a few dozen rows, on a weight packed once as 64-column panels.

irc's BLAS kernel (:mod:`.gemm`) runs one single-threaded OpenBLAS call per thread, and OpenBLAS packs
the weight again on every call: at 20-64 rows of x that packing is a pass over the weight for little
use of it. This kernel runs the register blocks of :mod:`.gemm_packed` (6 rows x 64 columns of
accumulators) the other way round from the convolutions: the 6 rows are rows of x, packed per call into
strips [K, 6] (``gemm_rows6``, a copy of x), and the 64 columns come from a panel of the weight's
transpose, [K, 64], laid out once per weights dict (``gemm_panels``, a derived weight), so every step
of K reads 256 contiguous bytes. K goes in blocks of ``KC`` steps, a block's slice of a panel (64 KB)
staying in L2, close by, while the strips pass over it, within blocks of K whose slice of all
the strips stays in L2. While a slice of the panels is in use the next one is prefetched into L2, a
share after each block: without it the first strip pulled each slice from memory in one burst
(1.05-1.10x on GPT-2's shapes with the weights cold).

Measured against the BLAS kernel, both called in turn on 2 threads, weights cold (16 copies in turn),
median GFLOP/s: 20x768x768 131 against 96 (1.36x; 1.70x with the weight hot), 64x2304x768 177/174
(1.09x hot); at GPT-2's 256 rows 0.97-1.09x, and 0.86-0.88x at 1024 rows. In GPT-2 at T = 256 the
model's GEMMs ran at 253 GFLOP/s either way. With the weights cold from memory, as in a model too big for
the caches (100 copies in turn), 256 rows still gain where the weight is small: 256x768x768 1.13x (238
against 211 GFLOP/s; GPT-2's Q, K, V and output projections), 256x512x512 1.13x, 256x1024x1024 1.03x,
while 256x3072x768 (0.96x), 256x768x3072 (0.94x) and 512 rows (1.00x) did not, on that machine (48 KB of L1
and 2 MiB of L2 a core). On an AMD EPYC (32 KB, 1 MiB, 32 MiB of L3 shared), hot, the large weights gain
too: 256x3072x768 198-208 against BLAS's 187, 256x768x3072 196 against 163-172, GPT-2's head 256x50257x768
204 against 190, the LSTM LM's 256x10000x650 203 against 185 GFLOP/s (ONNX Runtime's MLAS: 209-222), and
GPT-2 small at T = 256 runs in 332-341 ms against 355-379. At 2,048 rows BLAS stays ahead (0.82-0.95x).
So every product of more than SMALL_M rows (fewer are GEMV-like, gemm_stream's) and at most ``ROWS_MAX``
runs here, whatever its weight's size; the panels are an extra copy of the weight (the memory guard's
``BACKEND_WEIGHT_COPIES``).

When K is one block (up to ~1,000 steps at 256 rows), a panel's sums build up in a per-thread scratch
block, [rows, 64] in L1, and the epilogue writes out's rows once: the register blocks no longer load and
store their accumulators in out's rows, n floats apart, at every slice of K. Against adding into out,
weights cold: 64x3072x768 1.43-1.47x (167 -> 246 GFLOP/s), 17-20x768x768 1.35-1.44x, 64x768x768 1.33x,
128x3072x768 1.22x, 256x768x768 1.08x (271 -> 292), GPT-2's 64-row head 64x50257x768 0.98x (equal).

Threads split the panels (each packs all of x), or the rows when there are fewer panels than threads.
The last strip's rows past m and the last panel's columns past n go through a 6x64 scratch block. Every
output is one chain of fused multiply-adds in K order, in place or through the scratch, so results do
not depend on the thread count.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, I64, Kernel
from irc.backends.cpu.aligned import EMPTY64_DEVICE
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import gemm_packed
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.mathfns import DEVICE_JIT

# steps of K a block: its slice of a panel, 256 x 64 floats (64 KB), comes from L2. 128 steps (32 KB, L1's size
# on the EPYC) ran at 0.97-0.99x on GPT-2's 256-row shapes there, 384 or all of K alike
KC = 256
L2_ROWS = 1 << 20  # bytes of x's packed strips kept in L2 while the panels stream past (256 or 512 KB: 0.93-0.99x)
ROWS_MAX = 256  # above this many rows of x BLAS is as fast or faster, and it keeps them

PANELS = '''\
def gemm_panels(w, width):
    """``w`` [n, k] as the panels of w.T: [ceil(n / width), k, width], flat, the last panel's missing columns
    zeros."""
    n, k = w.shape
    panels = (n + width - 1) // width
    p = np.zeros((panels * width, k), np.float32)
    p[:n] = w
    return np.ascontiguousarray(p.reshape(panels, width, k).transpose(0, 2, 1)).reshape(-1)
'''

ROWS6 = f'''\
{DEVICE_JIT}
def gemm_rows6(x, s0, s1, ap, a0):
    """Rows [6·s0, 6·s1) of x into ap as strips [k, 6] (row r of strip s at ap[(s − a0)·6k + q·6 + r]); rows
    past the last one are zeros."""
    m, k = x.shape
    U = np.uint64
    for s in range(s0, s1):
        base = (s - a0) * k * 6
        for r in range(6):
            i = s * 6 + r
            if i < m:
                row = x[U(i)]
                for q in range(k):
                    ap[U(base + q * 6 + r)] = row[U(q)]
            else:
                for q in range(k):
                    ap[U(base + q * 6 + r)] = np.float32(0.0)
'''

PREFETCH_L2 = '''\
def _prefetch_l2(typingctx, a, offset, count):
    \"\"\"Prefetch a[offset : offset + count] (count >= 1) into L2, one request per 64-byte line (a hint:
    it never faults).\"\"\"
    def codegen(context, builder, sig, args):
        i64 = llvm_ir.IntType(64)
        base = vec_ptr(context, builder, sig.args[0], args[0])
        lines = builder.sdiv(builder.add(args[2], llvm_ir.Constant(i64, 15)), llvm_ir.Constant(i64, 16))

        def line(t, values):
            vec_prefetch(builder, base, builder.add(args[1], builder.mul(t, llvm_ir.Constant(i64, 16))), 2)
            return values
        vec_loop(builder, lines, [], line)
        return context.get_dummy_value()
    return numba_types.void(a, numba_types.intp, numba_types.intp), codegen


prefetch_l2 = intrinsic(_prefetch_l2)
'''

KERNEL = """\
{jit}
def {name}(x, wp, b, out, parts):
    # out = act(x @ w.T + b), wp = gemm_panels(w, 64)
    m, k = x.shape
    n = out.shape[1]
    of = out.reshape(-1)
    U = np.uint64
    panels = (n + 63) // 64
    strips = (m + 5) // 6
    full = m // 6  # strips of 6 real rows
    wide = n // 64  # panels of 64 real columns
    ap = np.empty(strips * 6 * k, np.float32)
    for p in prange(parts):
        gemm_rows6(x, p * strips // parts, (p + 1) * strips // parts, ap, 0)
    # blocks of K whose slice of all the strips fits L2 (at most 256 rows: 1024 steps or more), in whole
    # blocks of {kc}
    kb = min(k, max({kc}, {l2_rows} // (24 * max(1, full)) // {kc} * {kc}))
    by_rows = panels < parts
    for p in prange(parts):
        t0 = p * full // parts if by_rows else 0
        t1 = (p + 1) * full // parts if by_rows else full
        q0 = 0 if by_rows else p * wide // parts
        q1 = wide if by_rows else (p + 1) * wide // parts
        # one block of K (up to 1,024 steps at 256 rows): a panel's sums build up in a scratch block (L1) and
        # only the epilogue writes out, once; adding into out's rows, n floats apart, ran at 0.68-0.93x
        one = kb >= k
        cb = empty64_device((t1 - t0) * 6 * 64 if one and t1 > t0 else 0)  # on cache lines, as wp
        if t1 > t0 and q1 > q0:
            for k0 in range(0, k, kb):
                k2 = min(k, k0 + kb)
                for q in range(q0, q1):
                    # the next step's slice of the panels goes to L2 a share after each block, so that it is not
                    # pulled from memory in one burst by the first strip
                    nq = q + 1 if q + 1 < q1 else q0
                    nk = k0 if q + 1 < q1 else (k2 if k2 < k else 0)
                    ahead = 0 if q + 1 == q1 and k2 >= k else (min(k, nk + kb) - nk) * 64
                    blocks = (k2 - k0 + {kc} - 1) // {kc} * (t1 - t0)
                    share = (ahead + blocks - 1) // blocks
                    at = (nq * k + nk) * 64
                    done = 0
                    for k1 in range(k0, k2, {kc}):
                        for s in range(t0, t1):
                            dst = cb if one else of
                            at_dst = (s - t0) * 6 * 64 if one else s * 6 * n + q * 64
                            gemm_strips(ap, k1 * 6, k, s, s + 1, min({kc}, k - k1), wp, (q * k + k1) * 64, 64, 64,
                                        dst, at_dst, 64 if one else n, k1 > 0)
                            if done < ahead:
                                prefetch_l2(wp, at + done, min(share, ahead - done))
                                done += share
                    if one:
                        for i in range(t0 * 6, t1 * 6):
                            row = out[U(i)]
                            g = (i - t0 * 6) * 64
                            for j in range(64):
                                v = cb[U(g + j)] + b[U(q * 64 + j)]
                                row[U(q * 64 + j)] = {expr}
                    elif k2 >= k:
                        for i in range(t0 * 6, t1 * 6):
                            row = out[U(i)]
                            for j in range(q * 64, q * 64 + 64):
                                v = row[U(j)] + b[U(j)]
                                row[U(j)] = {expr}
    # the partial last strip (every panel) and the partial last panel (every strip), through a scratch block
    edges = (strips - full) * panels + (panels - wide) * full
    for p in prange(parts):
        tmp = empty64_device(6 * 64)
        for e in range(p * edges // parts, (p + 1) * edges // parts):
            s = full if e < (strips - full) * panels else e - (strips - full) * panels
            q = e if e < (strips - full) * panels else wide
            c0 = q * 64
            gemm_strips(ap, 0, k, s, s + 1, k, wp, q * k * 64, 64, 64, tmp, 0, 64, False)
            for r in range(min(6, m - s * 6)):
                row = out[U(s * 6 + r)]
                for j in range(min(64, n - c0)):
                    v = tmp[U(r * 64 + j)] + b[U(c0 + j)]
                    row[U(c0 + j)] = {expr}
"""


def applies(rows: int, small_m: int) -> bool:
    """Whether a product of ``rows`` rows of x runs here (GEMV-like ones stream, those of many rows keep BLAS)."""
    return small_m < rows <= ROWS_MAX


def panels_kernel(ctx: NodeCtx, act_name: str) -> str:
    """Register the panel product with ``act_name`` as its epilogue (and what it calls); its name."""
    name = f"k_gemm_panels_{act_name}"
    expr = act(ctx.parts, act_name)
    gemm_packed.use(ctx.parts)
    ctx.parts.device("gemm_rows6", ROWS6)
    ctx.parts.device("prefetch_l2", PREFETCH_L2)
    ctx.parts.device("empty64_device", EMPTY64_DEVICE)
    src = KERNEL.format(jit=jit(), name=name, expr=expr, kc=KC, l2_rows=L2_ROWS)
    return ctx.kernel(Kernel(name, src, (A2, A1, A1, A2, I64)))


def panels_weight(ctx: NodeCtx, key: str, width: int = 64) -> str:
    """The weight ``key`` packed by gemm_panels in panels ``width`` columns wide, derived once per weights dict."""
    ctx.parts.helper("gemm_panels", PANELS)
    return ctx.derive(f"~gemm_panels{width}({key})", f"gemm_panels({ctx.weight('', key=key)}, {width})")
