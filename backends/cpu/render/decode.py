"""The incremental-decoding ops (irc/ops/decode.py): attention over a KV cache updated in place,
and an encoder-decoder's cross-attention over keys and values made once (positions at an
offset are in render/decode_positions.py).

``cached_attention`` is one kernel per configuration (RoPE, a sliding window, a score bias):
the Q/K/V projection as one BLAS product over the stacked weights (split over Numba's threads
by rows or columns, as ``gemm`` splits), RoPE at the absolute positions pos[b] + t, then one
task per (row, head, 64-query tile) that scores its queries against the cache's filled slots
(one BLAS call over slots 0 .. min(pos, slots) − 1: the filled part only, never the whole
buffer) and against the new keys (a second call), takes one softmax over both and the two value
products. Only then are the valid[b] new keys and values written into the cache (after every
read: in a rolling buffer a new key may take the slot of a key an earlier query of the same
call reads), and the output projection runs. A rolling buffer (Mistral's window W) keeps
position p in slot p mod W; slot order does not matter to a softmax, so each slot is masked by
the position it holds (the latest one below pos with its residue), never gathered into order.

A decode step's attention is a few thousand multiply-adds a head: its tasks then run on the
calling thread (a parallel region would cost more than they do), and over Numba's threads only
when the work is large (a long prompt, a long context at B = 8). Positions and valid lengths
are checked before anything is written: a row that would write past its buffer is returned and
the driver raises InputError naming it. Caches are float32 (the backend's one float type).
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, F32, F64, I1, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import decode_positions
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.decode_common import (
    THREADS,
    check_f32,
    positions,
    proj,
    raise_bad,
    row,
    stacked,
    stacked_bias,
)
from irc.backends.cpu.render.gemm import use_dot_nt
from irc.backends.literals import f32_literal, float_literal, int_literal, shape_literal
from irc.ops.attention import head_dim, rope_theta, score_scale

JIT = jit()
DEVICE_JIT = '@njit(cache=True, error_model="numpy")'
TILE_Q = 64  # queries per attention task
SERIAL_WORK = 1 << 18  # multiply-adds of attention below which its tasks run on the calling thread


def _tasks(call: str) -> str:
    """Kernel text running ``call`` (with ``{qs}``: a query tile buffer) for every (row, head, query
    tile) task: serially when the work is small, else task i on thread i mod parts."""

    def loop(indent: str, qs: str) -> str:
        return "".join(indent + line + "\n" for line in (
            "qt = task % nqt", "h = (task // nqt) % heads", "n = task // (nqt * heads)", call.format(qs=qs)))

    return f"""\
    nqt = (nt + {TILE_Q} - 1) // {TILE_Q}
    tasks = nb * heads * nqt
    if tasks * min(nt, {TILE_Q}) * (keys + nt) * hd < {SERIAL_WORK}:
        tile = np.empty(({TILE_Q}, hd), np.float32)
        for task in range(tasks):
{loop(" " * 12, "tile")}\
    else:
        for part in prange(parts):
            qs = np.empty(({TILE_Q}, hd), np.float32)  # each thread's own
            for task in range(part, tasks, parts):
{loop(" " * 16, "qs")}\
"""


ROPE = f"""\
    # RoPE (rotate-half pairs) of q and k at the absolute position pos[b] + t: float64 angles
    half = hd // 2
    freq = np.empty(half, np.float64)
    for i in range(half):
        freq[i] = theta ** (-2.0 * i / hd)
    for r in range(m):
        at = np.float64({row("pos", "r // nt")} + r % nt)
        for i in range(half):
            co = np.float32(np.cos(at * freq[i]))
            si = np.float32(np.sin(at * freq[i]))
            for col in range(heads + ng):  # the query heads, then the key heads
                a = qkv[r, col * hd + i]
                bb = qkv[r, col * hd + half + i]
                qkv[r, col * hd + i] = a * co - bb * si
                qkv[r, col * hd + half + i] = bb * co + a * si
"""

# one task: queries i0 .. i0+mq-1 of row n against head h's cached slots and the new keys
ATTEND = """\
{jit}
def {name}(qkv, kc, vc, kn, vn, bias, heads_out, qs, n, h, p, c, i0, mq, nt, group, scale{window}):
    ns, hd = kc.shape[2], kc.shape[3]
    g = h // group  # query head h reads kv head h // group (GQA, MQA)
    for r in range(mq):  # the query tile, pre-scaled
        for d in range(hd):
            qs[r, d] = qkv[n * nt + i0 + r, h * hd + d] * scale
    qm = qs[:mq]
    filled = min(p, ns)  # cached slots: positions 0 .. p-1, or the rolling buffer's last W
    jend = min(c, i0 + mq)  # the new keys some query of the tile may see
    sp = np.empty((mq, filled), np.float32)
    sn = np.empty((mq, jend), np.float32)
    if filled > 0:
        np.dot(qm, kc[n, g, :filled].T, sp)
    if jend > 0:
        np.dot(qm, kn[n, g, :jend].T, sn)
    for r in range(mq):
        qp = p + i0 + r  # the query's absolute position
{bias_setup}\
        top = np.float32(-np.inf)
        for s in range(filled):
            kp = {key_position}
            a = sp[r, s]
{past_mask}{past_bias}\
            sp[r, s] = a
            top = a if a > top else top
        for j in range(jend):
            a = sn[r, j]
            if j > i0 + r{new_window}:
                a = np.float32(-np.inf)
{new_bias}\
            sn[r, j] = a
            top = a if a > top else top
        if top == np.float32(-np.inf):  # no key to attend to (a padded query): zeros, never NaN
            for s in range(filled):
                sp[r, s] = np.float32(0.0)
            for j in range(jend):
                sn[r, j] = np.float32(0.0)
            continue
        total = np.float32(0.0)
        for s in range(filled):
            e = np.exp(sp[r, s] - top)
            sp[r, s] = e
            total += e
        for j in range(jend):
            e = np.exp(sn[r, j] - top)
            sn[r, j] = e
            total += e
        inv = np.float32(1.0) / total
        for s in range(filled):
            sp[r, s] *= inv
        for j in range(jend):
            sn[r, j] *= inv
    acc = np.zeros((mq, hd), np.float32)
    if filled > 0:
        np.dot(sp, vc[n, g, :filled], acc)
    if jend > 0:
        pv = np.dot(sn, vn[n, g, :jend])
        for r in range(mq):
            for d in range(hd):
                acc[r, d] += pv[r, d]
    for r in range(mq):
        for d in range(hd):
            heads_out[n * nt + i0 + r, h * hd + d] = acc[r, d]
"""

BIAS_SETUP = """\
        bn = n if bias.shape[0] > 1 else 0  # the bias broadcasts: a size-1 axis is read at 0
        bh = h if bias.shape[1] > 1 else 0
        bi = i0 + r if bias.shape[2] > 1 else 0
        bj = 1 if bias.shape[3] > 1 else 0
"""
PAST_MASK_WINDOW = """\
            if kp <= qp - window:  # older than the query's window
                a = np.float32(-np.inf)
"""
PAST_BIAS = "            a += bias[bn, bh, bi, kp * bj]  # its columns are absolute key positions\n"
NEW_BIAS = "            a += bias[bn, bh, bi, (p + j) * bj]\n"

CACHED = """\
{jit}
def {name}(x, w, b, wo, bo, kc, vc, pos, valid, bias, out, heads, scale, theta, {window}parts):
    nb, nt, nd = x.shape
    ng, ns, hd = kc.shape[1], kc.shape[2], kc.shape[3]
    nq = heads * hd
    nk = ng * hd
    keys = 0  # the most cached slots a row reads
    for n in range(nb):  # every row's position is checked before anything is written
        chk_p = {pos_n}
        chk_c = {valid_n}
        if chk_p < 0 or chk_c < 0 or chk_c > nt{limit}:
            return n
        keys = max(keys, min(chk_p, ns))
    m = nb * nt
    qkv = np.empty((m, nq + 2 * nk), np.float32)
    x2 = x.reshape(m, nd)
{proj_in}\
{rope}\
    # the new keys and values by kv head, contiguous for the score and value products
    kn = np.empty((nb, ng, nt, hd), np.float32)
    vn = np.empty((nb, ng, nt, hd), np.float32)
    for r in range(m):
        for g in range(ng):
            for d in range(hd):
                kn[r // nt, g, r % nt, d] = qkv[r, nq + g * hd + d]
                vn[r // nt, g, r % nt, d] = qkv[r, nq + nk + g * hd + d]
    heads_out = np.empty((m, nq), np.float32)
{tasks}\
    # every read is done: store each row's valid new keys and values (in place)
    for n in range(nb):
        wp = {pos_n}
        wc = {valid_n}
        keep = {keep}
        for t in range(wc - keep, wc):
            slot = {slot}
            for g in range(ng):
                for d in range(hd):
                    kc[n, g, slot, d] = kn[n, g, t, d]
                    vc[n, g, slot, d] = vn[n, g, t, d]
    o2 = out.reshape(m, nd)
{proj_out}\
    return -1
"""

SIGNATURE = (A3, A2, A1, A2, A1, A4, A4, I1, I1, A4, A3, I64, F32, F64)


def _suffix(window: bool, bias: bool) -> str:
    return ("_window" if window else "") + ("_bias" if bias else "")


def attend_source(window: bool, bias: bool) -> tuple[str, str]:
    """The task function of one configuration: (name, source)."""
    name = "cached_attend" + _suffix(window, bias)
    src = ATTEND.format(
        jit=DEVICE_JIT, name=name, window=", window" if window else "",
        key_position="p - 1 - (p - 1 - s) % ns" if window else "s",  # a rolling slot holds the latest residue
        bias_setup=BIAS_SETUP if bias else "", past_mask=PAST_MASK_WINDOW if window else "",
        past_bias=PAST_BIAS if bias else "", new_window=" or j <= i0 + r - window" if window else "",
        new_bias=NEW_BIAS if bias else "")
    return name, src


def cached_kernel(rope: bool, window: bool, bias: bool) -> Kernel:
    """The kernel of one configuration (it calls ``attend_source(window, bias)``'s function); a
    ``window`` kernel takes W as an argument before ``parts``."""
    name = "k_cached_attention" + ("_rope" if rope else "") + _suffix(window, bias)
    attend, _ = attend_source(window, bias)
    pos_n, valid_n = row("pos", "n"), row("valid", "n")
    call = (f"{attend}(qkv, kc, vc, kn, vn, bias, heads_out, {{qs}}, n, h, {pos_n}, {valid_n}, qt * {TILE_Q}, "
            f"min(qt * {TILE_Q} + {TILE_Q}, nt) - qt * {TILE_Q}, nt, heads // ng, scale{', window' if window else ''})")
    src = CACHED.format(
        jit=JIT, name=name, window="window, " if window else "", pos_n=pos_n, valid_n=valid_n,
        limit="" if window else " or chk_p + chk_c > ns",
        proj_in=proj("x2", "w", "b", "qkv"), proj_out=proj("heads_out", "wo", "bo", "o2"),
        rope=ROPE if rope else "", tasks=_tasks(call),
        keep="min(wc, ns)  # of a chunk longer than the buffer only the last W stay" if window else "wc",
        slot="(wp + t) % ns" if window else "wp + t")
    return Kernel(name, src, SIGNATURE + ((I64,) if window else ()) + (I64,), returns=I64)


BAD_POSITION = '''\
def bad_position(where, pos, valid, row, slots, window):
    """The message for a row whose position or valid count does not fit its cache."""
    p = int(pos.reshape(-1)[row if pos.size > 1 else 0])
    c = int(valid.reshape(-1)[row if valid.size > 1 else 0])
    room = f"a rolling buffer of {slots} slots" if window else f"a cache of {slots} slots"
    return (f"{where}: row {row} holds pos {p} and writes valid {c} new tokens, which does not fit {room} "
            f"(pos >= 0, 0 <= valid <= T" + ("" if window else ", pos + valid <= slots") + ")")
'''


def _bias_4d(ctx: NodeCtx, i: int) -> str:
    """Operand ``i`` (an additive score bias of rank 2-4) viewed as 4-D, or a zero [1, 1, 1, 1]
    placeholder when the node has none (the kernel of that configuration never reads it)."""
    if len(ctx.args) <= i:
        return "np.zeros((1, 1, 1, 1), np.float32)"
    shape = ctx.in_shape(i)
    return f"{ctx.args[i]}.reshape({shape_literal((1,) * (4 - len(shape)) + tuple(shape))})"


def render_cached_attention(ctx: NodeCtx) -> None:
    a = ctx.node.attrs
    check_f32(ctx, (1, 2))
    d = ctx.in_shape(0)[-1]
    hd = head_dim(a, d)
    window = a.get("window")
    has_bias = len(ctx.args) > 5
    ctx.parts.device(*attend_source(window is not None, has_bias))
    use_dot_nt(ctx.parts)
    k = ctx.kernel(cached_kernel(bool(a.get("rope")), window is not None, has_bias))
    helper = ctx.helper("bad_position", BAD_POSITION)
    w = stacked(ctx, ("wq", "wk", "wv"), "qkv")
    b = stacked_bias(ctx, (("bq", "wq"), ("bk", "wk"), ("bv", "wv")), "qkv_bias")
    bias = _bias_4d(ctx, 5)
    out = ctx.alloc(0)
    win = "" if window is None else f"{int_literal(int(window))}, "
    call = (f"{k}({ctx.args[0]}, {w}, {b}, {ctx.weight('wo')}, {ctx.weight_or_zeros('bo', d)}, {ctx.args[1]}, "
            f"{ctx.args[2]}, {positions(ctx, 3)}, {positions(ctx, 4)}, {bias}, {out}, {int(a['heads'])}, "
            f"{f32_literal(score_scale(a, hd))}, {float_literal(float(rope_theta(a)))}, {win}{THREADS})")
    raise_bad(ctx, call, f"{helper}({{where}}, {ctx.args[3]}, {ctx.args[4]}, bad, {ctx.in_shape(1)[2]}, "
                         f"{window is not None})")
    ctx.emit(f"{ctx.outs[1]}, {ctx.outs[2]} = {ctx.args[1]}, {ctx.args[2]}  # the caches, updated in place")


CROSS_KV = """\
{jit}
def k_cross_kv(mem, w, b, k, v, parts):
    # [k | v] = mem @ [wk; wv].T + [bk; bv], then each row's heads into [B, G, S, hd]
    nb, ns, nd = mem.shape
    ng, hd = k.shape[1], k.shape[3]
    nk = ng * hd
    m = nb * ns
    kv = np.empty((m, 2 * nk), np.float32)
    x2 = mem.reshape(m, nd)
{proj}\
    for r in range(m):
        for g in range(ng):
            for d in range(hd):
                k[r // ns, g, r % ns, d] = kv[r, g * hd + d]
                v[r // ns, g, r % ns, d] = kv[r, nk + g * hd + d]
"""


def render_cross_kv(ctx: NodeCtx) -> None:
    if ctx.attr("dtype", "f32") != "f32":
        raise ctx.error("stores keys and values in f16: the CPU backend keeps them in f32 only "
                        "(run an f16 cache on the numpy reference)")
    use_dot_nt(ctx.parts)
    k = ctx.kernel(Kernel("k_cross_kv", CROSS_KV.format(jit=JIT, proj=proj("x2", "w", "b", "kv")),
                          (A3, A2, A1, A4, A4, I64)))
    w = stacked(ctx, ("wk", "wv"), "kv")
    b = stacked_bias(ctx, (("bk", "wk"), ("bv", "wv")), "kv_bias")
    ko, vo = ctx.alloc(0), ctx.alloc(1)
    ctx.emit(f"{k}({ctx.args[0]}, {w}, {b}, {ko}, {vo}, {THREADS})")


CROSS_ATTEND = """\
{jit}
def {name}(q, k, v, bias, heads_out, qs, n, h, i0, mq, nt, group, scale):
    # softmax(q k^T * scale [+ bias]) v over every encoder position (the bias: its padding mask)
    ns, hd = k.shape[2], k.shape[3]
    g = h // group
    for r in range(mq):
        for d in range(hd):
            qs[r, d] = q[n * nt + i0 + r, h * hd + d] * scale
    s = np.dot(qs[:mq], k[n, g].T)
    for r in range(mq):
{bias}\
        top = np.float32(-np.inf)
        for j in range(ns):
            top = s[r, j] if s[r, j] > top else top
        if top == np.float32(-np.inf):  # every key masked: zeros, never NaN
            for j in range(ns):
                s[r, j] = np.float32(0.0)
            continue
        total = np.float32(0.0)
        for j in range(ns):
            e = np.exp(s[r, j] - top)
            s[r, j] = e
            total += e
        inv = np.float32(1.0) / total
        for j in range(ns):
            s[r, j] *= inv
    acc = np.dot(s, v[n, g])
    for r in range(mq):
        for d in range(hd):
            heads_out[n * nt + i0 + r, h * hd + d] = acc[r, d]
"""

CROSS_BIAS = BIAS_SETUP + """\
        for j in range(ns):
            s[r, j] += bias[bn, bh, bi, j * bj]
"""

CROSS_ATTENTION = """\
{jit}
def {name}(x, wq, bq, wo, bo, k, v, bias, out, heads, scale, parts):
    nb, nt, nd = x.shape
    ng, keys, hd = k.shape[1], k.shape[2], k.shape[3]
    nq = heads * hd
    m = nb * nt
    q = np.empty((m, nq), np.float32)
    x2 = x.reshape(m, nd)
{proj_in}\
    heads_out = np.empty((m, nq), np.float32)
{tasks}\
    o2 = out.reshape(m, nd)
{proj_out}\
"""


def render_cached_cross_attention(ctx: NodeCtx) -> None:
    a = ctx.node.attrs
    check_f32(ctx, (1, 2))
    d = ctx.in_shape(0)[-1]
    hd = head_dim(a, d)
    has_bias = len(ctx.args) > 3
    attend = "cross_attend" + ("_bias" if has_bias else "")
    ctx.parts.device(attend, CROSS_ATTEND.format(jit=DEVICE_JIT, name=attend, bias=CROSS_BIAS if has_bias else ""))
    call = (f"{attend}(q, k, v, bias, heads_out, {{qs}}, n, h, qt * {TILE_Q}, min(qt * {TILE_Q} + {TILE_Q}, nt) - "
            f"qt * {TILE_Q}, nt, heads // ng, scale)")
    name = "k_cached_cross_attention" + ("_bias" if has_bias else "")
    use_dot_nt(ctx.parts)
    src = CROSS_ATTENTION.format(jit=JIT, name=name, proj_in=proj("x2", "wq", "bq", "q"), tasks=_tasks(call),
                                 proj_out=proj("heads_out", "wo", "bo", "o2"))
    k = ctx.kernel(Kernel(name, src, (A3, A2, A1, A2, A1, A4, A4, A4, A3, I64, F32, I64)))
    bias = _bias_4d(ctx, 3)
    out = ctx.alloc(0)
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.weight('wq')}, {ctx.weight_or_zeros('bq', ctx.weight_shape('wq')[0])}, "
             f"{ctx.weight('wo')}, {ctx.weight_or_zeros('bo', d)}, {ctx.args[1]}, {ctx.args[2]}, {bias}, {out}, "
             f"{int(a['heads'])}, {f32_literal(score_scale(a, hd))}, {THREADS})")


RENDERERS = {
    "cached_attention": render_cached_attention,
    "cross_kv": render_cross_kv,
    "cached_cross_attention": render_cached_cross_attention,
    **decode_positions.RENDERERS,
}
