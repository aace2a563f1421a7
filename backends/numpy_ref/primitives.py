"""Primitives of the decompose pass and the fused ops of the fusion passes.

The fused ops are written here as plainly as their unfused patterns, so the reference
checks the rewrite itself; the speed lives in the generated backends.
"""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.attention import hidden_keys, rope, sdpa
from irc.backends.numpy_ref.dense import affine
from irc.backends.numpy_ref.elementwise import ACT
from irc.backends.numpy_ref.norm import layernorm, rmsnorm
from irc.graph import Node
from irc.ops.attention import rope_theta


def _act(name: str, x: np.ndarray) -> np.ndarray:
    return x if name == "none" else ACT[name](x)


def gemm(node: Node, args, w):
    x, weight = args[0], args[1]
    return _act(node.attrs["act"], affine(x, weight, args[2] if len(args) > 2 else None))


def gemm_glu(node: Node, args, w):
    x, wg, wu = args
    return _act(node.attrs["act"], affine(x, wg)) * affine(x, wu)


def gemm_multi(node: Node, args, w):
    x, *ws = args
    return tuple(affine(x, wi) for wi in ws)


def causal_mask(node: Node, args, w):
    (x,) = args
    hidden = hidden_keys(*x.shape[-2:], node.attrs.get("window"))
    return np.where(hidden, -np.inf, x).astype(x.dtype)


def sdpa_op(node: Node, args, w):
    q, k, v = args[:3]
    bias = args[3] if len(args) > 3 else None
    return sdpa(q, k, v, node.attrs["causal"], node.attrs["scale"], bias, node.attrs.get("window"))


def add_norm(node: Node, args, w):
    a = node.attrs
    s = args[0] + args[1]
    if a["kind"] == "layernorm":
        return s, layernorm(s, w.get("gain"), w.get("bias"), a["eps"])
    return s, rmsnorm(s, w.get("gain"), a["eps"])


OPS = {
    "param": lambda node, args, w: w[node.attrs["name"]],
    "gemm": gemm,
    "gemm_glu": gemm_glu,
    "gemm_multi": gemm_multi,
    "rope": lambda node, args, w: rope(args[0], rope_theta(node.attrs, key="theta")),
    "causal_mask": causal_mask,
    "sdpa": sdpa_op,
    "add_norm": add_norm,
}
