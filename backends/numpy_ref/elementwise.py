"""Activations, softmax, dropout and broadcasting arithmetic."""

from __future__ import annotations

import math

import numpy as np

from irc.graph import Node


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -x)).astype(x.dtype)  # never overflows


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # scipy is optional at run time
        return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(x.dtype)
    return erf(x).astype(x.dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: x·Φ(x) = 0.5·x·(1 + erf(x/√2))."""
    return 0.5 * x * (1 + _erf(x / x.dtype.type(math.sqrt(2.0))))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = x.dtype.type(math.sqrt(2.0 / math.pi))
    return 0.5 * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def leaky_relu(x: np.ndarray, slope: float) -> np.ndarray:
    return np.where(x >= 0, x, x.dtype.type(slope) * x)


def relu6(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, 0), 6).astype(x.dtype)


def clamp(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """min(max(x, lo), hi), a bound of None left out; NaN stays NaN (np.maximum/np.minimum propagate it)."""
    if lo is not None:
        x = np.maximum(x, x.dtype.type(lo))
    if hi is not None:
        x = np.minimum(x, x.dtype.type(hi))
    return x


def hardsigmoid(x: np.ndarray) -> np.ndarray:
    """relu6(x + 3)/6 (PyTorch's: 0 below −3, 1 above 3, linear between)."""
    return relu6(x + x.dtype.type(3)) / x.dtype.type(6)


def hardswish(x: np.ndarray) -> np.ndarray:
    """x·relu6(x + 3)/6 (PyTorch's, MobileNetV3's)."""
    return x * hardsigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x).astype(x.dtype)  # log(1 + e^x) without overflow


def mish(x: np.ndarray) -> np.ndarray:
    """x·tanh(softplus(x))."""
    return x * np.tanh(softplus(x))


def elu(x: np.ndarray, alpha: float) -> np.ndarray:
    """x for x > 0, alpha·(e^x − 1) otherwise (expm1: exact near 0)."""
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(np.minimum(x, 0))).astype(x.dtype)


# the activation names `ffn(act=...)` accepts
ACT = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu, "tanh": np.tanh}


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax with the row max subtracted first; a row that is all −∞ gives zeros, not NaN."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def dropout_train(x: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Inverted dropout as in training: zero with probability p, scale survivors by 1/(1 − p)."""
    keep = rng.random(x.shape) >= p
    return np.where(keep, x / x.dtype.type(1 - p), 0).astype(x.dtype)


def _gelu_op(node: Node, args, w):
    return gelu_tanh(args[0]) if node.attrs.get("approx") == "tanh" else gelu(args[0])


def _binary(fn):
    def op(node: Node, args, w):
        if len(args) == 2:
            return fn(args[0], args[1])
        x = args[0]
        s = x.dtype.type(node.attrs["scalar"])
        return fn(s, x) if node.attrs.get("reverse") else fn(x, s)
    return op


OPS = {
    "relu": lambda node, args, w: relu(args[0]),
    "leaky_relu": lambda node, args, w: leaky_relu(args[0], node.attrs.get("slope", 0.01)),
    "gelu": _gelu_op,
    "silu": lambda node, args, w: silu(args[0]),
    "tanh": lambda node, args, w: np.tanh(args[0]),
    "sigmoid": lambda node, args, w: sigmoid(args[0]),
    "abs": lambda node, args, w: np.abs(args[0]),
    "relu6": lambda node, args, w: relu6(args[0]),
    "hardtanh": lambda node, args, w: clamp(args[0], node.attrs["min"], node.attrs["max"]),
    "clamp": lambda node, args, w: clamp(args[0], node.attrs["min"], node.attrs["max"]),
    "hardswish": lambda node, args, w: hardswish(args[0]),
    "hardsigmoid": lambda node, args, w: hardsigmoid(args[0]),
    "mish": lambda node, args, w: mish(args[0]),
    "elu": lambda node, args, w: elu(args[0], node.attrs["alpha"]),
    "maximum": lambda node, args, w: np.maximum(args[0], args[1]),
    "minimum": lambda node, args, w: np.minimum(args[0], args[1]),
    "identity": lambda node, args, w: args[0],
    "dropout": lambda node, args, w: args[0],  # inference: the identity
    "softmax": lambda node, args, w: softmax(args[0], node.attrs.get("axis", -1)),
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "div": _binary(np.divide),
}
