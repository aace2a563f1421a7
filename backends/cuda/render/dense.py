"""GEMMs with fused epilogues (bias, activation, gating, split outputs) and batched matmul."""

from __future__ import annotations

from math import prod

from irc.backends.cuda.render.context import Ctx, cdiv, dims
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch
from irc.backends.cuda.render.gemm_src import GemmSpec, gemm_kernel, pick_tile
from irc.backends.literals import str_literal


def launch_gemm(ctx: Ctx, spec: GemmSpec, a: str, b: list[str], bias: str, outs: list[str], m: int, n: int,
                k: int, z: int = 1, a_batch: tuple[int, int] = (1, 1), b_batch: tuple[int, int] = (1, 1),
                bias_mod: int = 1, splits: tuple[int, ...] = ()) -> None:
    """Launch C[z] = epilogue(A[z] · B[z]) on 3-D operands; ``*_batch`` are (div, mod) of the batch index."""
    name = ctx.kernel(gemm_kernel(spec))
    t = spec.tile
    args = [a, *b, bias, *outs, ctx.i(m), ctx.i(n), ctx.i(k), ctx.i(a_batch[0]), ctx.i(a_batch[1]),
            ctx.i(b_batch[0]), ctx.i(b_batch[1]), ctx.i(bias_mod)] + [ctx.i(s) for s in splits]
    ctx.launch(name, dims(cdiv(n, t.bn), cdiv(m, t.bm), z), dims(t.threads), args)


def _rows(ctx: Ctx, index: int, shape: tuple[int, ...]) -> tuple[str, int]:
    """A value seen as [1, rows, last axis]."""
    m = prod(shape[:-1])
    return ctx.v(ctx.view(index, (1, m, shape[-1]))), m


def render_gemm(ctx: Ctx) -> None:
    """act(x @ w.T + b) over the last axis."""
    ctx.need_float()
    xs, ws = ctx.in_shape(0), ctx.in_shape(1)
    n, k = ws
    a, m = _rows(ctx, ctx.ins[0], xs)
    has_bias = len(ctx.ins) > 2
    spec = GemmSpec(pick_tile(m, n, 1), "nt", "col" if has_bias else "none", ctx.attr("act", "none"))
    out = ctx.alloc()
    c, _ = _rows(ctx, out, ctx.out_shape())
    w = ctx.v(ctx.view(ctx.ins[1], (1, n, k)))
    launch_gemm(ctx, spec, a, [w], ctx.F(2) if has_bias else ctx.F(0), [c], m, n, k)


def render_gemm_glu(ctx: Ctx) -> None:
    """act(x @ w_gate.T) * (x @ w_up.T) in one pass over x."""
    ctx.need_float()
    xs = ctx.in_shape(0)
    n, k = ctx.in_shape(1)
    a, m = _rows(ctx, ctx.ins[0], xs)
    spec = GemmSpec(pick_tile(m, n, 1, glu=True), "nt", "none", ctx.attr("act", "silu"), glu=True)
    out = ctx.alloc()
    c, _ = _rows(ctx, out, ctx.out_shape())
    wg = ctx.v(ctx.view(ctx.ins[1], (1, n, k)))
    wu = ctx.v(ctx.view(ctx.ins[2], (1, n, k)))
    launch_gemm(ctx, spec, a, [wg, wu], ctx.F(0), [c], m, n, k)


def render_gemm_multi(ctx: Ctx) -> None:
    """x @ w_i.T for several weights: one GEMM over their concatenation (made once, when the
    weights are uploaded), its columns written straight into the separate results."""
    ctx.need_float()
    xs = ctx.in_shape(0)
    a, m = _rows(ctx, ctx.ins[0], xs)
    k = xs[-1]
    widths = [ctx.in_shape(i)[0] for i in range(1, len(ctx.ins))]
    keys = [ctx.parts.plan.values[ctx.parts.plan.values[i].root].weight for i in ctx.ins[1:]]
    outs = []
    for i in range(len(widths)):
        c, _ = _rows(ctx, ctx.alloc(i), ctx.out_shape(i))
        outs.append(c)
    if any(key is None or key.startswith("#") for key in keys) or len(widths) > 4:
        for i, (w_index, width) in enumerate(zip(ctx.ins[1:], widths)):  # computed weights: one GEMM each
            spec = GemmSpec(pick_tile(m, width, 1), "nt")
            launch_gemm(ctx, spec, a, [ctx.v(ctx.view(w_index, (1, width, k)))], ctx.F(0), [outs[i]], m, width, k)
        return
    total = sum(widths)
    joined = ", ".join(f"w[{str_literal(key)}]" for key in keys if key is not None)
    merged = ctx.derive(f"np.concatenate([{joined}], axis=0)", (1, total, k))
    ends = [sum(widths[: i + 1]) for i in range(len(widths) - 1)]
    spec = GemmSpec(pick_tile(m, total, 1), "nt", outputs=len(widths))
    launch_gemm(ctx, spec, a, [ctx.v(merged)], ctx.F(0), outs, m, total, k, splits=tuple(ends))


def _batch_operand(ctx: Ctx, index: int, shape: tuple[int, ...], batch: tuple[int, ...], tail: tuple[int, int]
                   ) -> tuple[str, tuple[int, int]]:
    """A matmul operand as [Z', rows, cols] with its batch (div, mod); broadcasting over
    several batch axes is materialised (a copy)."""
    z = prod(batch)
    own = shape[:-2]
    if prod(own) == 1:
        return ctx.v(ctx.view(index, (1,) + tail)), (1, 1)
    if tuple(own) == tuple(batch):
        return ctx.v(ctx.view(index, (z,) + tail)), (1, z)
    full = tuple(batch) + tail
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    strides = contiguous_strides(padded)
    bstrides = tuple(0 if d == 1 and f != 1 else s for d, f, s in zip(padded, full, strides))
    tmp = ctx.temp(full)
    copy_launch(ctx, ctx.f(index), ctx.f(tmp), full, bstrides, 0, contiguous_strides(full), 0)
    return ctx.v(ctx.view(tmp, (z,) + tail)), (1, z)


def render_matmul(ctx: Ctx) -> None:
    """NumPy matmul: batched, broadcasting; a 1-D operand is a row (left) or a column (right)."""
    ctx.need_float()
    sa, sb, so = ctx.in_shape(0), ctx.in_shape(1), ctx.out_shape()
    sa2 = (1,) + sa if len(sa) == 1 else sa
    sb2 = sb + (1,) if len(sb) == 1 else sb
    m, k, n = sa2[-2], sa2[-1], sb2[-1]
    batch = tuple(so[: len(so) - int(len(sa) > 1) - int(len(sb) > 1)])
    z = prod(batch)
    a, a_batch = _batch_operand(ctx, ctx.ins[0], sa2, batch, (m, k))
    b, b_batch = _batch_operand(ctx, ctx.ins[1], sb2, batch, (k, n))
    out = ctx.alloc()
    c = ctx.v(ctx.view(out, (z, m, n)))
    spec = GemmSpec(pick_tile(m, n, z), "nn")
    launch_gemm(ctx, spec, a, [b], ctx.F(0), [c], m, n, k, z, a_batch, b_batch)


RENDERERS = {
    "gemm": render_gemm,
    "gemm_glu": render_gemm_glu,
    "gemm_multi": render_gemm_multi,
    "matmul": render_matmul,
}
