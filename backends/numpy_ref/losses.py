"""Losses (PyTorch's reduction="mean"): cross entropy over the last axis with an ignored class id, and
the mean squared error. The backward kernels of both are in grad.py."""

from __future__ import annotations

import numpy as np

from irc.diagnostics import IrcError
from irc.graph import Node


def kept_rows(node: Node, logits: np.ndarray, targets: np.ndarray, ignore: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask of rows whose target is not ``ignore``, targets with ignored rows set to 0); an id outside
    [0, classes) that is not ignored is an error, as in PyTorch."""
    keep = targets != ignore
    classes = logits.shape[-1]
    bad = keep & ((targets < 0) | (targets >= classes))
    if np.any(bad):
        raise IrcError(f"target class {targets[bad].flat[0]} is outside [0, {classes}) and is not the "
                       f"ignore_index {ignore} ({int(bad.sum())} target(s) out of range)", node.loc)
    return keep, np.where(keep, targets, 0)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def cross_entropy(node: Node, args, w):
    logits, targets = args
    keep, safe = kept_rows(node, logits, targets, node.attrs["ignore_index"])
    picked = np.take_along_axis(log_softmax(logits), safe[..., None], axis=-1)[..., 0]
    # 0/0 = NaN when every row is ignored, as torch.nn.functional.cross_entropy
    return np.asarray(-np.sum(np.where(keep, picked, 0)) / np.sum(keep), dtype=logits.dtype)


def mse(node: Node, args, w):
    pred, target = args
    return np.asarray(np.mean((pred - target) ** 2), dtype=pred.dtype)


OPS = {"cross_entropy": cross_entropy, "mse": mse}
