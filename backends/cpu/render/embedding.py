"""Token embeddings (with an id range check) and positional encodings."""

from __future__ import annotations

from irc.backends.common.kernel import A2, A3, I1, I64, Kernel
from irc.backends.common.module_text import BAD_TOKEN_ID
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.literals import str_literal

JIT = jit()

EMBEDDING = """\
{jit}
def k_embedding(ids, table, out):
    vocab = table.shape[0]
    for i in range(ids.size):  # every id is checked before any row is copied
        if ids[i] < 0 or ids[i] >= vocab:
            return i
    for i in prange(ids.size):
        t = ids[i]
        for j in range(table.shape[1]):
            out[i, j] = table[t, j]
    return -1
"""

BAD_ID = '''\
def bad_token_id(where, ids, position, vocab):
    """The message for a token id outside the table (``where`` names the node)."""
    token = int(ids.reshape(-1)[position])
    return ''' + BAD_TOKEN_ID + '''
'''


def render_embedding(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_embedding", EMBEDDING.format(jit=JIT), (I1, A2, A2), returns=I64))
    helper = ctx.helper("bad_token_id", BAD_ID)
    ids = ctx.args[0]
    out = ctx.alloc()
    shape = ctx.out_shape()
    vocab = ctx.weight_shape("weight")[0]
    where = str_literal(f"embedding '{ctx.node.outputs[0]}'")
    ctx.emit(f"bad = {k}({ids}.reshape(-1).astype(np.int64), {ctx.weight('weight')}, {ctx.rows(out, shape)})")
    ctx.emit("if bad >= 0:")
    ctx.emit(f"    raise InputError({helper}({where}, {ids}, bad, {vocab}))")


POS_LEARNED = """\
{jit}
def k_pos_learned(x, table, out):
    nb, nt, nd = x.shape
    for t in prange(nt):
        for n in range(nb):
            for j in range(nd):
                out[n, t, j] = x[n, t, j] + table[t, j]
"""

POS_SINUSOIDAL = """\
{jit}
def k_pos_sinusoidal(x, out):
    nb, nt, nd = x.shape
    for t in prange(nt):
        for i in range(nd // 2):
            # P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(...): angles in float64
            angle = t / 10000.0 ** (2.0 * i / nd)
            s = np.float32(np.sin(angle))
            c = np.float32(np.cos(angle))
            for n in range(nb):
                out[n, t, 2 * i] = x[n, t, 2 * i] + s
                out[n, t, 2 * i + 1] = x[n, t, 2 * i + 1] + c
"""


POS_SINUSOIDAL_CONCAT = """\
{jit}
def k_pos_sinusoidal_concat(x, out):
    nb, nt, nd = x.shape
    half = nd // 2
    step = np.log(10000.0) / (half - 1)  # Whisper's log-timescale increment (half >= 2: shape inference)
    for t in prange(nt):
        for i in range(half):
            # P[t, i] = sin(t * exp(-i * step)), P[t, half + i] = cos(...): angles in float64
            angle = t * np.exp(-step * i)
            s = np.float32(np.sin(angle))
            c = np.float32(np.cos(angle))
            for n in range(nb):
                out[n, t, i] = x[n, t, i] + s
                out[n, t, half + i] = x[n, t, half + i] + c
"""


def render_positional(ctx: NodeCtx) -> None:
    out = ctx.alloc()
    x = ctx.args[0]
    if ctx.attr("kind", "sinusoidal") == "learned":
        k = ctx.kernel(Kernel("k_pos_learned", POS_LEARNED.format(jit=JIT), (A3, A2, A3)))
        ctx.emit(f"{k}({x}, {ctx.weight('weight')}, {out})")
    elif ctx.attr("layout") == "concat":
        k = ctx.kernel(Kernel("k_pos_sinusoidal_concat", POS_SINUSOIDAL_CONCAT.format(jit=JIT), (A3, A3)))
        ctx.emit(f"{k}({x}, {out})")
    else:
        k = ctx.kernel(Kernel("k_pos_sinusoidal", POS_SINUSOIDAL.format(jit=JIT), (A3, A3)))
        ctx.emit(f"{k}({x}, {out})")


RENDERERS = {
    "embedding": render_embedding,
    "positional": render_positional,
}
