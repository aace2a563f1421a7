"""Kernels over the rows of a [rows, D] matrix, one thread block per row, the row in registers.

LayerNorm, RMSNorm (each with an optional fused residual add) and softmax read their row
once from device memory into registers (``E`` values per thread, thread ``t`` holding
columns ``t, t + NT, t + 2·NT, ...``: coalesced), reduce across the block, and write once.
D is a constant of each kernel, so the loads unroll and full rows need no bounds checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.backends.common.kernel import A1, A2, F32, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import cdiv
from irc.backends.cuda.render.reduce import block_reduce, buffer_size

MAX_THREADS = 1024
PER_THREAD = 8  # values per thread the configuration aims for: enough loads in flight
MAX_PER_THREAD = 32  # beyond 1024 x 32 columns a row no longer fits in registers


@dataclass(frozen=True)
class RowShape:
    d: int
    threads: int
    per_thread: int

    @property
    def exact(self) -> bool:
        return self.threads * self.per_thread == self.d


def row_shape_for(ctx, d: int) -> RowShape:
    """``row_shape(d)`` for a node's rows; an error naming the node when a row does not fit."""
    rs = row_shape(d)
    if rs is None:
        raise ctx.error(f"normalises rows of {d} values; a row must fit in one thread block's registers "
                        f"(at most {MAX_THREADS * MAX_PER_THREAD} values)")
    return rs


def row_shape(d: int) -> RowShape | None:
    """Threads and values per thread for rows of ``d``; None when a row does not fit."""
    for e in range(PER_THREAD, 0, -1):  # an exact split needs no bounds checks
        if d % e == 0 and (d // e) % 32 == 0 and d // e <= MAX_THREADS:
            return RowShape(d, d // e, e)
    threads = min(MAX_THREADS, max(32, cdiv(cdiv(d, PER_THREAD), 32) * 32))
    e = cdiv(d, threads)
    if e > MAX_PER_THREAD:
        return None
    return RowShape(d, threads, e)


def _guard(rs: RowShape, k: int) -> str:
    """The condition under which value ``k`` of a thread is inside the row ('' = always)."""
    if rs.exact or (k + 1) * rs.threads <= rs.d:
        return ""
    return f"tid + {k * rs.threads} < {rs.d}"


def _load(rs: RowShape, k: int, expr: str, fill: str) -> list[str]:
    """``x{k} = expr`` at column ``j{k}``, or ``fill`` past the row's end."""
    col = f"tid + {k * rs.threads}" if k else "tid"
    guard = _guard(rs, k)
    body = expr.format(j=col)
    if not guard:
        return [f"x{k} = {body}"]
    return [f"x{k} = {fill}", f"if {guard}:", f"    x{k} = {body}"]


def _store(rs: RowShape, k: int, stmt: str) -> list[str]:
    col = f"tid + {k * rs.threads}" if k else "tid"
    guard = _guard(rs, k)
    body = stmt.format(j=col, k=k)
    return [body] if not guard else [f"if {guard}:", f"    {body}"]


def _head(name: str, args: str, path: str, rs: RowShape, buffers: int) -> list[str]:
    size = buffer_size(path, rs.threads)
    lines = [JIT, f"def {name}({args}):"]
    for b in range(buffers):  # one declaration per line: the simulator keys them by line
        lines.append(f"    red{b} = cuda.shared.array({size}, np.float32)")
    lines += ["    row = cuda.blockIdx.x", "    tid = cuda.threadIdx.x"]
    return lines


def norm_kernel(kind: str, residual: bool, gain: bool, bias: bool, rs: RowShape, path: str,
                keep_sum: bool = True) -> Kernel:
    """LayerNorm or RMSNorm of (x [+ r]) per row; with ``residual`` the sum is written too,
    unless ``keep_sum`` is off (nothing reads it: a quarter of the bytes saved)."""
    keep_sum = residual and keep_sum
    parts = ["k", "add" if residual else "", kind, "g" if gain else "", "b" if bias else "",
             "" if keep_sum or not residual else "nosum", f"d{rs.d}"]
    name = "_".join(p for p in parts if p) + f"__{path}"
    args = ["x"] + (["r"] if residual else []) + ["g", "b"] + (["s"] if keep_sum else []) + ["out", "eps"]
    lines = _head(name, ", ".join(args), path, rs, 2)
    body: list[str] = []
    load = "x[row, {j}] + r[row, {j}]" if residual else "x[row, {j}]"
    for k in range(rs.per_thread):
        body += _load(rs, k, load, "np.float32(0.0)")
        if keep_sum:
            body += _store(rs, k, "s[row, {j}] = x{k}")
    total = " + ".join(f"x{k}" for k in range(rs.per_thread))
    if kind == "layernorm":
        body.append(f"acc = {total}")
        lines += [f"    {b}" for b in body]
        lines.append(block_reduce(path, "sum", "acc", "red0", rs.threads).rstrip("\n"))
        body = [f"mean = acc / np.float32({rs.d})"]
        for k in range(rs.per_thread):
            guard = _guard(rs, k)
            body.append(f"x{k} = x{k} - mean" if not guard else f"x{k} = (x{k} - mean) if {guard} else np.float32(0.0)")
    body.append("q = " + " + ".join(f"x{k} * x{k}" for k in range(rs.per_thread)))
    lines += [f"    {b}" for b in body]
    lines.append(block_reduce(path, "sum", "q", "red1", rs.threads).rstrip("\n"))
    body = [f"inv = np.float32(1.0) / math.sqrt(q / np.float32({rs.d}) + eps)"]
    value = "x{k} * inv" + (" * g[{j}]" if gain else "") + (" + b[{j}]" if bias else "")
    for k in range(rs.per_thread):
        body += _store(rs, k, "out[row, {j}] = " + value)
    lines += [f"    {b}" for b in body]
    kinds = (A2,) + ((A2,) if residual else ()) + (A1, A1) + ((A2,) if keep_sum else ()) + (A2, F32)
    return Kernel(name, "\n".join(lines) + "\n", kinds)


def softmax_kernel(rs: RowShape, path: str) -> Kernel:
    """Softmax of each row (max subtracted first); a row that is all −∞ gives zeros."""
    name = f"k_softmax_d{rs.d}__{path}"
    lines = _head(name, "x, out", path, rs, 2)
    body: list[str] = []
    for k in range(rs.per_thread):
        body += _load(rs, k, "x[row, {j}]", "np.float32(-np.inf)")
    body.append("m = x0")
    for k in range(1, rs.per_thread):
        body.append(f"m = x{k} if (x{k} > m or x{k} != x{k}) else m")
    lines += [f"    {b}" for b in body]
    lines.append(block_reduce(path, "max", "m", "red0", rs.threads).rstrip("\n"))
    body = ["if m == np.float32(-np.inf):  # every entry is -inf: a defined row of zeros",
            "    m = np.float32(0.0)"]
    for k in range(rs.per_thread):
        body.append(f"x{k} = math.exp(x{k} - m)")
    body.append("acc = " + " + ".join(f"x{k}" for k in range(rs.per_thread)))
    lines += [f"    {b}" for b in body]
    lines.append(block_reduce(path, "sum", "acc", "red1", rs.threads).rstrip("\n"))
    body = ["inv = np.float32(1.0) / acc if acc > np.float32(0.0) else np.float32(0.0)"]
    for k in range(rs.per_thread):
        body += _store(rs, k, "out[row, {j}] = x{k} * inv")
    lines += [f"    {b}" for b in body]
    return Kernel(name, "\n".join(lines) + "\n", (A2, A2))
