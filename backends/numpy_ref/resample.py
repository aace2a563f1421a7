"""Upsampling and pixel (un)shuffle, as torch.nn.functional computes them (channels-first)."""

from __future__ import annotations

import numpy as np

from irc.graph import Node
from irc.ops.resample import scales


def nearest(x: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """out[..., i] = x[..., floor(i / s)] on each spatial axis: every element repeated s times."""
    for axis, s in enumerate(factors, start=2):
        x = np.repeat(x, s, axis=axis)
    return x


def _taps(size: int, s: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index along one axis: the two source indices and the weight of the second.

    align_corners=false: src = (i + 0.5)/s − 0.5, clamped at 0 (half-pixel centres);
    align_corners=true: src = i·(size − 1)/(out − 1), so both corners map onto corners."""
    out = size * s
    i = np.arange(out, dtype=np.float64)
    if align_corners:
        src = i * ((size - 1) / (out - 1)) if out > 1 else np.zeros_like(i)
    else:
        src = np.maximum((i + 0.5) / s - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    i1 = np.minimum(i0 + 1, size - 1)
    return i0, i1, src - i0


def bilinear(x: np.ndarray, factors: tuple[int, ...], align_corners: bool) -> np.ndarray:
    (h0, h1, lh), (w0, w1, lw) = (_taps(n, s, align_corners) for n, s in zip(x.shape[2:], factors))
    lh = lh.astype(x.dtype)[:, None]
    lw = lw.astype(x.dtype)[None, :]
    rows0, rows1 = x[:, :, h0], x[:, :, h1]  # [B, C, Ho, W]
    top = rows0[..., w0] * (1 - lw) + rows0[..., w1] * lw
    bottom = rows1[..., w0] * (1 - lw) + rows1[..., w1] * lw
    return top * (1 - lh) + bottom * lh


def upsample(node: Node, args, w):
    x = args[0]
    factors = scales(node.attrs, x.ndim)
    if node.attrs["mode"] == "nearest":
        return nearest(x, factors)
    return bilinear(x, factors, node.attrs["align_corners"])


def pixel_shuffle(x: np.ndarray, r: int) -> np.ndarray:
    """out[..., c, h·r + i, w·r + j] = x[..., c·r² + i·r + j, h, w]."""
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    y = y.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(x: np.ndarray, r: int) -> np.ndarray:
    """out[..., c·r² + i·r + j, h, w] = x[..., c, h·r + i, w·r + j]."""
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    y = y.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return y.reshape(*lead, c * r * r, h // r, w // r)


OPS = {
    "upsample": upsample,
    "pixel_shuffle": lambda node, args, w: pixel_shuffle(args[0], node.attrs["factor"]),
    "pixel_unshuffle": lambda node, args, w: pixel_unshuffle(args[0], node.attrs["factor"]),
}
