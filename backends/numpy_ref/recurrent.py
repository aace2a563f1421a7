"""RNN, LSTM and GRU over [B, T, D] sequences; the initial state is zero.

Gate rows follow PyTorch (LSTM i, f, g, o; GRU r, z, n). Each op returns
(sequence [B, T, H], final h [B, H]) and the LSTM also its final c.
"""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.elementwise import relu, sigmoid
from irc.graph import Node
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout


def _input_proj(x: np.ndarray, w_ih: np.ndarray, bias) -> np.ndarray:
    """x_t @ W_ih.T (+ bias) for every step at once: [B, T, gates·H]."""
    p = x @ w_ih.T
    return p if bias is None else p + bias


def rnn(x, w_ih, w_hh, bias, act: str = "tanh"):
    f = np.tanh if act == "tanh" else relu
    px = _input_proj(x, w_ih, bias)
    h = np.zeros((x.shape[0], w_hh.shape[1]), dtype=x.dtype)
    seq = []
    for t in range(x.shape[1]):
        h = f(px[:, t] + h @ w_hh.T)
        seq.append(h)
    return np.stack(seq, axis=1), h


def lstm(x, w_ih, w_hh, bias):
    """c_t = f·c_{t−1} + i·g, h_t = o·tanh(c_t); one bias (PyTorch's bias_ih + bias_hh)."""
    px = _input_proj(x, w_ih, bias)
    hidden = w_hh.shape[1]
    h = np.zeros((x.shape[0], hidden), dtype=x.dtype)
    c = np.zeros_like(h)
    seq = []
    for t in range(x.shape[1]):
        gates = px[:, t] + h @ w_hh.T
        i, f, g, o = np.split(gates, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        seq.append(h)
    return np.stack(seq, axis=1), h, c


def gru_chapter(x, w_ih, w_hh, bias):
    """The chapter's GRU: r acts on h before the hidden matmul, z is the write fraction."""
    px = _input_proj(x, w_ih, bias)
    hidden = w_hh.shape[1]
    u_r, u_z, u_n = np.split(w_hh, 3, axis=0)
    h = np.zeros((x.shape[0], hidden), dtype=x.dtype)
    seq = []
    for t in range(x.shape[1]):
        x_r, x_z, x_n = np.split(px[:, t], 3, axis=-1)
        r = sigmoid(x_r + h @ u_r.T)
        z = sigmoid(x_z + h @ u_z.T)
        n = np.tanh(x_n + (r * h) @ u_n.T)
        h = (1 - z) * h + z * n
        seq.append(h)
    return np.stack(seq, axis=1), h


def gru_torch(x, w_ih, w_hh, b_ih, b_hh):
    """PyTorch/cuDNN: n = tanh(x W_n + b_in + r·(h U_n + b_hn)), h = (1 − z)·n + z·h."""
    px = _input_proj(x, w_ih, b_ih)
    hidden = w_hh.shape[1]
    h = np.zeros((x.shape[0], hidden), dtype=x.dtype)
    seq = []
    for t in range(x.shape[1]):
        ph = _input_proj(h, w_hh, b_hh)
        x_r, x_z, x_n = np.split(px[:, t], 3, axis=-1)
        h_r, h_z, h_n = np.split(ph, 3, axis=-1)
        r = sigmoid(x_r + h_r)
        z = sigmoid(x_z + h_z)
        n = np.tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h
        seq.append(h)
    return np.stack(seq, axis=1), h


def _gru(node: Node, args, w):
    if torch_layout(node.attrs):
        return stacked(node, args[0], w, _mask(node, args))
    if node.attrs.get("variant") == "torch":
        return gru_torch(args[0], w["weight_ih"], w["weight_hh"], w.get("bias_ih"), w.get("bias_hh"))
    return gru_chapter(args[0], w["weight_ih"], w["weight_hh"], w.get("bias"))


def _one_pass(node: Node, x, w, sfx: str):
    """One direction of one layer of PyTorch's layout: (sequence, h[, c])."""
    w_ih, w_hh = w[f"weight_ih{sfx}"], w[f"weight_hh{sfx}"]
    b_ih, b_hh = w.get(f"bias_ih{sfx}"), w.get(f"bias_hh{sfx}")
    if node.op == "gru":
        return gru_torch(x, w_ih, w_hh, b_ih, b_hh)
    bias = None if b_ih is None else b_ih + b_hh  # the two only ever add (r acts inside a GRU only)
    if node.op == "lstm":
        return lstm(x, w_ih, w_hh, bias)
    return rnn(x, w_ih, w_hh, bias, node.attrs.get("act", "tanh"))


def _mask(node: Node, args):
    """The dropout mask [layers − 1, B, T, dirs·H] of a training node (train=true), else None."""
    return args[1] if node.attrs.get("train") else None


def stacked(node: Node, x, w, mask=None):
    """PyTorch's nn.RNN/LSTM/GRU (batch_first): layer by layer, each direction over the layer's
    input (the reverse one over it read backwards, its sequence turned back), the directions
    concatenated on features; dropout between layers is the identity at inference, and in training
    (``mask``) each layer's sequence but the last's times its mask. Returns the last layer's sequence
    and the final states [layers·dirs, B, H] (row layer·dirs + direction), unmasked as PyTorch's."""
    a = node.attrs
    seq, finals = x, []
    for layer in range(num_layers(a)):
        outs = []
        for d in range(directions(a)):
            res = _one_pass(node, seq[:, ::-1] if d else seq, w, layer_suffix(layer, d))
            outs.append(res[0][:, ::-1] if d else res[0])
            finals.append(res[1:])
        seq = np.ascontiguousarray(np.concatenate(outs, axis=-1))
        if mask is not None and layer < num_layers(a) - 1:
            seq = seq * mask[layer]
    states = [np.stack([f[i] for f in finals]) for i in range(len(finals[0]))]
    return (seq, *states)


def _layer(fn):
    """The op's own function, or PyTorch's stacked layout when the node asks for it."""
    def run(node: Node, args, w):
        return stacked(node, args[0], w, _mask(node, args)) if torch_layout(node.attrs) else fn(node, args, w)
    return run


OPS = {
    "rnn": _layer(lambda node, args, w: rnn(args[0], w["weight_ih"], w["weight_hh"], w.get("bias"),
                                            node.attrs.get("act", "tanh"))),
    "lstm": _layer(lambda node, args, w: lstm(args[0], w["weight_ih"], w["weight_hh"], w.get("bias"))),
    "gru": _gru,
}
