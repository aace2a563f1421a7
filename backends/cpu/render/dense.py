"""Dense layers: BLAS matmuls (``np.dot`` inside njit, which needs SciPy) with fused epilogues."""

from __future__ import annotations

from math import prod

from irc.backends.cpu.literals import shape_literal
from irc.backends.cpu.module import A1, A2, A3, Kernel, jit
from irc.backends.cpu.render.activations import act_expr
from irc.backends.cpu.render.context import NodeCtx, np_dtype

JIT = jit()

LINEAR = """\
{jit}
def k_linear(x, w, b, out):
    np.dot(x, w.T, out)
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += b[j]
"""
LINEAR_KERNEL = Kernel("k_linear", LINEAR.format(jit=JIT), (A2, A2, A1, A2))


def linear_call(ctx: NodeCtx, x: str, in_shape: tuple[int, ...], w: str, b: str) -> None:
    """Allocate the result and call ``k_linear`` on [rows, features] views."""
    k = ctx.kernel(LINEAR_KERNEL)
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(x, in_shape)}, {w}, {b}, {ctx.rows(out, ctx.out_shape())})")


def render_linear(ctx: NodeCtx) -> None:
    n_out = ctx.out_shape()[-1]
    linear_call(ctx, ctx.args[0], ctx.in_shape(), ctx.weight("weight"), ctx.weight_or_zeros("bias", n_out))


def render_unembed(ctx: NodeCtx) -> None:
    tied = ctx.attr("tied")
    w = ctx.weight("weight", key=f"{tied}.weight") if tied is not None else ctx.weight("weight")
    linear_call(ctx, ctx.args[0], ctx.in_shape(), w, ctx.weight_or_zeros("bias", ctx.out_shape()[-1]))


MATMUL = """\
{jit}
def k_matmul(a, b, out):
    for i in range(out.shape[0]):
        np.dot(a[i], b[i], out[i])
"""


def render_matmul(ctx: NodeCtx) -> None:
    sa, sb, so = ctx.in_shape(0), ctx.in_shape(1), ctx.out_shape()
    a, b, out = ctx.args[0], ctx.args[1], ctx.outs[0]
    if not ctx.out_types[0].is_float:
        ctx.emit(f"{out} = np.ascontiguousarray(np.matmul({a}, {b}), dtype={np_dtype(ctx.out_types[0])})")
        return
    batch = so[:-2]
    nb = prod(batch)
    m, k_, n = sa[-2], sa[-1], sb[-1]
    k = ctx.kernel(Kernel("k_matmul", MATMUL.format(jit=JIT), (A3, A3, A3)))
    ctx.alloc()
    ops = []
    for var, shape, tail in ((a, sa, (m, k_)), (b, sb, (k_, n))):
        if shape[:-2] == batch:
            ops.append(f"{var}.reshape({nb}, {tail[0]}, {tail[1]})")
        else:  # broadcast the batch axes (a copy)
            full = shape_literal(batch + tail)
            ops.append(f"np.ascontiguousarray(np.broadcast_to({var}, {full})).reshape({nb}, {tail[0]}, {tail[1]})")
    ctx.emit(f"{k}({ops[0]}, {ops[1]}, {out}.reshape({nb}, {m}, {n}))")


FFN = """\
{jit}
def {name}(x, w1, b1, w2, b2, out):
    h = np.dot(x, w1.T)
    for i in prange(h.shape[0]):
        for j in range(h.shape[1]):
            v = h[i, j] + b1[j]
            h[i, j] = {expr}
    np.dot(h, w2.T, out)
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += b2[j]
"""


def render_ffn(ctx: NodeCtx) -> None:
    act = ctx.attr("act", "gelu")
    name = f"k_ffn_{act}"
    k = ctx.kernel(Kernel(name, FFN.format(jit=JIT, name=name, expr=act_expr(act)), (A2, A2, A1, A2, A1, A2)))
    hidden = ctx.weight_shape("w1")[0]
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], ctx.in_shape())}, {ctx.weight('w1')}, {ctx.weight_or_zeros('b1', hidden)}, "
             f"{ctx.weight('w2')}, {ctx.weight_or_zeros('b2', ctx.out_shape()[-1])}, "
             f"{ctx.rows(out, ctx.out_shape())})")


SWIGLU = """\
{jit}
def k_swiglu(x, wg, bg, wu, bu, wd, bd, out):
    g = np.dot(x, wg.T)
    u = np.dot(x, wu.T)
    for i in prange(g.shape[0]):
        for j in range(g.shape[1]):
            a = g[i, j] + bg[j]
            g[i, j] = a / (np.float32(1.0) + np.exp(-a)) * (u[i, j] + bu[j])
    np.dot(g, wd.T, out)
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += bd[j]
"""


def render_swiglu(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_swiglu", SWIGLU.format(jit=JIT), (A2, A2, A1, A2, A1, A2, A1, A2)))
    hidden = ctx.weight_shape("w_gate")[0]
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], ctx.in_shape())}, "
             f"{ctx.weight('w_gate')}, {ctx.weight_or_zeros('b_gate', hidden)}, "
             f"{ctx.weight('w_up')}, {ctx.weight_or_zeros('b_up', hidden)}, "
             f"{ctx.weight('w_down')}, {ctx.weight_or_zeros('b_down', ctx.out_shape()[-1])}, "
             f"{ctx.rows(out, ctx.out_shape())})")


RENDERERS = {
    "linear": render_linear,
    "unembed": render_unembed,
    "matmul": render_matmul,
    "ffn": render_ffn,
    "swiglu": render_swiglu,
}
