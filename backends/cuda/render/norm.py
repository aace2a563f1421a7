"""LayerNorm and RMSNorm (alone, or fused with the residual add before them), BatchNorm."""

from __future__ import annotations

from math import prod

from irc.backends.cpu.module import A1, F32, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx, dims, rows_of
from irc.backends.cuda.render.rows import norm_kernel, row_shape_for


def _norm(ctx: Ctx, kind: str, residual: bool) -> None:
    ctx.need_float()
    shape = ctx.in_shape(0)
    rows, d = rows_of(shape)
    rs = row_shape_for(ctx, d)
    affine = bool(ctx.attr("affine", True))
    gain = affine and ctx.has_weight("gain")
    bias = affine and ctx.has_weight("bias")
    keep_sum = residual and not ctx.unread(0)
    k = ctx.parts.reducing_kernel(lambda path: norm_kernel(kind, residual, gain, bias, rs, path, keep_sum))
    g = ctx.weight_or_const("gain", d, 1.0)  # a constant where the kernel reads none
    b = ctx.weight_or_const("bias", d, 0.0)
    two = (rows, d)
    args = [ctx.v(ctx.view(ctx.ins[0], two))]
    if residual:
        args.append(ctx.v(ctx.view(ctx.ins[1], two)))
    args += [ctx.f(g), ctx.f(b)]
    if residual:
        s = ctx.alloc(0)  # allocated even when unread: the result needs storage of some kind
        if keep_sum:
            args.append(ctx.v(ctx.view(s, two)))
    out = ctx.alloc(1 if residual else 0)
    args += [ctx.v(ctx.view(out, two)), ctx.f32(ctx.attr("eps"))]
    ctx.launch(k, dims(rows), dims(rs.threads), args)


def render_layernorm(ctx: Ctx) -> None:
    _norm(ctx, "layernorm", residual=False)


def render_rmsnorm(ctx: Ctx) -> None:
    _norm(ctx, "rmsnorm", residual=False)


def render_add_norm(ctx: Ctx) -> None:
    if ctx.in_shape(0) != ctx.in_shape(1):
        raise ctx.error(f"adds {ctx.in_types[1]} to {ctx.in_types[0]}; the fused kernel needs equal shapes")
    _norm(ctx, ctx.attr("kind", "layernorm"), residual=True)


BATCHNORM = f"""\
{JIT}
def k_batchnorm(x, g, b, mean, var, out, n, channels, inner, eps):
    i = cuda.grid(1)
    if i < n:
        c = (i // inner) % channels
        inv = np.float32(1.0) / math.sqrt(var[c] + eps)
        out[i] = (x[i] - mean[c]) * inv * g[c] + b[c]
"""
BATCHNORM_KERNEL = Kernel("k_batchnorm", BATCHNORM, (A1, A1, A1, A1, A1, A1, I64, I64, I64, F32))


def render_batchnorm(ctx: Ctx) -> None:
    """Inference: the running statistics, per channel along ``axis``."""
    ctx.need_float()
    shape = ctx.in_shape()
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    n = prod(shape)
    k = ctx.kernel(BATCHNORM_KERNEL)
    out = ctx.alloc()
    grid, block = ctx.flat_grid(n)
    args = [ctx.F(0), ctx.f(ctx.weight("gain")), ctx.f(ctx.weight("bias")), ctx.f(ctx.weight("running_mean")),
            ctx.f(ctx.weight("running_var")), ctx.f(out), ctx.i(n), ctx.i(shape[axis]),
            ctx.i(prod(shape[axis + 1:])), ctx.f32(ctx.attr("eps"))]
    ctx.launch(k, grid, block, args)


RENDERERS = {
    "layernorm": render_layernorm,
    "rmsnorm": render_rmsnorm,
    "add_norm": render_add_norm,
    "batchnorm": render_batchnorm,
}
