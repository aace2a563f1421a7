"""Dense layers: linear, matmul, the FFN and SwiGLU (weights [out, in], PyTorch layout)."""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.elementwise import ACT, silu
from irc.graph import Node


def affine(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x @ weight.T (+ bias) over the last axis."""
    y = x @ weight.T
    return y if bias is None else y + bias


def linear(node: Node, args, w):
    return affine(args[0], w["weight"], w.get("bias"))


def ffn(node: Node, args, w):
    h = ACT[node.attrs.get("act", "gelu")](affine(args[0], w["w1"], w.get("b1")))
    return affine(h, w["w2"], w.get("b2"))


def swiglu(node: Node, args, w):
    x = args[0]
    h = silu(affine(x, w["w_gate"], w.get("b_gate"))) * affine(x, w["w_up"], w.get("b_up"))
    return affine(h, w["w_down"], w.get("b_down"))


OPS = {
    "linear": linear,
    "matmul": lambda node, args, w: np.matmul(args[0], args[1]),
    "ffn": ffn,
    "swiglu": swiglu,
}
