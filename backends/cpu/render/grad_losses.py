"""The losses (irc/ops/losses.py) and their gradients: cross entropy over the last axis with an ignored class
id, fused with its softmax gradient, and the mean squared error.

``cross_entropy_grad`` is one sweep per row: the row maximum, exp and its sum, then
``(softmax − onehot)·dloss/N`` written in place of nothing else (no probability matrix is kept). The loss
sums rows in float64, per thread, then adds the threads' sums. A class id outside ``[0, classes)`` that is
not the ignore index is refused before any row is read, as the reference (and PyTorch) refuse it.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, F32, I1, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.literals import int_literal, str_literal

JIT = jit(fastmath=True)

CHECK_TARGETS = """\
    n, c = x.shape
    for i in range(n):  # every class id is checked before any row is read
        if t[i] != ignore and (t[i] < 0 or t[i] >= c):
            return i
"""

CROSS_ENTROPY = """\
{jit}
def k_cross_entropy(x, t, out, ignore, parts):
    # mean over kept rows of logsumexp(row) - row[target]; float64 sums per thread
{check}\
    sums = np.zeros(parts, np.float64)
    kept = np.zeros(parts, np.int64)
    for p in prange(parts):
        for r in range(p * n // parts, (p + 1) * n // parts):
            if t[r] == ignore:
                continue
            m = np.float32(-np.inf)
            for j in range(c):
                m = x[r, j] if x[r, j] > m else m
            s = np.float32(0.0)
            for j in range(c):
                s += fexp(x[r, j] - m)
            sums[p] += np.float64(m) + np.log(np.float64(s)) - np.float64(x[r, t[r]])
            kept[p] += 1
    out[0] = np.float32(sums.sum() / np.float64(kept.sum()))  # 0/0 = NaN when every row is ignored, as torch
    return -1
"""

CROSS_ENTROPY_GRAD = """\
{jit}
def k_cross_entropy_grad(x, t, dloss, out, ignore):
    # (softmax(row) - onehot(target))·dloss/N on kept rows (N of them), 0 on ignored rows: one sweep per row
{check}\
    count = 0
    for r in range(n):
        if t[r] != ignore:
            count += 1
    scale = dloss / np.float32(count)
    for r in prange(n):
        if t[r] == ignore:
            for j in range(c):
                out[r, j] = np.float32(0.0)
            continue
        m = np.float32(-np.inf)
        for j in range(c):
            m = x[r, j] if x[r, j] > m else m
        s = np.float32(0.0)
        for j in range(c):
            e = fexp(x[r, j] - m)
            out[r, j] = e
            s += e
        f = scale / s
        for j in range(c):
            out[r, j] *= f
        out[r, t[r]] -= scale
    return -1
"""

BAD_TARGET = '''\
def bad_target(where, targets, position, classes, ignore):
    """The message for a class id outside [0, classes) that is not the ignore index."""
    target = int(targets.reshape(-1)[position])
    return f"{where}: target class {target} is outside [0, {classes}) and is not the ignore_index {ignore}"
'''


def _check(ctx: NodeCtx, classes: int) -> None:
    helper = ctx.helper("bad_target", BAD_TARGET)
    where = str_literal(f"{ctx.node.op} '{ctx.node.outputs[0]}'")
    ctx.emit("if bad >= 0:")
    ctx.emit(f"    raise InputError({helper}({where}, {ctx.args[1]}, bad, {classes}, "
             f"{int_literal(int(ctx.attr('ignore_index', -100)))}))")


def _rows(ctx: NodeCtx) -> tuple[str, str, int]:
    shape = ctx.in_shape(0)
    return ctx.rows(ctx.args[0], shape), f"{ctx.args[1]}.reshape(-1).astype(np.int64)", shape[-1]


def render_cross_entropy(ctx: NodeCtx) -> None:
    ctx.device("fexp")
    k = ctx.kernel(Kernel("k_cross_entropy", CROSS_ENTROPY.format(jit=JIT, check=CHECK_TARGETS),
                          (A2, I1, A1, I64, I64), returns=I64))
    x, t, classes = _rows(ctx)
    out = ctx.alloc()
    ignore = int_literal(int(ctx.attr("ignore_index", -100)))
    ctx.emit(f"bad = {k}({x}, {t}, {out}.reshape(1), {ignore}, {THREADS})")
    _check(ctx, classes)


def render_cross_entropy_grad(ctx: NodeCtx) -> None:
    ctx.device("fexp")
    k = ctx.kernel(Kernel("k_cross_entropy_grad", CROSS_ENTROPY_GRAD.format(jit=JIT, check=CHECK_TARGETS),
                          (A2, I1, F32, A2, I64), returns=I64))
    x, t, classes = _rows(ctx)
    out = ctx.alloc()
    dloss = f"np.float32({ctx.args[2]}.reshape(-1)[0])" if len(ctx.args) > 2 else "np.float32(1.0)"
    ignore = int_literal(int(ctx.attr("ignore_index", -100)))
    ctx.emit(f"bad = {k}({x}, {t}, {dloss}, {ctx.rows(out, ctx.out_shape())}, {ignore})")
    _check(ctx, classes)


MSE = """\
{jit}
def k_mse(p, t, out, parts):
    n = p.size
    sums = np.zeros(parts, np.float64)
    for c in prange(parts):
        s = 0.0
        for i in range(c * n // parts, (c + 1) * n // parts):
            d = np.float64(p[i]) - np.float64(t[i])
            s += d * d
        sums[c] = s
    out[0] = np.float32(sums.sum() / n)
"""

MSE_GRAD = """\
{jit}
def k_mse_grad(p, t, scale, out):
    for i in prange(p.size):
        out[i] = (p[i] - t[i]) * scale
"""


def render_mse(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_mse", MSE.format(jit=JIT), (A1, A1, A1, I64)))
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.flat(ctx.args[0])}, {ctx.flat(ctx.args[1])}, {out}.reshape(1), {THREADS})")


def render_mse_grad(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_mse_grad", MSE_GRAD.format(jit=jit()), (A1, A1, F32, A1)))
    n = 1
    for d in ctx.in_shape(0):
        n *= d
    dloss = f"float({ctx.args[2]}.reshape(-1)[0])" if len(ctx.args) > 2 else "1.0"
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.flat(ctx.args[0])}, {ctx.flat(ctx.args[1])}, np.float32({dloss} * 2 / {n}), "
             f"{ctx.flat(out)})")


RENDERERS = {
    "cross_entropy": render_cross_entropy,
    "cross_entropy_grad": render_cross_entropy_grad,
    "mse": render_mse,
    "mse_grad": render_mse_grad,
}
