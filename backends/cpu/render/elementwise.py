"""Activations, softmax and broadcasting arithmetic: flat or row-wise prange loops."""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, F32, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx, np_dtype
from irc.backends.cpu.render.mathfns import DEVICE_JIT
from irc.backends.literals import f32_literal, shape_literal

JIT = jit()
JIT_REDUCE = jit(fastmath=True)

UNARY = """\
{jit}
def {name}(x, out, p):
    for i in prange(x.size):
        v = x[i]
        out[i] = {expr}
"""


def unary_kernel(name_: str, expr: str) -> Kernel:
    name = f"k_{name_}"
    return Kernel(name, UNARY.format(jit=JIT, name=name, expr=expr), (A1, A1, F32))


def render_activation(ctx: NodeCtx) -> None:
    op = ctx.node.op
    name = op
    param = 0.0
    if op == "gelu" and ctx.attr("approx", "none") == "tanh":
        name = "gelu_tanh"
    if op == "leaky_relu":
        param = ctx.attr("slope", 0.01)
    if not ctx.out_types[0].is_float:
        raise ctx.error(f"needs a floating-point input, got {ctx.in_types[0]}")
    k = ctx.kernel(unary_kernel(name, act(ctx.parts, name)))
    out = ctx.alloc(inplace=(0,))
    ctx.emit(f"{k}({ctx.flat(ctx.args[0])}, {ctx.flat(out)}, {f32_literal(param)})")


# Activations outside the shared epilogue table (activations.py): each a float32 expression of ``v``
# with two parameters ``p`` and ``q`` (clamp's bounds, elu's alpha). A bound left out is ±inf, and
# the comparisons are written so that NaN stays NaN (both fail on NaN, so ``v`` passes through).
HARD_SIGMOID = ("np.float32(0.0) if v < np.float32(-3.0) else (np.float32(1.0) if v > np.float32(3.0) "
                "else (v + np.float32(3.0)) / np.float32(6.0))")
MORE_ACT_EXPR: dict[str, str] = {
    "relu6": "np.float32(0.0) if v < np.float32(0.0) else (np.float32(6.0) if v > np.float32(6.0) else v)",
    "clamp": "p if v < p else (q if v > q else v)",
    # relu6(x + 3)/6 and x·relu6(x + 3)/6 as PyTorch evaluates them (so hardswish(−inf) = −inf·0 = NaN)
    "hardsigmoid": HARD_SIGMOID,
    "hardswish": "v * (" + HARD_SIGMOID + ")",
    # x·tanh(softplus(x)) = x·n/(n + 2) with n = e^x·(e^x + 2): one exp, no cancellation; past x = 20
    # the ratio is 1 in float32, so e^x is capped there (NaN fails the test and stays NaN)
    "mish": "v * mish_ratio(fexp(np.float32(20.0) if v > np.float32(20.0) else v))",
    "elu": "v if v > np.float32(0.0) else p * np.float32(math.expm1(v))",
}

MISH_RATIO = f"""\
{DEVICE_JIT}
def mish_ratio(e):
    n = e * (e + np.float32(2.0))
    return n / (n + np.float32(2.0))
"""

UNARY2 = """\
{jit}
def {name}(x, out, p, q):
    for i in prange(x.size):
        v = x[i]
        out[i] = {expr}
"""


def _more_params(ctx: NodeCtx) -> tuple[float, float]:
    op = ctx.node.op
    if op in ("clamp", "hardtanh"):
        lo, hi = ctx.attr("min"), ctx.attr("max")
        return (float("-inf") if lo is None else lo), (float("inf") if hi is None else hi)
    if op == "elu":
        return ctx.attr("alpha", 1.0), 0.0
    return 0.0, 0.0


def render_more_activation(ctx: NodeCtx) -> None:
    op = ctx.node.op
    if not ctx.out_types[0].is_float:
        raise ctx.error(f"needs a floating-point input, got {ctx.in_types[0]}")
    name = "clamp" if op == "hardtanh" else op  # hardtanh is clamp with default bounds
    expr = MORE_ACT_EXPR[name]
    if "mish_ratio(" in expr:
        ctx.parts.device("mish_ratio", MISH_RATIO)
    if "fexp(" in expr:
        ctx.device("fexp")
    name = f"k_{name}"
    k = ctx.kernel(Kernel(name, UNARY2.format(jit=JIT, name=name, expr=expr), (A1, A1, F32, F32)))
    out = ctx.alloc(inplace=(0,))
    p, q = _more_params(ctx)
    ctx.emit(f"{k}({ctx.flat(ctx.args[0])}, {ctx.flat(out)}, {f32_literal(p)}, {f32_literal(q)})")


def render_alias(ctx: NodeCtx) -> None:
    """identity and dropout (inference): the result is the operand itself."""
    ctx.emit(f"{ctx.outs[0]} = {ctx.args[0]}")


SOFTMAX = """\
{jit}
def k_softmax(x, out):
    # per row: the maximum, then exp and its sum in one vectorised sweep, then one scaling
    n, d = x.shape
    for r in prange(n):
        m = np.float32(-np.inf)
        nan = False
        for j in range(d):
            a = x[r, j]
            m = a if a > m else m
            nan = nan or a != a
        if nan:  # NaN in, NaN out (as the reference)
            for j in range(d):
                out[r, j] = np.float32(np.nan)
        elif m == np.float32(-np.inf):  # every entry is -inf: a defined row of zeros
            for j in range(d):
                out[r, j] = np.float32(0.0)
        elif m == np.float32(np.inf):  # as the reference: inf / inf where +inf, 0 elsewhere
            for j in range(d):
                out[r, j] = np.float32(np.nan) if x[r, j] == m else np.float32(0.0)
        else:
            s = np.float32(0.0)
            for j in range(d):
                e = fexp(x[r, j] - m)
                out[r, j] = e
                s += e
            inv = np.float32(1.0) / s
            for j in range(d):
                out[r, j] *= inv
"""


def render_softmax(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    rank = len(shape)
    axis = ctx.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    ctx.device("fexp")
    k = ctx.kernel(Kernel("k_softmax", SOFTMAX.format(jit=JIT_REDUCE), (A2, A2)))
    x, out = ctx.args[0], ctx.outs[0]
    if axis == rank - 1:
        ctx.alloc(inplace=(0,))
        ctx.emit(f"{k}({ctx.rows(x, shape)}, {ctx.rows(out, shape)})")
        return
    # move the axis last (a copy of our own), normalise rows, copy back into the result
    moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
    tmp = f"{out}_moved"
    ctx.scratch(tmp, moved)
    ctx.emit(f"np.copyto({tmp}, np.moveaxis({x}, {axis}, -1))")
    ctx.emit(f"{k}({ctx.rows(tmp, moved)}, {ctx.rows(tmp, moved)})")
    ctx.alloc()
    ctx.emit(f"np.copyto({out}, np.moveaxis({tmp}, -1, {axis}))")
    ctx.emit(f"del {tmp}")


# -- binary arithmetic ------------------------------------------------------------------

SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# two-tensor ops written as a select; NaN in either operand gives NaN, as np.maximum and torch.maximum
PAIR = {"maximum": "{a} if ({a} > {b} or {a} != {a}) else {b}",
        "minimum": "{a} if ({a} < {b} or {a} != {a}) else {b}"}


def _combine(op: str, lhs: str, rhs: str) -> str:
    return PAIR[op].format(a=lhs, b=rhs) if op in PAIR else f"{lhs} {SYMBOL[op]} {rhs}"


FLAT = """\
{jit}
def {name}(a, b, out):
    for i in prange(out.size):
        out[i] = {value}
"""
ROWS = """\
{jit}
def {name}(a, b, out):
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = {value}
"""
SCALAR = """\
{jit}
def {name}(a, s, out):
    for i in prange(out.size):
        out[i] = {value}
"""


def _binary_kernel(op: str, form: str) -> Kernel:
    name = f"k_{op}_{form}"
    if form == "flat":
        return Kernel(name, FLAT.format(jit=JIT, name=name, value=_combine(op, "a[i]", "b[i]")), (A1, A1, A1))
    if form == "rows":  # a is [N, D], b is [D]
        value = _combine(op, "a[i, j]", "b[j]")
        return Kernel(name, ROWS.format(jit=JIT, name=name, value=value), (A2, A1, A2))
    if form == "rows_first":  # a is [D], b is [N, D]
        value = _combine(op, "a[j]", "b[i, j]")
        return Kernel(name, ROWS.format(jit=JIT, name=name, value=value), (A1, A2, A2))
    if form == "scalar":
        return Kernel(name, SCALAR.format(jit=JIT, name=name, value=_combine(op, "a[i]", "s")), (A1, F32, A1))
    if form == "rscalar":
        return Kernel(name, SCALAR.format(jit=JIT, name=name, value=_combine(op, "s", "a[i]")), (A1, F32, A1))
    raise AssertionError(form)


def _is_suffix(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """``small`` (leading 1s dropped) is a trailing block of ``big``: it repeats along rows."""
    s = list(small)
    while s and s[0] == 1:
        s.pop(0)
    return len(s) <= len(big) and tuple(big[len(big) - len(s):]) == tuple(s)


def render_binary(ctx: NodeCtx) -> None:
    op = ctx.node.op
    out_shape = ctx.out_shape()
    out = ctx.outs[0]
    if not ctx.out_types[0].is_float:
        _render_numpy_binary(ctx)
        return
    a = ctx.args[0]
    if len(ctx.args) == 1:
        form = "rscalar" if ctx.attr("reverse", False) and op in ("sub", "div") else "scalar"
        k = ctx.kernel(_binary_kernel(op, form))
        ctx.alloc(inplace=(0,))
        ctx.emit(f"{k}({ctx.flat(a)}, {f32_literal(ctx.attr('scalar'))}, {ctx.flat(out)})")
        return
    b = ctx.args[1]
    sa, sb = ctx.in_shape(0), ctx.in_shape(1)
    if sa == out_shape and sb == out_shape:
        k = ctx.kernel(_binary_kernel(op, "flat"))
        ctx.alloc(inplace=(0, 1))
        ctx.emit(f"{k}({ctx.flat(a)}, {ctx.flat(b)}, {ctx.flat(out)})")
    elif sa == out_shape and _is_suffix(sb, out_shape):
        d = prod(sb)
        k = ctx.kernel(_binary_kernel(op, "rows"))
        ctx.alloc(inplace=(0,))
        ctx.emit(f"{k}({a}.reshape(-1, {d}), {ctx.flat(b)}, {out}.reshape(-1, {d}))")
    elif sb == out_shape and _is_suffix(sa, out_shape):
        d = prod(sa)
        k = ctx.kernel(_binary_kernel(op, "rows_first"))
        ctx.alloc()
        ctx.emit(f"{k}({ctx.flat(a)}, {b}.reshape(-1, {d}), {out}.reshape(-1, {d}))")
    else:  # general broadcasting: materialise the operands that broadcast at the result's shape
        k = ctx.kernel(_binary_kernel(op, "flat"))
        ctx.alloc()
        full = shape_literal(out_shape)

        def flat_full(v: str, shape: tuple[int, ...]) -> str:
            # an operand already at the result's shape goes as it is: broadcast_to would give a read-only
            # view, which ascontiguousarray passes through unchanged and the kernel's signature refuses
            if shape == out_shape:
                return ctx.flat(v)
            return f"np.ascontiguousarray(np.broadcast_to({v}, {full})).reshape(-1)"

        ctx.emit(f"{k}({flat_full(a, sa)}, {flat_full(b, sb)}, {ctx.flat(out)})")


_NUMPY_FN = {"add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.divide",
             "maximum": "np.maximum", "minimum": "np.minimum"}


def _render_numpy_binary(ctx: NodeCtx) -> None:
    """Integer arithmetic (rare: index maths) runs in NumPy."""
    fn = _NUMPY_FN[ctx.node.op]
    a = ctx.args[0]
    if len(ctx.args) == 2:
        operands = f"{a}, {ctx.args[1]}"
    else:
        s = f32_literal(ctx.attr("scalar"))
        operands = f"{s}, {a}" if ctx.attr("reverse", False) else f"{a}, {s}"
    ctx.emit(f"{ctx.outs[0]} = np.ascontiguousarray({fn}({operands}), dtype={np_dtype(ctx.out_types[0])})")


RENDERERS = {
    **{name: render_activation for name in ("relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "abs")},
    **{name: render_more_activation for name in ("relu6", "hardtanh", "clamp", "hardswish", "hardsigmoid",
                                                 "mish", "elu")},
    "identity": render_alias,
    "dropout": render_alias,
    "softmax": render_softmax,
    **{name: render_binary for name in (*SYMBOL, *PAIR)},
}
