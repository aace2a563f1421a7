"""RNN, LSTM and GRU: the input projection of every step in one GEMM, then one launch per
step (two for the chapter's GRU, whose reset gate must act on all of h first).

A step's thread owns one hidden unit of one sequence; it reads the previous state from the
output sequence and the recurrent weights transposed (made once, when the weights are
uploaded), so neighbouring threads read neighbouring weights.
"""

from __future__ import annotations

from irc.backends.cpu.module import A2, A3, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx
from irc.backends.cuda.render.dense import launch_gemm
from irc.backends.cuda.render.gemm_src import GemmSpec, pick_tile

SIG = "np.float32(1.0) / (np.float32(1.0) + math.exp(-({})))"

HEAD = """\
    i = cuda.grid(1)
    if i < bsz * hid:
        b = i // hid
        j = i % hid
"""

LSTM = f"""\
{JIT}
def k_lstm_step(px, wt, seq, c, h_last, t, bsz, hid):
{HEAD}\
        gi = px[b, t, j]
        gf = px[b, t, hid + j]
        gg = px[b, t, 2 * hid + j]
        go = px[b, t, 3 * hid + j]
        if t > 0:
            for q in range(hid):
                hv = seq[b, t - 1, q]
                gi += hv * wt[q, j]
                gf += hv * wt[q, hid + j]
                gg += hv * wt[q, 2 * hid + j]
                go += hv * wt[q, 3 * hid + j]
        cp = c[b, j] if t > 0 else np.float32(0.0)
        cn = {SIG.format("gf")} * cp + {SIG.format("gi")} * math.tanh(gg)
        hn = {SIG.format("go")} * math.tanh(cn)
        c[b, j] = cn
        seq[b, t, j] = hn
        if t == seq.shape[1] - 1:
            h_last[b, j] = hn
"""

RNN = """\
{jit}
def k_rnn_{act}_step(px, wt, seq, h_last, t, bsz, hid):
{head}\
        a = px[b, t, j]
        if t > 0:
            for q in range(hid):
                a += seq[b, t - 1, q] * wt[q, j]
        hn = {expr}
        seq[b, t, j] = hn
        if t == seq.shape[1] - 1:
            h_last[b, j] = hn
"""
RNN_ACT = {"tanh": "math.tanh(a)", "relu": "a if a > np.float32(0.0) else np.float32(0.0)"}

GRU_TORCH = f"""\
{JIT}
def k_gru_torch_step(px, wt, bh, seq, h_last, t, bsz, hid):
{HEAD}\
        hr = bh[0, j]
        hz = bh[0, hid + j]
        hn = bh[0, 2 * hid + j]
        hp = np.float32(0.0)
        if t > 0:
            hp = seq[b, t - 1, j]
            for q in range(hid):
                hv = seq[b, t - 1, q]
                hr += hv * wt[q, j]
                hz += hv * wt[q, hid + j]
                hn += hv * wt[q, 2 * hid + j]
        r = {SIG.format("px[b, t, j] + hr")}
        z = {SIG.format("px[b, t, hid + j] + hz")}
        n = math.tanh(px[b, t, 2 * hid + j] + r * hn)
        h = (np.float32(1.0) - z) * n + z * hp
        seq[b, t, j] = h
        if t == seq.shape[1] - 1:
            h_last[b, j] = h
"""

GRU_GATES = f"""\
{JIT}
def k_gru_gates_step(px, wt, seq, rh, zs, t, bsz, hid):
{HEAD}\
        ar = px[b, t, j]
        az = px[b, t, hid + j]
        hp = np.float32(0.0)
        if t > 0:
            hp = seq[b, t - 1, j]
            for q in range(hid):
                hv = seq[b, t - 1, q]
                ar += hv * wt[q, j]
                az += hv * wt[q, hid + j]
        rh[b, j] = {SIG.format("ar")} * hp
        zs[b, j] = {SIG.format("az")}
"""

GRU_UPDATE = f"""\
{JIT}
def k_gru_update_step(px, wt, seq, rh, zs, h_last, t, bsz, hid):
{HEAD}\
        a = px[b, t, 2 * hid + j]
        for q in range(hid):
            a += rh[b, q] * wt[q, 2 * hid + j]
        n = math.tanh(a)
        hp = seq[b, t - 1, j] if t > 0 else np.float32(0.0)
        z = zs[b, j]
        h = (np.float32(1.0) - z) * hp + z * n
        seq[b, t, j] = h
        if t == seq.shape[1] - 1:
            h_last[b, j] = h
"""


def _projection(ctx: Ctx, bias_name: str | None) -> int:
    """px [B, T, gates·H] = x @ weight_ih.T (+ bias) for every step."""
    b, t, d = ctx.in_shape()
    width = ctx.params["weight_ih"][0]
    px = ctx.temp((b, t, width))
    has_bias = bias_name is not None and ctx.has_weight(bias_name)
    spec = GemmSpec(pick_tile(b * t, width, 1), "nt", "col" if has_bias else "none")
    bias = ctx.f(ctx.weight(bias_name)) if has_bias and bias_name else ctx.F(0)
    launch_gemm(ctx, spec, ctx.v(ctx.view(ctx.ins[0], (1, b * t, d))),
                [ctx.v(ctx.view(ctx.weight("weight_ih"), (1, width, d)))], bias,
                [ctx.v(ctx.view(px, (1, b * t, width)))], b * t, width, d)
    return px


def _steps(ctx: Ctx, kernel: Kernel, args: list[str]) -> None:
    b, t, _ = ctx.in_shape()
    hid = ctx.out_shape(0)[-1]
    grid, block = ctx.flat_grid(b * hid)
    name = ctx.kernel(kernel)
    ctx.emit(f"for step in range({ctx.i(t)}):")
    ctx.parts.launches += 1
    ctx.emit(f"    {name}[{grid}, {block}]({', '.join(args + ['step', ctx.i(b), ctx.i(hid)])})")


def _recurrent_t(ctx: Ctx) -> int:
    """weight_hh transposed to [H, gates·H], derived once."""
    g, h = ctx.params["weight_hh"]
    return ctx.derive(f"{ctx.host_weight('weight_hh')}.T", (h, g))


def render_lstm(ctx: Ctx) -> None:
    ctx.need_float()
    px = _projection(ctx, "bias")
    wt = _recurrent_t(ctx)
    seq, h_last, c = ctx.alloc(0), ctx.alloc(1), ctx.alloc(2)
    _steps(ctx, Kernel("k_lstm_step", LSTM, (A3, A2, A3, A2, A2, I64, I64, I64)),
           [ctx.v(px), ctx.v(wt), ctx.v(seq), ctx.v(c), ctx.v(h_last)])


def render_rnn(ctx: Ctx) -> None:
    ctx.need_float()
    act = ctx.attr("act", "tanh")
    px = _projection(ctx, "bias")
    wt = _recurrent_t(ctx)
    seq, h_last = ctx.alloc(0), ctx.alloc(1)
    src = RNN.format(jit=JIT, act=act, head=HEAD, expr=RNN_ACT[act])
    _steps(ctx, Kernel(f"k_rnn_{act}_step", src, (A3, A2, A3, A2, I64, I64, I64)),
           [ctx.v(px), ctx.v(wt), ctx.v(seq), ctx.v(h_last)])


def render_gru(ctx: Ctx) -> None:
    ctx.need_float()
    wt = _recurrent_t(ctx)
    b, _, _ = ctx.in_shape()
    g, hid = ctx.params["weight_hh"]
    if ctx.attr("variant", "chapter") == "torch":
        px = _projection(ctx, "bias_ih")
        if ctx.has_weight("bias_hh"):
            bh = ctx.view(ctx.weight("bias_hh"), (1, g))
        else:
            bh = ctx.derive(f"np.zeros((1, {g}))", (1, g))
        seq, h_last = ctx.alloc(0), ctx.alloc(1)
        _steps(ctx, Kernel("k_gru_torch_step", GRU_TORCH, (A3, A2, A2, A3, A2, I64, I64, I64)),
               [ctx.v(px), ctx.v(wt), ctx.v(bh), ctx.v(seq), ctx.v(h_last)])
        return
    px = _projection(ctx, "bias")
    seq, h_last = ctx.alloc(0), ctx.alloc(1)
    rh, zs = ctx.temp((b, hid)), ctx.temp((b, hid))
    grid, block = ctx.flat_grid(b * hid)
    gates = ctx.kernel(Kernel("k_gru_gates_step", GRU_GATES, (A3, A2, A3, A2, A2, I64, I64, I64)))
    update = ctx.kernel(Kernel("k_gru_update_step", GRU_UPDATE, (A3, A2, A3, A2, A2, A2, I64, I64, I64)))
    common = [ctx.v(px), ctx.v(wt), ctx.v(seq)]
    tail = ["step", ctx.i(b), ctx.i(hid)]
    ctx.emit(f"for step in range({ctx.i(ctx.in_shape()[1])}):")
    ctx.parts.launches += 2
    ctx.emit(f"    {gates}[{grid}, {block}]({', '.join(common + [ctx.v(rh), ctx.v(zs)] + tail)})")
    ctx.emit(f"    {update}[{grid}, {block}]({', '.join(common + [ctx.v(rh), ctx.v(zs), ctx.v(h_last)] + tail)})")


RENDERERS = {
    "lstm": render_lstm,
    "rnn": render_rnn,
    "gru": render_gru,
}
