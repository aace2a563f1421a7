"""Positions read at each row's offset, for the decoding graphs (irc/ops/decode.py):
``positional_at`` (a learned or sinusoidal table at pos[b] + t) and ``rel_position_bias_at``
(T5's bias for queries at pos[b] + t against every cache slot).

Both are a few thousand elements per decode step, so their kernels are serial: a parallel
region costs more than they do. A row whose position the op cannot read (negative, or past a
learned table) returns its index, and the driver raises InputError naming it.
"""

from __future__ import annotations

from irc.backends.common.kernel import A2, A3, A4, I1, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.attention import t5_bucket_helper
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.decode_common import positions, raise_bad, row

JIT = jit(parallel=False)

POS_AT_LEARNED = """\
{jit}
def k_positional_at_learned(x, table, pos, out):
    nb, nt, nd = x.shape
    for n in range(nb):  # a position past the table is an error, not a read out of bounds
        if {pos_n} < 0 or {pos_n} + nt > table.shape[0]:
            return n
    for r in range(nb * nt):
        at = {pos_r} + r % nt
        for j in range(nd):
            out[r // nt, r % nt, j] = x[r // nt, r % nt, j] + table[at, j]
    return -1
"""

POS_AT_SINUSOIDAL = """\
{jit}
def k_positional_at_sinusoidal(x, pos, out):
    # P[p, 2i] = sin(p / 10000^(2i/D)), P[p, 2i+1] = cos(...) at p = pos[b] + t: angles in float64
    nb, nt, nd = x.shape
    for n in range(nb):
        if {pos_n} < 0:
            return n
    for r in range(nb * nt):
        at = np.float64({pos_r} + r % nt)
        for i in range(nd // 2):
            angle = at / 10000.0 ** (2.0 * i / nd)
            out[r // nt, r % nt, 2 * i] = x[r // nt, r % nt, 2 * i] + np.float32(np.sin(angle))
            out[r // nt, r % nt, 2 * i + 1] = x[r // nt, r % nt, 2 * i + 1] + np.float32(np.cos(angle))
    return -1
"""

POS_AT_CONCAT = """\
{jit}
def k_positional_at_concat(x, pos, out):
    # Whisper's [sin | cos]: P[p, i] = sin(p * exp(-i * log(10000) / (D/2 - 1))) at p = pos[b] + t
    nb, nt, nd = x.shape
    half = nd // 2
    step = np.log(10000.0) / (half - 1)
    for n in range(nb):
        if {pos_n} < 0:
            return n
    for r in range(nb * nt):
        at = np.float64({pos_r} + r % nt)
        for i in range(half):
            angle = at * np.exp(-step * i)
            out[r // nt, r % nt, i] = x[r // nt, r % nt, i] + np.float32(np.sin(angle))
            out[r // nt, r % nt, half + i] = x[r // nt, r % nt, half + i] + np.float32(np.cos(angle))
    return -1
"""

BAD_OFFSET = '''\
def bad_offset(where, pos, row, limit):
    """The message for a row whose positions fall outside what the op can read."""
    p = int(pos.reshape(-1)[row if pos.size > 1 else 0])
    if limit is None:
        return f"{where}: row {row} starts at position {p}, which is negative"
    return f"{where}: row {row} starts at position {p}, outside [0, {limit}]"
'''


def render_positional_at(ctx: NodeCtx) -> None:
    fmt = {"jit": JIT, "pos_n": row("pos", "n"), "pos_r": row("pos", "r // nt")}
    helper = ctx.helper("bad_offset", BAD_OFFSET)
    out = ctx.alloc(0)
    x, pos = ctx.args[0], positions(ctx, 1)
    t = ctx.in_shape(0)[1]
    if ctx.attr("kind", "sinusoidal") == "learned":
        k = ctx.kernel(Kernel("k_positional_at_learned", POS_AT_LEARNED.format(**fmt), (A3, A2, I1, A3),
                              returns=I64))
        rows = ctx.weight_shape("weight")[0]
        raise_bad(ctx, f"{k}({x}, {ctx.weight('weight')}, {pos}, {out})",
                  f"{helper}({{where}}, {ctx.args[1]}, bad, {rows - t})")
        return
    concat = ctx.attr("layout") == "concat"
    name = "k_positional_at_concat" if concat else "k_positional_at_sinusoidal"
    k = ctx.kernel(Kernel(name, (POS_AT_CONCAT if concat else POS_AT_SINUSOIDAL).format(**fmt), (A3, I1, A3),
                          returns=I64))
    raise_bad(ctx, f"{k}({x}, {pos}, {out})", f"{helper}({{where}}, {ctx.args[1]}, bad, None)")


T5_REL_LINE = '''\
def t5_rel_line(table, nq, nk, num_buckets, max_distance, bidirectional):
    """table[bucket(r), h] for every relative position r = j - i, j < nk, i < nq (row r + nq - 1):
    a C-contiguous [nq + nk - 1, heads] float32 array."""
    rel = np.arange(-(nq - 1), nk, dtype=np.int64)
    return np.ascontiguousarray(table[t5_bucket_of(rel, num_buckets, max_distance, bidirectional)], dtype=np.float32)
'''

REL_AT = """\
{jit}
def k_rel_position_bias_at(line, pos, out, nq):
    # out[b, h, t, j] = line[j - (pos[b] + t) + nq - 1, h]: queries at pos[b] + t < nq, keys j
    nb, nh, nt, nk = out.shape
    for n in range(nb):
        if {pos_n} < 0 or {pos_n} + nt > nq:
            return n
    for n in range(nb):
        for h in range(nh):
            for t in range(nt):
                base = nq - 1 - ({pos_n} + t)
                for j in range(nk):
                    out[n, h, t, j] = line[base + j, h]
    return -1
"""


def render_rel_position_bias_at(ctx: NodeCtx) -> None:
    """The bias of every relative position is made once per weights dict (derive()); a call
    only reads each row's band of it at its offset."""
    _, _, t, keys = ctx.out_shape()
    nq = keys + t  # a query may sit at any position up to keys + T - 1 (pos <= keys)
    helper = t5_bucket_helper(ctx, "t5_rel_line", T5_REL_LINE)
    args = (f"{nq}, {keys}, {int(ctx.attr('buckets'))}, {int(ctx.attr('max_distance'))}, "
            f"{bool(ctx.attr('bidirectional'))}")
    line = ctx.derive(f"~t5_rel_line({ctx.weight_key('weight')}, {args})", f"{helper}({ctx.weight('weight')}, {args})")
    k = ctx.kernel(Kernel("k_rel_position_bias_at", REL_AT.format(jit=JIT, pos_n=row("pos", "n")),
                          (A2, I1, A4, I64), returns=I64))
    bad = ctx.helper("bad_offset", BAD_OFFSET)
    out = ctx.alloc(0)
    raise_bad(ctx, f"{k}({line}, {positions(ctx, 1)}, {out}, {nq})", f"{bad}({{where}}, {ctx.args[1]}, bad, {keys})")


RENDERERS = {"positional_at": render_positional_at, "rel_position_bias_at": render_rel_position_bias_at}
