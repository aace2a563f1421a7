"""The norms' backward (layernorm_grad, rmsnorm_grad, batchnorm_grad, groupnorm_grad, instancenorm_grad) and
BatchNorm's training-mode forward.

A row's backward is one sweep that gathers everything it needs at once — the shifted sum and sum of squares
of x (its statistics, as the forward's kernel takes them) and the sums of ``g·dy`` and ``g·dy·(x − k0)`` — then
one sweep, still in L1, that writes ``dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))/σ`` and adds ``dy·x̂`` and ``dy`` to
the thread's partial gain and bias gradients (``Σ dx̂·x̂ = (Σ g·dy·(x − k0) − (mean − k0)·Σ g·dy)/σ``). The
partials are float64, one row per thread, added at the end: no two threads write the same gradient.
BatchNorm's statistics pool a channel over the batch and every position (long sums: float64).
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, A2, A3, F32, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.cpu.render.mathfns import DEVICE_JIT
from irc.backends.literals import f32_literal

JIT = jit(fastmath=True)

LAYERNORM_GRAD = """\
{jit}
def k_layernorm_grad(x, dy, g, dx, dg, db, eps, rms, parts):
    # rows of [n, d] normalised over d (rms: RMSNorm, no mean); dg, db: Σ over rows of dy·x̂ and dy
    n, d = x.shape
    pg = np.zeros((parts, d), np.float64)
    pb = np.zeros((parts, d), np.float64)
    for p in prange(parts):
        for r in range(p * n // parts, (p + 1) * n // parts):
            k0 = np.float32(0.0) if rms else x[r, 0]
            s = np.float32(0.0)
            q = np.float32(0.0)
            a = np.float32(0.0)
            b = np.float32(0.0)
            for j in range(d):
                t = x[r, j] - k0
                gd = g[j] * dy[r, j]
                s += t
                q += t * t
                a += gd
                b += gd * t
            if rms:
                ms = np.float32(0.0)
                var = q / np.float32(d)
                ma = np.float32(0.0)
            else:
                ms = s / np.float32(d)
                var = max(q / np.float32(d) - ms * ms, np.float32(0.0))
                ma = a / np.float32(d)
            inv = np.float32(1.0) / np.sqrt(var + eps)
            mean = k0 + ms
            mb = inv * (b - ms * a) / np.float32(d)  # mean(dx̂·x̂)
            for j in range(d):
                xh = (x[r, j] - mean) * inv
                e = dy[r, j]
                dx[r, j] = inv * (g[j] * e - ma - xh * mb)
                pg[p, j] += e * xh
                pb[p, j] += e
    for j in range(d):
        sg = 0.0
        sb = 0.0
        for p in range(parts):
            sg += pg[p, j]
            sb += pb[p, j]
        dg[j] = np.float32(sg)
        db[j] = np.float32(sb)
"""

LAYERNORM_GRAD_MID = '''\
def layernorm_grad_mid(x, dy, g, eps, dx, dg, db):
    """LayerNorm over the middle axis of [outer, d, inner] (channels-first): NumPy in float64."""
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    xh = (x64 - mean) * inv
    dxh = dy64 * g.astype(np.float64)[None, :, None]
    np.copyto(dx, inv * (dxh - dxh.mean(axis=1, keepdims=True) - xh * (dxh * xh).mean(axis=1, keepdims=True)))
    np.copyto(dg, (dy64 * xh).sum(axis=(0, 2)))
    np.copyto(db, dy64.sum(axis=(0, 2)))
'''


def _grads(ctx: NodeCtx, d: int) -> tuple[str, str]:
    """The variables of the gain and bias gradients (results 1 and 2), or scratch the kernel may fill."""
    names = [ctx.alloc(i) for i in range(1, len(ctx.outs))]
    scratch = f"np.empty({d}, np.float32)"
    return (names[0] if names else scratch), (names[1] if len(names) > 1 else scratch)


def render_layernorm_grad(ctx: NodeCtx, rms: bool = False) -> None:
    shape = ctx.in_shape()
    axis = len(shape) - 1 if rms or ctx.attr("axis") is None else int(ctx.attr("axis")) % len(shape)
    d = shape[axis]
    g = ctx.weight("gain") if ctx.has_weight("gain") else f"np.ones({d}, np.float32)"
    eps = f32_literal(ctx.attr("eps", 1e-6 if rms else 1e-5))
    dx = ctx.alloc(0, inplace=(1,))  # each dy is read (second sweep) before its dx is written
    dg, db = _grads(ctx, d)
    if axis != len(shape) - 1:
        helper = ctx.helper("layernorm_grad_mid", LAYERNORM_GRAD_MID)
        view = f"({prod(shape[:axis])}, {d}, {prod(shape[axis + 1:])})"
        ctx.emit(f"{helper}({ctx.args[0]}.reshape{view}, {ctx.args[1]}.reshape{view}, {g}, {eps}, "
                 f"{dx}.reshape{view}, {dg}, {db})")
        return
    k = ctx.kernel(Kernel("k_layernorm_grad", LAYERNORM_GRAD.format(jit=JIT),
                          (A2, A2, A1, A2, A1, A1, F32, I64, I64)))
    ctx.emit(f"{k}({ctx.rows(ctx.args[0], shape)}, {ctx.rows(ctx.args[1], shape)}, {g}, {ctx.rows(dx, shape)}, "
             f"{dg}, {db}, {eps}, {1 if rms else 0}, {THREADS})")


def render_rmsnorm_grad(ctx: NodeCtx) -> None:
    render_layernorm_grad(ctx, rms=True)


# [outer, C, inner]: channel c pools x[:, c, :]. Statistics and the gradient's sums in float64.
CHANNEL_MOMENTS = f"""\
{DEVICE_JIT}
def channel_moments(x, c):
    # channel c of x [outer, C, inner]: its mean and the sum of squared deviations from it (two passes)
    no, _, ni = x.shape
    s = 0.0
    for o in range(no):
        for i in range(ni):
            s += np.float64(x[o, c, i])
    mu = s / (no * ni)
    q = 0.0
    for o in range(no):
        for i in range(ni):
            t = np.float64(x[o, c, i]) - mu
            q += t * t
    return mu, q
"""

BATCHNORM_GRAD = """\
{jit}
def k_batchnorm_grad(x, dy, g, mean, var, dx, dg, db, eps, train):
    no, nc, ni = x.shape
    m = no * ni
    for c in prange(nc):
        if train:
            mu, q = channel_moments(x, c)
            v = q / m
        else:
            mu = np.float64(mean[c])
            v = np.float64(var[c])
        inv = 1.0 / np.sqrt(v + np.float64(eps))
        a = 0.0
        b = 0.0
        for o in range(no):
            for i in range(ni):
                e = np.float64(dy[o, c, i])
                a += e
                b += e * (np.float64(x[o, c, i]) - mu)
        gain = inv * b  # Σ dy·x̂
        dg[c] = np.float32(gain)
        db[c] = np.float32(a)
        gc = np.float64(g[c])
        if train:  # dx = g·inv·(dy − mean(dy) − x̂·mean(dy·x̂))
            sa = np.float32(a / m)
            sx = np.float32(gain / m)
            f = np.float32(gc * inv)
            mf = np.float32(mu)
            i32 = np.float32(inv)
            for o in range(no):
                for i in range(ni):
                    xh = (x[o, c, i] - mf) * i32
                    dx[o, c, i] = f * (dy[o, c, i] - sa - xh * sx)
        else:
            f = np.float32(gc * inv)
            for o in range(no):
                for i in range(ni):
                    dx[o, c, i] = dy[o, c, i] * f
"""

BATCHNORM_TRAIN = """\
{jit}
def k_batchnorm_train(x, g, b, out, bmean, bvar, eps):
    # this batch's per-channel mean and biased variance normalise; the unbiased variance is returned
    no, nc, ni = x.shape
    m = no * ni
    for c in prange(nc):
        mu, q = channel_moments(x, c)
        v = q / m
        inv = 1.0 / np.sqrt(v + np.float64(eps))
        scale = np.float32(inv * np.float64(g[c]))
        shift = np.float32(np.float64(b[c]) - mu * inv * np.float64(g[c]))
        for o in range(no):
            for i in range(ni):
                out[o, c, i] = x[o, c, i] * scale + shift
        bmean[c] = np.float32(mu)
        bvar[c] = np.float32(q / max(m - 1, 1))
"""


def _channel_view(ctx: NodeCtx) -> tuple[str, int]:
    shape = ctx.in_shape()
    axis = int(ctx.attr("axis", 1)) % len(shape)
    return f"({prod(shape[:axis])}, {shape[axis]}, {prod(shape[axis + 1:])})", shape[axis]


def render_batchnorm_grad(ctx: NodeCtx) -> None:
    view, c = _channel_view(ctx)
    train = bool(ctx.attr("train", False))
    ctx.parts.device("channel_moments", CHANNEL_MOMENTS)  # the kernel's train branch names it either way
    k = ctx.kernel(Kernel("k_batchnorm_grad", BATCHNORM_GRAD.format(jit=JIT),
                          (A3, A3, A1, A1, A1, A3, A1, A1, F32, I64)))
    dx = ctx.alloc(0)
    dg, db = ctx.alloc(1), ctx.alloc(2)
    stats = "np.zeros(1, np.float32), np.zeros(1, np.float32)" if train else \
        f"{ctx.weight('running_mean')}, {ctx.weight('running_var')}"
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.args[1]}.reshape{view}, {ctx.weight('gain')}, {stats}, "
             f"{dx}.reshape{view}, {dg}, {db}, {f32_literal(ctx.attr('eps', 1e-5))}, {1 if train else 0})")


def render_batchnorm(ctx: NodeCtx) -> None:
    """batchnorm: the inference kernel of norm.py, or with train=true this batch's statistics (and them)."""
    from irc.backends.cpu.render import norm

    if not ctx.attr("train", False):
        norm.render_batchnorm(ctx)
        return
    view, c = _channel_view(ctx)
    ctx.parts.device("channel_moments", CHANNEL_MOMENTS)
    k = ctx.kernel(Kernel("k_batchnorm_train", BATCHNORM_TRAIN.format(jit=JIT), (A3, A1, A1, A3, A1, A1, F32)))
    out = ctx.alloc(0)
    mean, var = ctx.alloc(1), ctx.alloc(2)
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.weight('gain')}, {ctx.weight('bias')}, {out}.reshape{view}, "
             f"{mean}, {var}, {f32_literal(ctx.attr('eps', 1e-5))})")


# x as [B·groups, C/groups, positions], one (sample, group) per row; the gain and bias are per channel, so
# their gradients gather over rows of every sample: per-thread float64 partials
GROUPNORM_GRAD = """\
{jit}
def k_groupnorm_grad(x, dy, g, dx, dg, db, groups, eps, parts):
    n, cg, ns = x.shape
    nc = groups * cg
    m = cg * ns
    pg = np.zeros((parts, nc), np.float64)
    pb = np.zeros((parts, nc), np.float64)
    for p in prange(parts):
        for r in range(p * n // parts, (p + 1) * n // parts):
            g0 = (r % groups) * cg
            k0 = np.float64(x[r, 0, 0])
            s = 0.0
            q = 0.0
            a = 0.0
            b = 0.0
            for c in range(cg):
                gc = np.float64(g[g0 + c])
                for i in range(ns):
                    t = np.float64(x[r, c, i]) - k0
                    gd = gc * np.float64(dy[r, c, i])
                    s += t
                    q += t * t
                    a += gd
                    b += gd * t
            ms = s / m
            var = max(q / m - ms * ms, 0.0)
            inv = 1.0 / np.sqrt(var + np.float64(eps))
            ma = np.float32(a / m)
            mb = np.float32(inv * (b - ms * a) / m)
            mean = np.float32(k0 + ms)
            i32 = np.float32(inv)
            for c in range(cg):
                gc = g[g0 + c]
                sg = 0.0
                sb = 0.0
                for i in range(ns):
                    xh = (x[r, c, i] - mean) * i32
                    e = dy[r, c, i]
                    dx[r, c, i] = i32 * (gc * e - ma - xh * mb)
                    sg += np.float64(e * xh)
                    sb += np.float64(e)
                pg[p, g0 + c] += sg
                pb[p, g0 + c] += sb
    for c in range(nc):
        sg = 0.0
        sb = 0.0
        for p in range(parts):
            sg += pg[p, c]
            sb += pb[p, c]
        dg[c] = np.float32(sg)
        db[c] = np.float32(sb)
"""


def render_groupnorm_grad(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    c = shape[1]
    groups = c if ctx.node.op == "instancenorm_grad" else int(ctx.attr("groups"))
    view = f"({shape[0] * groups}, {c // groups}, {prod(shape[2:])})"
    k = ctx.kernel(Kernel("k_groupnorm_grad", GROUPNORM_GRAD.format(jit=JIT), (A3, A3, A1, A3, A1, A1, I64, F32, I64)))
    g = ctx.weight("gain") if ctx.has_weight("gain") else f"np.ones({c}, np.float32)"
    dx = ctx.alloc(0)
    dg, db = _grads(ctx, c)
    ctx.emit(f"{k}({ctx.args[0]}.reshape{view}, {ctx.args[1]}.reshape{view}, {g}, {dx}.reshape{view}, {dg}, {db}, "
             f"{groups}, {f32_literal(ctx.attr('eps', 1e-5))}, {THREADS})")


# what a generated backend's checks read (emit_checks.renderer): these renderers run train=true nodes too
render_batchnorm.trains = True  # type: ignore[attr-defined]
render_batchnorm_grad.trains = True  # type: ignore[attr-defined]

RENDERERS = {
    "layernorm_grad": render_layernorm_grad,
    "rmsnorm_grad": render_rmsnorm_grad,
    "batchnorm_grad": render_batchnorm_grad,
    "groupnorm_grad": render_groupnorm_grad,
    "instancenorm_grad": render_groupnorm_grad,
    "batchnorm": render_batchnorm,  # replaces norm.py's entry: training mode too (the inference path is norm.py's)
}
