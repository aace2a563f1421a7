"""Multi-head attention: projections through BLAS, a per-head score matrix, masked softmax;
and T5's relative-position bias table.

One kernel per configuration (causal, a sliding window, RoPE, T5 relative bias, an additive
attn_bias), so each variant's inner loop holds only the code it needs; the window's width is
an argument of its kernel. GQA reads kv head ``h // (heads // kv_heads)`` in place. This is
the plain, materialising kernel of the unfused graph (``--no-fuse``, or an attention with its
own ``rel_buckets`` table); the fused graph runs the flash-style ``sdpa``.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, F32, F64, I2, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.sdpa import window_arg
from irc.backends.literals import f32_literal, float_literal, shape_literal
from irc.ops.attention import REL_TABLE, rel_max_distance, rope_theta, score_scale
from irc.ops.attention import kv_heads as attention_kv_heads

JIT = jit()

ATTENTION = """\
{jit}
def {name}(x, kv, wq, bq, wk, bk, wv, bv, wo, bo, rel, buckets, bias, out, heads, kv_heads, scale, theta{window}):
    nb, nt, nd = x.shape
    ns, nkv = kv.shape[1], kv.shape[2]
    hd = wq.shape[0] // heads
    q = np.dot(x.reshape(nb * nt, nd), wq.T)
    k = np.dot(kv.reshape(nb * ns, nkv), wk.T)
    v = np.dot(kv.reshape(nb * ns, nkv), wv.T)
    for r in range(nb * nt):  # element-wise passes stay serial: cheap next to the matmuls
        for j in range(q.shape[1]):
            q[r, j] += bq[j]
    for r in range(nb * ns):
        for j in range(k.shape[1]):
            k[r, j] += bk[j]
            v[r, j] += bv[j]
{rope}\
    heads_out = np.empty((nb * nt, heads * hd), np.float32)
    group = heads // kv_heads
    for n in range(nb):
        for h in range(heads):
            g = h // group  # the kv head this query head reads (GQA)
            qh = np.ascontiguousarray(q[n * nt:(n + 1) * nt, h * hd:(h + 1) * hd])
            kh = np.ascontiguousarray(k[n * ns:(n + 1) * ns, g * hd:(g + 1) * hd])
            vh = np.ascontiguousarray(v[n * ns:(n + 1) * ns, g * hd:(g + 1) * hd])
            sc = np.dot(qh, kh.T)
            bn = n if bias.shape[0] > 1 else 0  # the bias broadcasts: a size-1 axis is read at 0
            bh = h if bias.shape[1] > 1 else 0
            bi = 1 if bias.shape[2] > 1 else 0
            bj = 1 if bias.shape[3] > 1 else 0
            for i in prange(nt):  # rows are independent
                m = np.float32(-np.inf)
                for j in range(ns):
                    a = sc[i, j] * scale
{rel}{bias}{causal}\
                    sc[i, j] = a
                    if a > m or a != a:
                        m = a
                if m == np.float32(-np.inf):  # every key masked: a row of zeros, never NaN
                    for j in range(ns):
                        sc[i, j] = np.float32(0.0)
                else:
                    s = np.float32(0.0)
                    for j in range(ns):
                        e = np.exp(sc[i, j] - m)
                        sc[i, j] = e
                        s += e
                    inv = np.float32(1.0) / s
                    for j in range(ns):
                        sc[i, j] *= inv
            oh = np.dot(sc, vh)
            for i in range(nt):
                for d in range(hd):
                    heads_out[n * nt + i, h * hd + d] = oh[i, d]
    o2 = out.reshape(nb * nt, nd)
    np.dot(heads_out, wo.T, o2)
    for r in range(nb * nt):
        for j in range(nd):
            o2[r, j] += bo[j]
"""

def _rotate(x: str, rows: str, heads: str) -> str:
    """Rotate every head of ``x`` ([nb * rows, heads * hd]) by the table's angles at its position."""
    return f"""\
    for r in range(nb * {rows}):
        p = r % {rows}
        for h in range({heads}):
            for i in range(half):
                a = {x}[r, h * hd + i]
                b = {x}[r, h * hd + half + i]
                {x}[r, h * hd + i] = a * rc[p, i] - b * rs[p, i]
                {x}[r, h * hd + half + i] = b * rc[p, i] + a * rs[p, i]
"""


ROPE = """\
    # RoPE, rotate-half pairing: angle(p, i) = p * theta^(-2i/hd), in float64
    half = hd // 2
    npos = max(nt, ns)
    rc = np.empty((npos, half), np.float32)
    rs = np.empty((npos, half), np.float32)
    for p in range(npos):
        for i in range(half):
            angle = p * theta ** (-2.0 * i / hd)
            rc[p, i] = np.cos(angle)
            rs[p, i] = np.sin(angle)
""" + _rotate("q", "nt", "heads") + _rotate("k", "ns", "kv_heads")

REL = "                    a += rel[buckets[i, j], h]\n"
BIAS = "                    a += bias[bn, bh, i * bi, j * bj]\n"
CAUSAL = """\
                    if j > i:
                        a = np.float32(-np.inf)
"""
CAUSAL_WINDOW = """\
                    if j > i or j <= i - window:  # Mistral's sliding window: the last `window` keys
                        a = np.float32(-np.inf)
"""

T5_BUCKET_OF = '''\
def t5_bucket_of(rel, num_buckets, max_distance, bidirectional):
    """T5's bucket of each relative position (key position - query position) in the int64 array rel."""
    bucket = np.zeros(rel.shape, np.int64)
    if bidirectional:
        num_buckets //= 2
        bucket += (rel > 0).astype(np.int64) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    safe = np.maximum(rel, 1).astype(np.float64)  # the log is only read where rel >= max_exact
    large = max_exact + (np.log(safe / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return bucket + np.where(rel < max_exact, rel, large)
'''

T5_BUCKETS = '''\
def t5_buckets(nq, nk, num_buckets, max_distance, bidirectional):
    """T5's bucket of (key position - query position) for every pair: an [nq, nk] int64 table."""
    rel = np.arange(nk, dtype=np.int64)[None, :] - np.arange(nq, dtype=np.int64)[:, None]
    return np.ascontiguousarray(t5_bucket_of(rel, num_buckets, max_distance, bidirectional))
'''


def t5_bucket_helper(ctx: NodeCtx, name: str = "t5_buckets", source: str = T5_BUCKETS) -> str:
    """Add a helper built on T5's one bucket rule (``t5_bucket_of``) to the module; its name."""
    ctx.helper("t5_bucket_of", T5_BUCKET_OF)
    return ctx.helper(name, source)


SIGNATURE = (A3, A3, A2, A1, A2, A1, A2, A1, A2, A1, A2, I2, A4, A3, I64, I64, F32, F64)


def attention_kernel(causal: bool, rope: bool, rel: bool, bias: bool, window: bool = False) -> Kernel:
    """The kernel of one configuration; a ``window`` kernel (causal only) takes the window's
    width as a last argument."""
    if window and not causal:
        raise AssertionError("a sliding window slides the causal mask")
    name = ("k_attention" + ("_causal" if causal else "") + ("_window" if window else "") + ("_rope" if rope else "")
            + ("_rel" if rel else "") + ("_bias" if bias else ""))
    mask = (CAUSAL_WINDOW if window else CAUSAL) if causal else ""
    src = ATTENTION.format(jit=JIT, name=name, rope=ROPE if rope else "", rel=REL if rel else "",
                           bias=BIAS if bias else "", causal=mask, window=", window" if window else "")
    return Kernel(name, src, SIGNATURE + ((I64,) if window else ()))


def bias_4d(ctx: NodeCtx, i: int) -> str:
    """Operand ``i`` (an additive attention bias of rank 2-4) viewed as 4-D."""
    shape = ctx.in_shape(i)
    return f"{ctx.args[i]}.reshape({shape_literal((1,) * (4 - len(shape)) + tuple(shape))})"


def render_attention(ctx: NodeCtx) -> None:
    causal, rope = bool(ctx.attr("causal", False)), bool(ctx.attr("rope", False))
    buckets_n = ctx.attr("rel_buckets")
    x = ctx.args[0]
    xs = ctx.in_shape(0)
    kv = ctx.args[1] if len(ctx.args) > 1 else x
    kvs = ctx.in_shape(1) if len(ctx.args) > 1 else xs
    heads = int(ctx.attr("heads"))
    kv_heads = int(attention_kv_heads(ctx.node.attrs))
    hd = ctx.weight_shape("wq")[0] // heads
    scale = score_scale(ctx.node.attrs, hd)
    theta = float(rope_theta(ctx.node.attrs))
    if kvs[0] != xs[0]:  # one key/value sequence for every query (shape inference allows only 1)
        kv = f"np.ascontiguousarray(np.broadcast_to({kv}, {shape_literal((xs[0],) + kvs[1:])}))"
    has_bias = len(ctx.args) > 2
    window = window_arg(ctx)
    k = ctx.kernel(attention_kernel(causal, rope, buckets_n is not None, has_bias, window is not None))
    bias = bias_4d(ctx, 2) if has_bias else "np.zeros((1, 1, 1, 1), np.float32)"
    if buckets_n is not None:
        helper = t5_bucket_helper(ctx)
        max_distance = int(rel_max_distance(ctx.node.attrs))
        rel = ctx.weight(REL_TABLE)
        buckets = f"{helper}({xs[1]}, {kvs[1]}, {int(buckets_n)}, {max_distance}, {not causal})"
    else:
        rel, buckets = "np.zeros((1, 1), np.float32)", "np.zeros((1, 1), np.int64)"
    d, dq, dkv = xs[-1], ctx.weight_shape("wq")[0], ctx.weight_shape("wk")[0]
    out = ctx.alloc()
    ctx.emit(f"{k}({x}, {kv}, wq={ctx.weight('wq')}, bq={ctx.weight_or_zeros('bq', dq)}, "
             f"wk={ctx.weight('wk')}, bk={ctx.weight_or_zeros('bk', dkv)}, "
             f"wv={ctx.weight('wv')}, bv={ctx.weight_or_zeros('bv', dkv)}, "
             f"wo={ctx.weight('wo')}, bo={ctx.weight_or_zeros('bo', d)}, rel={rel}, buckets={buckets}, "
             f"bias={bias}, out={out}, heads={heads}, kv_heads={kv_heads}, scale={f32_literal(scale)}, "
             f"theta={float_literal(theta)}" + ("" if window is None else f", window={window}") + ")")


T5_BIAS = '''\
def t5_bias(table, nq, nk, num_buckets, max_distance, bidirectional):
    """table[bucket(j - i), h] as a C-contiguous [1, heads, nq, nk] float32 array."""
    index = t5_buckets(nq, nk, num_buckets, max_distance, bidirectional)
    return np.ascontiguousarray(np.moveaxis(table[index], -1, 0)[None], dtype=np.float32)
'''


def render_rel_position_bias(ctx: NodeCtx) -> None:
    """A function of the table and the (static) lengths only: made once per weights dict."""
    t, s = ctx.out_shape()[2:]
    t5_bucket_helper(ctx)
    helper = ctx.helper("t5_bias", T5_BIAS)
    args = (f"{t}, {s}, {int(ctx.attr('buckets'))}, {int(ctx.attr('max_distance'))}, "
            f"{bool(ctx.attr('bidirectional'))}")
    table = ctx.derive(f"~t5_bias({ctx.weight_key('weight')}, {args})", f"{helper}({ctx.weight('weight')}, {args})")
    ctx.emit(f"{ctx.outs[0]} = {table}  # read-only: made by derive()")


RENDERERS = {"attention": render_attention, "rel_position_bias": render_rel_position_bias}
