"""conv2d_bn, the fold-bn pass's fused convolution: BatchNorm's statistics folded into the convolution's
weight and bias at load, the residual add and the activation as its kernel's epilogue, and a max pool after
it in the table kernel's epilogue (ResNet's stem) or on the convolution's result otherwise."""

from __future__ import annotations

from dataclasses import replace

import irc.ops.fused_conv
from irc.backends.cpu.render import conv_blas, conv_table, gemm_packed, winograd
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.conv import (
    CONV2D_KERNEL,
    _conv_kernel,
    _gemm_conv_call,
    _geometry,
    _winograd,
    maxpool_kernel,
)
from irc.backends.cpu.render.gemm import THREADS

# BatchNorm's statistics folded into the convolution, in float64, once per weights dict (or on every run
# when an operand is computed, not a weight): s = gain / sqrt(var + eps), w' = w·s, b' = bias − mean·s
BN_FOLD_WEIGHT = '''\
def bn_fold_weight(w, gain, var, eps):
    """The convolution's weight [out, ...] scaled by its channel's BatchNorm factor, as [out, in·kh·kw]."""
    s = gain.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    return np.ascontiguousarray((w.reshape(w.shape[0], -1) * s[:, None]).astype(np.float32))
'''
BN_FOLD_BIAS = '''\
def bn_fold_bias(gain, bias, mean, var, eps):
    """The BatchNorm's shift once its scale is in the weights: bias − mean·s."""
    s = gain.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    return np.ascontiguousarray((bias - mean * s).astype(np.float32))
'''


def render_conv_bn(ctx: NodeCtx) -> None:
    """conv2d_bn: the folded weight and bias, then one convolution with bias, residual and activation as its
    epilogue (grouped convolutions run the grouped kernel and their epilogue in the driver). A max pool after
    it runs in the table kernel's epilogue where that kernel serves the convolution (ResNet's stem), else on
    the convolution's result, a temporary of this node (k_maxpool2d)."""
    if ctx.attr("pool") is None:
        _render_conv_bn(ctx)
        return
    conv_type = irc.ops.fused_conv.conv_result(ctx.node.attrs, ctx.in_types)
    conv_shape = tuple(int(d) for d in conv_type.shape)
    (pk, pl), (ps, pt), (pp, pq) = irc.ops.fused_conv.pool_geometry(ctx.node.attrs)
    keys = [ctx.param_key(i) for i in range(1, 6)]
    geometry = _geometry(ctx, 2)
    ci = ctx.in_shape()[1]
    nb, _, ho, wo = conv_shape
    folded_at_load = int(ctx.attr("groups")) == 1 and all(k is not None for k in keys)
    if folded_at_load and not _winograd(replace(ctx, out_types=[conv_type])) and _conv_kernel(
            ci, geometry, nb, ho, wo, True) == "table":
        _render_table_pool(ctx, keys, geometry, conv_shape, (pk, pl, ps, pt, pp, pq))
        return
    tmp = f"{ctx.outs[0]}_conv"
    _render_conv_bn(replace(ctx, out_types=[conv_type], outs=[tmp], schedule=None))
    out = ctx.alloc()
    k = maxpool_kernel(ctx)
    ctx.emit(f"{k}({tmp}, {out}, kh={pk}, kw={pl}, sh={ps}, sw={pt}, ph={pp}, pw={pq}, dh=1, dw=1)")
    ctx.emit(f"del {tmp}")


def _render_table_pool(ctx: NodeCtx, keys: list[str | None], geometry: tuple[int, ...], conv_shape: tuple[int, ...],
                       pool: tuple[int, ...]) -> None:
    """conv2d_bn with its max pool in conv_table's pooled kernel: the folded weight packed once."""
    ctx.helper("bn_fold_weight", BN_FOLD_WEIGHT)
    ctx.helper("bn_fold_bias", BN_FOLD_BIAS)
    eps = repr(float(ctx.attr("eps")))
    w, g, b, m, v = (ctx.weight("", key=k) for k in keys)
    tag = ",".join(str(k) for k in keys) + f",{eps}"
    b2 = ctx.derive(f"~bn_fold_bias({tag})", f"bn_fold_bias({g}, {b}, {m}, {v}, {eps})")
    kh, kw, sh, sw, ph, pw, dh, dw = geometry
    nb, co, ho, wo = conv_shape
    ci = ctx.in_shape()[1]
    kk = ci * kh * kw
    gemm_packed.use(ctx.parts)
    folded = f"bn_fold_weight({w}, {g}, {v}, {eps})"
    ap = ctx.derive(f"~gemm_pack6(bn_fold_weight({tag}))", f"gemm_pack6({folded}, {co}, {kk})")
    res = ctx.args[6] if len(ctx.args) > 6 else None
    out = ctx.alloc()
    pk, pl, ps, pt, pp, pq = pool
    x_shape = ctx.in_shape()
    work = conv_blas.work(ctx, conv_table.pool_work_size(geometry, x_shape, conv_shape, (pk, pl, ps, pt, pq),
                                                         ctx.out_shape()[3]))
    res3 = f"{res}.reshape({nb}, {co}, {ho * wo})" if res is not None else f"{out}.reshape({nb}, {co}, -1)"  # unread
    wq = wo + ((kw - 1) * dw) // sw
    ctx.emit(f"{conv_table.conv_table_pool_kernel(ctx, ctx.attr('act'))}({ctx.args[0]}, "
             f"{ap}.reshape({gemm_packed.strips(co) * 6}, {kk}), {b2}, {res3}, {out}, {work}, {ap}, sh={sh}, sw={sw}, "
             f"ph={ph}, pw={pw}, dh={dh}, dw={dw}, kh={kh}, kw={kw}, has_res={0 if res is None else 1}, ho={ho}, "
             f"wo={wo}, pk={pk}, pl={pl}, ps={ps}, pt={pt}, pp={pp}, pq={pq}, pg={conv_table.pool_group(pk, ps, wq)}, "
             f"pb={conv_table.pool_block(pk, ps, wq)}, "
             f"parts={THREADS})")


def _render_conv_bn(ctx: NodeCtx) -> None:
    """conv2d_bn without a pool (its result the node's, or a pooled node's temporary)."""
    ctx.helper("bn_fold_weight", BN_FOLD_WEIGHT)
    ctx.helper("bn_fold_bias", BN_FOLD_BIAS)
    eps = repr(float(ctx.attr("eps")))
    keys = [ctx.param_key(i) for i in range(1, 6)]
    weights = all(k is not None for k in keys)
    w, g, b, m, v = (ctx.weight("", key=k) for k in keys) if weights else ctx.args[1:6]
    tag = ",".join(keys) + f",{eps}" if weights else ""
    w2_expr = f"bn_fold_weight({w}, {g}, {v}, {eps})"
    b2 = f"bn_fold_bias({g}, {b}, {m}, {v}, {eps})"
    if weights:
        b2 = ctx.derive(f"~bn_fold_bias({tag})", b2)
    res = ctx.args[6] if len(ctx.args) > 6 else None
    co, ci = ctx.in_shape(1)[:2]
    wino = _winograd(ctx)
    if wino is not None:
        u = (winograd.packed_filter(ctx, wino, f"bn_fold_weight({tag})", w2_expr, co, ci) if weights
             else winograd.filter_expr(ctx, wino, w2_expr, co, ci))
        winograd.winograd_call(ctx, wino, u, b2, res, ctx.attr("act"), *_geometry(ctx, 2)[4:6], packed=weights)
        return
    def folded() -> str:
        return ctx.derive(f"~bn_fold_weight({tag})", w2_expr) if weights else w2_expr

    if int(ctx.attr("groups")) == 1:
        _gemm_conv_call(ctx, 2, folded, f"bn_fold_weight({tag})" if weights else None, w2_expr, b2, res,
                        ctx.attr("act"))
        return
    w2 = folded()
    kh, kw, sh, sw, ph, pw, dh, dw = _geometry(ctx, 2)
    k = ctx.kernel(CONV2D_KERNEL)
    out = ctx.alloc()
    ws = ctx.in_shape(1)
    ctx.emit(f"{k}({ctx.args[0]}, {w2}.reshape({', '.join(map(str, ws))}), {b2}, {out}, sh={sh}, sw={sw}, "
             f"ph={ph}, pw={pw}, dh={dh}, dw={dw}, groups={ctx.attr('groups')}, parts={THREADS})")
    if res is not None:
        ctx.emit(f"np.add({out}, {res}, out={out})")
    if ctx.attr("act") == "relu":
        ctx.emit(f"np.maximum({out}, np.float32(0.0), out={out})")


RENDERERS = {"conv2d_bn": render_conv_bn}
