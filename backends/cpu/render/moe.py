"""A mixture of experts (irc/ops/moe.py): route every token, then run each expert once on the tokens it got.

Routing is the router gemm and a per-token kernel (softmax over every expert, the top k by repeated
maximum, the lower index first on a tie, as the numpy reference's stable sort). The experts run in
parallel, one task each: an expert gathers its tokens' rows, multiplies them with BLAS (a [tokens, d] ×
[d, h] product, not one gemv per token) and writes each token's weighted result into that token's slot
of a [n, k, d] buffer, so two experts never write the same element; the k slots are summed at the end.
Shared experts are the ordinary gemm kernels over every row.
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A2, A3, F32, I2, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.activations import act
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS, gemm_call, glu_kernel
from irc.backends.cpu.render.mathfns import DEVICE_JIT
from irc.backends.literals import f32_literal

JIT = jit()

# the router's softmax over one row, unnormalised, as the forward and the backward both compute it
ROW_EXP = f"""\
{DEVICE_JIT}
def moe_row_exp(logits, i, p):
    # p = exp(logits[i] − max): returns Σ p, so p / Σ p is the row's softmax
    e_n = logits.shape[1]
    m = logits[i, 0]
    for e in range(1, e_n):
        m = max(m, logits[i, e])
    total = np.float32(0.0)
    for e in range(e_n):
        p[e] = np.exp(logits[i, e] - m)
        total += p[e]
    return total
"""

ROUTE = """\
{jit}
def k_moe_route(logits, chosen, weights, norm, scale):
    # logits [n, E] -> the top k experts of each row and their weights (softmax probabilities over all E)
    n, e_n = logits.shape
    k = chosen.shape[1]
    for i in prange(n):
        p = np.empty(e_n, np.float32)
        total = moe_row_exp(logits, i, p)
        taken = np.zeros(e_n, np.bool_)
        s = np.float32(0.0)
        for j in range(k):
            best = -1
            for e in range(e_n):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            chosen[i, j] = best
            weights[i, j] = p[best] / total
            s += weights[i, j]
        for j in range(k):
            w = weights[i, j] / s if norm else weights[i, j]
            weights[i, j] = w * scale
"""

def route_kernel(ctx: NodeCtx) -> str:
    """The top-k routing kernel (and the row softmax it calls) in the module; its name."""
    ctx.parts.device("moe_row_exp", ROW_EXP)
    return ctx.kernel(Kernel("k_moe_route", ROUTE.format(jit=JIT), (A2, I2, A2, I64, F32)))


# the (token, slot) pairs that chose expert e, in token order: what the forward and the backward gather
EXPERT_TOKENS = f"""\
{DEVICE_JIT}
def expert_tokens(chosen, e):
    n, k = chosen.shape
    cnt = 0
    for i in range(n):
        for j in range(k):
            if chosen[i, j] == e:
                cnt += 1
    rows = np.empty(cnt, np.int64)
    slots = np.empty(cnt, np.int64)
    r = 0
    for i in range(n):
        for j in range(k):
            if chosen[i, j] == e:
                rows[r] = i
                slots[r] = j
                r += 1
    return rows, slots
"""


def experts_kernel(ctx: NodeCtx, kernel: Kernel) -> str:
    """Add an experts kernel, and the expert_tokens it calls, to the module; its name."""
    ctx.parts.device("expert_tokens", EXPERT_TOKENS)
    return ctx.kernel(kernel)


# the body every expert task runs: gather its tokens, then {ffn} on the rows xs, then scatter
EXPERTS = """\
{jit}
def {name}(x, chosen, cw, {weights}, y):
    # y[i, j] = cw[i, j] * FFN_e(x[i]) for e = chosen[i, j]: one task per expert, BLAS on its rows
    d = x.shape[1]
    for e in prange({first}.shape[0]):
        rows, slots = expert_tokens(chosen, e)
        cnt = rows.size
        if cnt > 0:
            xs = np.empty((cnt, d), np.float32)
            for a in range(cnt):
                xs[a] = x[rows[a]]
{ffn}\
            for a in range(cnt):
                wgt = cw[rows[a], slots[a]]
                for c in range(d):
                    y[rows[a], slots[a], c] = wgt * o[a, c]
"""

GATED_FFN = """\
            g = np.dot(xs, w_gate[e].T)
            u = np.dot(xs, w_up[e].T)
            for a in range(cnt):
                for b in range(g.shape[1]):
                    v = g[a, b]
                    g[a, b] = ({expr}) * u[a, b]
            o = np.dot(g, w_down[e].T)
"""

PLAIN_FFN = """\
            g = np.dot(xs, w1[e].T)
            for a in range(cnt):
                for b in range(g.shape[1]):
                    v = g[a, b]
                    g[a, b] = {expr}
            o = np.dot(g, w2[e].T)
"""


def _experts_kernel(ctx: NodeCtx, act_name: str, gated: bool) -> str:
    expr = act(ctx.parts, act_name)
    names = ("w_gate", "w_up", "w_down") if gated else ("w1", "w2")
    name = f"k_moe_{'gated' if gated else 'plain'}_{act_name}"
    src = EXPERTS.format(jit=JIT, name=name, weights=", ".join(names), first=names[0],
                         ffn=(GATED_FFN if gated else PLAIN_FFN).format(expr=expr))
    return experts_kernel(ctx, Kernel(name, src, (A2, I2, A2) + (A3,) * len(names) + (A3,)))


def _shared(ctx: NodeCtx, x: str, rows: int, gated: bool, out: str) -> None:
    """The shared experts over every row into the result ``out``: gemm kernels, as swiglu and ffn render."""
    first = "shared_gate" if gated else "shared_w1"
    hidden = ctx.weight_shape(first)[0]
    h = f"{ctx.outs[0]}_shared"
    ctx.scratch(h, (rows, hidden))
    if gated:
        k = glu_kernel(ctx, ctx.attr("act"))
        key = f"~stack({ctx.weight_key('shared_gate')},{ctx.weight_key('shared_up')})"
        w = ctx.derive(key, f"np.concatenate([{ctx.weight('shared_gate')}, {ctx.weight('shared_up')}])")
        ctx.emit(f"{k}({x}, {w}, {h}, {THREADS})")
        down = ctx.weight("shared_down")
    else:
        gemm_call(ctx, x, (rows, ctx.in_shape()[-1]), ctx.weight("shared_w1"), f"np.zeros({hidden}, np.float32)",
                  ctx.attr("act"), out=h, out_shape=(rows, hidden))
        down = ctx.weight("shared_w2")
    d = ctx.in_shape()[-1]
    gemm_call(ctx, h, (rows, hidden), down, f"np.zeros({d}, np.float32)", out=out, out_shape=(rows, d))
    ctx.emit(f"del {h}")


def render_moe(ctx: NodeCtx) -> None:
    shape = ctx.in_shape()
    rows, d = prod(shape[:-1]), shape[-1]
    experts, top_k, gated = int(ctx.attr("experts")), int(ctx.attr("top_k")), bool(ctx.attr("gated"))
    x = ctx.rows(ctx.args[0], shape)
    v = ctx.outs[0]
    logits, chosen, cw, y = f"{v}_logits", f"{v}_chosen", f"{v}_weights", f"{v}_slots"
    ctx.scratch(logits, (rows, experts))
    gemm_call(ctx, x, (rows, d), ctx.weight("router"), f"np.zeros({experts}, np.float32)", out=logits,
              out_shape=(rows, experts))
    ctx.emit(f"{chosen} = np.empty(({rows}, {top_k}), np.int64)")
    ctx.emit(f"{cw} = np.empty(({rows}, {top_k}), np.float32)")
    route = route_kernel(ctx)
    ctx.emit(f"{route}({logits}, {chosen}, {cw}, {int(bool(ctx.attr('norm_topk')))}, "
             f"{f32_literal(ctx.attr('scale'))})")
    ctx.emit(f"{y} = np.zeros(({rows}, {top_k}, {d}), np.float32)")
    k = _experts_kernel(ctx, ctx.attr("act"), gated)
    names = ("w_gate", "w_up", "w_down") if gated else ("w1", "w2")
    ctx.emit(f"{k}({x}, {chosen}, {cw}, {', '.join(ctx.weight(n) for n in names)}, {y})")
    result = ctx.alloc()
    out = ctx.rows(result, ctx.out_shape())
    if ctx.has_weight("shared_down") or ctx.has_weight("shared_w2"):
        _shared(ctx, x, rows, gated, result)
        ctx.emit(f"np.add({out}, {y}.sum(axis=1), out={out})")
    else:
        ctx.emit(f"np.sum({y}, axis=1, out={out})")
    ctx.emit(f"del {logits}, {chosen}, {cw}, {y}")


RENDERERS = {"moe": render_moe}
