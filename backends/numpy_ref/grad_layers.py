"""Backward kernels of the windowed layers (convolutions and transposed ones, pools, upsampling) and the
norms with per-sample or per-channel statistics (BatchNorm in either mode, GroupNorm, InstanceNorm), in
float64-exact NumPy. Each mirrors its forward kernel in conv.py, norm.py and resample.py tap for tap; the
recurrent layers' backpropagation through time is in grad_recurrent.py."""

from __future__ import annotations

import itertools
import math

import numpy as np

from irc.backends.numpy_ref.conv import _out_size, _pad, _pool_geometry, conv_pads
from irc.backends.numpy_ref.grad_recurrent import OPS as RECURRENT
from irc.backends.numpy_ref.norm import _along, batch_statistics
from irc.backends.numpy_ref.resample import _taps
from irc.graph import Node
from irc.ops.common import per_axis
from irc.ops.resample import scales


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
    stride, dilation = per_axis(a.get("stride", 1), nd), per_axis(a.get("dilation", 1), nd)
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


def _normalised_grad(xhat: np.ndarray, dxhat: np.ndarray, inv: np.ndarray, axes) -> np.ndarray:
    """dx of x̂ = (x − mean)·inv with mean and (biased) variance over ``axes``:
    (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))·inv (Ioffe & Szegedy 2015; LayerNorm's formula over other axes)."""
    return inv * (dxhat - dxhat.mean(axis=axes, keepdims=True) - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))


def batchnorm_grad(node: Node, args, w):
    """Inference mode: y = (x − mean)·gain/√(var + eps) + bias with the running statistics (constants).
    train=true: the statistics are this batch's, so the gradient also flows through them."""
    x, dy = args
    a = node.attrs
    axis = a.get("axis", 1) % x.ndim
    others = tuple(i for i in range(x.ndim) if i != axis)
    mean, var = (batch_statistics(x, axis)[:2] if a.get("train") else (w["running_mean"], w["running_var"]))
    inv = 1 / np.sqrt(_along(var, axis, x.ndim) + x.dtype.type(a.get("eps", 1e-5)))
    xhat = (x - _along(mean, axis, x.ndim)) * inv
    dxhat = dy * _along(w["gain"], axis, x.ndim)
    dx = _normalised_grad(xhat, dxhat, inv, others) if a.get("train") else dxhat * inv
    return dx, (dy * xhat).sum(axis=others), dy.sum(axis=others)


def groupnorm_grad(node: Node, args, w):
    """nn.GroupNorm's backward (InstanceNorm: one group per channel): x̂ over each sample's group of channels
    and positions, dx̂ = dy·gain per channel, dgain = Σ dy·x̂, dbias = Σ dy over the batch and positions."""
    x, dy = args
    b, c = x.shape[:2]
    groups = node.attrs["groups"] if node.op == "groupnorm_grad" else c
    g = x.reshape(b, groups, -1)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(var + x.dtype.type(node.attrs["eps"]))
    xhat = (g - mean) * inv
    dxhat = dy * _along(w["gain"], 1, x.ndim) if "gain" in w else dy
    dx = _normalised_grad(xhat, dxhat.reshape(g.shape), inv, -1).reshape(x.shape)
    if "gain" not in w:
        return dx
    others = (0, *range(2, x.ndim))
    return dx, (dy * xhat.reshape(x.shape)).sum(axis=others), dy.sum(axis=others)


def conv_transpose_grad(node: Node, args, w):
    """y = the scatter of x·W[c, o, tap] to i·stride + tap·dilation, cropped by padding (conv.conv_transpose):
    its adjoint gathers dy (the crop undone with zeros) at those positions, dx = Σ W·dy and dW = Σ x·dy."""
    x, dy = args
    a = node.attrs
    weight = w["weight"]
    nd = x.ndim - 2
    kernel = weight.shape[2:]
    stride, padding, dilation = per_axis(a["stride"], nd), per_axis(a["padding"], nd), per_axis(a["dilation"], nd)
    groups = a["groups"]
    cg, og = x.shape[1] // groups, weight.shape[1]
    size = x.shape[2:]
    full = [(n - 1) * s + d * (k - 1) + 1 + e
            for n, s, d, k, e in zip(size, stride, dilation, kernel, per_axis(a["output_padding"], nd))]
    dfull = np.zeros(dy.shape[:2] + tuple(full), dtype=dy.dtype)
    dfull[(slice(None), slice(None)) + tuple(slice(p, f - p) for p, f in zip(padding, full))] = dy
    dx, dw = np.zeros_like(x), np.zeros_like(weight)
    for g in range(groups):
        xg, wg = x[:, g * cg:(g + 1) * cg], weight[g * cg:(g + 1) * cg]
        for tap in itertools.product(*(range(k) for k in kernel)):
            index = tuple(slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(tap, dilation, stride, size))
            view = dfull[(slice(None), slice(g * og, (g + 1) * og)) + index]  # [B, Og, *size]
            at = (slice(None), slice(None)) + tap
            dx[:, g * cg:(g + 1) * cg] += np.einsum("bo...,co->bc...", view, wg[at])
            summed = [0, *range(2, x.ndim)]  # the batch and every input position
            dw[g * cg:(g + 1) * cg][at] = np.tensordot(xg, view, axes=(summed, summed))
    grads = [dx, dw]
    if "bias" in w:
        grads.append(dy.sum(axis=(0, *range(2, dy.ndim))))
    return tuple(grads)


def adaptive_avgpool2d_grad(node: Node, args, w):
    """Each bin's dy over its size, added at every position of the bin (PyTorch's bin edges; bins may overlap)."""
    x, dy = args
    oh, ow = per_axis(node.attrs["size"], 2)
    h, wd = x.shape[2:]
    dx = np.zeros_like(x)
    for i in range(oh):
        r0, r1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            c0, c1 = (j * wd) // ow, -((-(j + 1) * wd) // ow)
            dx[:, :, r0:r1, c0:c1] += dy[:, :, i:i + 1, j:j + 1] / x.dtype.type((r1 - r0) * (c1 - c0))
    return dx


def _interpolation(size: int, s: int, align_corners: bool, dtype) -> np.ndarray:
    """The [size·s, size] matrix of one axis's bilinear weights (resample._taps): out = A·x along the axis."""
    i0, i1, frac = _taps(size, s, align_corners)
    frac = frac.astype(dtype)
    m = np.zeros((size * s, size), dtype=dtype)
    rows = np.arange(size * s)
    np.add.at(m, (rows, i0), 1 - frac)
    np.add.at(m, (rows, i1), frac)
    return m


def upsample_grad(node: Node, args, w):
    """Nearest: each output's dy summed back onto its source pixel. Bilinear: out = A_h·x·A_wᵀ per channel,
    so dx = A_hᵀ·dy·A_w (each output's dy shared among its 4 taps by their weights)."""
    x, dy = args
    factors = scales(node.attrs, x.ndim)
    if node.attrs["mode"] == "nearest":
        split = dy.reshape(x.shape[:2] + tuple(d for n, s in zip(x.shape[2:], factors) for d in (n, s)))
        return split.sum(axis=tuple(3 + 2 * i for i in range(len(factors))))
    ah, aw = (_interpolation(n, s, node.attrs["align_corners"], x.dtype) for n, s in zip(x.shape[2:], factors))
    return np.einsum("ih,bcij,jw->bchw", ah, dy, aw)


OPS = {
    "conv1d_grad": conv_grad,
    "conv2d_grad": conv_grad,
    "maxpool1d_grad": maxpool_grad,
    "maxpool2d_grad": maxpool_grad,
    "avgpool1d_grad": avgpool_grad,
    "avgpool2d_grad": avgpool_grad,
    "global_avgpool_grad": global_avgpool_grad,
    "batchnorm_grad": batchnorm_grad,
    "groupnorm_grad": groupnorm_grad,
    "instancenorm_grad": groupnorm_grad,
    "conv_transpose1d_grad": conv_transpose_grad,
    "conv_transpose2d_grad": conv_transpose_grad,
    "adaptive_avgpool2d_grad": adaptive_avgpool2d_grad,
    "upsample_grad": upsample_grad,
    **RECURRENT,
}
