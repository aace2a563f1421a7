"""Activations, broadcasting arithmetic, softmax and the causal mask: one thread per element
(softmax: one block per row, see rows.py)."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, F32, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx, dims, rows_of
from irc.backends.cuda.render.copy import contiguous_strides, copy_launch
from irc.backends.cuda.render.rows import row_shape_for, softmax_kernel

# Activations as float32 expressions of ``v`` (``p``: the op's one parameter). Constants are
# np.float32 on purpose: a bare float literal is float64 in numba and promotes everything.
ACT_EXPR: dict[str, str] = {
    "none": "v",
    "relu": "np.float32(0.0) if v < np.float32(0.0) else v",
    "leaky_relu": "v * p if v < np.float32(0.0) else v",
    "gelu": "np.float32(0.5) * v * (np.float32(1.0) + math.erf(v * np.float32(0.7071067811865476)))",
    "gelu_tanh": "np.float32(0.5) * v * (np.float32(1.0) + math.tanh(np.float32(0.7978845608028654)"
                 " * (v + np.float32(0.044715) * v * v * v)))",
    "silu": "v / (np.float32(1.0) + math.exp(-v))",
    "tanh": "math.tanh(v)",
    "sigmoid": "np.float32(1.0) / (np.float32(1.0) + math.exp(-v))",
    "abs": "abs(v)",
}


def act_expr(name: str) -> str:
    """The activation of ``v`` (a KeyError for anything not in the table)."""
    return ACT_EXPR[name]


UNARY = """\
{jit}
def {name}(x, out, n, p):
    i = cuda.grid(1)
    if i < n:
        v = x[i]
        out[i] = {expr}
"""


def unary_kernel(act: str) -> Kernel:
    name = f"k_{act}"
    return Kernel(name, UNARY.format(jit=JIT, name=name, expr=ACT_EXPR[act]), (A1, A1, I64, F32))


def render_activation(ctx: Ctx) -> None:
    ctx.need_float()
    op = ctx.node.op
    act, param = op, 0.0
    if op == "gelu" and ctx.attr("approx", "none") == "tanh":
        act = "gelu_tanh"
    if op == "leaky_relu":
        param = ctx.attr("slope", 0.01)
    _launch_unary(ctx, unary_kernel(act), param)


def _launch_unary(ctx: Ctx, kernel: Kernel, *params: float) -> None:
    """One thread per element of the output: ``kernel(x, out, n, *params)``, parameters as float32."""
    k = ctx.kernel(kernel)
    out = ctx.alloc()
    n = prod(ctx.out_shape())
    grid, block = ctx.flat_grid(n)
    ctx.launch(k, grid, block, [ctx.F(0), ctx.f(out), ctx.i(n), *(ctx.f32(p) for p in params)])


# Activations outside the epilogue table above: the statements that set ``y`` from ``v``, with two
# parameters ``p`` and ``q`` (clamp's bounds, elu's alpha). A bound left out is ±inf, and the
# comparisons fail on NaN, so NaN passes through as in the reference.
HARD_SIGMOID = ("np.float32(0.0) if v < np.float32(-3.0) else (np.float32(1.0) if v > np.float32(3.0) "
                "else (v + np.float32(3.0)) / np.float32(6.0))")
MORE_ACT_BODY: dict[str, str] = {
    "relu6": "y = np.float32(0.0) if v < np.float32(0.0) else (np.float32(6.0) if v > np.float32(6.0) else v)",
    "clamp": "y = p if v < p else (q if v > q else v)",
    # relu6(x + 3)/6 and x·relu6(x + 3)/6 as PyTorch evaluates them (so hardswish(−inf) = −inf·0 = NaN)
    "hardsigmoid": "y = " + HARD_SIGMOID,
    "hardswish": "y = v * (" + HARD_SIGMOID + ")",
    # x·tanh(softplus(x)) = x·n/(n + 2), n = e^x·(e^x + 2): one exp, no cancellation; capped at x = 20,
    # where the ratio is 1 in float32
    "mish": "e = math.exp(np.float32(20.0) if v > np.float32(20.0) else v)\n"
            "n2 = e * (e + np.float32(2.0))\n"
            "y = v * (n2 / (n2 + np.float32(2.0)))",
    "elu": "y = v if v > np.float32(0.0) else p * math.expm1(v)",
}

UNARY2 = """\
{jit}
def {name}(x, out, n, p, q):
    i = cuda.grid(1)
    if i < n:
        v = x[i]
{body}
        out[i] = y
"""


def more_unary_kernel(act: str) -> Kernel:
    name = f"k_{act}"
    body = "".join(f"        {line}\n" for line in MORE_ACT_BODY[act].split("\n"))
    return Kernel(name, UNARY2.format(jit=JIT, name=name, body=body.rstrip("\n")), (A1, A1, I64, F32, F32))


def render_more_activation(ctx: Ctx) -> None:
    ctx.need_float()
    op = ctx.node.op
    act, p, q = op, 0.0, 0.0
    if op in ("clamp", "hardtanh"):
        act = "clamp"  # hardtanh is clamp with default bounds
        lo, hi = ctx.attr("min"), ctx.attr("max")
        p, q = (float("-inf") if lo is None else lo), (float("inf") if hi is None else hi)
    if op == "elu":
        p = ctx.attr("alpha", 1.0)
    _launch_unary(ctx, more_unary_kernel(act), p, q)


# -- binary arithmetic ------------------------------------------------------------------

SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# two-tensor ops written as a select; NaN in either operand gives NaN, as np.maximum and torch.maximum
PAIR = {"maximum": "{a} if ({a} > {b} or {a} != {a}) else {b}",
        "minimum": "{a} if ({a} < {b} or {a} != {a}) else {b}"}
FORMS = {  # form -> (left operand, right operand) in terms of the flat index i
    "flat": ("a[i]", "b[i]"),
    "rows": ("a[i]", "b[i % d]"),  # b repeats along rows of a
    "rows_first": ("a[i % d]", "b[i]"),
    "scalar": ("a[i]", "s"),
    "rscalar": ("s", "a[i]"),
}

BINARY = """\
{jit}
def {name}(a, {second}, out, n, d):
    i = cuda.grid(1)
    if i < n:
        out[i] = {value}
"""


def binary_kernel(op: str, form: str) -> Kernel:
    name = f"k_{op}_{form}"
    lhs, rhs = FORMS[form]
    scalar = form in ("scalar", "rscalar")
    value = PAIR[op].format(a=lhs, b=rhs) if op in PAIR else f"{lhs} {SYMBOL[op]} {rhs}"
    src = BINARY.format(jit=JIT, name=name, second="s" if scalar else "b", value=value)
    return Kernel(name, src, (A1, F32 if scalar else A1, A1, I64, I64))


def _is_suffix(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """``small`` (leading 1s dropped) is a trailing block of ``big``: it repeats along rows."""
    s = list(small)
    while s and s[0] == 1:
        s.pop(0)
    return len(s) <= len(big) and tuple(big[len(big) - len(s):]) == tuple(s)


def broadcast_into(ctx: Ctx, src: str, shape: tuple[int, ...], out_shape: tuple[int, ...], dst: str) -> None:
    """Materialise ``src`` (of ``shape``) broadcast to ``out_shape`` into ``dst``."""
    full = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = contiguous_strides(full)
    bstrides = tuple(0 if n == 1 and m != 1 else s for n, m, s in zip(full, out_shape, strides))
    copy_launch(ctx, src, dst, out_shape, bstrides, 0, contiguous_strides(out_shape), 0)


def render_binary(ctx: Ctx) -> None:
    op = ctx.node.op
    ctx.need_float()
    out_shape = ctx.out_shape()
    n = prod(out_shape)
    grid, block = ctx.flat_grid(n)
    if len(ctx.ins) == 1:
        form = "rscalar" if ctx.attr("reverse", False) and op in ("sub", "div") else "scalar"
        k = ctx.kernel(binary_kernel(op, form))
        out = ctx.alloc()
        ctx.launch(k, grid, block, [ctx.F(0), ctx.f32(ctx.attr("scalar")), ctx.f(out), ctx.i(n), ctx.i(1)])
        return
    sa, sb = ctx.in_shape(0), ctx.in_shape(1)
    a, b = ctx.F(0), ctx.F(1)
    if sa == out_shape and sb == out_shape:
        form, d = "flat", 1
    elif sa == out_shape and _is_suffix(sb, out_shape):
        form, d = "rows", prod(sb)
    elif sb == out_shape and _is_suffix(sa, out_shape):
        form, d = "rows_first", prod(sa)
    else:  # general broadcasting: both operands materialised at the result's shape
        form, d = "flat", 1
        ta, tb = ctx.temp(out_shape), ctx.temp(out_shape)
        broadcast_into(ctx, a, sa, out_shape, ctx.f(ta))
        broadcast_into(ctx, b, sb, out_shape, ctx.f(tb))
        a, b = ctx.f(ta), ctx.f(tb)
    k = ctx.kernel(binary_kernel(op, form))
    out = ctx.alloc()
    ctx.launch(k, grid, block, [a, b, ctx.f(out), ctx.i(n), ctx.i(max(d, 1))])


# -- softmax and the causal mask ------------------------------------------------------------

def softmax_rows(ctx: Ctx, src: int, dst: int, rows: int, d: int) -> None:
    rs = row_shape_for(ctx, d)
    k = ctx.parts.reducing_kernel(lambda path: softmax_kernel(rs, path))
    ctx.launch(k, dims(rows), dims(rs.threads), [ctx.v(ctx.view(src, (rows, d))), ctx.v(ctx.view(dst, (rows, d)))])


def render_softmax(ctx: Ctx) -> None:
    ctx.need_float()
    shape = ctx.in_shape()
    rank = len(shape)
    axis = ctx.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    if axis == rank - 1:
        out = ctx.alloc()
        rows, d = rows_of(shape)
        softmax_rows(ctx, ctx.ins[0], out, rows, d)
        return
    # move the axis last, normalise rows, move it back
    perm = [k for k in range(rank) if k != axis] + [axis]
    moved = tuple(shape[k] for k in perm)
    strides = contiguous_strides(shape)
    t1, t2 = ctx.temp(moved), ctx.temp(moved)
    copy_launch(ctx, ctx.F(0), ctx.f(t1), moved, tuple(strides[k] for k in perm), 0, contiguous_strides(moved), 0)
    softmax_rows(ctx, t1, t2, prod(moved[:-1]), moved[-1])
    out = ctx.alloc()
    out_strides = contiguous_strides(shape)
    copy_launch(ctx, ctx.f(t2), ctx.f(out), moved, contiguous_strides(moved), 0,
                tuple(out_strides[k] for k in perm), 0)


CAUSAL = f"""\
{JIT}
def k_causal_mask(x, out, n, t, s):
    i = cuda.grid(1)
    if i < n:
        j = i % s
        q = (i // s) % t
        out[i] = np.float32(-np.inf) if j > q else x[i]
"""
CAUSAL_KERNEL = Kernel("k_causal_mask", CAUSAL, (A1, A1, I64, I64, I64))

CAUSAL_WINDOW = f"""\
{JIT}
def k_causal_mask_window(x, out, n, t, s, window):
    i = cuda.grid(1)
    if i < n:
        j = i % s
        q = (i // s) % t
        out[i] = np.float32(-np.inf) if j > q or j <= q - window else x[i]
"""
CAUSAL_WINDOW_KERNEL = Kernel("k_causal_mask_window", CAUSAL_WINDOW, (A1, A1, I64, I64, I64, I64))


def render_causal_mask(ctx: Ctx) -> None:
    ctx.need_float()
    shape = ctx.in_shape()
    n = prod(shape)
    window = ctx.attr("window")  # a sliding window also hides key j <= query i − window
    k = ctx.kernel(CAUSAL_KERNEL if window is None else CAUSAL_WINDOW_KERNEL)
    out = ctx.alloc()
    grid, block = ctx.flat_grid(n)
    args = [ctx.F(0), ctx.f(out), ctx.i(n), ctx.i(shape[-2]), ctx.i(shape[-1])]
    ctx.launch(k, grid, block, args + ([ctx.i(int(window))] if window is not None else []))


RENDERERS = {
    **{name: render_activation for name in ("relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "abs")},
    **{name: render_more_activation for name in (*MORE_ACT_BODY, "hardtanh")},
    **{name: render_binary for name in (*SYMBOL, *PAIR)},
    "softmax": render_softmax,
    "causal_mask": render_causal_mask,
}
