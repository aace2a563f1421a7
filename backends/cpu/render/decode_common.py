"""Pieces the decoding kernels share (render/decode.py, render/decode_positions.py): the
projection loop, per-row reads of ``pos``/``valid``, stacked weights, and the error a kernel
returns for a row it cannot run."""

from __future__ import annotations

from irc.backends.cpu.render.context import NodeCtx
from irc.backends.literals import int_literal, str_literal

THREADS = "get_num_threads()"  # an argument: numba cannot cache a kernel that calls get_num_threads()
SERIAL_PROJ = 1 << 16  # multiply-adds of a projection below which it is one BLAS call on the calling thread


def proj(x: str, w: str, b: str, out: str) -> str:
    """Kernel text for ``out = x @ w.T + b`` on [rows, features] arrays: one single-threaded BLAS
    call per block of rows (many rows) or of columns (a few rows: a decode step splits the weight
    instead, and at SMALL_M rows or fewer dot_nt reads each weight row once for all of them rather than
    BLAS packing it), as the ``gemm`` kernels split theirs; a small one (or one thread) is a single call.
    Needs ``parts`` (the thread count) in scope, and dot_nt in the module (``use_dot_nt``)."""
    return f"""\
    pm, pn = {out}.shape
    if parts == 1 or pm * pn * {x}.shape[1] < {SERIAL_PROJ}:  # one call: a parallel region costs more
        np.dot({x}, {w}.T, {out})
        for i in range(pm):
            for j in range(pn):
                {out}[i, j] += {b}[j]
    elif pm >= 32 * parts or pn < 64 * parts:
        for blk in prange(parts):
            r0 = blk * pm // parts
            r1 = (blk + 1) * pm // parts
            if r1 > r0:
                o = {out}[r0:r1]
                np.dot({x}[r0:r1], {w}.T, o)
                for i in range(r1 - r0):
                    for j in range(pn):
                        o[i, j] += {b}[j]
    else:
        for blk in prange(parts):
            c0 = blk * pn // parts
            c1 = (blk + 1) * pn // parts
            if c1 > c0:
                tb = dot_nt({x}, {w}, c0, c1)
                for i in range(pm):
                    for j in range(c1 - c0):
                        {out}[i, c0 + j] = tb[i, j] + {b}[c0 + j]
"""


def row(arr: str, n: str) -> str:
    """Kernel text: ``arr`` [B] (or [1], broadcast) at row ``n``."""
    return f"{arr}[{n} if {arr}.size > 1 else 0]"


def positions(ctx: NodeCtx, i: int) -> str:
    """Operand ``i`` (pos or valid: integers [B]) as the int64 vector the kernels take."""
    return f"{ctx.args[i]}.reshape(-1).astype(np.int64)"


def raise_bad(ctx: NodeCtx, call: str, message: str) -> None:
    """Call a kernel that returns the first row it cannot run (or -1), and raise InputError with
    ``message`` (a helper call; ``{where}`` becomes the node's name) for that row."""
    where = str_literal(f"{ctx.node.op} '{ctx.node.outputs[0]}'")
    ctx.emit(f"bad = {call}")
    ctx.emit("if bad >= 0:")
    ctx.emit(f"    raise InputError({message.format(where=where)})")


def stacked(ctx: NodeCtx, names: tuple[str, ...], tag: str) -> str:
    """This node's weights ``names`` stacked by rows (one BLAS product for all), derived once per
    weights dict."""
    for nm in names:
        ctx.weight_shape(nm)  # an error when the node lacks one
    expr = "np.concatenate([" + ", ".join(ctx.weight(nm) for nm in names) + "])"
    return ctx.derive(f"~{tag}(" + ",".join(ctx.weight_key(nm) for nm in names) + ")", expr)


def stacked_bias(ctx: NodeCtx, pairs: tuple[tuple[str, str], ...], tag: str) -> str:
    """The biases of ``pairs`` (bias, the weight whose rows it offsets) stacked, zeros for a missing
    one (``bias=qv``); plain zeros, nothing derived, when the node has none."""
    sizes = [ctx.weight_shape(wname)[0] for _, wname in pairs]
    if not any(ctx.has_weight(bname) for bname, _ in pairs):
        return f"np.zeros({int_literal(int(sum(sizes)))}, np.float32)"
    items = [ctx.weight(bname) if ctx.has_weight(bname) else f"np.zeros({int_literal(int(n))}, np.float32)"
             for (bname, _), n in zip(pairs, sizes)]
    keys = [ctx.weight_key(bname) for bname, _ in pairs]
    return ctx.derive(f"~{tag}(" + ",".join(keys) + ")", "np.concatenate([" + ", ".join(items) + "])")


def check_f32(ctx: NodeCtx, indices: tuple[int, ...]) -> None:
    """Caches reach the kernels as float32 arrays, the caller's own (written in place): an f16
    cache would be converted, a copy, so it is refused here."""
    for i in indices:
        if ctx.in_types[i].dtype != "f32":
            raise ctx.error(f"operand {i} is {ctx.in_types[i]}: the CPU backend keeps caches in f32 only "
                            "(run an f16 cache on the numpy reference)")
