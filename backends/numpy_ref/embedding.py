"""Token embeddings, the unembedding and positional encodings."""

from __future__ import annotations

import numpy as np

from irc.diagnostics import IrcError
from irc.graph import Node


def embedding(node: Node, args, w):
    ids, table = args[0], w["weight"]
    bad = (ids < 0) | (ids >= table.shape[0])
    if np.any(bad):
        first = ids[bad].flat[0]
        raise IrcError(f"token id {first} is outside the embedding's vocabulary [0, {table.shape[0]}) "
                       f"({int(bad.sum())} id(s) out of range)", node.loc)
    return table[ids]


def unembed(node: Node, args, w):
    y = args[0] @ w["weight"].T  # its own table, or the tied embedding's
    return y if w.get("bias") is None else y + w["bias"]


def sinusoidal(length: int, width: int, dtype) -> np.ndarray:
    """P[p, 2i] = sin(p / 10000^(2i/D)), P[p, 2i+1] = cos(p / 10000^(2i/D)), in float64 then cast."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    i2 = np.arange(0, width, 2, dtype=np.float64)[None, :]
    angle = pos / 10000.0 ** (i2 / width)
    p = np.empty((length, width))
    p[:, 0::2] = np.sin(angle)
    p[:, 1::2] = np.cos(angle)
    return p.astype(dtype)


def sinusoidal_concat(length: int, width: int, dtype) -> np.ndarray:
    """Whisper's (and tensor2tensor's) [sin | cos]: P[p, i] = sin(p·e^(−i·log(10000)/(D/2 − 1))),
    P[p, D/2 + i] = cos(the same angle), i < D/2; in float64 then cast."""
    half = width // 2
    inv = np.exp(-np.log(10000.0) / (half - 1) * np.arange(half, dtype=np.float64))
    angle = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(dtype)


def positional(node: Node, args, w):
    x = args[0]
    t = x.shape[1]
    if node.attrs.get("kind") == "learned":
        return x + w["weight"][:t]
    if node.attrs.get("layout") == "concat":
        return x + sinusoidal_concat(t, x.shape[2], x.dtype)
    return x + sinusoidal(t, x.shape[2], x.dtype)


OPS = {"embedding": embedding, "unembed": unembed, "positional": positional}
