"""Fused attention (sdpa), rotary embeddings, the causal mask's fused form, T5's relative-position
bias (``rel_position_bias``, built once from its table), and the layer-level ``attention`` op that
fusion leaves alone (one with a ``rel_buckets`` table of its own): projections by GEMM, the bias
table built once from the weights (plus an ``attn_bias`` operand), the same fused kernel in the middle."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx, dims
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch
from irc.backends.cuda.render.dense import launch_gemm
from irc.backends.cuda.render.elementwise import binary_kernel, broadcast_into
from irc.backends.cuda.render.gemm_src import GemmSpec
from irc.backends.cuda.render.gemm_src import pick_tile as pick_gemm_tile
from irc.backends.cuda.render.sdpa_src import AttnSpec, pick_tile, sdpa_kernel
from irc.backends.literals import float_literal, int_literal
from irc.ops.attention import REL_TABLE, kv_heads, rel_max_distance, rope_theta, score_scale


def launch_sdpa(ctx: Ctx, q: int, k: int, v: int, bias: int | None, out: int, scale: float, causal: bool,
                window: int | None = None) -> None:
    """The fused kernel on values q [B, H, T, hd], k/v [B, G, S, hd/hdv] -> out [B, H, T, hdv];
    a causal ``window`` also hides key j <= query i − window (one kernel for every width)."""
    values = ctx.parts.plan.values
    b, heads, t, hd = values[q].shape
    groups, hdv = values[k].shape[1], values[v].shape[3]
    if heads % groups:
        raise ctx.error(f"has {heads} query heads, not a multiple of {groups} key/value heads")
    tile = pick_tile(hdv)
    name = ctx.parts.reducing_kernel(
        lambda path: sdpa_kernel(AttnSpec(tile, hd, hdv, causal, bias is not None, path, window=window is not None)))
    bias_arg = ctx.v(bias) if bias is not None else ctx.v(ctx.view(q, (b, heads, t, hd)))
    grid = dims(-(-t // tile.bm), b * heads)
    args = [ctx.v(q), ctx.v(k), ctx.v(v), bias_arg, ctx.v(out), ctx.f32(scale), ctx.i(heads), ctx.i(groups)]
    ctx.launch(name, grid, dims(tile.threads), args + ([ctx.i(window)] if window is not None else []))


def render_sdpa(ctx: Ctx) -> None:
    ctx.need_float()
    bias = None
    if len(ctx.ins) > 3:
        bshape = ctx.in_shape(3)
        bias = ctx.view(ctx.ins[3], (1,) * (4 - len(bshape)) + tuple(bshape))
    out = ctx.alloc()
    launch_sdpa(ctx, ctx.ins[0], ctx.ins[1], ctx.ins[2], bias, out, float(ctx.attr("scale")),
                bool(ctx.attr("causal", False)), window_arg(ctx))


def window_arg(ctx: Ctx) -> int | None:
    """The node's sliding window, or None for none (it slides the causal mask only)."""
    window = ctx.attr("window")
    return int(window) if window is not None and ctx.attr("causal", False) else None


# -- rotary position embedding ------------------------------------------------------------

ROPE = f"""\
{JIT}
def k_rope(x, cos, sin, out, n, t_len, half):
    i = cuda.grid(1)
    if i < n:
        f = i % half
        pair = i // half  # (b, h, t) flattened
        p = pair % t_len
        base = pair * 2 * half
        a = x[base + f]
        b = x[base + half + f]
        c = cos[p, f]
        s = sin[p, f]
        out[base + f] = a * c - b * s
        out[base + half + f] = b * c + a * s
"""
ROPE_KERNEL = Kernel("k_rope", ROPE, (A1, A2, A2, A1, I64, I64, I64))


def rope_tables(ctx: Ctx, length: int, hd: int, theta: float) -> tuple[int, int]:
    """cos and sin of p·theta^(−2i/hd) for p < length, i < hd/2: float64 then float32, once."""
    angle = (f"np.arange({int_literal(length)}, dtype=np.float64)[:, None] * "
             f"{float_literal(theta)} ** (-np.arange(0, {int_literal(hd)}, 2, dtype=np.float64) / {int_literal(hd)})")
    shape = (length, hd // 2)
    return ctx.derive(f"np.cos({angle})", shape), ctx.derive(f"np.sin({angle})", shape)


def launch_rope(ctx: Ctx, x: int, out: int, theta: float) -> None:
    shape = ctx.parts.plan.values[x].shape
    t, hd = shape[-2], shape[-1]  # hd is even: rope's (and attention's) shape inference checks it
    cos, sin = rope_tables(ctx, t, hd, theta)
    n = prod(shape) // 2
    grid, block = ctx.flat_grid(n)
    ctx.launch(ctx.kernel(ROPE_KERNEL), grid, block,
               [ctx.f(x), ctx.v(cos), ctx.v(sin), ctx.f(out), ctx.i(n), ctx.i(t), ctx.i(hd // 2)])


def render_rope(ctx: Ctx) -> None:
    ctx.need_float()
    out = ctx.alloc()
    launch_rope(ctx, ctx.ins[0], out, float(rope_theta(ctx.node.attrs, key="theta")))


# -- the attention layer ------------------------------------------------------------------------

T5_BIAS = '''\
def t5_bias(table, t_len, s_len, buckets, max_distance, bidirectional):
    """rel_bias[bucket(j - i), h] as [1, H, T, S] (T5), from the weight table [buckets, H]."""
    from irc.backends.numpy_ref.attention import t5_buckets

    index = t5_buckets(t_len, s_len, buckets, max_distance, bidirectional)
    return np.moveaxis(table[index], -1, 0)[None]
'''


def _t5_table(ctx: Ctx, weight: str, t: int, s: int, buckets: int, max_distance: int, bidirectional: bool) -> int:
    """The [1, H, T, S] bias of a T5 table, made on the host once per weights dict."""
    helper = ctx.parts.helper("t5_bias", T5_BIAS)
    heads = ctx.weight_shape(weight)[1]
    expr = (f"{helper}({ctx.host_weight(weight)}, {int_literal(t)}, {int_literal(s)}, {int_literal(buckets)}, "
            f"{int_literal(max_distance)}, {bidirectional})")
    return ctx.derive(expr, (1, heads, t, s))


def render_rel_position_bias(ctx: Ctx) -> None:
    shape = ctx.out_shape()
    table = _t5_table(ctx, "weight", shape[2], shape[3], int(ctx.attr("buckets")), int(ctx.attr("max_distance")),
                      bool(ctx.attr("bidirectional")))
    out = ctx.alloc()
    broadcast_into(ctx, ctx.f(table), shape, shape, ctx.f(out))  # a copy: the table outlives every run


def _heads(ctx: Ctx, src: int, b: int, length: int, heads: int, hd: int) -> int:
    """[B, L, heads·hd] -> a new [B, heads, L, hd] (a transposing copy)."""
    dst = ctx.temp((b, heads, length, hd))
    s = contiguous_strides((b, length, heads, hd))
    copy_launch(ctx, ctx.f(src), ctx.f(dst), (b, heads, length, hd), (s[0], s[2], s[1], s[3]), 0,
                contiguous_strides((b, heads, length, hd)), 0)
    return dst


def _project(ctx: Ctx, x: int, rows: int, width: int, w: str, b: str | None) -> int:
    """x [.., d] @ weight.T (+ bias) into a new [rows, width] scratch value."""
    values = ctx.parts.plan.values
    d = values[x].shape[-1]
    out = ctx.temp((rows, width))
    wv = ctx.weight(w)
    spec = GemmSpec(pick_gemm_tile(rows, width, 1), "nt", "col" if b else "none")
    bias = ctx.f(ctx.weight(b)) if b else ctx.f(x)
    launch_gemm(ctx, spec, ctx.v(ctx.view(x, (1, rows, d))), [ctx.v(ctx.view(wv, (1, width, d)))], bias,
                [ctx.v(ctx.view(out, (1, rows, width)))], rows, width, d)
    return out


def render_attention(ctx: Ctx) -> None:
    ctx.need_float()
    x = ctx.ins[0]
    kv = ctx.ins[1] if len(ctx.ins) > 1 else x
    b, t, d = ctx.in_shape(0)
    s = ctx.in_shape(1)[1] if len(ctx.ins) > 1 else t
    heads = int(ctx.attr("heads"))
    groups = int(kv_heads(ctx.node.attrs))
    dq, dkv = ctx.params["wq"][0], ctx.params["wk"][0]
    hd = dq // heads
    if len(ctx.ins) > 1 and ctx.in_shape(1)[0] != b:  # one key/value sequence for every query batch
        kvs = ctx.in_shape(1)
        full = ctx.temp((b,) + kvs[1:])
        broadcast_into(ctx, ctx.F(1), kvs, (b,) + kvs[1:], ctx.f(full))
        kv = full
    q = _heads(ctx, _project(ctx, x, b * t, dq, "wq", "bq" if ctx.has_weight("bq") else None), b, t, heads, hd)
    k = _heads(ctx, _project(ctx, kv, b * s, dkv, "wk", "bk" if ctx.has_weight("bk") else None), b, s, groups, hd)
    v = _heads(ctx, _project(ctx, kv, b * s, dkv, "wv", "bv" if ctx.has_weight("bv") else None), b, s, groups, hd)
    causal = bool(ctx.attr("causal", False))
    if ctx.attr("rope", False):
        theta = float(rope_theta(ctx.node.attrs))
        q2, k2 = ctx.temp((b, heads, t, hd)), ctx.temp((b, groups, s, hd))
        launch_rope(ctx, q, q2, theta)
        launch_rope(ctx, k, k2, theta)
        q, k = q2, k2
    bias = None
    if ctx.attr("rel_buckets") is not None:
        bias = _t5_table(ctx, REL_TABLE, t, s, int(ctx.attr("rel_buckets")), int(rel_max_distance(ctx.node.attrs)),
                         not causal)
    if len(ctx.ins) > 2:  # an additive attn_bias operand, alone or on top of the table
        bshape = (1,) * (4 - len(ctx.in_shape(2))) + tuple(ctx.in_shape(2))
        given = ctx.view(ctx.ins[2], bshape)
        if bias is None:
            bias = given
        else:
            full = (bshape[0], heads, t, s)
            spread, total = ctx.temp(full), ctx.temp(full)
            broadcast_into(ctx, ctx.f(given), bshape, full, ctx.f(spread))
            n = prod(full)
            grid, block = ctx.flat_grid(n)
            ctx.launch(ctx.kernel(binary_kernel("add", "rows")), grid, block,
                       [ctx.f(spread), ctx.f(bias), ctx.f(total), ctx.i(n), ctx.i(heads * t * s)])
            bias = total
    scale = score_scale(ctx.node.attrs, hd)
    o = ctx.temp((b, heads, t, hd))
    launch_sdpa(ctx, q, k, v, bias, o, float(scale), causal, window_arg(ctx))
    merged = ctx.temp((b, t, heads, hd))
    so = contiguous_strides((b, heads, t, hd))
    copy_launch(ctx, ctx.f(o), ctx.f(merged), (b, t, heads, hd), (so[0], so[2], so[1], so[3]), 0,
                contiguous_strides((b, t, heads, hd)), 0)
    out = ctx.alloc()
    wo = ctx.weight("wo")
    spec = GemmSpec(pick_gemm_tile(b * t, d, 1), "nt", "col" if ctx.has_weight("bo") else "none")
    bo = ctx.f(ctx.weight("bo")) if ctx.has_weight("bo") else ctx.f(out)
    launch_gemm(ctx, spec, ctx.v(ctx.view(merged, (1, b * t, dq))), [ctx.v(ctx.view(wo, (1, d, dq)))], bo,
                [ctx.v(ctx.view(out, (1, b * t, d)))], b * t, d, dq)


RENDERERS = {
    "sdpa": render_sdpa,
    "rope": render_rope,
    "attention": render_attention,
    "rel_position_bias": render_rel_position_bias,
}
