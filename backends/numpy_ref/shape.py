"""Ops that only move data, with NumPy C-order semantics."""

from __future__ import annotations

import numpy as np

from irc.graph import Node


def _result_shape(node: Node, x: np.ndarray) -> tuple[int, ...]:
    """The result type's shape when bound, else the attribute with its -1 resolved by NumPy."""
    shape = node.types[0].shape if node.types else None
    if shape is not None and all(isinstance(d, int) for d in shape):
        return tuple(shape)
    return tuple(node.attrs["shape"])


def flatten(node: Node, args, w):
    x = args[0]
    s, e = node.attrs.get("start", 1) % x.ndim, node.attrs.get("end", -1) % x.ndim
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])


def split(node: Node, args, w):
    x = args[0]
    axis = node.attrs.get("axis", -1)
    parts = node.attrs["parts"]
    if isinstance(parts, list):
        return tuple(np.split(x, np.cumsum(parts)[:-1], axis=axis))
    return tuple(np.split(x, parts, axis=axis))


def select(node: Node, args, w):
    return np.take(args[0], node.attrs["index"], axis=node.attrs["axis"])


def slice_(node: Node, args, w):
    x = args[0]
    axis = node.attrs["axis"] % x.ndim
    index = [slice(None)] * x.ndim
    index[axis] = slice(node.attrs.get("start", 0), node.attrs.get("end"))
    return x[tuple(index)]



def expand(node: Node, args, w):
    """Broadcast to the result's shape (a copy, so that later in-place work cannot alias it)."""
    return np.broadcast_to(args[0], node.types[0].shape).copy()

OPS = {
    "flatten": flatten,
    "reshape": lambda node, args, w: args[0].reshape(_result_shape(node, args[0])),
    "transpose": lambda node, args, w: np.transpose(args[0], node.attrs["perm"]),
    "concat": lambda node, args, w: np.concatenate(args, axis=node.attrs.get("axis", -1)),
    "split": split,
    "select": select,
    "slice": slice_,
    "expand": expand,
}
