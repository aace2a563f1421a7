"""Constant folding at import time: the shape arithmetic exporters write (``Shape``, ``Gather``, ``Concat``,
``Cast``, ``Div``, ...) evaluated on arrays whose entries may be symbolic irc sizes.

Entries of an object array are irc sizes (int or ``Sym``), so a batch size ``B`` flows through as ``B``;
purely numeric nodes outside the table run on ONNX's reference evaluator. A node whose symbolic inputs
the table cannot evaluate raises :class:`CannotFold`: the caller reports it as a dynamic shape irc
cannot express.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from irc.dims import Dim, dim_floordiv

Arrays = list[np.ndarray | None]
Attrs = dict[str, Any]


class CannotFold(Exception):
    """The node's constant inputs are symbolic in a way the folding table cannot evaluate."""


def _ints(a: np.ndarray | None) -> list[int]:
    if a is None:
        return []
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _operand_or_attr(ins: Arrays, i: int, attrs: Attrs, name: str) -> list[int] | None:
    if len(ins) > i and ins[i] is not None:
        return _ints(ins[i])
    return list(attrs[name]) if name in attrs else None


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        return _elementwise(a, b, _dim_div)
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(np.result_type(a, b))
    return (a / b).astype(np.result_type(a, b))


def _dim_div(x: Dim, y: Dim) -> Dim:
    if isinstance(x, int) and isinstance(y, int):
        return int(x / y) if y else 0
    return dim_floordiv(x, y)  # sizes are positive: truncation and floor agree


def _elementwise(a: np.ndarray, b: np.ndarray, fn: Callable[[Any, Any], Any]) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = fn(a[idx], b[idx])
    return out


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        return _elementwise(a, b, lambda x, y: x % y)
    return np.fmod(a, b) if np.issubdtype(a.dtype, np.floating) else np.mod(a, b)


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        return _elementwise(a, b, lambda x, y: bool(x == y)).astype(bool)
    return np.equal(a, b)


def _cast(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x = ins[0]
    assert x is not None
    to = attrs["to"]
    if x.dtype == object:
        if to in (6, 7):  # int32, int64: sizes stay sizes
            return x
        if all(isinstance(v, int) for v in x.reshape(-1)):
            x = x.astype(np.int64)
        else:
            raise CannotFold("casts a symbolic size to a non-integer type")
    import onnx

    return x.astype(onnx.helper.tensor_dtype_to_np_dtype(to))


def _slice(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x = ins[0]
    assert x is not None
    starts = _operand_or_attr(ins, 1, attrs, "starts") or []
    ends = _operand_or_attr(ins, 2, attrs, "ends") or []
    axes = _operand_or_attr(ins, 3, attrs, "axes") or list(range(len(starts)))
    steps = _operand_or_attr(ins, 4, attrs, "steps") or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        index[ax] = slice(s, e, st)
    return x[tuple(index)]


def _unsqueeze(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x = ins[0]
    assert x is not None
    axes = _operand_or_attr(ins, 1, attrs, "axes") or []
    rank = x.ndim + len(axes)
    for ax in sorted(a % rank for a in axes):
        x = np.expand_dims(x, ax)
    return x


def _squeeze(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x = ins[0]
    assert x is not None
    axes = _operand_or_attr(ins, 1, attrs, "axes")
    return np.squeeze(x, axis=tuple(a % x.ndim for a in axes)) if axes else np.squeeze(x)


def reshape_target(shape: list[Dim], source: tuple[Dim, ...], allowzero: bool) -> list[Dim]:
    """ONNX Reshape's target: 0 copies the input's size on that axis (unless ``allowzero``); -1 stays."""
    return [source[i] if d == 0 and not allowzero and i < len(source) else d for i, d in enumerate(shape)]


def _reshape(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x, shape = ins[0], ins[1]
    assert x is not None and shape is not None
    target = reshape_target(list(shape.reshape(-1)), x.shape, bool(attrs.get("allowzero", 0)))
    if any(not isinstance(d, (int, np.integer)) for d in target):
        raise CannotFold("reshapes a constant to a symbolic shape")
    return x.reshape([int(d) for d in target])


def _constant_of_shape(ins: Arrays, attrs: Attrs) -> np.ndarray:
    shape = ins[0]
    assert shape is not None
    if shape.dtype == object and not all(isinstance(v, int) for v in shape.reshape(-1)):
        raise CannotFold("fills a tensor of symbolic shape")
    value = attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else _tensor_array(value)
    return np.full([int(v) for v in shape.reshape(-1)], fill.reshape(-1)[0], dtype=fill.dtype)


def _expand(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x, shape = ins[0], ins[1]
    assert x is not None and shape is not None
    if shape.dtype == object and not all(isinstance(v, int) for v in shape.reshape(-1)):
        raise CannotFold("expands a constant to a symbolic shape")
    return x * np.ones([int(v) for v in shape.reshape(-1)], dtype=x.dtype)


def _where(ins: Arrays, attrs: Attrs) -> np.ndarray:
    c, a, b = ins
    assert c is not None and a is not None and b is not None
    if a.dtype == object or b.dtype == object:
        return np.where(c, a.astype(object), b.astype(object))
    return np.where(c, a, b)


def _concat(ins: Arrays, attrs: Attrs) -> np.ndarray:
    parts = [p for p in ins if p is not None]
    if any(p.dtype == object for p in parts):
        parts = [p.astype(object) for p in parts]
    return np.concatenate(parts, axis=attrs.get("axis", 0))


def _gather(ins: Arrays, attrs: Attrs) -> np.ndarray:
    x, idx = ins
    assert x is not None and idx is not None
    return np.take(x, idx.astype(np.int64), axis=attrs.get("axis", 0))


def _tensor_array(t: Any) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(t)


def _two(fn: Callable[[Any, Any], Any]) -> Callable[[Arrays, Attrs], np.ndarray]:
    def run(ins: Arrays, attrs: Attrs) -> np.ndarray:
        a, b = ins[0], ins[1]
        assert a is not None and b is not None
        if a.dtype == object or b.dtype == object:
            return _elementwise(a, b, fn)
        return np.asarray(fn(a, b)).astype(np.result_type(a, b))
    return run


def _one(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Arrays, Attrs], np.ndarray]:
    def run(ins: Arrays, attrs: Attrs) -> np.ndarray:
        x = ins[0]
        assert x is not None
        if x.dtype == object:
            raise CannotFold("applies a non-integer function to a symbolic size")
        return fn(x).astype(x.dtype)
    return run


FOLDS: dict[str, Callable[[Arrays, Attrs], np.ndarray]] = {
    "Identity": lambda ins, a: ins[0],  # type: ignore[dict-item,return-value]
    "Cast": _cast,
    "Shape": lambda ins, a: np.array(ins[0].shape[a.get("start", 0):a.get("end")], dtype=np.int64),  # type: ignore
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Add": _two(lambda x, y: x + y),
    "Sub": _two(lambda x, y: x - y),
    "Mul": _two(lambda x, y: x * y),
    "Div": lambda ins, a: _div(ins[0], ins[1]),  # type: ignore[arg-type]
    "Mod": lambda ins, a: _mod(ins[0], ins[1]),  # type: ignore[arg-type]
    "Equal": lambda ins, a: _equal(ins[0], ins[1]),  # type: ignore[arg-type]
    "Sqrt": _one(np.sqrt),
    "Neg": _one(np.negative),
    "Slice": _slice,
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Reshape": _reshape,
    "Expand": _expand,
    "Transpose": lambda ins, a: np.transpose(ins[0], a.get("perm")),  # type: ignore[arg-type]
}


def fold(op_type: str, ins: Arrays, attrs: Attrs, proto: Any, opset: int) -> list[np.ndarray]:
    """The outputs of a node whose inputs are all constants."""
    fn = FOLDS.get(op_type)
    if fn is not None:
        return [np.asarray(fn(ins, attrs))]
    if any(a is not None and a.dtype == object for a in ins):
        raise CannotFold(f"ONNX '{op_type}' on symbolic sizes")
    return _reference(proto, ins, opset)


def _reference(proto: Any, ins: Arrays, opset: int) -> list[np.ndarray]:
    """One numeric node on ONNX's reference evaluator (rare: exporters fold most constants themselves)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [n for n in proto.input]
    feeds = {n: a for n, a in zip(names, ins) if n and a is not None}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(o) for o in proto.output]
    graph = helper.make_graph([proto], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]
    except Exception as e:  # the evaluator's own errors: the caller reports the node
        raise CannotFold(f"evaluating it at import time failed ({type(e).__name__})") from None
