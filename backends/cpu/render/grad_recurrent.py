"""Backpropagation through time for rnn, lstm and gru (either GRU variant, either layout).

One kernel runs one pass (one direction of one layer): the forward again, keeping each step's gates and
states, then the steps backwards. Every product is one BLAS call: the input projection of all steps at once,
per step ``h·W_hhᵀ`` forward and ``dgates·W_hh`` and ``dgatesᵀ·h_{t−1}`` backward, and at the end
``dx = dgates·W_ih``, ``dW_ih = dgatesᵀ·x`` over all steps; the gate arithmetic runs over the batch's rows in
parallel. The equations are the reference's (backends/numpy_ref/grad_recurrent.py, docs/autodiff.md).
PyTorch's layout (stacked layers, bidirectional) runs in a driver helper: each layer's forward (the pass
with ``backward=0``) for the next layer's input, then the layers top down, the reverse direction over the
time-reversed sequence.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout

JIT = jit()
SIG = "np.float32(1.0) / (np.float32(1.0) + fexp(-({})))"

HEAD = """\
{jit}
def {name}(x, wih, whh, bih, bhh, dseq, dh0, dc0, dx, dwih, dwhh, dbih, dbhh, seq, backward, act):
    # one pass: the forward (keeping every step's gates), then, with backward=1, the steps in reverse
    nb, nt, ni = x.shape
    gh, nh = whh.shape
    x2 = x.reshape(nb * nt, ni)
    px = np.dot(x2, wih.T).reshape(nb, nt, gh)
    hs = np.zeros((nt + 1, nb, nh), np.float32)  # hs[t + 1] = h_t, hs[0] = 0
    gates = np.empty((nt, nb, gh), np.float32)  # the activated gates (lstm: i, f, g, o; gru: r, z, n)
    extra = np.empty((nt + 1, nb, nh), np.float32)  # lstm: the cell c_t at t + 1; torch gru: h·W_hn + b_hn
    for b in range(nb):
        for j in range(nh):
            extra[0, b, j] = np.float32(0.0)
    for t in range(nt):
"""

# the bias of rnn and lstm: b_ih + b_hh (the chapter's one bias: b_hh is zeros)
LSTM_FORWARD = """\
        hp = np.dot(hs[t], whh.T)
        for b in prange(nb):
            for j in range(nh):
                ai = px[b, t, j] + hp[b, j] + bih[j] + bhh[j]
                af = px[b, t, nh + j] + hp[b, nh + j] + bih[nh + j] + bhh[nh + j]
                ag = px[b, t, 2 * nh + j] + hp[b, 2 * nh + j] + bih[2 * nh + j] + bhh[2 * nh + j]
                ao = px[b, t, 3 * nh + j] + hp[b, 3 * nh + j] + bih[3 * nh + j] + bhh[3 * nh + j]
                si = {sig_i}
                sf = {sig_f}
                tg = ftanh(ag)
                so = {sig_o}
                c = sf * extra[t, b, j] + si * tg
                extra[t + 1, b, j] = c
                hv = so * ftanh(c)
                hs[t + 1, b, j] = hv
                seq[b, t, j] = hv
                gates[t, b, j] = si
                gates[t, b, nh + j] = sf
                gates[t, b, 2 * nh + j] = tg
                gates[t, b, 3 * nh + j] = so
"""

LSTM_BACKWARD = """\
        for b in prange(nb):
            for j in range(nh):
                dht = dseq[b, t, j] + dhn[b, j]
                si = gates[t, b, j]
                sf = gates[t, b, nh + j]
                tg = gates[t, b, 2 * nh + j]
                so = gates[t, b, 3 * nh + j]
                tc = ftanh(extra[t + 1, b, j])
                dct = dht * so * (np.float32(1.0) - tc * tc) + dcn[b, j]
                dg[b, j] = dct * tg * si * (np.float32(1.0) - si)
                dg[b, nh + j] = dct * extra[t, b, j] * sf * (np.float32(1.0) - sf)
                dg[b, 2 * nh + j] = dct * si * (np.float32(1.0) - tg * tg)
                dg[b, 3 * nh + j] = dht * tc * so * (np.float32(1.0) - so)
                dcn[b, j] = dct * sf
            for j in range(gh):
                dpx[b, t, j] = dg[b, j]
        dwhh += np.dot(dg.T, hs[t])
        dhn = np.dot(dg, whh)
"""

RNN_FORWARD = """\
        hp = np.dot(hs[t], whh.T)
        for b in prange(nb):
            for j in range(nh):
                a = px[b, t, j] + hp[b, j] + bih[j] + bhh[j]
                hv = ftanh(a) if act == 0 else (a if a > np.float32(0.0) else np.float32(0.0))
                hs[t + 1, b, j] = hv
                seq[b, t, j] = hv
"""

RNN_BACKWARD = """\
        for b in prange(nb):
            for j in range(nh):
                dht = dseq[b, t, j] + dhn[b, j]
                hv = hs[t + 1, b, j]
                da = dht * (np.float32(1.0) - hv * hv) if act == 0 else (dht if hv > np.float32(0.0) else
                                                                         np.float32(0.0))
                dg[b, j] = da
                dpx[b, t, j] = da
        dwhh += np.dot(dg.T, hs[t])
        dhn = np.dot(dg, whh)
"""

# act = 1: PyTorch's GRU (r after the hidden matmul, its own hidden bias); act = 0: the chapter's (r on h)
GRU_FORWARD = """\
        if act == 1:
            hp = np.dot(hs[t], whh.T)
        else:
            hp = np.dot(hs[t], whh[:2 * nh].T)
        for b in prange(nb):
            for j in range(nh):
                ar = px[b, t, j] + hp[b, j] + bih[j] + bhh[j]
                az = px[b, t, nh + j] + hp[b, nh + j] + bih[nh + j] + bhh[nh + j]
                gates[t, b, j] = {sig_r}
                gates[t, b, nh + j] = {sig_z}
        if act == 0:
            rh = np.empty((nb, nh), np.float32)
            for b in range(nb):
                for j in range(nh):
                    rh[b, j] = gates[t, b, j] * hs[t, b, j]
            hn = np.dot(rh, whh[2 * nh:].T)
        else:
            hn = hp
        for b in prange(nb):
            for j in range(nh):
                r = gates[t, b, j]
                z = gates[t, b, nh + j]
                hprev = hs[t, b, j]
                if act == 1:
                    hnj = hp[b, 2 * nh + j] + bhh[2 * nh + j]
                    extra[t + 1, b, j] = hnj
                    n = ftanh(px[b, t, 2 * nh + j] + bih[2 * nh + j] + r * hnj)
                    hv = (np.float32(1.0) - z) * n + z * hprev
                else:
                    n = ftanh(px[b, t, 2 * nh + j] + bih[2 * nh + j] + hn[b, j])
                    hv = (np.float32(1.0) - z) * hprev + z * n
                gates[t, b, 2 * nh + j] = n
                hs[t + 1, b, j] = hv
                seq[b, t, j] = hv
"""

GRU_BACKWARD = """\
        if act == 1:  # PyTorch's: the hidden side's gradient [dr, dz, dn·r] gives dW_hh, db_hh and dh_{t-1}
            for b in prange(nb):
                for j in range(nh):
                    dht = dseq[b, t, j] + dhn[b, j]
                    r = gates[t, b, j]
                    z = gates[t, b, nh + j]
                    n = gates[t, b, 2 * nh + j]
                    hprev = hs[t, b, j]
                    dan = dht * (np.float32(1.0) - z) * (np.float32(1.0) - n * n)
                    daz = dht * (hprev - n) * z * (np.float32(1.0) - z)
                    dar = dan * extra[t + 1, b, j] * r * (np.float32(1.0) - r)
                    dg[b, j] = dar
                    dg[b, nh + j] = daz
                    dg[b, 2 * nh + j] = dan * r
                    dpx[b, t, j] = dar
                    dpx[b, t, nh + j] = daz
                    dpx[b, t, 2 * nh + j] = dan
                    dzh[b, j] = dht * z
                for j in range(gh):
                    dph[b, t, j] = dg[b, j]
            dwhh += np.dot(dg.T, hs[t])
            dhn = np.dot(dg, whh)
            for b in range(nb):
                for j in range(nh):
                    dhn[b, j] += dzh[b, j]
        else:  # the chapter's: d(r·h) = dn̂·U_n, and U_n's gradient reads r·h
            for b in prange(nb):
                for j in range(nh):
                    dht = dseq[b, t, j] + dhn[b, j]
                    z = gates[t, b, nh + j]
                    n = gates[t, b, 2 * nh + j]
                    hprev = hs[t, b, j]
                    dg[b, 2 * nh + j] = dht * z * (np.float32(1.0) - n * n)
                    dg[b, nh + j] = dht * (n - hprev) * z * (np.float32(1.0) - z)
                    dzh[b, j] = dht * (np.float32(1.0) - z)
            drh = np.dot(np.ascontiguousarray(dg[:, 2 * nh:]), whh[2 * nh:])
            rh = np.empty((nb, nh), np.float32)
            for b in prange(nb):
                for j in range(nh):
                    r = gates[t, b, j]
                    hprev = hs[t, b, j]
                    dg[b, j] = drh[b, j] * hprev * r * (np.float32(1.0) - r)
                    rh[b, j] = r * hprev
                    dzh[b, j] += drh[b, j] * r
                for j in range(gh):
                    dpx[b, t, j] = dg[b, j]
            drz = np.ascontiguousarray(dg[:, :2 * nh])
            dwhh[:2 * nh] += np.dot(drz.T, hs[t])
            dwhh[2 * nh:] += np.dot(np.ascontiguousarray(dg[:, 2 * nh:]).T, rh)
            dhn = np.dot(drz, whh[:2 * nh])
            for b in range(nb):
                for j in range(nh):
                    dhn[b, j] += dzh[b, j]
"""

TAIL = """\
    if backward == 0:
        return
    dpx = np.empty((nb, nt, gh), np.float32)
    dph = np.zeros((nb, nt, gh), np.float32)  # torch gru: the hidden side's pre-activation gradient
    dg = np.empty((nb, gh), np.float32)
    dzh = np.empty((nb, nh), np.float32)
    dhn = dh0.copy()
    dcn = dc0.copy()
    for i in range(gh):
        for j in range(dwhh.shape[1]):
            dwhh[i, j] = np.float32(0.0)
    for t in range(nt - 1, -1, -1):
{backward}\
    dp2 = dpx.reshape(nb * nt, gh)
    np.dot(dp2, wih, dx.reshape(nb * nt, ni))
    np.dot(dp2.T, x2, dwih)
    dph2 = dph.reshape(nb * nt, gh)
    for j in prange(gh):
        s = 0.0
        q = 0.0
        for r in range(nb * nt):
            s += dp2[r, j]
            q += dph2[r, j]
        dbih[j] = np.float32(s)
        dbhh[j] = np.float32(s) if {same_bias} else np.float32(q)
"""


def pass_kernel(ctx: NodeCtx, op: str) -> str:
    ctx.device("fexp")
    ctx.device("ftanh")
    if op == "lstm":
        fwd = LSTM_FORWARD.format(sig_i=SIG.format("ai"), sig_f=SIG.format("af"), sig_o=SIG.format("ao"))
        bwd, same = LSTM_BACKWARD, "True"
    elif op == "rnn":
        fwd, bwd, same = RNN_FORWARD, RNN_BACKWARD, "True"
    else:
        fwd, bwd, same = GRU_FORWARD.format(sig_r=SIG.format("ar"), sig_z=SIG.format("az")), GRU_BACKWARD, "False"
    name = f"k_{op}_pass"
    src = HEAD.format(jit=JIT, name=name) + fwd + TAIL.format(backward=bwd, same_bias=same)
    return ctx.kernel(Kernel(name, src, (A3, A2, A2, A1, A1, A3, A2, A2, A3, A2, A2, A1, A1, A3, I64, I64)))


STACK = '''\
def recurrent_stack_grad(kernel, x, dseq, dh, dc, ws, grads, layers, dirs, hidden, act, mask):
    """PyTorch's layout: each layer's forward for the next layer's input, then the layers top down (the
    reverse direction over the time-reversed sequence); ws and grads hold (w_ih, w_hh, b_ih, b_hh) per pass.
    In training (mask not None) a layer reads the previous one's sequence times its dropout mask, and the
    gradient reaching that sequence from the layer's input is multiplied by the same mask."""
    nb, nt = x.shape[:2]
    zero = np.zeros((nb, hidden), np.float32)
    inputs, seq = [], x
    for layer in range(layers):
        if mask is not None and layer > 0:
            seq = seq * mask[layer - 1]
        inputs.append(seq)
        outs = []
        for d in range(dirs):
            wih, whh, bih, bhh = ws[layer * dirs + d]
            src = np.ascontiguousarray(seq[:, ::-1]) if d else seq
            out = np.empty((nb, nt, hidden), np.float32)
            scratch = [np.empty_like(a) for a in (src, wih, whh, bih, bhh)]
            kernel(src, wih, whh, bih, bhh, out, zero, zero, *scratch, out, 0, act)
            outs.append(out[:, ::-1] if d else out)
        seq = np.ascontiguousarray(np.concatenate(outs, axis=-1))
    dout = dseq
    for layer in reversed(range(layers)):
        xin = inputs[layer]
        din = np.zeros(xin.shape, np.float32)
        for d in range(dirs):
            row = layer * dirs + d
            wih, whh, bih, bhh = ws[row]
            gih, ghh, gbih, gbhh = grads[row]
            part = dout[..., d * hidden:(d + 1) * hidden]
            src = np.ascontiguousarray(xin[:, ::-1] if d else xin)
            dpart = np.ascontiguousarray(part[:, ::-1] if d else part)
            h0 = zero if dh is None else np.ascontiguousarray(dh[row])
            c0 = zero if dc is None else np.ascontiguousarray(dc[row])
            dxp = np.empty(src.shape, np.float32)
            out = np.empty((nb, nt, hidden), np.float32)
            kernel(src, wih, whh, bih, bhh, dpart, h0, c0, dxp, gih, ghh, gbih, gbhh, out, 1, act)
            din += dxp[:, ::-1] if d else dxp
        dout = din * mask[layer - 1] if mask is not None and layer > 0 else din
    return dout
'''


def _act(ctx: NodeCtx, op: str) -> int:
    if op == "gru":
        return 1 if torch_layout(ctx.node.attrs) or ctx.attr("variant") == "torch" else 0
    return 1 if op == "rnn" and ctx.attr("act", "tanh") == "relu" else 0


def render_recurrent_grad(ctx: NodeCtx) -> None:
    op = ctx.node.op.removesuffix("_grad")
    k = pass_kernel(ctx, op)
    act = _act(ctx, op)
    train = bool(ctx.node.attrs.get("train"))
    mask = ctx.args[-1] if train else None  # training: the forward's dropout mask comes last
    args = ctx.args[:-1] if train else ctx.args
    x, dseq = args[0], args[1]
    dh = args[2] if len(args) > 2 else None
    dc = args[3] if len(args) > 3 else None
    names = list(ctx.params)  # the record's parameter order: the order of the gradient results
    outs = {name: ctx.alloc(i + 1) for i, name in enumerate(names)}
    dx = ctx.alloc(0)
    hidden = int(ctx.attr("hidden"))
    a = ctx.node.attrs
    nb = ctx.in_shape(0)[0]
    zero = f"np.zeros(({nb}, {hidden}), np.float32)"
    if not torch_layout(a):
        gh = ctx.weight_shape("weight_hh")[0]
        bias = ctx.weight("bias") if ctx.has_weight("bias") else (
            ctx.weight("bias_ih") if ctx.has_weight("bias_ih") else f"np.zeros({gh}, np.float32)")
        bhh = ctx.weight("bias_hh") if ctx.has_weight("bias_hh") else f"np.zeros({gh}, np.float32)"
        gb = outs.get("bias", outs.get("bias_ih", f"np.empty({gh}, np.float32)"))
        gbh = outs.get("bias_hh", f"np.empty({gh}, np.float32)")
        seq = f"np.empty({tuple(ctx.in_shape(1))}, np.float32)"
        ctx.emit(f"{k}({x}, {ctx.weight('weight_ih')}, {ctx.weight('weight_hh')}, {bias}, {bhh}, {dseq}, "
                 f"{dh or zero}, {dc or zero}, {dx}, {outs['weight_ih']}, {outs['weight_hh']}, {gb}, {gbh}, "
                 f"{seq}, 1, {act})")
        return
    helper = ctx.helper("recurrent_stack_grad", STACK)
    ws, grads = [], []
    for layer in range(num_layers(a)):
        for d in range(directions(a)):
            sfx = layer_suffix(layer, d)
            keys = [f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}"]
            gh = ctx.weight_shape(keys[1])[0]
            ws.append("(" + ", ".join(ctx.weight(k) if ctx.has_weight(k) else f"np.zeros({gh}, np.float32)"
                                      for k in keys) + ")")
            grads.append("(" + ", ".join(outs.get(k, f"np.empty({gh}, np.float32)") for k in keys) + ")")
    ctx.emit(f"{dx}[...] = {helper}({k}, {x}, {dseq}, {dh}, {dc}, [{', '.join(ws)}], [{', '.join(grads)}], "
             f"{num_layers(a)}, {directions(a)}, {hidden}, {act}, {mask})")


render_recurrent_grad.trains = True  # type: ignore[attr-defined]  # train=true: dropout between layers (emit_checks)

RENDERERS = {"lstm_grad": render_recurrent_grad, "gru_grad": render_recurrent_grad, "rnn_grad": render_recurrent_grad}
