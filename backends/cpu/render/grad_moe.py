"""The mixture of experts' backward (irc/ops/grad_moe.py): ``moe_grad(x, dy)`` -> dx and every weight's gradient.

The routing is the forward's (backends/cpu/render/moe.py: the router gemm and its top-k kernel), so the
gradient reaches exactly the experts the forward chose. Then one task per expert, as the forward: it gathers
its tokens' rows of x and dy, and with BLAS on those rows (never one gemv per token) recomputes its hidden
layer, takes ``q = dy·W_down`` and writes its own matrices' gradients (``dW_down = (w·dy)ᵀ·hidden``,
``dW_in = dpreᵀ·x``), its tokens' input gradients into their slot of a [n, k, d] buffer and ``dy·FFN_e(x)``
into their slot of a [n, k] one, so no two experts write the same element. A per-row kernel then takes the
k weights' gradients back through the renormalisation (or scale) and the softmax (recomputed from the
logits) to the logits, and two BLAS products give the router's gradient and its part of dx. The shared
experts run through the same expert kernel as one expert that every token is routed to with weight 1.
The equations are the reference's (backends/numpy_ref/experts_grad.py).
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A2, A3, F32, I2, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.activations import act, register
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import gemm_call
from irc.backends.cpu.render.grad_elementwise import DERIVATIVE, GELU_TANH_GRAD
from irc.backends.cpu.render.moe import experts_kernel, route_kernel
from irc.backends.literals import f32_literal

JIT = jit()

EXPERTS_GRAD = """\
{jit}
def {name}(x, dy, chosen, cw, {weights}, {grads}, dxs, dws):
    # one task per expert e: its rows' dx into dxs[i, j] and dy·FFN_e(x[i]) into dws[i, j] (e = chosen[i, j]),
    # and the gradients of its own matrices
    d = x.shape[1]
    for e in prange({first}.shape[0]):
        rows, slots = expert_tokens(chosen, e)
        cnt = rows.size
        if cnt == 0:
{zero}\
            continue
        xs = np.empty((cnt, d), np.float32)
        ds = np.empty((cnt, d), np.float32)  # dy
        dsw = np.empty((cnt, d), np.float32)  # w·dy, the gradient of the expert's output
        for a in range(cnt):
            i = rows[a]
            wgt = cw[i, slots[a]]
            for c in range(d):
                xs[a, c] = x[i, c]
                ds[a, c] = dy[i, c]
                dsw[a, c] = wgt * dy[i, c]
{body}\
        for a in range(cnt):
            dws[rows[a], slots[a]] = dwa[a]
            for c in range(d):
                dxs[rows[a], slots[a], c] = dxe[a, c]
"""

GATED_GRAD = """\
        pre = np.dot(xs, w_gate[e].T)
        up = np.dot(xs, w_up[e].T)
        q = np.dot(ds, w_down[e])  # dy back through the down matrix, before the weight
        hid = np.empty_like(pre)
        dwa = np.empty(cnt, np.float32)
        for a in range(cnt):
            wgt = cw[rows[a], slots[a]]
            s = np.float32(0.0)
            for b in range(pre.shape[1]):
                v = pre[a, b]
                f = {expr}
                fp = {deriv}
                u = up[a, b]
                hid[a, b] = f * u
                s += q[a, b] * f * u
                dh = wgt * q[a, b]
                pre[a, b] = dh * u * fp  # d(gate pre-activation)
                up[a, b] = dh * f  # d(up)
            dwa[a] = s
        np.dot(dsw.T, hid, g_down[e])
        np.dot(pre.T, xs, g_gate[e])
        np.dot(up.T, xs, g_up[e])
        dxe = np.dot(pre, w_gate[e]) + np.dot(up, w_up[e])
"""

PLAIN_GRAD = """\
        pre = np.dot(xs, w1[e].T)
        q = np.dot(ds, w2[e])
        hid = np.empty_like(pre)
        dwa = np.empty(cnt, np.float32)
        for a in range(cnt):
            wgt = cw[rows[a], slots[a]]
            s = np.float32(0.0)
            for b in range(pre.shape[1]):
                v = pre[a, b]
                f = {expr}
                fp = {deriv}
                hid[a, b] = f
                s += q[a, b] * f
                pre[a, b] = wgt * q[a, b] * fp
            dwa[a] = s
        np.dot(dsw.T, hid, g2[e])
        np.dot(pre.T, xs, g1[e])
        dxe = np.dot(pre, w1[e])
"""

ZERO = """\
            for t in range({g}.shape[1]):
                for c in range({g}.shape[2]):
                    {g}[e, t, c] = np.float32(0.0)
"""

ROUTE_GRAD = """\
{jit}
def k_moe_route_grad(logits, chosen, dws, x, router, dlogits, drouter, dxr, norm, scale):
    # dws [n, k]: the gradients of the k routed weights w = scale·g/Σg (norm) or scale·g, g the chosen
    # probabilities of softmax(logits); the top-k choice has none. dlogits = p·(dp − Σ p·dp), dp = dg at the
    # chosen experts and 0 elsewhere; then drouter = dlogitsᵀ·x and dxr = dlogits·router.
    n, e_n = logits.shape
    k = chosen.shape[1]
    for i in prange(n):
        p = np.empty(e_n, np.float32)
        total = moe_row_exp(logits, i, p)
        for e in range(e_n):
            p[e] = p[e] / total
        s = np.float32(0.0)
        t = np.float32(0.0)
        for j in range(k):
            g = p[chosen[i, j]]
            s += g
            t += dws[i, j] * g
        dp = np.zeros(e_n, np.float32)
        for j in range(k):
            dp[chosen[i, j]] = scale / s * (dws[i, j] - t / s) if norm else scale * dws[i, j]
        u = np.float32(0.0)
        for e in range(e_n):
            u += p[e] * dp[e]
        for e in range(e_n):
            dlogits[i, e] = p[e] * (dp[e] - u)
    np.dot(dlogits.T, x, drouter)
    np.dot(dlogits, router, dxr)
"""

GATED = ("w_gate", "w_up", "w_down")
PLAIN = ("w1", "w2")


def _derivative(ctx: NodeCtx, name: str) -> str:
    """act′(v) as act_grad's CPU kernel writes it (gelu_tanh through its device function)."""
    expr = DERIVATIVE[name]
    if "gelu_tanh_grad(" in expr:
        ctx.device("ftanh")
        ctx.parts.device("gelu_tanh_grad", GELU_TANH_GRAD)
    return register(ctx.parts, expr)


def _experts_grad_kernel(ctx: NodeCtx, act_name: str, gated: bool) -> str:
    names = GATED if gated else PLAIN
    grads = ("g_gate", "g_up", "g_down") if gated else ("g1", "g2")
    name = f"k_moe_grad_{'gated' if gated else 'plain'}_{act_name}"
    body = (GATED_GRAD if gated else PLAIN_GRAD).format(expr=act(ctx.parts, act_name),
                                                         deriv=_derivative(ctx, act_name))
    src = EXPERTS_GRAD.format(jit=JIT, name=name, weights=", ".join(names), grads=", ".join(grads), first=names[0],
                              zero="".join(ZERO.format(g=g) for g in grads), body=body)
    args = (A2, A2, I2, A2) + (A3,) * (2 * len(names)) + (A3, A2)
    return experts_kernel(ctx, Kernel(name, src, args))


def render_moe_grad(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    n, d = prod(shape[:-1]), shape[-1]
    experts, top_k, gated = int(ctx.attr("experts")), int(ctx.attr("top_k")), bool(ctx.attr("gated"))
    x, dy = ctx.rows(ctx.args[0], shape), ctx.rows(ctx.args[1], shape)
    outs = {name: ctx.alloc(i + 1) for i, name in enumerate(ctx.params)}  # the record's parameter order
    dx_rows = ctx.rows(ctx.alloc(0), shape)
    v = ctx.outs[0]
    logits, chosen, cw = f"{v}_logits", f"{v}_chosen", f"{v}_weights"
    dxs, dws, dlogits = f"{v}_dxs", f"{v}_dws", f"{v}_dlogits"
    # the forward's routing, again: the same router gemm and top-k kernel
    ctx.emit(f"{logits} = np.empty(({n}, {experts}), np.float32)")
    gemm_call(ctx, x, (n, d), ctx.weight("router"), f"np.zeros({experts}, np.float32)", out=logits,
              out_shape=(n, experts))
    ctx.emit(f"{chosen} = np.empty(({n}, {top_k}), np.int64)")
    ctx.emit(f"{cw} = np.empty(({n}, {top_k}), np.float32)")
    route = route_kernel(ctx)
    norm, scale = int(bool(ctx.attr("norm_topk"))), f32_literal(ctx.attr("scale"))
    ctx.emit(f"{route}({logits}, {chosen}, {cw}, {norm}, {scale})")
    k = _experts_grad_kernel(ctx, ctx.attr("act"), gated)
    names = GATED if gated else PLAIN
    ctx.emit(f"{dxs} = np.empty(({n}, {top_k}, {d}), np.float32)")
    ctx.emit(f"{dws} = np.empty(({n}, {top_k}), np.float32)")
    ctx.emit(f"{k}({x}, {dy}, {chosen}, {cw}, {', '.join(ctx.weight(m) for m in names)}, "
             f"{', '.join(outs[m] for m in names)}, {dxs}, {dws})")
    ctx.emit(f"{dlogits} = np.empty(({n}, {experts}), np.float32)")
    rk = ctx.kernel(Kernel("k_moe_route_grad", ROUTE_GRAD.format(jit=JIT), (A2, I2, A2, A2, A2, A2, A2, A2, I64, F32)))
    ctx.emit(f"{rk}({logits}, {chosen}, {dws}, {x}, {ctx.weight('router')}, {dlogits}, {outs['router']}, {dx_rows}, "
             f"{norm}, {scale})")
    ctx.emit(f"np.add({dx_rows}, {dxs}.sum(axis=1), out={dx_rows})")
    shared = [f"shared_{m.removeprefix('w_')}" for m in names]
    if all(ctx.has_weight(m) for m in shared):
        # the shared experts: one expert (stacked views of one) that every row reaches with weight 1
        one = f"{v}_one"
        ctx.emit(f"{one} = np.ones(({n}, 1), np.float32)")
        ctx.emit(f"{dxs} = np.empty(({n}, 1, {d}), np.float32)")
        views = [f"{ctx.weight(m)}.reshape((1, *{ctx.weight(m)}.shape))" for m in shared]
        gviews = [f"{outs[m]}.reshape((1, *{outs[m]}.shape))" for m in shared]
        ctx.emit(f"{k}({x}, {dy}, np.zeros(({n}, 1), np.int64), {one}, {', '.join(views)}, {', '.join(gviews)}, "
                 f"{dxs}, np.empty(({n}, 1), np.float32))")
        ctx.emit(f"np.add({dx_rows}, {dxs}[:, 0], out={dx_rows})")
        ctx.emit(f"del {one}")
    ctx.emit(f"del {logits}, {chosen}, {cw}, {dxs}, {dws}, {dlogits}")


RENDERERS = {"moe_grad": render_moe_grad}
