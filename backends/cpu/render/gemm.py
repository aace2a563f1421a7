"""Matrix products split over Numba's threads, each block one single-threaded BLAS call
followed by its epilogue (bias, activation, gating, scatter) while the block is in cache.

Blocks are rows of the result when there are enough rows, else columns (a GEMV-like
product of a few rows splits the weight instead). BLAS runs single-threaded meanwhile
(:mod:`irc.backends.cpu.threads`), so exactly one pool of threads is busy.
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, I64, Kernel, ModuleParts
from irc.backends.cpu.jit import FASTMATH, jit
from irc.backends.cpu.render import gemm_panels, gemm_stream
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.conv_blas import sgemm

JIT = jit()
# the thread count is an argument: numba cannot cache a kernel that calls get_num_threads()
THREADS = "get_num_threads()"

# Each block's BLAS call packs the whole of the operand it does not split: by rows, every thread packs all
# of the weight (n·k), by columns all of x (m·k). So by rows only when x has at least as many rows as the
# weight (and each thread gets 32 of them), or the product is too narrow to split its columns (under 64
# per thread): GPT-2's projections at T = 64 split the weight, each thread packing half of it once.
SPLIT = """\
    m, n = out.shape
    by_rows = n < 64 * parts or (m >= 32 * parts and m >= n)
"""

# the blocks of rows [r0, r1) of m, or of columns [c0, c1) of n, one per task
ROW_BLOCKS = """\
        for c in prange(parts):
            r0 = c * m // parts
            r1 = (c + 1) * m // parts
            if r1 > r0:
"""
COL_BLOCKS = """\
        for c in prange(parts):
            c0 = c * n // parts
            c1 = (c + 1) * n // parts
            if c1 > c0:
"""
BLOCKS = {"split": SPLIT, "rows": ROW_BLOCKS, "cols": COL_BLOCKS}  # for the templates below

# At or below this many rows of x a product is GEMV-like: bound by reading the weight once, which BLAS
# does badly (it packs the weight, a second pass over it, for 8 rows of use). GPT-2's head at B = 8, T = 1
# reads its 154 MB in 8.0 ms this way and in 14.8 ms through BLAS (2 threads, this machine).
SMALL_M = 16

def _nt_rows(rows: int, pad: str) -> str:
    """dot_nt_into's pass over ``rows`` rows of x (from row i) against the 4 weight rows w0r..w3r: 4·rows sums in
    registers, each weight value loaded once for all the rows."""
    at = ["i"] + [f"i + {r}" for r in range(1, rows)]
    to = ["jj"] + [f"jj + {c}" for c in range(1, 4)]
    xs = [f"x{r}" for r in range(rows)]
    lines = [f"{pad}x{r}r = x[U({at[r]})]" for r in range(rows)]
    lines += [f"{pad}a{c}{r} = np.float32(0.0)" for c in range(4) for r in range(rows)]
    lines += [f"{pad}for q in range(k):", f"{pad}    uq = U(q)"]
    lines += [f"{pad}    {x} = {x}r[uq]" for x in xs]
    for c in range(4):
        lines.append(f"{pad}    v = w{c}r[uq]")
        lines += [f"{pad}    a{c}{r} += {x} * v" for r, x in enumerate(xs)]
    lines += [f"{pad}t[{at[r]}, {to[c]}] = a{c}{r}" for c in range(4) for r in range(rows)]
    return "\n".join(lines) + "\n"


def _nt_rest() -> str:
    """The one pass over the 3, 2 or 1 rows of x left after the passes of 4."""
    return "".join(f"        {'if' if rows == 3 else 'elif'} m - i == {rows}:\n" + _nt_rows(rows, " " * 12)
                   for rows in (3, 2, 1))


# t = x @ w[c0:c1].T: BLAS, or for a few rows of x each weight row read once and used for every row of x:
# 4 weight rows at a time, by passes of 4 rows of x (their 16 sums in registers; the second pass of B = 8 finds
# the weight rows in L1), then one pass of the rest. Row views and unsigned indices: numba then adds no
# wraparound check per load and the loop over k vectorises. Against 2 rows of x a pass, which read each weight
# row 4 times: 1.15-1.35x on GPT-2's projections at B = 8, T = 1 from L3, equal from memory, 1.2x for the LSTM's
# step at B = 8. (Passes of 8 rows by 2 weight rows, one read for all 8, were 0.8x from memory: their 16 sums
# and operands spill AVX2's 16 registers.)
DOT_NT_INTO = f"""\
@njit(cache=True, fastmath={FASTMATH}, error_model="numpy")
def dot_nt_into(x, w, c0, c1, t):
    m, k = x.shape
    if m > {SMALL_M}:
        np.dot(x, w[c0:c1].T, t)
        return
    U = np.uint64
    j = c0
    while j + 4 <= c1:
        w0r = w[U(j)]
        w1r = w[U(j + 1)]
        w2r = w[U(j + 2)]
        w3r = w[U(j + 3)]
        jj = j - c0
        i = 0
        while i + 4 <= m:
{_nt_rows(4, " " * 12)}\
            i += 4
{_nt_rest()}\
        j += 4
    while j < c1:
        for i in range(m):
            s = np.float32(0.0)
            for q in range(k):
                s += x[i, q] * w[j, q]
            t[i, j - c0] = s
        j += 1
"""

DOT_NT = """\
@njit(cache=True, error_model="numpy")
def dot_nt(x, w, c0, c1):
    # x @ w[c0:c1].T in a new array (dot_nt_into)
    t = np.empty((x.shape[0], c1 - c0), np.float32)
    dot_nt_into(x, w, c0, c1, t)
    return t
"""


def use_dot_nt(parts: ModuleParts) -> str:
    """Add dot_nt_into and dot_nt to the module (kernels may call either); the name of the first."""
    parts.device("dot_nt_into", DOT_NT_INTO)
    parts.device("dot_nt", DOT_NT)
    return "dot_nt_into"

# out = act(x @ w.T + b). Each block of out first holds the bias, then BLAS adds the product into it (beta = 1:
# BLAS skips the pass that zeroes its result, which the bias fill replaces) in place, by leading dimensions:
# a block of columns needs no temporary (the LM heads' 51-412 MB of logits were written twice, into fresh
# pages), and without an activation there is no epilogue pass at all. Products of a few rows keep dot_nt.
GEMM = """\
{jit}
def {name}(x, w, b, out, parts):
{split}\
    k = x.shape[1]
    U = np.uint64
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    of = out.reshape(-1)
    # numba resolves its BLAS pointer on first use, taking the GIL: do it here, on the thread that holds it
    blas_sgemm(0, 0, 1, 1, 0, wf, 0, 1, wf, 0, 1, np.float32(1.0), of, 0, 1)
    if by_rows:
{rows}\
                bias_block(b, out, r0, r1, 0, n)
                blas_sgemm(0, 1, r1 - r0, n, k, xf, r0 * k, k, wf, 0, k, np.float32(1.0), of, r0 * n, n)
{act_rows}\
    else:
{cols}\
                if m <= {small_m}:
                    t = dot_nt(x, w, c0, c1)
                    for i in range(m):
                        for j in range(c1 - c0):
                            v = t[i, j] + b[c0 + j]
                            out[i, c0 + j] = {expr}
                else:
                    bias_block(b, out, 0, m, c0, c1)
                    blas_sgemm(0, 1, m, c1 - c0, k, xf, 0, k, wf, c0 * k, k, np.float32(1.0), of, c0, n)
{act_cols}\
"""

BIAS_BLOCK = """\
@njit(cache=True, error_model="numpy")
def bias_block(b, out, r0, r1, c0, c1):
    # out[r0:r1, c0:c1] = b[c0:c1] on every row (unsigned indices: no wraparound check, the copy vectorises)
    U = np.uint64
    for i in range(r0, r1):
        row = out[U(i)]
        for j in range(c0, c1):
            row[U(j)] = b[U(j)]
"""

# the activation in place over a block written by BLAS (absent for "none"); unsigned indices: with signed ones
# from r0 or c0 numba's wraparound checks keep the loop (GELU's tanh) from vectorising, 1.8x slower
ACT_BLOCK = """\
{pad}for i in range({r0}, {r1}):
{pad}    row = out[U(i)]
{pad}    for j in range({c0}, {c1}):
{pad}        v = row[U(j)]
{pad}        row[U(j)] = {expr}
"""


GEMM_GLU = """\
{jit}
def {name}(x, w, out, parts):
    # out = act(x @ w[:h].T) * (x @ w[h:].T): gate and up rows stacked in one weight
{split}\
    if by_rows:
{rows}\
                t = np.dot(x[r0:r1], w.T)
                for i in range(r1 - r0):
                    for j in range(n):
                        v = t[i, j]
                        out[r0 + i, j] = ({expr}) * t[i, n + j]
    else:
{cols}\
                g = dot_nt(x, w, c0, c1)
                u = dot_nt(x, w, n + c0, n + c1)
                for i in range(m):
                    for j in range(c1 - c0):
                        v = g[i, j]
                        out[i, c0 + j] = ({expr}) * u[i, j]
"""


def _with_dot(ctx: NodeCtx, kernel: Kernel) -> str:
    """Add a product kernel, and the dot_nt its column blocks call, to the module; its name."""
    use_dot_nt(ctx.parts)
    return ctx.kernel(kernel)


def gemm_kernel(ctx: NodeCtx, act_name: str) -> str:
    name = f"k_gemm_{act_name}"
    expr = act(ctx.parts, act_name)
    sgemm(ctx)
    ctx.parts.device("bias_block", BIAS_BLOCK)
    blocks = {"act_rows": "", "act_cols": ""} if act_name == "none" else {
        "act_rows": ACT_BLOCK.format(pad=" " * 16, r0="r0", r1="r1", c0="0", c1="n", expr=expr),
        "act_cols": ACT_BLOCK.format(pad=" " * 20, r0="0", r1="m", c0="c0", c1="c1", expr=expr)}
    src = GEMM.format(jit=JIT, name=name, expr=expr, small_m=SMALL_M, **BLOCKS, **blocks)
    return _with_dot(ctx, Kernel(name, src, (A2, A2, A1, A2, I64)))


def glu_kernel(ctx: NodeCtx, act_name: str) -> str:
    name = f"k_gemm_glu_{act_name}"
    expr = act(ctx.parts, act_name)
    return _with_dot(ctx, Kernel(name, GEMM_GLU.format(jit=JIT, name=name, expr=expr, **BLOCKS), (A2, A2, A2, I64)))


def multi_kernel(count: int) -> Kernel:
    """x @ w.T for the stacked weights of ``count`` results, scattered into each result."""
    outs = [f"o{i}" for i in range(count)]
    widths = "\n".join(f"    n{i} = o{i}.shape[1]" for i in range(count))
    starts = ["0"]
    for i in range(1, count):
        starts.append(f"{starts[-1]} + n{i - 1}" if starts[-1] != "0" else f"n{i - 1}")
    scatter_rows = "\n".join(
        f"                    for j in range(n{i}):\n"
        f"                        o{i}[r0 + r, j] = t[r, {starts[i]} + j]" for i in range(count))
    scatter_cols = "\n".join(
        f"                        {'if' if i == 0 else 'elif'} col < {starts[i]} + n{i}:\n"
        f"                            o{i}[r, col - ({starts[i]})] = t[r, j]" for i in range(count))
    name = f"k_gemm_multi{count}"
    src = f"""\
{JIT}
def {name}(x, w, {', '.join(outs)}, parts):
    # [o0 | o1 | ...] = x @ w.T with w the stacked weights: one BLAS call per block
    m = x.shape[0]
    n = w.shape[0]
{widths}
    if n < 64 * parts or (m >= 32 * parts and m >= n):  # as SPLIT
{ROW_BLOCKS}\
                t = np.dot(x[r0:r1], w.T)
                for r in range(r1 - r0):
{scatter_rows}
    else:
{COL_BLOCKS}\
                t = dot_nt(x, w, c0, c1)
                for r in range(m):
                    for j in range(c1 - c0):
                        col = c0 + j
{scatter_cols}
"""
    return Kernel(name, src, (A2, A2) + (A2,) * count + (I64,))


def gemm_call(ctx: NodeCtx, x: str, in_shape: tuple[int, ...], w: str, b: str, act_name: str = "none",
              out: str | None = None, out_shape: tuple[int, ...] | None = None, w_key: str | None = None) -> str:
    """Call the gemm kernel on [rows, features] views; allocates the node's result unless ``out``. A weight
    known at load (``w_key``) runs on its packed panels (:mod:`.gemm_panels`) at the sizes where they win."""
    rows = prod(in_shape[:-1])
    if not ctx.pack_weights:
        w_key = None
    if w_key is not None and gemm_panels.applies(rows, SMALL_M):
        k = gemm_panels.panels_kernel(ctx, act_name)
        w = gemm_panels.panels_weight(ctx, w_key)
    elif w_key is not None and gemm_stream.applies(rows, SMALL_M):
        k = gemm_stream.stream_kernel(ctx, rows, act_name)
        w = gemm_stream.stream_weight(ctx, w_key, rows)
    else:
        k = gemm_kernel(ctx, act_name)
    if out is None:
        out, out_shape = ctx.alloc(), ctx.out_shape()
    ctx.emit(f"{k}({ctx.rows(x, in_shape)}, {w}, {b}, {ctx.rows(out, out_shape)}, {THREADS})")
    return out


def _bias_or_zeros(ctx: NodeCtx, index: int, n: int) -> str:
    return ctx.args[index] if len(ctx.args) > index else f"np.zeros({int(n)}, np.float32)"


def render_param(ctx: NodeCtx) -> None:
    """A weight as a value: the caller's array itself (never written: the schedule keeps it)."""
    key = f"{ctx.node.weights}.{ctx.attr('name')}"
    ctx.emit(f"{ctx.outs[0]} = {ctx.weight(ctx.attr('name'), key=key)}")


def render_gemm(ctx: NodeCtx) -> None:
    n = ctx.out_shape()[-1]
    gemm_call(ctx, ctx.args[0], ctx.in_shape(0), ctx.args[1], _bias_or_zeros(ctx, 2, n), ctx.attr("act", "none"),
              w_key=ctx.param_key(1))


def _stacked(ctx: NodeCtx, first: int, tag: str) -> str:
    """The weights of operands ``first..`` stacked along rows: derived once per weights dict when
    they are parameters, else concatenated in the driver on every run."""
    keys = [ctx.param_key(i) for i in range(first, len(ctx.args))]
    if all(k is not None for k in keys):
        expr = "np.concatenate([" + ", ".join(ctx.weight("", key=k) for k in keys) + "])"
        return ctx.derive(f"~{tag}(" + ",".join(keys) + ")", expr)
    return "np.concatenate([" + ", ".join(ctx.args[first:]) + "])"


def render_gemm_glu(ctx: NodeCtx) -> None:
    k = glu_kernel(ctx, ctx.attr("act", "silu"))
    w = _stacked(ctx, 1, "stack")
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], ctx.in_shape(0))}, {w}, {ctx.rows(out, ctx.out_shape())}, {THREADS})")


def render_gemm_multi(ctx: NodeCtx) -> None:
    count = len(ctx.outs)
    k = _with_dot(ctx, multi_kernel(count))
    w = _stacked(ctx, 1, "stack")
    outs = [ctx.rows(ctx.alloc(i), ctx.out_shape(i)) for i in range(count)]
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], ctx.in_shape(0))}, {w}, {', '.join(outs)}, {THREADS})")


RENDERERS = {
    "param": render_param,
    "gemm": render_gemm,
    "gemm_glu": render_gemm_glu,
    "gemm_multi": render_gemm_multi,
}
