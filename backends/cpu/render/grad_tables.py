"""Gradients of tables: the token embedding's scatter-add, a learned position table's, T5's relative-position
buckets'.

``embedding_grad`` splits the feature axis over the threads: each task walks every position and adds its
row of ``dy`` into its block of columns of the table's gradient, so repeated ids (a tied unembedding's
frequent tokens) accumulate without two threads ever writing the same element.
"""

from __future__ import annotations

from irc.backends.common.kernel import A2, A3, I1, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.cpu.render.grad_moe import RENDERERS as MOE_GRAD
from irc.backends.literals import str_literal

JIT = jit()

EMBEDDING_GRAD = """\
{jit}
def k_embedding_grad(ids, dy, out, parts):
    vocab, d = out.shape
    for i in range(ids.size):  # every id is checked before any row is added
        if ids[i] < 0 or ids[i] >= vocab:
            return i
    blocks = min(parts, d)
    for c in prange(blocks):
        j0 = c * d // blocks
        j1 = (c + 1) * d // blocks
        for v in range(vocab):
            for j in range(j0, j1):
                out[v, j] = np.float32(0.0)
        for i in range(ids.size):
            t = ids[i]
            for j in range(j0, j1):
                out[t, j] += dy[i, j]
    return -1
"""


def render_embedding_grad(ctx: NodeCtx) -> None:
    from irc.backends.cpu.render.embedding import BAD_ID

    k = ctx.kernel(Kernel("k_embedding_grad", EMBEDDING_GRAD.format(jit=JIT), (I1, A2, A2, I64), returns=I64))
    helper = ctx.helper("bad_token_id", BAD_ID)
    ids, dy = ctx.args
    out = ctx.alloc()
    vocab, d = ctx.out_shape()
    where = str_literal(f"embedding_grad '{ctx.node.outputs[0]}'")
    ctx.emit(f"bad = {k}({ids}.reshape(-1).astype(np.int64), {dy}.reshape(-1, {d}), {out}, {THREADS})")
    ctx.emit("if bad >= 0:")
    ctx.emit(f"    raise InputError({helper}({where}, {ids}, bad, {vocab}))")


POSITION_GRAD = """\
{jit}
def k_position_grad(dy, out):
    # row t < T: Σ over the batch of dy[:, t]; rows past T: 0
    nb, nt, nd = dy.shape
    for t in prange(out.shape[0]):
        for j in range(nd):
            out[t, j] = np.float32(0.0)
        if t < nt:
            for n in range(nb):
                for j in range(nd):
                    out[t, j] += dy[n, t, j]
"""


def render_position_grad(ctx: NodeCtx) -> None:
    k = ctx.kernel(Kernel("k_position_grad", POSITION_GRAD.format(jit=JIT), (A3, A2)))
    out = ctx.alloc()
    ctx.emit(f"{k}({ctx.args[0]}, {out})")


REL_BIAS_GRAD = '''\
def rel_position_bias_grad(dy, num_buckets, max_distance, bidirectional, out):
    """out[k, h] = Σ dy[0, h, i, j] over the pairs (i, j) in T5 bucket k (a scatter-add, in float64)."""
    heads, nq, nk = dy.shape[1:]
    bucket = t5_buckets(nq, nk, num_buckets, max_distance, bidirectional).reshape(-1)
    acc = np.zeros((num_buckets, heads), np.float64)
    np.add.at(acc, bucket, dy[0].reshape(heads, -1).T.astype(np.float64))
    np.copyto(out, acc)
'''


def render_rel_position_bias_grad(ctx: NodeCtx) -> None:
    from irc.backends.cpu.render.attention import t5_bucket_helper

    t5_bucket_helper(ctx)
    helper = ctx.helper("rel_position_bias_grad", REL_BIAS_GRAD)
    out = ctx.alloc()
    ctx.emit(f"{helper}({ctx.args[0]}, {int(ctx.attr('buckets'))}, {int(ctx.attr('max_distance'))}, "
             f"{bool(ctx.attr('bidirectional'))}, {out})")


RENDERERS = {
    "embedding_grad": render_embedding_grad,
    "position_grad": render_position_grad,
    "rel_position_bias_grad": render_rel_position_bias_grad,
    **MOE_GRAD,  # the experts' tables of matrices (grad_moe.py)
}
