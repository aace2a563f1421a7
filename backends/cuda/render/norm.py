"""LayerNorm and RMSNorm (alone, or fused with the residual add before them), BatchNorm, LayerNorm over a
middle axis (ConvNeXt's channels-first), GroupNorm and InstanceNorm."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, F32, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx, cdiv, dims, rows_of
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch
from irc.backends.cuda.render.reduce import block_reduce, buffer_size
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
    rank = len(ctx.in_shape())
    axis = ctx.attr("axis")
    if axis is not None and axis % rank != rank - 1:
        _layernorm_mid(ctx, axis % rank)
        return
    _norm(ctx, "layernorm", residual=False)


def _layernorm_mid(ctx: Ctx, axis: int) -> None:
    """LayerNorm over a middle axis: move it last (one strided copy), normalise the rows in registers,
    move it back. The statistics are per position over C, the row kernel's job once C is last."""
    ctx.need_float()
    shape = ctx.in_shape()
    rank = len(shape)
    d = shape[axis]
    perm = [k for k in range(rank) if k != axis] + [axis]
    moved = tuple(shape[k] for k in perm)
    rows = prod(moved[:-1])
    rs = row_shape_for(ctx, d)
    affine = bool(ctx.attr("affine", True))
    gain, bias = affine and ctx.has_weight("gain"), affine and ctx.has_weight("bias")
    k = ctx.parts.reducing_kernel(lambda path: norm_kernel("layernorm", False, gain, bias, rs, path))
    g, b = ctx.weight_or_const("gain", d, 1.0), ctx.weight_or_const("bias", d, 0.0)
    strides = contiguous_strides(shape)
    t1, t2 = ctx.temp(moved), ctx.temp(moved)
    copy_launch(ctx, ctx.F(0), ctx.f(t1), moved, tuple(strides[k] for k in perm), 0, contiguous_strides(moved), 0)
    two = (rows, d)
    ctx.launch(k, dims(rows), dims(rs.threads), [ctx.v(ctx.view(t1, two)), ctx.f(g), ctx.f(b),
                                                  ctx.v(ctx.view(t2, two)), ctx.f32(ctx.attr("eps"))])
    out = ctx.alloc()
    copy_launch(ctx, ctx.f(t2), ctx.f(out), moved, contiguous_strides(moved), 0, tuple(strides[k] for k in perm), 0)


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


# GroupNorm on x as [B·groups, (C/groups)·spatial]: one thread block per (sample, group) row, which
# can be far longer than a block's registers (a U-Net's 10 channels × 64² = 40,960 values), so each
# thread strides over the row three times: the sum (→ mean), the squared deviations (→ variance,
# two-pass, no cancellation), the write with the channel's gain and bias. InstanceNorm: groups = C.
GROUP_THREADS = 256  # PyTorch's group_norm_kernel.cu also reduces a (sample, group) row per block of 256


def group_threads(m: int) -> int:
    """Threads per row: whole warps, about 4 values each for short rows, at most GROUP_THREADS."""
    return min(GROUP_THREADS, max(32, cdiv(cdiv(m, 4), 32) * 32))


def groupnorm_kernel(threads: int, path: str) -> Kernel:
    name = f"k_groupnorm_t{threads}__{path}"
    size = buffer_size(path, threads)
    head = f"""\
{JIT}
def {name}(x, g, b, out, cg, ns, groups, eps):
    red0 = cuda.shared.array({size}, np.float32)
    red1 = cuda.shared.array({size}, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m = cg * ns
    acc = np.float32(0.0)
    for j in range(tid, m, {threads}):
        acc += x[row, j]
"""
    middle = f"""\
    mean = acc / np.float32(m)
    q = np.float32(0.0)
    for j in range(tid, m, {threads}):
        t = x[row, j] - mean
        q += t * t
"""
    tail = f"""\
    inv = np.float32(1.0) / math.sqrt(q / np.float32(m) + eps)
    first = (row % groups) * cg
    for j in range(tid, m, {threads}):
        ch = first + j // ns
        out[row, j] = (x[row, j] - mean) * inv * g[ch] + b[ch]
"""
    src = (head + block_reduce(path, "sum", "acc", "red0", threads) + middle
           + block_reduce(path, "sum", "q", "red1", threads) + tail)
    return Kernel(name, src, (A2, A1, A1, A2, I64, I64, I64, F32))


def render_groupnorm(ctx: Ctx) -> None:
    """groupnorm and instancenorm (groups = C) on [B, C, ...]."""
    ctx.need_float()
    shape = ctx.in_shape()
    c = shape[1]
    groups = c if ctx.node.op == "instancenorm" else int(ctx.attr("groups"))
    cg, ns = c // groups, prod(shape[2:])
    rows, m = shape[0] * groups, cg * ns
    threads = group_threads(m)
    k = ctx.parts.reducing_kernel(lambda path: groupnorm_kernel(threads, path))
    g, b = ctx.weight_or_const("gain", c, 1.0), ctx.weight_or_const("bias", c, 0.0)
    out = ctx.alloc()
    two = (rows, m)
    ctx.launch(k, dims(rows), dims(threads), [ctx.v(ctx.view(ctx.ins[0], two)), ctx.f(g), ctx.f(b),
                                              ctx.v(ctx.view(out, two)), ctx.i(cg), ctx.i(ns), ctx.i(groups),
                                              ctx.f32(ctx.attr("eps"))])


RENDERERS = {
    "groupnorm": render_groupnorm,
    "instancenorm": render_groupnorm,
    "layernorm": render_layernorm,
    "rmsnorm": render_rmsnorm,
    "add_norm": render_add_norm,
    "batchnorm": render_batchnorm,
}
