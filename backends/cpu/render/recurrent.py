"""RNN, LSTM and both GRUs: one BLAS matmul for every input step, one per time step for h.

Gate rows follow PyTorch (LSTM i, f, g, o; GRU r, z, n). The chapter's GRU applies the
reset gate to h before the hidden matmul; the torch variant applies it after.
"""

from __future__ import annotations

from irc.backends.cpu.module import A1, A2, A3, Kernel, jit
from irc.backends.cpu.render.activations import act_expr, sigmoid
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()

RNN = """\
{jit}
def {name}(x, wih, whh, b, seq, h_last):
    nb, nt, nd = x.shape
    nh = whh.shape[1]
    xw = np.dot(x.reshape(nb * nt, nd), wih.T).reshape(nb, nt, nh)
    h = np.zeros((nb, nh), np.float32)
    for t in range(nt):
        hw = np.dot(h, whh.T)
        for n in range(nb):
            for j in range(nh):
                v = xw[n, t, j] + hw[n, j] + b[j]
                h[n, j] = {expr}
                seq[n, t, j] = h[n, j]
    for n in range(nb):  # explicit loops: a slice assignment costs seconds of compile time
        for j in range(nh):
            h_last[n, j] = h[n, j]
"""

LSTM = """\
{jit}
def k_lstm(x, wih, whh, b, seq, h_last, c_last):
    nb, nt, nd = x.shape
    nh = whh.shape[1]
    xw = np.dot(x.reshape(nb * nt, nd), wih.T).reshape(nb, nt, 4 * nh)
    h = np.zeros((nb, nh), np.float32)
    c = np.zeros((nb, nh), np.float32)
    for t in range(nt):
        hw = np.dot(h, whh.T)
        for n in range(nb):
            for j in range(nh):
                gi = xw[n, t, j] + hw[n, j] + b[j]
                gf = xw[n, t, nh + j] + hw[n, nh + j] + b[nh + j]
                gg = xw[n, t, 2 * nh + j] + hw[n, 2 * nh + j] + b[2 * nh + j]
                go = xw[n, t, 3 * nh + j] + hw[n, 3 * nh + j] + b[3 * nh + j]
                c[n, j] = {sig_f} * c[n, j] + {sig_i} * np.tanh(gg)
                h[n, j] = {sig_o} * np.tanh(c[n, j])
                seq[n, t, j] = h[n, j]
    for n in range(nb):  # explicit loops: a slice assignment costs seconds of compile time
        for j in range(nh):
            h_last[n, j] = h[n, j]
            c_last[n, j] = c[n, j]
"""

GRU_CHAPTER = """\
{jit}
def k_gru_chapter(x, wih, whh_rz, whh_n, b, seq, h_last):
    nb, nt, nd = x.shape
    nh = whh_n.shape[1]
    xw = np.dot(x.reshape(nb * nt, nd), wih.T).reshape(nb, nt, 3 * nh)
    h = np.zeros((nb, nh), np.float32)
    z = np.empty((nb, nh), np.float32)
    rh = np.empty((nb, nh), np.float32)
    for t in range(nt):
        hu = np.dot(h, whh_rz.T)
        for n in range(nb):
            for j in range(nh):
                r = {sig_r}
                z[n, j] = {sig_z}
                rh[n, j] = r * h[n, j]  # the reset gate acts before the hidden matmul
        hn = np.dot(rh, whh_n.T)
        for n in range(nb):
            for j in range(nh):
                g = np.tanh(xw[n, t, 2 * nh + j] + hn[n, j] + b[2 * nh + j])
                h[n, j] = (np.float32(1.0) - z[n, j]) * h[n, j] + z[n, j] * g
                seq[n, t, j] = h[n, j]
    for n in range(nb):  # explicit loops: a slice assignment costs seconds of compile time
        for j in range(nh):
            h_last[n, j] = h[n, j]
"""

GRU_TORCH = """\
{jit}
def k_gru_torch(x, wih, whh, bih, bhh, seq, h_last):
    nb, nt, nd = x.shape
    nh = whh.shape[1]
    xw = np.dot(x.reshape(nb * nt, nd), wih.T).reshape(nb, nt, 3 * nh)
    h = np.zeros((nb, nh), np.float32)
    for t in range(nt):
        hw = np.dot(h, whh.T)
        for n in range(nb):
            for j in range(nh):
                r = {sig_r}
                z = {sig_z}
                g = np.tanh(xw[n, t, 2 * nh + j] + bih[2 * nh + j] + r * (hw[n, 2 * nh + j] + bhh[2 * nh + j]))
                h[n, j] = (np.float32(1.0) - z) * g + z * h[n, j]  # z is the keep fraction
                seq[n, t, j] = h[n, j]
    for n in range(nb):  # explicit loops: a slice assignment costs seconds of compile time
        for j in range(nh):
            h_last[n, j] = h[n, j]
"""


def render_rnn(ctx: NodeCtx) -> None:
    act = ctx.attr("act", "tanh")
    name = f"k_rnn_{act}"
    k = ctx.kernel(Kernel(name, RNN.format(jit=JIT, name=name, expr=act_expr(act)), (A3, A2, A2, A1, A3, A2)))
    seq, h = ctx.alloc(0), ctx.alloc(1)
    g = ctx.weight_shape("weight_hh")[0]
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.weight('weight_ih')}, {ctx.weight('weight_hh')}, "
             f"{ctx.weight_or_zeros('bias', g)}, {seq}, {h})")


def render_lstm(ctx: NodeCtx) -> None:
    src = LSTM.format(jit=JIT, sig_i=sigmoid("gi"), sig_f=sigmoid("gf"), sig_o=sigmoid("go"))
    k = ctx.kernel(Kernel("k_lstm", src, (A3, A2, A2, A1, A3, A2, A2)))
    seq, h, c = ctx.alloc(0), ctx.alloc(1), ctx.alloc(2)
    g = ctx.weight_shape("weight_hh")[0]
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.weight('weight_ih')}, {ctx.weight('weight_hh')}, "
             f"{ctx.weight_or_zeros('bias', g)}, {seq}, {h}, {c})")


def render_gru(ctx: NodeCtx) -> None:
    g, nh = ctx.weight_shape("weight_hh")
    seq, h = ctx.alloc(0), ctx.alloc(1)
    wih, whh = ctx.weight("weight_ih"), ctx.weight("weight_hh")
    if ctx.attr("variant", "chapter") == "torch":
        src = GRU_TORCH.format(
            jit=JIT,
            sig_r=sigmoid("xw[n, t, j] + bih[j] + hw[n, j] + bhh[j]"),
            sig_z=sigmoid("xw[n, t, nh + j] + bih[nh + j] + hw[n, nh + j] + bhh[nh + j]"),
        )
        k = ctx.kernel(Kernel("k_gru_torch", src, (A3, A2, A2, A1, A1, A3, A2)))
        ctx.emit(f"{k}({ctx.args[0]}, {wih}, {whh}, {ctx.weight_or_zeros('bias_ih', g)}, "
                 f"{ctx.weight_or_zeros('bias_hh', g)}, {seq}, {h})")
        return
    src = GRU_CHAPTER.format(
        jit=JIT,
        sig_r=sigmoid("xw[n, t, j] + hu[n, j] + b[j]"),
        sig_z=sigmoid("xw[n, t, nh + j] + hu[n, nh + j] + b[nh + j]"),
    )
    k = ctx.kernel(Kernel("k_gru_chapter", src, (A3, A2, A2, A2, A1, A3, A2)))
    # rows [0, 2h) of weight_hh are U_r, U_z; rows [2h, 3h) are U_n (C-contiguous views)
    ctx.emit(f"{k}({ctx.args[0]}, {wih}, {whh}[:{2 * nh}], {whh}[{2 * nh}:], "
             f"{ctx.weight_or_zeros('bias', g)}, {seq}, {h})")


RENDERERS = {
    "rnn": render_rnn,
    "lstm": render_lstm,
    "gru": render_gru,
}
