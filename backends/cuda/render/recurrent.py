"""RNN, LSTM and GRU: the input projection of every step in one GEMM, then one launch per
step (two for the chapter's GRU, whose reset gate must act on all of h first).

A step's thread owns one hidden unit of one sequence; it reads the previous state from the
output sequence and the recurrent weights transposed (made once, when the weights are
uploaded), so neighbouring threads read neighbouring weights.
"""

from __future__ import annotations

from irc.backends.common.kernel import A2, A3, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx
from irc.backends.cuda.render.copy import copy_launch
from irc.backends.cuda.render.dense import launch_gemm
from irc.backends.cuda.render.gemm_src import GemmSpec, pick_tile
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout

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
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
    px = _projection(ctx, "bias")
    wt = _recurrent_t(ctx)
    seq, h_last, c = ctx.alloc(0), ctx.alloc(1), ctx.alloc(2)
    _steps(ctx, Kernel("k_lstm_step", LSTM, (A3, A2, A3, A2, A2, I64, I64, I64)),
           [ctx.v(px), ctx.v(wt), ctx.v(seq), ctx.v(c), ctx.v(h_last)])


def render_rnn(ctx: Ctx) -> None:
    ctx.need_float()
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
    act = ctx.attr("act", "tanh")
    px = _projection(ctx, "bias")
    wt = _recurrent_t(ctx)
    seq, h_last = ctx.alloc(0), ctx.alloc(1)
    src = RNN.format(jit=JIT, act=act, head=HEAD, expr=RNN_ACT[act])
    _steps(ctx, Kernel(f"k_rnn_{act}_step", src, (A3, A2, A3, A2, I64, I64, I64)),
           [ctx.v(px), ctx.v(wt), ctx.v(seq), ctx.v(h_last)])


def render_gru(ctx: Ctx) -> None:
    ctx.need_float()
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
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


# -- PyTorch's layout: the step kernels above, once per layer and direction ----------------------

STEP_KERNELS = {
    "lstm": lambda act: Kernel("k_lstm_step", LSTM, (A3, A2, A3, A2, A2, I64, I64, I64)),
    "rnn": lambda act: Kernel(f"k_rnn_{act}_step", RNN.format(jit=JIT, act=act, head=HEAD, expr=RNN_ACT[act]),
                              (A3, A2, A3, A2, I64, I64, I64)),
    "gru": lambda act: Kernel("k_gru_torch_step", GRU_TORCH, (A3, A2, A2, A3, A2, I64, I64, I64)),
}


def _time_copy(ctx: Ctx, src: int, dst: int, b: int, t: int, width: int, reverse: bool, dst_width: int,
               dst_off: int) -> None:
    """dst[:, :, off:off+width] = src[:, ::-1 if reverse] for src [B, T, width], dst [B, T, dst_width]."""
    sstrides = (t * width, -width if reverse else width, 1)
    copy_launch(ctx, ctx.f(src), ctx.f(dst), (b, t, width), sstrides, (t - 1) * width if reverse else 0,
                (t * dst_width, dst_width, 1), dst_off)


def _pass(ctx: Ctx, x: int, b: int, t: int, sfx: str, seq: int, states: list[int]) -> None:
    """One direction of one layer over x [B, T, D]: px by one GEMM, then one launch per step."""
    op, act = ctx.node.op, ctx.attr("act", "tanh")
    g, hid = ctx.params["weight_hh" + sfx]
    d = ctx.params["weight_ih" + sfx][1]
    has_bias = ctx.has_weight("bias_ih" + sfx)
    bias = None
    if has_bias and op == "gru":
        bias = ctx.weight("bias_ih" + sfx)
    elif has_bias:  # in an RNN or LSTM b_ih and b_hh only ever add: one vector, summed once
        bias = ctx.derive(f"{ctx.host_weight('bias_ih' + sfx)} + {ctx.host_weight('bias_hh' + sfx)}", (g,))
    px = ctx.temp((b, t, g))
    spec = GemmSpec(pick_tile(b * t, g, 1), "nt", "col" if bias is not None else "none")
    launch_gemm(ctx, spec, ctx.v(ctx.view(x, (1, b * t, d))),
                [ctx.v(ctx.view(ctx.weight("weight_ih" + sfx), (1, g, d)))],
                ctx.f(bias) if bias is not None else ctx.F(0), [ctx.v(ctx.view(px, (1, b * t, g)))], b * t, g, d)
    wt = ctx.derive(f"{ctx.host_weight('weight_hh' + sfx)}.T", (hid, g))
    args = [ctx.v(px), ctx.v(wt)]
    if op == "gru":
        bh = (ctx.view(ctx.weight("bias_hh" + sfx), (1, g)) if has_bias
              else ctx.derive(f"np.zeros((1, {g}))", (1, g)))
        args += [ctx.v(bh), ctx.v(seq), ctx.v(states[0])]
    elif op == "lstm":
        args += [ctx.v(seq), ctx.v(states[1]), ctx.v(states[0])]
    else:
        args += [ctx.v(seq), ctx.v(states[0])]
    grid, block = ctx.flat_grid(b * hid)
    name = ctx.kernel(STEP_KERNELS[op](act))
    ctx.emit(f"for step in range({ctx.i(t)}):")
    ctx.parts.launches += 1
    ctx.emit(f"    {name}[{grid}, {block}]({', '.join(args + ['step', ctx.i(b), ctx.i(hid)])})")


def render_stacked(ctx: Ctx) -> None:
    """nn.RNN/LSTM/GRU's layers and directions: the reverse pass reads its input through a
    time-reversing copy and writes its sequence back turned round into its half of the layer's
    output; pass p's final h (and c) are copied into row p of the [layers·dirs, B, H] results."""
    ctx.need_float()
    a = ctx.node.attrs
    b, t, _ = ctx.in_shape()
    hid, dirs, layers = int(a["hidden"]), directions(a), num_layers(a)
    outs = [ctx.alloc(i) for i in range(len(ctx.out_types))]
    x = ctx.ins[0]
    for layer in range(layers):
        width = ctx.in_shape()[2] if layer == 0 else dirs * hid
        out = outs[0] if layer == layers - 1 else ctx.temp((b, t, dirs * hid))
        for d in range(dirs):
            src = x
            if d:
                src = ctx.temp((b, t, width))
                _time_copy(ctx, x, src, b, t, width, True, width, 0)
            seq = ctx.temp((b, t, hid))
            states = [ctx.temp((b, hid)) for _ in outs[1:]]
            _pass(ctx, src, b, t, layer_suffix(layer, d), seq, states)
            _time_copy(ctx, seq, out, b, t, hid, bool(d), dirs * hid, d * hid)
            row = layer * dirs + d
            for state, result in zip(states, outs[1:]):
                copy_launch(ctx, ctx.f(state), ctx.f(result), (b, hid), (hid, 1), 0, (hid, 1), row * b * hid)
        x = out


RENDERERS = {
    "lstm": render_lstm,
    "rnn": render_rnn,
    "gru": render_gru,
}
