"""LayerNorm and RMSNorm over rows, residual add + norm in one pass, BatchNorm (inference),
LayerNorm over a middle axis (ConvNeXt's channels-first), GroupNorm and InstanceNorm.

One sweep over a row gathers the sum and the sum of squares (of the row shifted by its first
element, so a large mean does not cancel the variance away, and a constant row gives exactly
zero variance); a second loop over the same row, still in L1, writes the result. Rows run
in parallel and reductions vectorise (``fastmath`` reassociation only).
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, A3, F32, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import stream_stores
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.literals import f32_literal

JIT = jit(fastmath=True)

# a row's mean and 1/sqrt(var + eps) from the sums s, q of the row shifted by k0
SHIFTED_STATS = """\
        ms = s / np.float32(d)
        var = max(q / np.float32(d) - ms * ms, np.float32(0.0))
        mean = k0 + ms
        inv = np.float32(1.0) / np.sqrt(var + eps)
"""

# a row's shifted sums (LayerNorm's first sweep), here and in the streaming kernel
LN_SUMS = """\
        k0 = x[r, 0]
        s = np.float32(0.0)
        q = np.float32(0.0)
        for j in range(d):
            t = x[r, j] - k0
            s += t
            q += t * t
"""

LAYERNORM = """\
{jit}
def k_layernorm(x, g, b, out, eps):
    n, d = x.shape
    for r in prange(n):
{sums}\
{stats}\
        for j in range(d):
            out[r, j] = (x[r, j] - mean) * inv * g[j] + b[j]
"""

RMSNORM = """\
{jit}
def k_rmsnorm(x, g, out, eps):
    n, d = x.shape
    for r in prange(n):
        q = np.float32(0.0)
        for j in range(d):
            q += x[r, j] * x[r, j]
        inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
        for j in range(d):
            out[r, j] = x[r, j] * inv * g[j]
"""

ADD_LAYERNORM = """\
{jit}
def k_add_layernorm(x, res, g, b, total, out, eps):
    # total = x + res and out = layernorm(total): x and res are read once, in one sweep
    n, d = x.shape
    for r in prange(n):
        k0 = x[r, 0] + res[r, 0]
        s = np.float32(0.0)
        q = np.float32(0.0)
        for j in range(d):
            a = x[r, j] + res[r, j]
            total[r, j] = a
            t = a - k0
            s += t
            q += t * t
{stats}\
        for j in range(d):
            out[r, j] = (total[r, j] - mean) * inv * g[j] + b[j]
"""

ADD_RMSNORM = """\
{jit}
def k_add_rmsnorm(x, res, g, total, out, eps):
    # total = x + res and out = rmsnorm(total) in one sweep over x and res
    n, d = x.shape
    for r in prange(n):
        q = np.float32(0.0)
        for j in range(d):
            a = x[r, j] + res[r, j]
            total[r, j] = a
            q += a * a
        inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
        for j in range(d):
            out[r, j] = total[r, j] * inv * g[j]
"""

# The same kernels for outputs of stream_stores.STREAM_BYTES or more: the normalised row (and the sum, for the
# add + norms, recomputed from x and res while their rows are in L1) goes out by streaming stores, each thread
# taking a contiguous share of the rows and fencing its stores at the end. An output written over its own input
# (as the schedule places a norm whose input dies there) keeps plain stores: in place, the fused add + LayerNorm ran
# at 47.6 GB/s so and 38.4 streamed
STREAM_ROWS = """\
{jit}
def {name}({args}, parts):
    n, d = x.shape
    of = out.reshape(-1)
    xf = x.reshape(-1)
    zero = np.zeros(d, np.float32)
{flat}\
    plain = {plain}  # over its own input: the lines are in cache, and streaming would evict them
    for p in prange(parts):
        for r in range(p * n // parts, (p + 1) * n // parts):
{sweep}\
            if plain:
                for j in range(d):
{row}\
            else:
                {call}
        stream_fence()
"""


def _deeper(lines: str) -> str:
    """Template lines one loop deeper (the streaming kernels' rows are inside a loop over a thread's share)."""
    return "".join("    " + line + "\n" for line in lines.splitlines())


LN_SWEEP = _deeper(LN_SUMS)
RMS_SWEEP = """\
            q = np.float32(0.0)
            for j in range(d):
                q += x[r, j] * x[r, j]
            inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
"""
ADD_LN_SWEEP = """\
            k0 = x[r, 0] + res[r, 0]
            s = np.float32(0.0)
            q = np.float32(0.0)
            for j in range(d):
                t = x[r, j] + res[r, j] - k0
                s += t
                q += t * t
"""
ADD_RMS_SWEEP = """\
            q = np.float32(0.0)
            for j in range(d):
                a = x[r, j] + res[r, j]
                q += a * a
            inv = np.float32(1.0) / np.sqrt(q / np.float32(d) + eps)
"""
STATS_ROWS = _deeper(SHIFTED_STATS)
ADD_FLAT = "    rf = res.reshape(-1)\n    tf = total.reshape(-1)\n"
LN_ROW = "out[r, j] = (x[r, j] - mean) * inv * g[j] + b[j]"
ADD_ROW = "a = x[r, j] + res[r, j]; total[r, j] = a; "
# name: (arguments, flat views the call needs, the first sweep, the call that streams the row, the plain loop's
# statements, the arrays whose sharing memory means in place)
STREAMED = {
    "k_layernorm_stream": ("x, g, b, out, eps", "", LN_SWEEP + STATS_ROWS,
                           "stream_affine(xf, r * d, g, b, of, r * d, d, mean, inv)", LN_ROW, ("out", "x")),
    "k_rmsnorm_stream": ("x, g, out, eps", "", RMS_SWEEP,
                         "stream_affine(xf, r * d, g, zero, of, r * d, d, np.float32(0.0), inv)",
                         "out[r, j] = x[r, j] * inv * g[j]", ("out", "x")),
    "k_add_layernorm_stream": ("x, res, g, b, total, out, eps", ADD_FLAT, ADD_LN_SWEEP + STATS_ROWS,
                               "stream_add_affine(xf, rf, r * d, g, b, tf, of, r * d, d, mean, inv)",
                               ADD_ROW + "out[r, j] = (a - mean) * inv * g[j] + b[j]", ("total", "x", "out", "res")),
    "k_add_rmsnorm_stream": ("x, res, g, total, out, eps", ADD_FLAT, ADD_RMS_SWEEP,
                             "stream_add_affine(xf, rf, r * d, g, zero, tf, of, r * d, d, np.float32(0.0), inv)",
                             ADD_ROW + "out[r, j] = a * inv * g[j]", ("total", "x", "out", "res")),
}


def _kernel(ctx: NodeCtx, name: str, source: str, types: tuple, nbytes: int) -> tuple[str, str]:
    """The kernel ``name``, or its streaming-store variant for an output of ``nbytes`` or more; (its name,
    the extra argument the call ends with)."""
    if not stream_stores.streams(nbytes):
        return ctx.kernel(Kernel(name, source, types)), ""
    stream_stores.use(ctx.parts)
    args, flat, sweep, call, row, shared = STREAMED[f"{name}_stream"]
    plain = " or ".join(f"same_data({a}, {b})" for a, b in zip(shared[::2], shared[1::2]))
    row = "".join(f"{' ' * 20}{statement.strip()}\n" for statement in row.split(";"))
    text = STREAM_ROWS.format(jit=JIT, name=f"{name}_stream", args=args, flat=flat, sweep=sweep, call=call,
                              plain=plain, row=row)
    return ctx.kernel(Kernel(f"{name}_stream", text, types + (I64,))), f", {THREADS}"


BATCHNORM = """\
{jit}
def k_batchnorm(x, g, b, mean, var, out, eps):
    no, nc, ni = x.shape
    for oc in prange(no * nc):
        o = oc // nc
        c = oc % nc
        inv = np.float32(1.0) / np.sqrt(var[c] + eps)
        for i in range(ni):
            out[o, c, i] = (x[o, c, i] - mean[c]) * inv * g[c] + b[c]
"""


def _ones(d: int) -> str:
    return f"np.ones({d}, np.float32)"


def _zeros(d: int) -> str:
    return f"np.zeros({d}, np.float32)"


LAYERNORM_MID = """\
{jit}
def k_layernorm_mid(x, g, b, out, eps):
    # x is [outer, d, inner], normalised over d at each (outer, inner) position: the inner axis is
    # contiguous, so every sweep runs as vectors over it, d rows at a time. Two passes (the mean, then
    # the squared deviations from it): a row here is a column of the map, with no first element a
    # shift could trust, and the sweeps are cheap (the [d, inner] block of one position stays in cache)
    no, d, ni = x.shape
    for o in prange(no):
        mean = np.zeros(ni, np.float32)
        q = np.zeros(ni, np.float32)
        for j in range(d):
            for i in range(ni):
                mean[i] += x[o, j, i]
        for i in range(ni):
            mean[i] /= np.float32(d)
        for j in range(d):
            for i in range(ni):
                t = x[o, j, i] - mean[i]
                q[i] += t * t
        for i in range(ni):
            q[i] = np.float32(1.0) / np.sqrt(q[i] / np.float32(d) + eps)
        for j in range(d):
            for i in range(ni):
                out[o, j, i] = (x[o, j, i] - mean[i]) * q[i] * g[j] + b[j]
"""

# GroupNorm: x as [B·groups, C/groups, spatial], one (sample, group) per row. Rows are long (a
# U-Net's 10 channels × 64² = 40,960 values), so the shifted sums run in float64; the second sweep
# folds mean, 1/std, gain and bias into one scale and shift per channel. InstanceNorm: groups = C.
GROUPNORM = """\
{jit}
def k_groupnorm(x, g, b, out, groups, eps):
    n, cg, ns = x.shape
    for r in prange(n):
        k0 = np.float64(x[r, 0, 0])
        s = 0.0
        q = 0.0
        for c in range(cg):
            for i in range(ns):
                t = np.float64(x[r, c, i]) - k0
                s += t
                q += t * t
        m = cg * ns
        ms = s / m
        var = max(q / m - ms * ms, 0.0)
        mean = np.float32(k0 + ms)
        inv = np.float32(1.0 / np.sqrt(var + np.float64(eps)))
        for c in range(cg):
            ch = (r % groups) * cg + c
            scale = inv * g[ch]
            shift = b[ch] - mean * scale
            for i in range(ns):
                out[r, c, i] = x[r, c, i] * scale + shift
"""


def render_layernorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = ctx.attr("axis")
    axis = len(shape) - 1 if axis is None else axis % len(shape)
    if axis != len(shape) - 1:
        _render_layernorm_mid(ctx, shape, axis)
        return
    d = shape[-1]
    src = LAYERNORM.format(jit=JIT, sums=LN_SUMS, stats=SHIFTED_STATS)
    k, parts = _kernel(ctx, "k_layernorm", src, (A2, A1, A1, A2, F32), 4 * prod(shape))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {b}, {ctx.rows(out, shape)}, "
             f"{f32_literal(ctx.attr('eps'))}{parts})")


def _render_layernorm_mid(ctx: NodeCtx, shape: tuple[int, ...], axis: int) -> None:
    d = shape[axis]
    view = f"({prod(shape[:axis])}, {d}, {prod(shape[axis + 1:])})"
    k = ctx.kernel(Kernel("k_layernorm_mid", LAYERNORM_MID.format(jit=JIT), (A3, A1, A1, A3, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
    out = ctx.alloc(inplace=(0,))  # the last sweep reads each element before writing it
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {g}, {b}, {out}.reshape{view}, {f32_literal(ctx.attr('eps'))})")


def render_groupnorm(ctx: NodeCtx) -> None:
    """groupnorm and instancenorm (groups = C) on [B, C, ...]."""
    shape = ctx.in_shape()
    c = shape[1]
    groups = c if ctx.node.op == "instancenorm" else int(ctx.attr("groups"))
    view = f"({shape[0] * groups}, {c // groups}, {prod(shape[2:])})"
    k = ctx.kernel(Kernel("k_groupnorm", GROUPNORM.format(jit=JIT), (A3, A1, A1, A3, I64, F32)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(c)
    b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(c)
    out = ctx.alloc(inplace=(0,))  # each element is read (second sweep) before it is written
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {g}, {b}, {out}.reshape{view}, {groups}, "
             f"{f32_literal(ctx.attr('eps'))})")


def render_rmsnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    k, parts = _kernel(ctx, "k_rmsnorm", RMSNORM.format(jit=JIT), (A2, A1, A2, F32), 4 * prod(shape))
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(shape[-1])
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {g}, {ctx.rows(out, shape)}, {f32_literal(ctx.attr('eps'))}{parts})")


def render_add_norm(ctx: NodeCtx) -> None:
    """(x + r, norm(x + r)): the sum may take x's buffer and the norm r's when they die here."""
    shape = ctx.out_shape(0)
    d = shape[-1]
    eps = f32_literal(ctx.attr("eps"))
    x, r = ctx.rows(ctx.args[0], shape), ctx.rows(ctx.args[1], shape)
    g = ctx.weight("gain") if ctx.has_weight("gain") else _ones(d)
    total = ctx.rows(ctx.alloc(0, inplace=(0,)), shape)
    out = ctx.rows(ctx.alloc(1, inplace=(1,)), shape)
    if ctx.attr("kind", "layernorm") == "layernorm":
        src = ADD_LAYERNORM.format(jit=JIT, stats=SHIFTED_STATS)
        k, parts = _kernel(ctx, "k_add_layernorm", src, (A2, A2, A1, A1, A2, A2, F32), 4 * prod(shape))
        b = ctx.weight("bias") if ctx.has_weight("bias") else _zeros(d)
        ctx.emit(f"{k}({x}, {r}, {g}, {b}, {total}, {out}, {eps}{parts})")
    else:
        src = ADD_RMSNORM.format(jit=JIT)
        k, parts = _kernel(ctx, "k_add_rmsnorm", src, (A2, A2, A1, A2, A2, F32), 4 * prod(shape))
        ctx.emit(f"{k}({x}, {r}, {g}, {total}, {out}, {eps}{parts})")


def render_batchnorm(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    view = f"({prod(shape[:axis])}, {shape[axis]}, {prod(shape[axis + 1:])})"
    k = ctx.kernel(Kernel("k_batchnorm", BATCHNORM.format(jit=JIT), (A3, A1, A1, A1, A1, A3, F32)))
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.weight('gain')}, {ctx.weight('bias')}, "
             f"{ctx.weight('running_mean')}, {ctx.weight('running_var')}, {out}.reshape{view}, "
             f"{f32_literal(ctx.attr('eps'))})")


RENDERERS = {
    "layernorm": render_layernorm,
    "rmsnorm": render_rmsnorm,
    "batchnorm": render_batchnorm,
    "add_norm": render_add_norm,
    "groupnorm": render_groupnorm,
    "instancenorm": render_groupnorm,
}
