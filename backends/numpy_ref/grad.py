"""Backward primitives (irc/ops/grad_ops.py): each op's vector-Jacobian product in float64-exact NumPy.

The derivative of each activation follows PyTorch's autograd formula (its value at kinks included:
relu′(0) = 0, abs′(0) = 0, clamp passes the gradient at its bounds, hardtanh does not); docs/autodiff.md
lists them.
"""

from __future__ import annotations

import math

import numpy as np

from irc.backends.numpy_ref.attention import hidden_keys, t5_buckets
from irc.backends.numpy_ref.elementwise import _erf, sigmoid, softmax, softplus
from irc.backends.numpy_ref.grad_attention import OPS as ATTENTION
from irc.backends.numpy_ref.losses import kept_rows
from irc.backends.numpy_ref.norm import _along
from irc.graph import Node
from irc.ops.attention import rope_theta


def sum_to(dy: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``dy`` over the axes along which an array of ``shape`` was broadcast to dy's shape."""
    lead = dy.ndim - len(shape)
    out = dy.sum(axis=tuple(range(lead))) if lead else dy
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(axis=axes, keepdims=True) if axes else out


def _between(x: np.ndarray, lo: float | None, hi: float | None, strict: bool) -> np.ndarray:
    keep = np.ones(x.shape, dtype=bool)
    if lo is not None:
        keep &= (x > lo) if strict else (x >= lo)
    if hi is not None:
        keep &= (x < hi) if strict else (x <= hi)
    return keep


def act_derivative(act: str, x: np.ndarray, a: dict) -> np.ndarray:
    """act′(x), PyTorch's autograd formula for each activation."""
    one = x.dtype.type(1)
    if act == "relu":
        return (x > 0).astype(x.dtype)
    if act == "leaky_relu":
        return np.where(x > 0, one, x.dtype.type(a.get("slope") if a.get("slope") is not None else 0.01))
    if act == "gelu":
        if a.get("approx") == "tanh":
            c, k = x.dtype.type(math.sqrt(2.0 / math.pi)), x.dtype.type(0.044715)
            t = np.tanh(c * (x + k * x**3))
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * k * x * x)
        cdf = 0.5 * (1 + _erf(x / x.dtype.type(math.sqrt(2.0))))
        pdf = np.exp(-0.5 * x * x) / x.dtype.type(math.sqrt(2 * math.pi))
        return cdf + x * pdf
    if act == "silu":
        s = sigmoid(x)
        return s * (1 + x * (1 - s))
    if act == "tanh":
        t = np.tanh(x)
        return 1 - t * t
    if act == "sigmoid":
        s = sigmoid(x)
        return s * (1 - s)
    if act == "abs":
        return np.sign(x)
    if act == "relu6":
        return _between(x, 0.0, 6.0, strict=True).astype(x.dtype)
    if act == "hardtanh":
        lo = a.get("min") if a.get("min") is not None else -1.0
        hi = a.get("max") if a.get("max") is not None else 1.0
        return _between(x, lo, hi, strict=True).astype(x.dtype)
    if act == "clamp":
        return _between(x, a.get("min"), a.get("max"), strict=False).astype(x.dtype)
    if act == "hardswish":
        return np.where(x < -3, 0, np.where(x <= 3, x / 3 + 0.5, one)).astype(x.dtype)
    if act == "hardsigmoid":
        return np.where((x > -3) & (x < 3), x.dtype.type(1 / 6), 0).astype(x.dtype)
    if act == "mish":
        t = np.tanh(softplus(x))
        return t + x * sigmoid(x) * (1 - t * t)
    if act == "elu":
        alpha = x.dtype.type(a.get("alpha") if a.get("alpha") is not None else 1.0)
        return np.where(x > 0, one, alpha * np.exp(np.minimum(x, 0))).astype(x.dtype)
    raise AssertionError(f"no derivative for {act}")


def act_grad(node: Node, args, w):
    x, dy = args
    return dy * act_derivative(node.attrs["fn"], x, node.attrs)


def softmax_grad(node: Node, args, w):
    y, dy = args
    axis = node.attrs.get("axis", -1)
    return y * (dy - np.sum(y * dy, axis=axis, keepdims=True))


def causal_mask_grad(node: Node, args, w):
    (dy,) = args
    return np.where(hidden_keys(*dy.shape[-2:], node.attrs.get("window")), 0, dy).astype(dy.dtype)


def _others(axis: int, rank: int) -> tuple[int, ...]:
    return tuple(i for i in range(rank) if i != axis)


def layernorm_grad(node: Node, args, w):
    x, dy = args
    a = node.attrs
    axis = (a.get("axis") if a.get("axis") is not None else -1) % x.ndim
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    inv = 1 / np.sqrt(var + x.dtype.type(a.get("eps", 1e-5)))
    xhat = (x - mean) * inv
    dxhat = dy * _along(w["gain"], axis, x.ndim) if "gain" in w else dy
    dx = inv * (dxhat - dxhat.mean(axis=axis, keepdims=True) - xhat * (dxhat * xhat).mean(axis=axis, keepdims=True))
    out = [dx]
    if "gain" in w:
        out.append((dy * xhat).sum(axis=_others(axis, x.ndim)))
    if "bias" in w:
        out.append(dy.sum(axis=_others(axis, x.ndim)))
    return tuple(out) if len(out) > 1 else dx


def rmsnorm_grad(node: Node, args, w):
    x, dy = args
    inv = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(node.attrs.get("eps", 1e-6)))
    xhat = x * inv
    dxhat = dy * w["gain"] if "gain" in w else dy
    dx = inv * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    if "gain" not in w:
        return dx
    return dx, (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)


def embedding_grad(node: Node, args, w):
    ids, dy = args
    out = np.zeros((node.attrs["vocab"], dy.shape[-1]), dtype=dy.dtype)
    np.add.at(out, ids.reshape(-1), dy.reshape(-1, dy.shape[-1]))  # repeated ids accumulate
    return out


def position_grad(node: Node, args, w):
    (dy,) = args
    out = np.zeros((node.attrs["max_len"], dy.shape[2]), dtype=dy.dtype)
    out[: dy.shape[1]] = dy.sum(axis=0)
    return out


def cross_entropy_grad(node: Node, args, w):
    logits, targets = args[:2]
    keep, safe = kept_rows(node, logits, targets, node.attrs["ignore_index"])
    p = softmax(logits, axis=-1)
    np.put_along_axis(p, safe[..., None], np.take_along_axis(p, safe[..., None], axis=-1) - 1, axis=-1)
    scale = (args[2] if len(args) > 2 else 1) / np.sum(keep)
    return (np.where(keep[..., None], p, 0) * scale).astype(logits.dtype)


def mse_grad(node: Node, args, w):
    pred, target = args[:2]
    scale = (args[2] if len(args) > 2 else 1) * 2 / pred.size
    return ((pred - target) * scale).astype(pred.dtype)


def rel_position_bias_grad(node: Node, args, w):
    (dy,) = args
    a = node.attrs
    heads, t, s = dy.shape[1:]
    bucket = t5_buckets(t, s, a["buckets"], a["max_distance"], a["bidirectional"])  # [T, S]
    out = np.zeros((a["buckets"], heads), dtype=dy.dtype)
    np.add.at(out, bucket.reshape(-1), dy[0].reshape(heads, -1).T)
    return out


def slice_grad(node: Node, args, w):
    """Zeros of ``size`` along the axis, dy at ``start``: the adjoint of slice, select and split."""
    (dy,) = args
    a = node.attrs
    axis = a["axis"] % dy.ndim
    out = np.zeros(dy.shape[:axis] + (a["size"],) + dy.shape[axis + 1:], dtype=dy.dtype)
    index = [slice(None)] * dy.ndim
    index[axis] = slice(a["start"], a["start"] + dy.shape[axis])
    out[tuple(index)] = dy
    return out


def minmax_grad(node: Node, args, w):
    """torch.maximum/minimum's backward: dy to the operand that wins, dy/2 to each on a tie (before sum_to)."""
    x, y, dy = args
    wins = x > y if node.attrs["fn"] == "maximum" else x < y
    loses = x < y if node.attrs["fn"] == "maximum" else x > y
    half = dy / dy.dtype.type(2)
    da = np.where(wins, dy, np.where(loses, 0, half)).astype(dy.dtype)
    db = np.where(loses, dy, np.where(wins, 0, half)).astype(dy.dtype)
    return np.broadcast_to(da, dy.shape).copy(), np.broadcast_to(db, dy.shape).copy()


def rope_grad(node: Node, args, w):
    """rope rotates each pair by +angle; its transpose rotates dy by −angle: rope of dy with sin negated."""
    (dy,) = args
    t, hd = dy.shape[-2:]
    freq = rope_theta(node.attrs, key="theta") ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    angle = np.arange(t, dtype=np.float64)[:, None] * freq[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1).astype(dy.dtype)
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1).astype(dy.dtype)
    half = hd // 2
    rotated = np.concatenate([-dy[..., half:], dy[..., :half]], axis=-1)
    return dy * cos - rotated * sin


def dropout_rng(seed: int, step=None) -> np.random.Generator:
    """The generator of a dropout mask: from ``seed`` alone, or from (seed, step) when the graph feeds a step
    (NumPy's SeedSequence mixes the two). The CPU backend draws its masks with this very function."""
    if step is None:
        return np.random.default_rng(seed)
    return np.random.default_rng([seed, int(step) % 2**63])  # SeedSequence takes no negative entropy


def dropout_mask(node: Node, args, w):
    """0 with probability p, else 1/(1 − p): uniforms in float64 from ``seed`` (and ``step``), so a mask is the
    same in float32 and float64 runs."""
    x = args[0]
    p = node.attrs["p"]
    keep = dropout_rng(node.attrs["seed"], args[1] if len(args) > 1 else None).random(x.shape) >= p
    return np.where(keep, x.dtype.type(1 / (1 - p)), x.dtype.type(0))


OPS = {
    "dropout_mask": dropout_mask,
    "slice_grad": slice_grad,
    "minmax_grad": minmax_grad,
    "rope_grad": rope_grad,
    "rel_position_bias_grad": rel_position_bias_grad,
    "sum_to": lambda node, args, w: sum_to(args[0], tuple(node.attrs["shape"])),
    "act_grad": act_grad,
    "softmax_grad": softmax_grad,
    "causal_mask_grad": causal_mask_grad,
    "layernorm_grad": layernorm_grad,
    "rmsnorm_grad": rmsnorm_grad,
    "embedding_grad": embedding_grad,
    "position_grad": position_grad,
    "cross_entropy_grad": cross_entropy_grad,
    "mse_grad": mse_grad,
    **ATTENTION,
}
