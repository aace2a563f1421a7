"""Backward kernels of the windowed layers (convolutions, pools), the inference-mode BatchNorm and the
LSTM (backpropagation through time), in float64-exact NumPy. Each mirrors its forward kernel in
conv.py, norm.py and recurrent.py tap for tap and step for step."""

from __future__ import annotations

import itertools
import math

import numpy as np

from irc.backends.numpy_ref.conv import _out_size, _pad, _pool_geometry, _tuple, conv_pads
from irc.backends.numpy_ref.elementwise import sigmoid
from irc.backends.numpy_ref.norm import _along
from irc.graph import Node


def _tap_index(tap, dilation, stride, out) -> tuple[slice, ...]:
    return (slice(None), slice(None)) + tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                                              for t, d, s, o in zip(tap, dilation, stride, out))


def _unpad(dxp: np.ndarray, pads) -> np.ndarray:
    return dxp[(slice(None), slice(None)) + tuple(slice(p0, dxp.shape[2 + i] - p1) for i, (p0, p1) in enumerate(pads))]


def conv_grad(node: Node, args, w):
    """y[b, o, n] = Σ_tap W[o, c, tap]·xp[b, c, n·s + tap·d]: dx scatters Wᵀ·dy to every tap's view, dW[tap]
    gathers dy·viewᵀ; per group."""
    x, dy = args
    a = node.attrs
    weight = w["weight"]
    nd = x.ndim - 2
    kernel = weight.shape[2:]
    stride, dilation = _tuple(a.get("stride", 1), nd), _tuple(a.get("dilation", 1), nd)
    pads = conv_pads(a.get("padding", 0), kernel, dilation, nd)
    out = [_out_size(x.shape[2 + i], pads[i], kernel[i], stride[i], dilation[i]) for i in range(nd)]
    groups = a.get("groups", 1)
    b, c = x.shape[:2]
    o = weight.shape[0]
    cg, og = c // groups, o // groups
    wg = weight.reshape(groups, og, cg, *kernel)
    dyg = dy.reshape(b, groups, og, -1)  # [B, G, Og, N]
    xp = _pad(x, pads)
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(wg)
    for tap in itertools.product(*(range(k) for k in kernel)):
        index = _tap_index(tap, dilation, stride, out)
        patch = xp[index].reshape(b, groups, cg, -1)  # [B, G, Cg, N]
        wt = wg[(slice(None), slice(None), slice(None)) + tap]  # [G, Og, Cg]
        dxp[index] += (np.swapaxes(wt, -1, -2) @ dyg).reshape(xp[index].shape)
        dw[(slice(None), slice(None), slice(None)) + tap] = (dyg @ np.swapaxes(patch, -1, -2)).sum(axis=0)
    grads = [_unpad(dxp, pads), dw.reshape(weight.shape)]
    if "bias" in w:
        grads.append(dy.sum(axis=(0, *range(2, dy.ndim))))
    return tuple(grads)


def maxpool_grad(node: Node, args, w):
    """The gradient goes to the first maximum of each window (taps in order), as PyTorch's argmax."""
    x, dy = args
    kernel, stride, dilation, pads, out = _pool_geometry(x, node.attrs)
    xp = _pad(x, pads, -np.inf)
    best = np.full(x.shape[:2] + tuple(out), -np.inf, dtype=x.dtype)
    which = np.zeros(best.shape, dtype=np.int64)
    taps = list(itertools.product(*(range(k) for k in kernel)))
    for i, tap in enumerate(taps):
        view = xp[_tap_index(tap, dilation, stride, out)]
        better = view > best
        best = np.where(better, view, best)
        which = np.where(better, i, which)
    dxp = np.zeros_like(xp)
    for i, tap in enumerate(taps):
        dxp[_tap_index(tap, dilation, stride, out)] += np.where(which == i, dy, 0)
    return _unpad(dxp, pads)


def avgpool_grad(node: Node, args, w):
    x, dy = args
    a = node.attrs
    kernel, stride, dilation, pads, out = _pool_geometry(x, a)
    if a.get("count_include_pad", True):
        count = np.full((1, 1) + tuple(out), math.prod(kernel), dtype=x.dtype)
    else:
        ones = _pad(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), pads)
        count = sum(ones[_tap_index(t, dilation, stride, out)] for t in itertools.product(*(range(k) for k in kernel)))
    share = dy / count
    dxp = np.zeros_like(_pad(x, pads))
    for tap in itertools.product(*(range(k) for k in kernel)):
        dxp[_tap_index(tap, dilation, stride, out)] += share
    return _unpad(dxp, pads)


def global_avgpool_grad(node: Node, args, w):
    x, dy = args
    spatial = x.shape[2:]
    return np.broadcast_to(dy.reshape(dy.shape + (1,) * len(spatial)) / math.prod(spatial), x.shape).copy()


def batchnorm_grad(node: Node, args, w):
    """Inference mode: y = (x − mean)·gain/√(var + eps) + bias with the running statistics (constants)."""
    x, dy = args
    axis = node.attrs.get("axis", 1) % x.ndim
    inv = 1 / np.sqrt(_along(w["running_var"], axis, x.ndim) + x.dtype.type(node.attrs.get("eps", 1e-5)))
    others = tuple(i for i in range(x.ndim) if i != axis)
    xhat = (x - _along(w["running_mean"], axis, x.ndim)) * inv
    return dy * inv * _along(w["gain"], axis, x.ndim), (dy * xhat).sum(axis=others), dy.sum(axis=others)


def lstm_grad(node: Node, args, w):
    """BPTT of recurrent.lstm: the forward again, keeping each step's gates and cells, then back in time."""
    x, dseq = args[0], args[1]
    w_ih, w_hh, bias = w["weight_ih"], w["weight_hh"], w.get("bias")
    bsz, steps = x.shape[:2]
    hidden = w_hh.shape[1]
    px = x @ w_ih.T if bias is None else x @ w_ih.T + bias
    h = np.zeros((bsz, hidden), dtype=x.dtype)
    c = np.zeros_like(h)
    saved = []
    for t in range(steps):
        i, f, g, o = np.split(px[:, t] + h @ w_hh.T, 4, axis=-1)
        si, sf, tg, so = sigmoid(i), sigmoid(f), np.tanh(g), sigmoid(o)
        c_prev, h_prev = c, h
        c = sf * c + si * tg
        h = so * np.tanh(c)
        saved.append((si, sf, tg, so, c_prev, c, h_prev))
    dh_next = args[2].copy() if len(args) > 2 else np.zeros_like(h)
    dc_next = args[3].copy() if len(args) > 3 else np.zeros_like(h)
    dpx = np.zeros_like(px)
    dw_hh = np.zeros_like(w_hh)
    for t in reversed(range(steps)):
        si, sf, tg, so, c_prev, c, h_prev = saved[t]
        dh = dseq[:, t] + dh_next
        tc = np.tanh(c)
        dc = dh * so * (1 - tc * tc) + dc_next
        dgates = np.concatenate([dc * tg * si * (1 - si), dc * c_prev * sf * (1 - sf), dc * si * (1 - tg * tg),
                                 dh * tc * so * (1 - so)], axis=-1)
        dw_hh += dgates.T @ h_prev
        dh_next = dgates @ w_hh
        dc_next = dc * sf
        dpx[:, t] = dgates
    flat = dpx.reshape(-1, dpx.shape[-1])
    grads = [dpx @ w_ih, flat.T @ x.reshape(-1, x.shape[-1]), dw_hh]
    if bias is not None:
        grads.append(flat.sum(axis=0))
    return tuple(grads)


OPS = {
    "conv1d_grad": conv_grad,
    "conv2d_grad": conv_grad,
    "maxpool1d_grad": maxpool_grad,
    "maxpool2d_grad": maxpool_grad,
    "avgpool1d_grad": avgpool_grad,
    "avgpool2d_grad": avgpool_grad,
    "global_avgpool_grad": global_avgpool_grad,
    "batchnorm_grad": batchnorm_grad,
    "lstm_grad": lstm_grad,
}
