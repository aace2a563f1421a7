"""LayerNorm and RMSNorm (over the last axis, per token) and BatchNorm (per channel)."""

from __future__ import annotations

import numpy as np


def layernorm(x: np.ndarray, gain=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as PyTorch
    y = (x - mean) / np.sqrt(var + x.dtype.type(eps))
    if gain is not None:
        y = y * gain
    return y if bias is None else y + bias


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


OPS = {
    "layernorm": lambda node, args, w: layernorm(args[0], w.get("gain"), w.get("bias"), node.attrs.get("eps", 1e-5)),
    "rmsnorm": lambda node, args, w: rmsnorm(args[0], w.get("gain"), node.attrs.get("eps", 1e-6)),
    "batchnorm": lambda node, args, w: batchnorm(args[0], w["running_mean"], w["running_var"], w["gain"], w["bias"],
                                                 node.attrs.get("axis", 1), node.attrs.get("eps", 1e-5)),
}

