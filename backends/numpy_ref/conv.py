"""Convolution and pooling, channels-first, as torch.nn.functional computes them.

Every op works on N spatial axes (1 or 2): the input is padded, then for each kernel tap
a strided view of the input is taken and combined (a matmul for convolution, max or sum
for pooling). Readable rather than fast.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from irc.graph import Node
from irc.ops.common import per_axis


def conv_pads(padding, kernel, dilation, nd: int) -> list[tuple[int, int]]:
    """(before, after) per spatial axis; ``same`` puts total//2 before, the rest after (PyTorch)."""
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in totals]
    return [(p, p) for p in per_axis(padding, nd)]


def _out_size(size: int, pads: tuple[int, int], k: int, s: int, d: int) -> int:
    return (size + pads[0] + pads[1] - d * (k - 1) - 1) // s + 1


def _taps(xp: np.ndarray, kernel, stride, dilation, out):
    """Yield (tap index, strided view [B, C, *out]) for every kernel position."""
    for tap in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(tap, dilation, stride, out))
        yield tap, xp[(slice(None), slice(None)) + index]


def _pad(x: np.ndarray, pads, value: float = 0.0) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0)] + list(pads), constant_values=value)


def conv(x: np.ndarray, weight: np.ndarray, bias, stride, padding, dilation, groups: int) -> np.ndarray:
    nd = x.ndim - 2
    kernel = weight.shape[2:]
    stride, dilation = per_axis(stride, nd), per_axis(dilation, nd)
    pads = conv_pads(padding, kernel, dilation, nd)
    out = [_out_size(x.shape[2 + i], pads[i], kernel[i], stride[i], dilation[i]) for i in range(nd)]
    b, c = x.shape[:2]
    o = weight.shape[0]
    cg, og = c // groups, o // groups
    w = weight.reshape(groups, og, cg, *kernel)
    y = np.zeros((b, groups, og, math.prod(out)), dtype=x.dtype)
    for tap, view in _taps(_pad(x, pads), kernel, stride, dilation, out):
        patch = view.reshape(b, groups, cg, -1)  # [B, G, Cg, N]
        y += w[(slice(None), slice(None), slice(None)) + tap] @ patch  # [G, Og, Cg] @ [B, G, Cg, N]
    y = y.reshape(b, o, *out)
    return y if bias is None else y + bias.reshape((1, o) + (1,) * nd)


def _conv_op(node: Node, args, w):
    a = node.attrs
    return conv(args[0], w["weight"], w.get("bias"), a.get("stride", 1), a.get("padding", 0),
                a.get("dilation", 1), a.get("groups", 1))


def _pool_geometry(x: np.ndarray, a: dict):
    nd = x.ndim - 2
    kernel = per_axis(a["kernel"], nd)
    stride = per_axis(a["stride"] if a.get("stride") is not None else a["kernel"], nd)
    dilation = per_axis(a.get("dilation", 1), nd)
    pads = [(p, p) for p in per_axis(a.get("padding", 0), nd)]
    out = [_out_size(x.shape[2 + i], pads[i], kernel[i], stride[i], dilation[i]) for i in range(nd)]
    return kernel, stride, dilation, pads, out


def maxpool(x: np.ndarray, a: dict) -> np.ndarray:
    """Padding counts as −∞."""
    kernel, stride, dilation, pads, out = _pool_geometry(x, a)
    y = np.full(x.shape[:2] + tuple(out), -np.inf, dtype=x.dtype)
    for _, view in _taps(_pad(x, pads, -np.inf), kernel, stride, dilation, out):
        y = np.maximum(y, view)
    return y


def avgpool(x: np.ndarray, a: dict) -> np.ndarray:
    """``count_include_pad=true`` divides by the kernel size, else by the real elements covered."""
    kernel, stride, dilation, pads, out = _pool_geometry(x, a)
    total = np.zeros(x.shape[:2] + tuple(out), dtype=x.dtype)
    for _, view in _taps(_pad(x, pads), kernel, stride, dilation, out):
        total += view
    if a.get("count_include_pad", True):
        return total / x.dtype.type(math.prod(kernel))
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    count = np.zeros((1, 1) + tuple(out), dtype=x.dtype)
    for _, view in _taps(_pad(ones, pads), kernel, stride, dilation, out):
        count += view
    return total / count


def adaptive_avgpool2d(x: np.ndarray, size) -> np.ndarray:
    """PyTorch's bins: rows floor(i·H/o) to ceil((i+1)·H/o)."""
    oh, ow = per_axis(size, 2)
    h, w = x.shape[2:]
    y = np.empty(x.shape[:2] + (oh, ow), dtype=x.dtype)
    for i in range(oh):
        r0, r1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            c0, c1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            y[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    return y



def conv_transpose(x: np.ndarray, weight: np.ndarray, bias, stride, padding, output_padding, dilation,
                   groups: int) -> np.ndarray:
    """torch.nn.functional.conv_transpose{1,2}d, weight [in, out/groups, k...]: each input element
    scatters ``x · w[c, o, tap]`` to position ``i·stride + tap·dilation`` of a full output, whose
    first ``padding`` and last ``padding − output_padding`` positions are then cut off."""
    nd = x.ndim - 2
    kernel = weight.shape[2:]
    stride, padding, dilation = per_axis(stride, nd), per_axis(padding, nd), per_axis(dilation, nd)
    extra = per_axis(output_padding, nd)
    b, c = x.shape[:2]
    cg, og = c // groups, weight.shape[1]
    size = x.shape[2:]
    full = [(n - 1) * s + d * (k - 1) + 1 + e for n, s, d, k, e in zip(size, stride, dilation, kernel, extra)]
    y = np.zeros((b, groups * og, *full), dtype=x.dtype)
    for g in range(groups):
        xg, wg = x[:, g * cg:(g + 1) * cg], weight[g * cg:(g + 1) * cg]
        for tap in itertools.product(*(range(k) for k in kernel)):
            index = tuple(slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(tap, dilation, stride, size))
            part = np.einsum("bc...,co->bo...", xg, wg[(slice(None), slice(None)) + tap])
            y[(slice(None), slice(g * og, (g + 1) * og)) + index] += part
    crop = tuple(slice(p, f - p) for p, f in zip(padding, full))
    y = y[(slice(None), slice(None)) + crop]
    return y if bias is None else y + bias.reshape((1, -1) + (1,) * nd)


def _conv_transpose_op(node: Node, args, w):
    a = node.attrs
    return conv_transpose(args[0], w["weight"], w.get("bias"), a["stride"], a["padding"], a["output_padding"],
                          a["dilation"], a["groups"])

OPS = {
    "conv1d": _conv_op,
    "conv2d": _conv_op,
    "conv_transpose1d": _conv_transpose_op,
    "conv_transpose2d": _conv_transpose_op,
    "maxpool1d": lambda node, args, w: maxpool(args[0], node.attrs),
    "maxpool2d": lambda node, args, w: maxpool(args[0], node.attrs),
    "avgpool1d": lambda node, args, w: avgpool(args[0], node.attrs),
    "avgpool2d": lambda node, args, w: avgpool(args[0], node.attrs),
    "global_avgpool": lambda node, args, w: args[0].mean(axis=tuple(range(2, args[0].ndim))),
    "adaptive_avgpool2d": lambda node, args, w: adaptive_avgpool2d(args[0], node.attrs["size"]),
}
