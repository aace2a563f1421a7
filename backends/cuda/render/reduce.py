"""Block-wide reductions as kernel text, in the two paths every reducing kernel has.

``shuffle``: each warp folds its 32 lanes with ``shfl_xor_sync``, lane 0 writes the warp's
partial to shared memory, and every thread adds the (at most 32) partials. ``shared``: a
shared-memory tree over the whole block, which numba's simulator can run (it has no
shuffles). Both leave the block's total in the variable on every thread.

Maxima propagate NaN as NumPy's ``max`` does: ``a`` wins when ``a > m`` or ``a`` is NaN.
"""

from __future__ import annotations

FULL_MASK = "0xFFFFFFFF"


def combine(op: str, acc: str, other: str) -> str:
    """``acc = acc (op) other`` as a statement."""
    if op == "sum":
        return f"{acc} = {acc} + {other}"
    if op == "max":
        return f"{acc} = {other} if ({other} > {acc} or {other} != {other}) else {acc}"
    if op == "fmax":  # no NaN rule, no branch
        return f"{acc} = max({acc}, {other})"
    raise AssertionError(op)


def buffer_size(path: str, threads: int) -> int:
    """Floats of shared memory one reduction needs."""
    return 32 if path == "shuffle" else threads


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def block_reduce(path: str, op: str, var: str, buf: str, threads: int, indent: str = "    ") -> str:
    """Lines reducing ``var`` over the block (``tid`` is the thread's index, ``threads`` a
    multiple of 32). Two reductions in a row must use different buffers."""
    if threads % 32:
        raise AssertionError(f"block of {threads} threads is not whole warps")
    lines: list[str] = []
    if path == "shuffle":
        for off in (16, 8, 4, 2, 1):
            lines.append(f"t_ = cuda.shfl_xor_sync({FULL_MASK}, {var}, {off})")
            lines.append(combine(op, var, "t_"))
        lines.append(f"if (tid & 31) == 0: {buf}[tid >> 5] = {var}")
        lines.append("cuda.syncthreads()")
        lines.append(f"{var} = {buf}[0]")
        if threads > 32:
            lines.append(f"for w_ in range(1, {threads // 32}):")
            lines.append("    t_ = " + f"{buf}[w_]")
            lines.append("    " + combine(op, var, "t_"))
    elif path == "shared":
        lines.append(f"{buf}[tid] = {var}")
        lines.append("cuda.syncthreads()")
        lines.append(f"s_ = {next_pow2(threads) // 2}")
        lines.append("while s_ > 0:")
        lines.append(f"    if tid < s_ and tid + s_ < {threads}:")
        lines.append(f"        a_ = {buf}[tid]")
        lines.append(f"        t_ = {buf}[tid + s_]")
        lines.append("        " + combine(op, "a_", "t_"))
        lines.append(f"        {buf}[tid] = a_")
        lines.append("    cuda.syncthreads()")
        lines.append("    s_ //= 2")
        lines.append(f"{var} = {buf}[0]")
    else:
        raise AssertionError(path)
    return "".join(f"{indent}{line}\n" for line in lines)


def group_reduce(path: str, op: str, var: str, lanes: int, buf: str, row: str, lane: str,
                 indent: str = "    ") -> str:
    """Lines reducing ``var`` over ``lanes`` consecutive threads (a power of two ≤ 32 that
    share one row). The shared path goes through ``buf[row, lane]`` and needs a barrier the
    caller places between the write (here, before the barrier) and the reads (``group_read``)."""
    lines: list[str] = []
    if path == "shuffle":
        off = lanes // 2
        while off >= 1:
            lines.append(f"t_ = cuda.shfl_xor_sync({FULL_MASK}, {var}, {off})")
            lines.append(combine(op, var, "t_"))
            off //= 2
    else:
        lines.append(f"{buf}[{row}, {lane}] = {var}")
    return "".join(f"{indent}{line}\n" for line in lines)


def group_read(path: str, op: str, var: str, lanes: int, buf: str, row: str, indent: str = "    ") -> str:
    """The shared path's second half of :func:`group_reduce` (after a barrier)."""
    if path == "shuffle":
        return ""
    lines = [f"{var} = {buf}[{row}, 0]"]
    for k in range(1, lanes):
        lines.append(f"t_ = {buf}[{row}, {k}]")
        lines.append(combine(op, var, "t_"))
    return "".join(f"{indent}{line}\n" for line in lines)
