"""LayerNorm and RMSNorm over rows, residual add + norm in one pass, BatchNorm (inference).

One sweep over a row gathers the sum and the sum of squares (of the row shifted by its first
element, so a large mean does not cancel the variance away, and a constant row gives exactly
zero variance); a second loop over the same row, still in L1, writes the result. Rows run
in parallel and reductions vectorise (``fastmath`` reassociation only).
"""

from __future__ import annotations

from math import prod

from irc.backends.cpu.module import A1, A2, A3, F32, Kernel, jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.literals import f32_literal

JIT = jit(fastmath=True)

# a row's mean and 1/sqrt(var + eps) from the sums s, q of the row shifted by k0
SHIFTED_STATS = """\
        ms = s / np.float32(d)
        var = max(q / np.float32(d) - ms * ms, np.float32(0.0))
        mean = k0 + ms
        inv = np.float32(1.0) / np.sqrt(var + eps)
"""

LAYERNORM = """\
{jit}
def k_layernorm(x, g, b, out, eps):
    n, d = x.shape
    for r in prange(n):
        k0 = x[r, 0]
        s = np.float32(0.0)
        q = np.float32(0.0)
        for j in range(d):
            t = x[r, j] - k0
            s += t
            q += t * t
{stats}\
        for j in range(d):
            out[r, j] = (x[r, j] - mean) * inv * g[j] + b[j]
"""

RMSNORM = """\
{jit}
def k_rmsnorm(x, g, out, eps):
    n, d = x.shape
    for r in prange(n):
        q = np.float32(0.0)
        for j in range(d):
            q += x[r, j] * x[r, j]
        inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
        for j in range(d):
            out[r, j] = x[r, j] * inv * g[j]
"""

ADD_LAYERNORM = """\
{jit}
def k_add_layernorm(x, res, g, b, total, out, eps):
    # total = x + res and out = layernorm(total): x and res are read once, in one sweep
    n, d = x.shape
    for r in prange(n):
        k0 = x[r, 0] + res[r, 0]
        s = np.float32(0.0)
        q = np.float32(0.0)
        for j in range(d):
            a = x[r, j] + res[r, j]
            total[r, j] = a
            t = a - k0
            s += t
            q += t * t
{stats}\
        for j in range(d):
            out[r, j] = (total[r, j] - mean) * inv * g[j] + b[j]
"""

ADD_RMSNORM = """\
{jit}
def k_add_rmsnorm(x, res, g, total, out, eps):
    # total = x + res and out = rmsnorm(total) in one sweep over x and res
    n, d = x.shape
    for r in prange(n):
        q = np.float32(0.0)
        for j in range(d):
            a = x[r, j] + res[r, j]
            total[r, j] = a
            q += a * a
        inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
        for j in range(d):
            out[r, j] = total[r, j] * inv * g[j]
"""

BATCHNORM = """\
{jit}
def k_batchnorm(x, g, b, mean, var, out, eps):
    no, nc, ni = x.shape
    for oc in prange(no * nc):
        o = oc // nc
        c = oc % nc
        inv = np.float32(1.0) / np.sqrt(var[c] + eps)
        for i in range(ni):
            out[o, c, i] = (x[o, c, i] - mean[c]) * inv * g[c] + b[c]
"""


def _ones(d: int) -> str:
    return f"np.ones({d}, np.float32)"


def _zeros(d: int) -> str:
    return f"np.zeros({d}, np.float32)"


def render_layernorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    d = shape[-1]
    k = ctx.kernel(Kernel("k_layernorm", LAYERNORM.format(jit=JIT, stats=SHIFTED_STATS), (A2, A1, A1, A2, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {b}, {ctx.rows(out, shape)}, {f32_literal(ctx.attr('eps'))})")


def render_rmsnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    k = ctx.kernel(Kernel("k_rmsnorm", RMSNORM.format(jit=JIT), (A2, A1, A2, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(shape[-1])
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {ctx.rows(out, shape)}, {f32_literal(ctx.attr('eps'))})")


def render_add_norm(ctx: NodeCtx) -> None:
    """(x + r, norm(x + r)): the sum may take x's buffer and the norm r's when they die here."""
    shape = ctx.out_shape(0)
    d = shape[-1]
    eps = f32_literal(ctx.attr("eps"))
    x, r = ctx.rows(ctx.args[0], shape), ctx.rows(ctx.args[1], shape)
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    total = ctx.rows(ctx.alloc(0, inplace=(0,)), shape)
    out = ctx.rows(ctx.alloc(1, inplace=(1,)), shape)
    if ctx.attr("kind", "layernorm") == "layernorm":
        src = ADD_LAYERNORM.format(jit=JIT, stats=SHIFTED_STATS)
        k = ctx.kernel(Kernel("k_add_layernorm", src, (A2, A2, A1, A1, A2, A2, F32)))
        b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
        ctx.emit(f"{k}({x}, {r}, {g}, {b}, {total}, {out}, {eps})")
    else:
        k = ctx.kernel(Kernel("k_add_rmsnorm", ADD_RMSNORM.format(jit=JIT), (A2, A2, A1, A2, A2, F32)))
        ctx.emit(f"{k}({x}, {r}, {g}, {total}, {out}, {eps})")


def render_batchnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    view = f"({prod(shape[:axis])}, {shape[axis]}, {prod(shape[axis + 1:])})"
    k = ctx.kernel(Kernel("k_batchnorm", BATCHNORM.format(jit=JIT), (A3, A1, A1, A1, A1, A3, F32)))
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.weight('gain')}, {ctx.weight('bias')}, "
             f"{ctx.weight('running_mean')}, {ctx.weight('running_var')}, {out}.reshape{view}, "
             f"{f32_literal(ctx.attr('eps'))})")


RENDERERS = {
    "layernorm": render_layernorm,
    "rmsnorm": render_rmsnorm,
    "batchnorm": render_batchnorm,
    "add_norm": render_add_norm,
}
