"""LayerNorm (over the last axis, per token, or any one axis) and RMSNorm, GroupNorm and InstanceNorm (per
sample), BatchNorm (per channel)."""

from __future__ import annotations

import numpy as np


def layernorm(x: np.ndarray, gain=None, bias=None, eps: float = 1e-5, axis: int = -1) -> np.ndarray:
    """Over ``axis`` (the last by default; 1 is ConvNeXt's channels-first LayerNorm), gain and bias along it."""
    axis = axis % x.ndim
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)  # biased, as PyTorch
    y = (x - mean) / np.sqrt(var + x.dtype.type(eps))
    if gain is not None:
        y = y * _along(gain, axis, x.ndim)
    return y if bias is None else y + _along(bias, axis, x.ndim)


def rmsnorm(x: np.ndarray, gain=None, eps: float = 1e-6) -> np.ndarray:
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
    return y if gain is None else y * gain


def _along(v: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """Reshape a per-channel vector to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return v.reshape(shape)


def batchnorm(x: np.ndarray, mean, var, gain, bias, axis: int = 1, eps: float = 1e-5) -> np.ndarray:
    """Inference: normalise with the running statistics."""
    axis = axis % x.ndim
    inv = 1 / np.sqrt(_along(var, axis, x.ndim) + x.dtype.type(eps))
    return (x - _along(mean, axis, x.ndim)) * inv * _along(gain, axis, x.ndim) + _along(bias, axis, x.ndim)


def batchnorm_train(x: np.ndarray, axis: int = 1, eps: float = 1e-5) -> np.ndarray:
    """Training mode, no affine: statistics of this batch, pooled over every axis but ``axis``."""
    axis = axis % x.ndim
    others = tuple(i for i in range(x.ndim) if i != axis)
    mean = x.mean(axis=others, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=others, keepdims=True)
    return (x - mean) / np.sqrt(var + x.dtype.type(eps))


def batch_statistics(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, int]:
    """This batch's per-channel mean and biased variance (what training-mode BatchNorm normalises with),
    pooled over every axis but ``axis``, and the count they pool."""
    others = tuple(i for i in range(x.ndim) if i != axis)
    mean = x.mean(axis=others)
    centred = x - _along(mean, axis, x.ndim)
    return mean, (centred * centred).mean(axis=others), x.size // x.shape[axis]


def _batchnorm_op(node, args, w):
    a = node.attrs
    x = args[0]
    axis = a.get("axis", 1) % x.ndim
    if not a.get("train"):
        return batchnorm(x, w["running_mean"], w["running_var"], w["gain"], w["bias"], axis, a.get("eps", 1e-5))
    # training (F.batch_norm(training=True)): this batch's statistics; also return the mean and the unbiased
    # variance, which PyTorch's running averages take in (running ← (1 − momentum)·running + momentum·batch)
    mean, var, n = batch_statistics(x, axis)
    y = batchnorm(x, mean, var, w["gain"], w["bias"], axis, a.get("eps", 1e-5))
    return y, mean, (var * x.dtype.type(n / max(n - 1, 1))).astype(x.dtype)


def groupnorm(x: np.ndarray, groups: int, gain=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """nn.GroupNorm on [B, C, ...]: per sample, mean and biased variance over each group of C/groups channels
    and every position, then gain and bias per channel. InstanceNorm is groups = C."""
    b, c = x.shape[:2]
    g = x.reshape(b, groups, -1)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((g - mean) / np.sqrt(var + x.dtype.type(eps))).reshape(x.shape)
    if gain is not None:
        y = y * _along(gain, 1, x.ndim)
    return y if bias is None else y + _along(bias, 1, x.ndim)


def _layernorm_op(node, args, w):
    axis = node.attrs.get("axis")
    return layernorm(args[0], w.get("gain"), w.get("bias"), node.attrs.get("eps", 1e-5), -1 if axis is None else axis)


OPS = {
    "layernorm": _layernorm_op,
    "groupnorm": lambda node, args, w: groupnorm(args[0], node.attrs["groups"], w.get("gain"), w.get("bias"),
                                                 node.attrs["eps"]),
    "instancenorm": lambda node, args, w: groupnorm(args[0], args[0].shape[1], w.get("gain"), w.get("bias"),
                                                    node.attrs["eps"]),
    "rmsnorm": lambda node, args, w: rmsnorm(args[0], w.get("gain"), node.attrs.get("eps", 1e-6)),
    "batchnorm": _batchnorm_op,
}

