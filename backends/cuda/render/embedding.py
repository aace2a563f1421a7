"""Token embeddings (a gather; ids checked on the host first) and positional encodings."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, I1, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx
from irc.backends.literals import int_literal, str_literal

GATHER = f"""\
{JIT}
def k_embedding(ids, table, out, n, d):
    i = cuda.grid(1)
    if i < n:
        out[i] = table[ids[i // d], i % d]
"""
GATHER_KERNEL = Kernel("k_embedding", GATHER, (I1, A2, A1, I64, I64))


def render_embedding(ctx: Ctx) -> None:
    table = ctx.weight("weight")
    vocab, d = ctx.params["weight"]
    ids = ctx.ins[0]
    host = ctx.parts.host_inputs.get(ids, f"V[{ids}].copy_to_host()")  # computed ids: fetched to check
    where = str_literal(f"embedding '{ctx.node.outputs[0]}'")
    ctx.emit(f"check_ids({host}, {int_literal(vocab)}, {where})")
    out = ctx.alloc()
    n = prod(ctx.out_shape())
    grid, block = ctx.flat_grid(n)
    ctx.launch(ctx.kernel(GATHER_KERNEL), grid, block, [ctx.F(0), ctx.v(table), ctx.f(out), ctx.i(n), ctx.i(d)])


ADD_TABLE = f"""\
{JIT}
def k_add_positions(x, table, out, n, t_len, d):
    i = cuda.grid(1)
    if i < n:
        out[i] = x[i] + table[(i // d) % t_len, i % d]
"""
ADD_TABLE_KERNEL = Kernel("k_add_positions", ADD_TABLE, (A1, A2, A1, I64, I64, I64))


def render_positional(ctx: Ctx) -> None:
    """x + P[:T]: a learned table, or the sinusoidal one computed once (float64, then float32)."""
    ctx.need_float()
    shape = ctx.in_shape()
    t, d = shape[-2], shape[-1]
    if ctx.attr("kind", "sinusoidal") == "learned":
        table = ctx.weight("weight")
    elif ctx.attr("layout") == "concat":
        table = ctx.derive(f"sinusoidal_concat({int_literal(t)}, {int_literal(d)})", (t, d))
        ctx.parts.helper("sinusoidal_concat", SINUSOIDAL_CONCAT)
    else:
        table = ctx.derive(f"sinusoidal({int_literal(t)}, {int_literal(d)})", (t, d))
        ctx.parts.helper("sinusoidal", SINUSOIDAL)
    out = ctx.alloc()
    n = prod(shape)
    grid, block = ctx.flat_grid(n)
    ctx.launch(ctx.kernel(ADD_TABLE_KERNEL), grid, block,
               [ctx.F(0), ctx.v(table), ctx.f(out), ctx.i(n), ctx.i(t), ctx.i(d)])


SINUSOIDAL = '''\
def sinusoidal(length, width):
    """P[p, 2i] = sin(p / 10000^(2i/D)), P[p, 2i+1] = cos(...), as the reference computes it."""
    from irc.backends.numpy_ref.embedding import sinusoidal as table

    return table(length, width, np.float32)
'''

SINUSOIDAL_CONCAT = '''\
def sinusoidal_concat(length, width):
    """Whisper's [sin | cos] table, as the reference computes it."""
    from irc.backends.numpy_ref.embedding import sinusoidal_concat as table

    return table(length, width, np.float32)
'''


RENDERERS = {
    "embedding": render_embedding,
    "positional": render_positional,
}
