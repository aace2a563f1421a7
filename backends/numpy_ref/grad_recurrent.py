"""Backpropagation through time for rnn, lstm and gru (backends/numpy_ref/recurrent.py's forwards), in
float64-exact NumPy: each pass runs forward again keeping its states, then walks back in time.

One pass is one direction of one layer: weights ``w_ih``, ``w_hh`` and biases ``b_ih`` (the chapter layout's
one bias, or PyTorch's ``bias_ih``) and ``b_hh`` (PyTorch's ``bias_hh``, or None). PyTorch's layout
(``layout=torch``) stacks passes: the backward runs the layers top down, the reverse direction over the
time-reversed sequence, and a layer's input gradient is the sum of its directions'. Each kernel returns
``dx`` then the gradient of every weight in the record's parameter order (the order of ``w``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from irc.backends.numpy_ref.elementwise import sigmoid
from irc.graph import Node
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout

Arr = np.ndarray


def _proj(x: Arr, w: Arr, b: Arr | None) -> Arr:
    return x @ w.T if b is None else x @ w.T + b


def _rnn_pass(op: str, a: dict[str, Any], x: Arr, w_ih: Arr, w_hh: Arr, b_ih, b_hh, dseq: Arr, dh: Arr,
              dc: Arr) -> tuple[Arr, Arr, Arr, Arr, Arr | None]:
    """One pass: (dx, dw_ih, dw_hh, d of the input-side pre-activations (the bias_ih gradient's terms),
    d of the hidden-side ones where they differ (PyTorch's GRU), else None)."""
    bias = None if b_ih is None else (b_ih if b_hh is None or op == "gru" else b_ih + b_hh)
    px = _proj(x, w_ih, bias)
    bsz, steps = x.shape[:2]
    hidden = w_hh.shape[1]
    h = np.zeros((bsz, hidden), dtype=x.dtype)
    c = np.zeros_like(h)
    saved = []
    torch_gru = op == "gru" and (torch_layout(a) or a.get("variant") == "torch")
    for t in range(steps):
        h_prev, c_prev = h, c
        if op == "rnn":
            h = np.tanh(px[:, t] + h @ w_hh.T) if a.get("act", "tanh") == "tanh" else \
                np.maximum(px[:, t] + h @ w_hh.T, 0)
            saved.append((h_prev, h))
        elif op == "lstm":
            i, f, g, o = np.split(px[:, t] + h @ w_hh.T, 4, axis=-1)
            si, sf, tg, so = sigmoid(i), sigmoid(f), np.tanh(g), sigmoid(o)
            c = sf * c + si * tg
            h = so * np.tanh(c)
            saved.append((h_prev, c_prev, si, sf, tg, so, c))
        elif torch_gru:
            x_r, x_z, x_n = np.split(px[:, t], 3, axis=-1)
            h_r, h_z, h_n = np.split(_proj(h, w_hh, b_hh), 3, axis=-1)
            r, z = sigmoid(x_r + h_r), sigmoid(x_z + h_z)
            n = np.tanh(x_n + r * h_n)
            h = (1 - z) * n + z * h
            saved.append((h_prev, r, z, n, h_n))
        else:  # the chapter's GRU: r acts on h before the hidden matmul
            u_r, u_z, u_n = np.split(w_hh, 3, axis=0)
            x_r, x_z, x_n = np.split(px[:, t], 3, axis=-1)
            r, z = sigmoid(x_r + h @ u_r.T), sigmoid(x_z + h @ u_z.T)
            n = np.tanh(x_n + (r * h) @ u_n.T)
            h = (1 - z) * h + z * n
            saved.append((h_prev, r, z, n))
    dpx = np.zeros_like(px)
    dph = np.zeros_like(px) if torch_gru else None
    dw_hh = np.zeros_like(w_hh)
    dh_next, dc_next = dh.copy(), dc.copy()
    for t in reversed(range(steps)):
        dht = dseq[:, t] + dh_next
        if op == "rnn":
            h_prev, ht = saved[t]
            da = dht * ((1 - ht * ht) if a.get("act", "tanh") == "tanh" else (ht > 0))
            dw_hh += da.T @ h_prev
            dh_next = da @ w_hh
            dpx[:, t] = da
        elif op == "lstm":
            h_prev, c_prev, si, sf, tg, so, ct = saved[t]
            tc = np.tanh(ct)
            dct = dht * so * (1 - tc * tc) + dc_next
            dgates = np.concatenate([dct * tg * si * (1 - si), dct * c_prev * sf * (1 - sf),
                                     dct * si * (1 - tg * tg), dht * tc * so * (1 - so)], axis=-1)
            dw_hh += dgates.T @ h_prev
            dh_next = dgates @ w_hh
            dc_next = dct * sf
            dpx[:, t] = dgates
        elif torch_gru:
            h_prev, r, z, n, h_n = saved[t]
            dan = dht * (1 - z) * (1 - n * n)
            daz = dht * (h_prev - n) * z * (1 - z)
            dar = dan * h_n * r * (1 - r)
            dhid = np.concatenate([dar, daz, dan * r], axis=-1)  # d of h·W_hhᵀ + b_hh, gate by gate
            dw_hh += dhid.T @ h_prev
            dh_next = dht * z + dhid @ w_hh
            dpx[:, t] = np.concatenate([dar, daz, dan], axis=-1)
            dph[:, t] = dhid
        else:
            h_prev, r, z, n = saved[t]
            u_r, u_z, u_n = np.split(w_hh, 3, axis=0)
            dan = dht * z * (1 - n * n)
            daz = dht * (n - h_prev) * z * (1 - z)
            drh = dan @ u_n
            dar = drh * h_prev * r * (1 - r)
            dw_hh += np.concatenate([dar.T @ h_prev, daz.T @ h_prev, dan.T @ (r * h_prev)], axis=0)
            dh_next = dht * (1 - z) + drh * r + dar @ u_r + daz @ u_z
            dpx[:, t] = np.concatenate([dar, daz, dan], axis=-1)
    flat = dpx.reshape(-1, dpx.shape[-1])
    return dpx @ w_ih, flat.T @ x.reshape(-1, x.shape[-1]), dw_hh, dpx, dph


def _pass_grads(op: str, a: dict[str, Any], x: Arr, w: dict[str, Arr], sfx: str, ih: str, hh: str, bias_names,
                dseq: Arr, dh: Arr, dc: Arr) -> tuple[Arr, dict[str, Arr]]:
    """One pass's dx and {weight name: gradient} (the bias names: the one bias, or bias_ih and bias_hh)."""
    b_ih = w.get(bias_names[0]) if bias_names else None
    b_hh = w.get(bias_names[1]) if len(bias_names) > 1 else None
    dx, dw_ih, dw_hh, dpx, dph = _rnn_pass(op, a, x, w[ih], w[hh], b_ih, b_hh, dseq, dh, dc)
    grads = {ih: dw_ih, hh: dw_hh}
    if bias_names:
        db = dpx.reshape(-1, dpx.shape[-1]).sum(axis=0)
        grads[bias_names[0]] = db
        if len(bias_names) > 1:  # b_ih + b_hh add (rnn, lstm) or sit on either side of r (torch's gru)
            grads[bias_names[1]] = db if dph is None else dph.reshape(-1, dph.shape[-1]).sum(axis=0)
    return dx, grads


def _stacked(node: Node, x: Arr, w: dict[str, Arr], dseq: Arr, dh: Arr | None, dc: Arr | None, mask: Arr | None):
    """PyTorch's layout: the forward layer by layer (each layer's input kept: in training the previous layer's
    sequence times its dropout mask), then the layers top down, the gradient reaching a layer's sequence from
    the next layer's input multiplied by the same mask."""
    from irc.backends.numpy_ref.recurrent import _one_pass

    a = node.attrs
    op = node.op.removesuffix("_grad")
    forward = replace(node, op=op)  # the forward kernel reads the op's name
    hidden, dirs = a["hidden"], directions(a)
    inputs, seq = [], x
    for layer in range(num_layers(a)):
        if mask is not None and layer > 0:
            seq = seq * mask[layer - 1]
        inputs.append(seq)
        outs = [_one_pass(forward, seq[:, ::-1] if d else seq, w, layer_suffix(layer, d))[0] for d in range(dirs)]
        seq = np.concatenate([o[:, ::-1] if d else o for d, o in enumerate(outs)], axis=-1)
    grads: dict[str, Arr] = {}
    dout = dseq
    for layer in reversed(range(num_layers(a))):
        xin, din = inputs[layer], np.zeros_like(inputs[layer])
        for d in range(dirs):
            sfx = layer_suffix(layer, d)
            row = layer * dirs + d
            dpart = dout[..., d * hidden:(d + 1) * hidden]
            zero = np.zeros((x.shape[0], hidden), dtype=x.dtype)
            dx, g = _pass_grads(op, a, xin[:, ::-1] if d else xin, w, sfx, f"weight_ih{sfx}", f"weight_hh{sfx}",
                                (f"bias_ih{sfx}", f"bias_hh{sfx}") if a["bias"] else (),
                                dpart[:, ::-1] if d else dpart, zero if dh is None else dh[row],
                                zero if dc is None else dc[row])
            din += dx[:, ::-1] if d else dx
            grads.update(g)
        dout = din * mask[layer - 1] if mask is not None and layer > 0 else din
    return dout, grads


def recurrent_grad(node: Node, args, w):
    """rnn_grad, lstm_grad, gru_grad (x, dseq, dh?, dc?, and with train=true the dropout mask last): dx, then
    each weight's gradient."""
    op = node.op.removesuffix("_grad")
    a = node.attrs
    mask = args[-1] if a.get("train") else None
    args = args[:-1] if a.get("train") else args
    x, dseq = args[0], args[1]
    dh = args[2] if len(args) > 2 else None
    dc = args[3] if len(args) > 3 else None
    if torch_layout(a):
        dx, grads = _stacked(node, x, w, dseq, dh, dc, mask)
    else:
        zero = np.zeros((x.shape[0], a["hidden"]), dtype=x.dtype)
        biases = tuple(k for k in ("bias", "bias_ih", "bias_hh") if k in w)
        dx, grads = _pass_grads(op, a, x, w, "", "weight_ih", "weight_hh", biases, dseq,
                                zero if dh is None else dh, zero if dc is None else dc)
    return (dx, *(grads[k] for k in w))


OPS = {"rnn_grad": recurrent_grad, "lstm_grad": recurrent_grad, "gru_grad": recurrent_grad}
