"""Backward primitives that work element by element or row by row (irc/ops/grad_ops.py): activation
derivatives, the softmax and causal-mask gradients, ``sum_to`` (the adjoint of broadcasting), RoPE's
adjoint, slice_grad, minmax_grad and training dropout's mask.

Derivatives follow the NumPy reference (backends/numpy_ref/grad.py), PyTorch's values at kinks
included; transcendentals go through the vectorising float32 device functions (``fexp``, ``ftanh``,
``ferf``). Sums over many rows accumulate in float64 (a bias gradient sums every row of a batch).
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, A3, A4, F32, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.activations import register
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.cpu.render.mathfns import DEVICE_JIT
from irc.backends.literals import f32_literal, float_literal, int_literal, shape_literal
from irc.ops.attention import rope_theta

JIT = jit()
JIT_REDUCE = jit(fastmath=True)

# act′(v) as a float32 expression; p and q are the activation's parameters (slope, bounds, alpha)
SIG = "(np.float32(1.0) / (np.float32(1.0) + fexp(-v)))"
DERIVATIVE: dict[str, str] = {
    "relu": "np.float32(1.0) if v > np.float32(0.0) else np.float32(0.0)",
    "leaky_relu": "np.float32(1.0) if v > np.float32(0.0) else p",
    # Φ(v) + v·φ(v)
    "gelu": "np.float32(0.5) * (np.float32(1.0) + ferf(v * np.float32(0.7071067811865476))) + v * "
            "fexp(np.float32(-0.5) * v * v) * np.float32(0.3989422804014327)",
    "gelu_tanh": "gelu_tanh_grad(v)",
    "silu": f"{SIG} * (np.float32(1.0) + v * (np.float32(1.0) - {SIG}))",
    "tanh": "np.float32(1.0) - ftanh(v) * ftanh(v)",
    "sigmoid": f"{SIG} * (np.float32(1.0) - {SIG})",
    "abs": "np.float32(1.0) if v > np.float32(0.0) else (np.float32(-1.0) if v < np.float32(0.0) else "
           "np.float32(0.0))",
    "relu6": "np.float32(1.0) if np.float32(0.0) < v < np.float32(6.0) else np.float32(0.0)",
    "hardtanh": "np.float32(1.0) if p < v < q else np.float32(0.0)",
    "clamp": "np.float32(1.0) if p <= v <= q else np.float32(0.0)",
    "hardswish": "np.float32(0.0) if v < np.float32(-3.0) else (v / np.float32(3.0) + np.float32(0.5) if "
                 "v <= np.float32(3.0) else np.float32(1.0))",
    "hardsigmoid": "np.float32(1.0) / np.float32(6.0) if np.float32(-3.0) < v < np.float32(3.0) else "
                   "np.float32(0.0)",
    "mish": "mish_grad(v)",
    "elu": "np.float32(1.0) if v > np.float32(0.0) else p * fexp(v)",
}

GELU_TANH_GRAD = f"""\
{DEVICE_JIT}
def gelu_tanh_grad(v):
    c = np.float32(0.7978845608028654)
    k = np.float32(0.044715)
    t = ftanh(c * (v + k * v * v * v))
    return np.float32(0.5) * (np.float32(1.0) + t) + np.float32(0.5) * v * (np.float32(1.0) - t * t) * c * (
        np.float32(1.0) + np.float32(3.0) * k * v * v)
"""
# tanh(softplus(v)) + v·σ(v)·(1 − tanh²(softplus(v))); softplus in float64 (log1p), as the reference's logaddexp
MISH_GRAD = f"""\
{DEVICE_JIT}
def mish_grad(v):
    w = np.float64(v)
    sp = w if w > 30.0 else np.log1p(np.exp(w))
    t = np.float32(np.tanh(sp))
    s = np.float32(1.0) / (np.float32(1.0) + fexp(-v))
    return t + v * s * (np.float32(1.0) - t * t)
"""

ACT_GRAD = """\
{jit}
def {name}(x, dy, out, p, q):
    for i in prange(x.size):
        v = x[i]
        out[i] = dy[i] * ({expr})
"""


def _act_params(fn: str, ctx: NodeCtx) -> tuple[float, float]:
    if fn == "leaky_relu":
        return ctx.attr("slope", 0.01), 0.0
    if fn == "hardtanh":
        return ctx.attr("min", -1.0), ctx.attr("max", 1.0)
    if fn == "clamp":
        lo, hi = ctx.attr("min"), ctx.attr("max")
        return (float("-inf") if lo is None else lo), (float("inf") if hi is None else hi)
    if fn == "elu":
        return ctx.attr("alpha", 1.0), 0.0
    return 0.0, 0.0


def render_act_grad(ctx: NodeCtx) -> None:
    fn = ctx.attr("fn")
    if fn == "gelu" and ctx.attr("approx", "none") == "tanh":
        fn = "gelu_tanh"
    expr = DERIVATIVE[fn]
    if "gelu_tanh_grad(" in expr:
        ctx.device("ftanh")
        ctx.parts.device("gelu_tanh_grad", GELU_TANH_GRAD)
    if "mish_grad(" in expr:
        ctx.device("fexp")
        ctx.parts.device("mish_grad", MISH_GRAD)
    register(ctx.parts, expr)
    name = f"k_act_grad_{fn}"
    k = ctx.kernel(Kernel(name, ACT_GRAD.format(jit=JIT, name=name, expr=expr), (A1, A1, A1, F32, F32)))
    out = ctx.alloc(inplace=(1,))  # dy dies here in a chain of layers: each element is read, then written
    p, q = _act_params(fn, ctx)
    ctx.emit(f"{k}({ctx.flat(ctx.args[0])}, {ctx.flat(ctx.args[1])}, {ctx.flat(out)}, {f32_literal(p)}, "
             f"{f32_literal(q)})")


SOFTMAX_GRAD = """\
{jit}
def k_softmax_grad(y, dy, out):
    # per row: s = Σ y·dy (one vectorised sweep), then out = y·(dy − s)
    n, d = y.shape
    for r in prange(n):
        s = np.float32(0.0)
        for j in range(d):
            s += y[r, j] * dy[r, j]
        for j in range(d):
            out[r, j] = y[r, j] * (dy[r, j] - s)
"""

SOFTMAX_GRAD_MID = """\
{jit}
def k_softmax_grad_mid(y, dy, out):
    # [outer, d, inner], the softmax along d: the sums run as vectors over the contiguous inner axis
    no, d, ni = y.shape
    for o in prange(no):
        s = np.zeros(ni, np.float32)
        for j in range(d):
            for i in range(ni):
                s[i] += y[o, j, i] * dy[o, j, i]
        for j in range(d):
            for i in range(ni):
                out[o, j, i] = y[o, j, i] * (dy[o, j, i] - s[i])
"""


def render_softmax_grad(ctx: NodeCtx) -> None:
    shape = ctx.in_shape(0)
    axis = int(ctx.attr("axis", -1)) % len(shape)
    out = ctx.alloc(inplace=(1,))
    if axis == len(shape) - 1:
        k = ctx.kernel(Kernel("k_softmax_grad", SOFTMAX_GRAD.format(jit=JIT_REDUCE), (A2, A2, A2)))
        ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {ctx.rows(ctx.args[1], shape)}, {ctx.rows(out, shape)})")
        return
    view = f"({prod(shape[:axis])}, {shape[axis]}, {prod(shape[axis + 1:])})"
    k = ctx.kernel(Kernel("k_softmax_grad_mid", SOFTMAX_GRAD_MID.format(jit=JIT_REDUCE), (A3, A3, A3)))
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.args[1]}.reshape{view}, {out}.reshape{view})")


CAUSAL_MASK_GRAD = """\
{jit}
def k_causal_mask_grad(dy, out, nt, window):
    # rows are (..., query i): the gradient of a hidden score (key j > i, or j <= i - window when window > 0) is 0
    rows, ns = dy.shape
    for r in prange(rows):
        i = r % nt
        for j in range(ns):
            hidden = j > i or (window > 0 and j <= i - window)
            out[r, j] = np.float32(0.0) if hidden else dy[r, j]
"""


def render_causal_mask_grad(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    out = ctx.alloc(inplace=(0,))
    k = ctx.kernel(Kernel("k_causal_mask_grad", CAUSAL_MASK_GRAD.format(jit=JIT), (A2, A2, I64, I64)))
    window = ctx.attr("window")
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {ctx.rows(out, shape)}, {shape[-2]}, "
             f"{int_literal(int(window) if window is not None else 0)})")


SUM_ROWS = """\
{jit}
def k_sum_rows(x, out, parts):
    # out[j] = Σ_r x[r, j]: each task sums a block of columns over every row, in float64
    n, d = x.shape
    blocks = min(parts, d)
    for c in prange(blocks):
        j0 = c * d // blocks
        j1 = (c + 1) * d // blocks
        acc = np.zeros(j1 - j0, np.float64)
        for r in range(n):
            for j in range(j1 - j0):
                acc[j] += x[r, j0 + j]
        for j in range(j1 - j0):
            out[j0 + j] = np.float32(acc[j])
"""

SUM_TO = '''\
def sum_to(dy, shape, out):
    """dy summed over the axes along which ``shape`` was broadcast (NumPy's rules), in float64."""
    lead = dy.ndim - len(shape)
    s = dy.astype(np.float64).sum(axis=tuple(range(lead))) if lead else dy.astype(np.float64)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and s.shape[i] != 1)
    np.copyto(out, (s.sum(axis=axes, keepdims=True) if axes else s).reshape(out.shape))
'''


def render_sum_to(ctx: NodeCtx) -> None:
    src, dst = ctx.in_shape(), ctx.out_shape()
    out = ctx.alloc()
    lead = len(src) - len(dst)
    if tuple(src[lead:]) == tuple(dst):  # only leading axes summed: rows of the trailing block
        k = ctx.kernel(Kernel("k_sum_rows", SUM_ROWS.format(jit=JIT), (A2, A1, I64)))
        ctx.emit(f"{k}({ctx.args[0]}.reshape({prod(src[:lead])}, {max(1, prod(dst))}), {ctx.flat(out)}, {THREADS})")
        return
    helper = ctx.helper("sum_to", SUM_TO)
    ctx.emit(f"{helper}({ctx.args[0]}, {shape_literal(dst)}, {out})")


def render_slice_grad(ctx: NodeCtx) -> None:
    """Zeros of the operand's size along the axis, dy copied in at ``start``."""
    shape = ctx.out_shape()
    axis = int(ctx.attr("axis")) % len(shape)
    start = int(ctx.attr("start"))
    n = ctx.in_shape()[axis]
    out = ctx.alloc()
    ctx.emit(f"{out}.fill(np.float32(0.0))")
    index = "[" + ", ".join([":"] * axis + [f"{start}:{start + n}"]) + "]"
    ctx.emit(f"np.copyto({out}{index}, {ctx.args[0]})")


MINMAX_GRAD = '''\
def minmax_grad(a, b, dy, maximum, da, db):
    """dy to the operand that wins (a > b for maximum, a < b for minimum), dy/2 to each on a tie."""
    wins = a > b if maximum else a < b
    loses = a < b if maximum else a > b
    half = dy / np.float32(2.0)
    np.copyto(da, np.where(wins, dy, np.where(loses, np.float32(0.0), half)))
    np.copyto(db, np.where(loses, dy, np.where(wins, np.float32(0.0), half)))
'''


def render_minmax_grad(ctx: NodeCtx) -> None:
    helper = ctx.helper("minmax_grad", MINMAX_GRAD)
    da, db = ctx.alloc(0), ctx.alloc(1)
    maximum = "True" if ctx.attr("fn") == "maximum" else "False"
    ctx.emit(f"{helper}({ctx.args[0]}, {ctx.args[1]}, {ctx.args[2]}, {maximum}, {da}, {db})")


def render_rope_grad(ctx: NodeCtx) -> None:
    """rope's kernel with the angle negated: the adjoint of a rotation is the opposite rotation."""
    from irc.backends.cpu.render.sdpa import ROPE, ROPE_TABLES

    shape = ctx.in_shape()
    k = ctx.kernel(Kernel("k_rope", ROPE.format(jit=jit()), (A4, A2, A2, A4)))
    tables = ctx.helper("rope_tables", ROPE_TABLES)
    theta = float(rope_theta(ctx.node.attrs, key="theta"))
    out = ctx.alloc(inplace=(0,))
    cos, sin = f"{out}_cos", f"{out}_sin"
    ctx.emit(f"{cos}, {sin} = {tables}({shape[2]}, {shape[3]}, {float_literal(theta)})")
    ctx.emit(f"{k}({ctx.args[0]}, {cos}, -{sin}, {out})")
    ctx.emit(f"del {cos}, {sin}")


# The same draw as the NumPy reference (backends/numpy_ref/grad.py: dropout_rng, dropout_mask): float64
# uniforms from NumPy's generator, so both engines train with the very same masks
DROPOUT_MASK = '''\
def dropout_mask(seed, step, p, out):
    """0 with probability p, else 1/(1 - p): uniforms from (seed) or (seed, step), as the reference draws them."""
    rng = np.random.default_rng(seed if step is None else [seed, int(step.reshape(-1)[0]) % 2**63])
    keep = rng.random(out.shape) >= p
    np.copyto(out, np.where(keep, np.float32(1 / (1 - p)), np.float32(0.0)))
'''


def render_dropout_mask(ctx: NodeCtx) -> None:
    helper = ctx.helper("dropout_mask", DROPOUT_MASK)
    out = ctx.alloc()
    step = ctx.args[1] if len(ctx.args) > 1 else "None"
    ctx.emit(f"{helper}({int_literal(int(ctx.attr('seed', 0)))}, {step}, {float_literal(ctx.attr('p'))}, {out})")


RENDERERS = {
    "act_grad": render_act_grad,
    "softmax_grad": render_softmax_grad,
    "causal_mask_grad": render_causal_mask_grad,
    "sum_to": render_sum_to,
    "slice_grad": render_slice_grad,
    "minmax_grad": render_minmax_grad,
    "rope_grad": render_rope_grad,
    "dropout_mask": render_dropout_mask,
}
