"""GEMV-like dense layers, ``act(x @ w.T + b)`` for at most SMALL_M rows of x, streaming a weight packed once.

At a few rows (decode-shaped batches: GPT-2 at B = 8, T = 1; its head at 8 × 50,257 × 768) a product reads
the whole weight for a few multiply-adds per value, so it runs at the rate memory delivers the weight.
``dot_nt`` (:mod:`.gemm`) reads 4 rows of the [n, k] weight at a time as 4 streams and ends every output with
a horizontal sum; it got 16-18 GB/s of the 26 GB/s that OpenBLAS's 2-thread sgemv reaches here.

Here the weight's transpose is laid out once as panels [k, W] (``gemm_panels``, a derived weight), W columns
wide so that all the rows of x and all W columns fit the registers at once: W = 64 up to 6 rows, 48 up to 8,
32 up to 12, 16 up to 16 (rows x W / 16 accumulators <= 24 of AVX-512's 32 registers). One register block per
panel then runs down the whole of K: each step loads W / 16 vectors of the panel, broadcasts one value of each
row of x (x is transposed once per call, a few KB) and multiplies-adds, while it prefetches the panel
``AHEAD_BYTES`` on. So each thread reads its share of the weight as one sequential stream, once, and
every output is one chain of fused multiply-adds in K order: results do not depend on the thread count.

Threads take contiguous runs of panels; a partial last panel goes through a scratch block.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, I64, Kernel
from irc.backends.cpu.aligned import EMPTY64_DEVICE
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import gemm_panels
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx

AHEAD_BYTES = 4096  # how far ahead of its block the panel is prefetched (4-16 KB measured alike)


# One row: panels 128 columns wide (8 accumulators, one broadcast per 8 vectors) and no prefetch ahead.
# Against dot_nt (1 x 1000 x 512 hot: 30 against 33 us; 40 products 768 <-> 3072 in turn, 377 MB from memory:
# 11.3 against 13.3 ms, 33.5 GB/s of the 39.7 a 1 GiB gemv reaches) and the 64-wide panels with the
# prefetch (32 and 12.0): the hardware's own prefetcher follows a single stream, and the explicit one only
# adds instructions.
ONE_ROW_WIDTH = 128


def width(rows: int) -> int:
    """The panel width for ``rows`` rows of x: ONE_ROW_WIDTH for one, else as many 16-float vectors (at most
    4) as keep rows x vectors accumulators within 24 registers."""
    if rows == 1:
        return ONE_ROW_WIDTH
    return 16 * max(1, min(4, 24 // max(1, rows)))


KERNEL = """\
{jit}
def {name}(x, wp, b, out, parts):
    # out = act(x @ w.T + b) for the {m} rows of x, wp = gemm_panels(w, {w})
    m, k = x.shape
    n = out.shape[1]
    U = np.uint64
    panels = (n + {w} - 1) // {w}
    xt = np.empty(k * {m}, np.float32)  # x transposed: step q of K holds every row's value, one broadcast each
    for i in range({m}):
        row = x[U(i)]
        for q in range(k):
            xt[U(q * {m} + i)] = row[U(q)]
    of = out.reshape(-1)
    for p in prange(parts):
        tmp = empty64_device({m} * {w})
        for q in range(p * panels // parts, (p + 1) * panels // parts):
            c0 = q * {w}
            cols = min({w}, n - c0)
            if cols == {w}:
                {block}(xt, 0, {m}, wp, q * k * {w}, {w}, of, c0, n, k)
                for i in range({m}):
                    row = out[U(i)]
                    for j in range(c0, c0 + {w}):
                        v = row[U(j)] + b[U(j)]
                        row[U(j)] = {expr}
            else:
                {block}(xt, 0, {m}, wp, q * k * {w}, {w}, tmp, 0, {w}, k)
                for i in range({m}):
                    row = out[U(i)]
                    for j in range(cols):
                        v = tmp[U(i * {w} + j)] + b[U(c0 + j)]
                        row[U(c0 + j)] = {expr}
"""


def stream_kernel(ctx: NodeCtx, rows: int, act_name: str) -> str:
    """Register the streaming product of ``rows`` rows with ``act_name`` as its epilogue; its name."""
    from irc.backends.cpu.render import sdpa_simd

    w = width(rows)
    ahead = 0 if rows == 1 else AHEAD_BYTES // (4 * w)
    block = sdpa_simd.use_pv(ctx.parts, f"gemm_sv{rows}x{w}", rows, w, fresh=True, stream=ahead)
    ctx.parts.device("empty64_device", EMPTY64_DEVICE)
    name = f"k_gemm_stream{rows}_{act_name}"
    src = KERNEL.format(jit=jit(), name=name, expr=act(ctx.parts, act_name), m=rows, w=w, block=block)
    return ctx.kernel(Kernel(name, src, (A2, A1, A1, A2, I64)))


def stream_weight(ctx: NodeCtx, key: str, rows: int) -> str:
    """The weight ``key`` in the panels the streaming product of ``rows`` rows reads, derived once."""
    return gemm_panels.panels_weight(ctx, key, width(rows))


def applies(rows: int, small_m: int) -> bool:
    """Whether a product of ``rows`` rows of x streams here: 1 to ``small_m`` (a weight known at load; one
    computed at run time keeps dot_nt)."""
    return 1 <= rows <= small_m
