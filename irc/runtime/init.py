"""Deterministic initial weights from a seed, by the rule each op's record declares per parameter.

The rules (``irc.ops.registry.INIT_RULES``), as the chapter gives them:
- ``normal``: normal(0, 0.02), as GPT-2 does, for transformer parts (attention projections, FFN and
  SwiGLU matrices, embeddings, learned positions, an untied unembedding, T5's relative bias);
- ``fan``: He normal, Var = 2/fan_in, when the layer feeds a rectifier (directly or through a batch
  norm, a pass-through op or a residual add), else Xavier uniform, Var = 2/(fan_in + fan_out);
- ``he``, ``xavier``: those two regardless of what follows (an FFN with act=relu takes He for its first
  matrix; a relu rnn He, other recurrent matrices Xavier);
- ``zeros`` (biases, running means), ``ones`` (gains, running variances), ``forget_gate`` (the LSTM
  bias: zeros with the forget gate's rows h..2h at the forget_bias attribute, so sigmoid(b_f) starts
  at 0.73).
A parameter whose op declares no rule is an error, never a silent zero.

Each key draws from its own stream, seeded by (seed, crc32(key)): a weight's initial value
depends only on the seed, its key and its shape, never on the rest of the graph.
"""

from __future__ import annotations

import zlib
from math import prod, sqrt

import numpy as np

from irc.graph import Graph, Node
from irc.ops import get_op
from irc.runtime.weights import WEIGHT_DTYPE, expected_weights, node_weight_keys

GPT_STD = 0.02
# what may stand between a layer and the rectifier it feeds for the He rule to apply
_TRANSPARENT = ("batch_norm", "pass_through", "residual")


def key_rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, zlib.crc32(key.encode())])


def feeds_relu(graph: Graph, node: Node, users: dict[str, list[Node]] | None = None) -> bool:
    """Whether ``node`` feeds a rectifier, directly or through ops that keep its sign structure."""
    users = graph.users() if users is None else users
    seen: set[str] = set()
    frontier = [node.outputs[0]]
    while frontier:
        value = frontier.pop()
        for user in users.get(value, []):
            opdef = get_op(user.op)
            if opdef is None:
                continue
            if opdef.has("rectifier"):
                return True
            if opdef.has(*_TRANSPARENT) and user.outputs[0] not in seen:
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


def _init_one(node: Node, rule: str, shape: tuple[int, ...], rng: np.random.Generator,
              users: dict[str, list[Node]], graph: Graph) -> np.ndarray:
    if rule == "zeros":
        return np.zeros(shape, np.float32)
    if rule == "ones":
        return np.ones(shape, np.float32)
    if rule == "forget_gate":  # gates i, f, g, o: the forget gate's rows
        h = shape[0] // 4
        b = np.zeros(shape, np.float32)
        b[h:2 * h] = node.attrs.get("forget_bias", 1.0)
        return b
    if rule == "normal":
        return _normal(rng, shape, GPT_STD)
    if rule == "he" or (rule == "fan" and feeds_relu(graph, node, users)):
        return _he(rng, shape)
    if rule in ("xavier", "fan"):
        return _xavier(rng, shape)
    raise AssertionError(f"op '{node.op}' names an unknown init rule '{rule}'")


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
        opdef = get_op(node.op)
        rules = opdef.init_rules(node.attrs) if opdef is not None else {}
        for name, key in keys.items():
            if key in out or node.weights is None or not key.startswith(f"{node.weights}."):
                continue  # shared or tied: initialised once, by its owner
            if name not in rules:
                raise AssertionError(f"op '{node.op}' declares no init rule for its parameter '{name}' (add it to "
                                     "the op's init= in irc/ops/)")
            value = _init_one(node, rules[name], expected[key], key_rng(seed, key), users, graph)
            out[key] = value.astype(WEIGHT_DTYPE, copy=False)
    missing = set(expected) - set(out)
    assert not missing, f"no initialiser reached {sorted(missing)}"
    return {k: out[k] for k in expected}
