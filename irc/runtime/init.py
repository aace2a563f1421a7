"""Deterministic initial weights from a seed, by the chapter's rules.

- Transformer parts (attention projections, FFN/SwiGLU matrices, embeddings, learned
  positions, an untied unembedding, T5 relative bias): normal(0, 0.02), as GPT-2 does.
- Other matrices and kernels (linear, conv, rnn/lstm/gru): He normal, Var = 2/fan_in, when
  the layer feeds a ReLU (directly or through batchnorm, dropout, identity or a residual
  add), else Xavier uniform, Var = 2/(fan_in + fan_out). An FFN with act=relu takes He for
  its first matrix: the ReLU rule wins.
- Biases 0, except the LSTM forget gate's (rows h..2h): its forget_bias attribute (default 1.0,
  so sigmoid(b_f) starts at 0.73).
- Norms: gain 1, bias 0. BatchNorm buffers: running_mean 0, running_var 1.

Each key draws from its own stream, seeded by (seed, crc32(key)): a weight's initial value
depends only on the seed, its key and its shape, never on the rest of the graph.
"""

from __future__ import annotations

import zlib
from math import prod, sqrt

import numpy as np

from irc.graph import Graph, Node
from irc.runtime.weights import WEIGHT_DTYPE, expected_weights, node_weight_keys

TRANSFORMER_OPS = {"attention", "ffn", "swiglu", "embedding", "positional", "unembed"}
RELU_OPS = {"relu", "leaky_relu"}
PASS_THROUGH = {"batchnorm", "dropout", "identity", "add"}  # ops between a layer and the ReLU it feeds
GPT_STD = 0.02


def key_rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, zlib.crc32(key.encode())])


def feeds_relu(graph: Graph, node: Node, users: dict[str, list[Node]] | None = None) -> bool:
    users = graph.users() if users is None else users
    seen: set[str] = set()
    frontier = [node.outputs[0]]
    while frontier:
        value = frontier.pop()
        for user in users.get(value, []):
            if user.op in RELU_OPS:
                return True
            if user.op in PASS_THROUGH and user.outputs[0] not in seen:
                seen.add(user.outputs[0])
                frontier.append(user.outputs[0])
    return False


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    receptive = prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive  # PyTorch's fan_in, fan_out


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    out = rng.standard_normal(shape, dtype=np.float32)  # drawn in float32: no float64 copy of a big table
    out *= np.float32(std)
    return out


def _he(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return _normal(rng, shape, sqrt(2.0 / _fans(shape)[0]))


def _xavier(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    fan_in, fan_out = _fans(shape)
    a = np.float32(sqrt(6.0 / (fan_in + fan_out)))
    out = rng.random(shape, dtype=np.float32)
    out *= 2 * a
    out -= a
    return out


def _init_one(node: Node, name: str, shape: tuple[int, ...], rng: np.random.Generator, relu: bool) -> np.ndarray:
    op = node.op
    if name in ("gain", "running_var"):
        return np.ones(shape)
    if name == "running_mean" or (len(shape) == 1 and not (op == "lstm" and name == "bias")):
        return np.zeros(shape)  # every other 1-D parameter is a bias
    if op == "lstm" and name == "bias":
        h = shape[0] // 4
        b = np.zeros(shape)
        b[h:2 * h] = node.attrs.get("forget_bias", 1.0)  # gates i, f, g, o: the forget gate
        return b
    if op == "ffn" and name == "w1" and node.attrs.get("act") == "relu":
        return _he(rng, shape)
    if op in TRANSFORMER_OPS or name == "rel_bias":
        return _normal(rng, shape, GPT_STD)
    if relu or (op == "rnn" and node.attrs.get("act") == "relu"):
        return _he(rng, shape)
    return _xavier(rng, shape)


def init_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """``{key: float32 array}`` for every parameter and buffer of ``graph``."""
    expected = expected_weights(graph)
    types = graph.value_types()
    users = graph.users()
    out: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        keys = node_weight_keys(node, types)
        if not keys:
            continue
        relu = feeds_relu(graph, node, users) if node.op in ("linear", "conv1d", "conv2d") else False
        for name, key in keys.items():
            if key in out or node.weights is None or not key.startswith(f"{node.weights}."):
                continue  # shared or tied: initialised once, by its owner
            value = _init_one(node, name, expected[key], key_rng(seed, key), relu)
            out[key] = value.astype(WEIGHT_DTYPE, copy=False)
    missing = set(expected) - set(out)
    assert not missing, f"no initialiser reached {sorted(missing)}"
    return {k: out[k] for k in expected}
