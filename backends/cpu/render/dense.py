"""Dense layers as the split gemm kernels of :mod:`.gemm` (``np.dot`` inside njit needs SciPy)."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, A3, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx, np_dtype
from irc.backends.cpu.render.gemm import THREADS, gemm_call, glu_kernel
from irc.backends.literals import shape_literal

JIT = jit()


def render_linear(ctx: NodeCtx) -> None:
    n_out = ctx.out_shape()[-1]
    gemm_call(ctx, ctx.args[0], ctx.in_shape(), ctx.weight("weight"), ctx.weight_or_zeros("bias", n_out),
              w_key=ctx.weight_key("weight"))


def render_unembed(ctx: NodeCtx) -> None:
    tied = ctx.attr("tied")
    key = f"{tied}.weight" if tied is not None else ctx.weight_key("weight")
    gemm_call(ctx, ctx.args[0], ctx.in_shape(), ctx.weight("weight", key=key),
              ctx.weight_or_zeros("bias", ctx.out_shape()[-1]), w_key=key)


MATMUL = """\
{jit}
def k_matmul(a, b, out):
    for i in prange(out.shape[0]):  # one single-threaded BLAS call per batch item
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


def render_ffn(ctx: NodeCtx) -> None:
    """Two gemms; the hidden layer is a driver temporary, the activation the first one's epilogue."""
    hidden = ctx.weight_shape("w1")[0]
    rows = prod(ctx.in_shape()[:-1])
    h = f"{ctx.outs[0]}_hidden"
    ctx.scratch(h, (rows, hidden))
    gemm_call(ctx, ctx.args[0], ctx.in_shape(), ctx.weight("w1"), ctx.weight_or_zeros("b1", hidden),
              ctx.attr("act", "gelu"), out=h, out_shape=(rows, hidden), w_key=ctx.weight_key("w1"))
    gemm_call(ctx, h, (rows, hidden), ctx.weight("w2"), ctx.weight_or_zeros("b2", ctx.out_shape()[-1]),
              w_key=ctx.weight_key("w2"))
    ctx.emit(f"del {h}")


BIASED_GLU = """\
{jit}
def k_swiglu_bias(x, wg, bg, wu, bu, out, parts):
    m, n = out.shape
    for c in prange(parts):
        r0 = c * m // parts
        r1 = (c + 1) * m // parts
        if r1 > r0:
            g = np.dot(x[r0:r1], wg.T)
            u = np.dot(x[r0:r1], wu.T)
            for i in range(r1 - r0):
                for j in range(n):
                    v = g[i, j] + bg[j]
                    out[r0 + i, j] = ({expr}) * (u[i, j] + bu[j])
"""


def render_swiglu(ctx: NodeCtx) -> None:
    hidden = ctx.weight_shape("w_gate")[0]
    rows = prod(ctx.in_shape()[:-1])
    h = f"{ctx.outs[0]}_hidden"
    ctx.scratch(h, (rows, hidden))
    x = ctx.rows(ctx.args[0], ctx.in_shape())
    if ctx.has_weight("b_gate") or ctx.has_weight("b_up"):
        src = BIASED_GLU.format(jit=JIT, expr=act(ctx.parts, "silu"))
        k = ctx.kernel(Kernel("k_swiglu_bias", src, (A2, A2, A1, A2, A1, A2, I64)))
        ctx.emit(f"{k}({x}, {ctx.weight('w_gate')}, {ctx.weight_or_zeros('b_gate', hidden)}, "
                 f"{ctx.weight('w_up')}, {ctx.weight_or_zeros('b_up', hidden)}, {h}, {THREADS})")
    else:
        k = glu_kernel(ctx, "silu")
        key = f"~stack({ctx.weight_key('w_gate')},{ctx.weight_key('w_up')})"
        w = ctx.derive(key, f"np.concatenate([{ctx.weight('w_gate')}, {ctx.weight('w_up')}])")
        ctx.emit(f"{k}({x}, {w}, {h}, {THREADS})")
    gemm_call(ctx, h, (rows, hidden), ctx.weight("w_down"), ctx.weight_or_zeros("b_down", ctx.out_shape()[-1]),
              w_key=ctx.weight_key("w_down"))
    ctx.emit(f"del {h}")


RENDERERS = {
    "linear": render_linear,
    "unembed": render_unembed,
    "matmul": render_matmul,
    "ffn": render_ffn,
    "swiglu": render_swiglu,
}
