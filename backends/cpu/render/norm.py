"""LayerNorm and RMSNorm over rows, BatchNorm (inference) per channel.

Sums are float32 accumulators on purpose (the reference computes in float32); the variance
takes a second pass over the row, so a constant row gives exactly zero.
"""

from __future__ import annotations

from math import prod

from irc.backends.cpu.literals import f32_literal
from irc.backends.cpu.module import A1, A2, A3, F32, Kernel, jit
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()

LAYERNORM = """\
{jit}
def k_layernorm(x, g, b, out, eps):
    n, d = x.shape
    for r in prange(n):
        s = np.float32(0.0)
        for j in range(d):
            s += x[r, j]
        mean = s / np.float32(d)
        q = np.float32(0.0)
        for j in range(d):
            t = x[r, j] - mean
            q += t * t
        inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
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
    k = ctx.kernel(Kernel("k_layernorm", LAYERNORM.format(jit=JIT), (A2, A1, A1, A2, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {b}, {ctx.rows(out, shape)}, {f32_literal(ctx.attr('eps'))})")


def render_rmsnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    k = ctx.kernel(Kernel("k_rmsnorm", RMSNORM.format(jit=JIT), (A2, A1, A2, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(shape[-1])
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {ctx.rows(out, shape)}, {f32_literal(ctx.attr('eps'))})")


def render_batchnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    view = f"({prod(shape[:axis])}, {shape[axis]}, {prod(shape[axis + 1:])})"
    k = ctx.kernel(Kernel("k_batchnorm", BATCHNORM.format(jit=JIT), (A3, A1, A1, A1, A1, A3, F32)))
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.weight('gain')}, {ctx.weight('bias')}, "
             f"{ctx.weight('running_mean')}, {ctx.weight('running_var')}, {out}.reshape{view}, "
             f"{f32_literal(ctx.attr('eps'))})")


RENDERERS = {
    "layernorm": render_layernorm,
    "rmsnorm": render_rmsnorm,
    "batchnorm": render_batchnorm,
}
