"""The interpreter loop: feed inputs, run each node's op function, keep only live values."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from irc.backends.numpy_ref import (
    attention,
    conv,
    decode,
    dense,
    elementwise,
    embedding,
    experts,
    experts_grad,
    fused_conv,
    grad,
    grad_layers,
    losses,
    norm,
    primitives,
    recurrent,
    resample,
    shape,
)
from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ops import canonical_name
from irc.runtime.weights import fmt_shape, node_weight_keys

OpFn = Any  # (node, args, weights) -> array | tuple of arrays

OPS: dict[str, OpFn] = {
    **dense.OPS, **conv.OPS, **recurrent.OPS, **attention.OPS, **norm.OPS,
    **elementwise.OPS, **embedding.OPS, **shape.OPS, **primitives.OPS, **resample.OPS,
    **grad.OPS, **grad_layers.OPS, **losses.OPS, **decode.OPS, **experts.OPS, **experts_grad.OPS,
    **fused_conv.OPS,
}


def _cast_input(node: Node, arr: np.ndarray, dtype: Any) -> np.ndarray:
    name = node.outputs[0]
    want = node.types[0] if node.types else None
    arr = np.asarray(arr)
    if want is not None:
        shape = want.shape
        if len(shape) != arr.ndim or any(isinstance(d, int) and d != n for d, n in zip(shape, arr.shape)):
            raise IrcError(f"input '{name}' has shape {fmt_shape(arr.shape)}, but the model expects "
                           f"{fmt_shape(shape)}", node.loc)
        if not want.is_float:
            if arr.dtype.kind not in "iu":
                raise IrcError(f"input '{name}' must hold integers ({want.dtype}), got {arr.dtype}", node.loc)
            return arr.astype(np.int64)
    if arr.dtype.kind not in "fiu":
        raise IrcError(f"input '{name}' must hold numbers, got {arr.dtype}", node.loc)
    return arr.astype(dtype)


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    for _, v in graph.outputs:
        last[v] = len(graph.nodes)
    return last


def interpret(graph: Graph, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
              dtype: Any = np.float32, profile: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    dtype = np.dtype(dtype)
    names = [n.outputs[0] for n in graph.inputs()]
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise IrcError(f"model '{graph.name}' has no input '{unknown[0]}' (inputs: {', '.join(names) or 'none'})")
    types = graph.value_types()
    last = _last_uses(graph)
    cast: dict[str, np.ndarray] = {}  # weights converted to dtype once, shared by every user
    env: dict[str, np.ndarray] = {}
    for i, node in enumerate(graph.nodes):
        if node.op == "input":
            name = node.outputs[0]
            if name not in inputs:
                raise IrcError(f"missing input '{name}' ({types[name]})", node.loc)
            env[name] = _cast_input(node, inputs[name], dtype)
            continue
        fn = OPS.get(canonical_name(node.op))
        if fn is None:
            raise IrcError(f"the numpy reference cannot run op '{node.op}'", node.loc)
        w: dict[str, np.ndarray] = {}
        for short, key in node_weight_keys(node, types).items():
            if key not in cast:
                if key not in weights:
                    raise IrcError(f"missing weight '{key}' for '{node.op}'", node.loc)
                cast[key] = np.asarray(weights[key]).astype(dtype, copy=False)
            w[short] = cast[key]
        start = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            result = fn(node, [env[v] for v in node.inputs], w)
        if profile is not None:
            profile[node.op] = profile.get(node.op, 0.0) + time.perf_counter() - start
        results = result if isinstance(result, tuple) else (result,)
        for v, arr in zip(node.outputs, results):
            env[v] = arr if arr.dtype.kind in "iu" else arr.astype(dtype, copy=False)
        for v in set(node.inputs):  # an operand may appear twice (x * x)
            if last.get(v) == i:
                del env[v]
        for v in node.outputs:
            if v not in last:  # never read
                env.pop(v, None)
    return {label: env[v] for label, v in graph.outputs}
