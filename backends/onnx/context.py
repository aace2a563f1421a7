"""The state one export builds: nodes, initializers and names, and the helpers op exporters call.

An op exporter (``backends/onnx/ops_*.py``) is ``fn(ctx, node, xs) -> list of ONNX value names``:
``xs`` are the ONNX names of the node's operands, and it returns one name per result of the irc
node. It adds ONNX nodes with ``ctx.op`` (named after the irc node's scope path, so Netron and
ORT profiles name layers as the user wrote them), reads weights with ``ctx.weight``
(initializers keyed exactly by irc's weight keys) and makes constants with ``ctx.const``.
Shapes are read at run time (``Shape``) wherever irc's type is symbolic, so the exported graph
keeps ``B``, ``T``... as named ``dim_param``s instead of baking one binding in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from irc.graph import Graph, Node
from irc.runtime.weights import node_weight_keys
from irc.types import TensorType

OPSET = 17  # LayerNormalization's opset; TensorRT 8.6+, OpenVINO 2023+ and ORT 1.14+ all read it
INT64_MAX = 2**63 - 1

# irc dtype -> ONNX TensorProto enum name. irc's reference computes every float tensor in float32
# (an f16 or bf16 input is read as float32), so the export does too: its numbers are the reference's.
DTYPES = {"f32": "FLOAT", "f64": "FLOAT", "f16": "FLOAT", "bf16": "FLOAT", "i32": "INT32", "i64": "INT64",
          "i8": "INT8", "bool": "BOOL"}
# the numpy type of a scalar operand next to a tensor of each irc dtype
SCALAR_TYPES = {"i32": np.int32, "i64": np.int64, "i8": np.int8}


class Context:
    def __init__(self, graph: Graph, weights: dict[str, np.ndarray]):
        import onnx
        from onnx import helper

        self.onnx = onnx
        self.helper = helper
        self.graph = graph
        self.weights = weights
        self.types = graph.value_types()
        self.nodes: list[Any] = []
        self.initializers: dict[str, Any] = {}
        self._const_names: dict[tuple, str] = {}
        self._used_names: set[str] = set(self.types) | set(weights)
        self._counter: dict[str, int] = {}
        self._node_counter: dict[str, int] = {}
        self.node: Node | None = None  # the irc node being exported (names and errors)

    # -- names ------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A value name no other value has: ``<scope>/<hint>``, numbered when taken."""
        base = f"{self._prefix()}/{hint}"
        n = self._counter.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._used_names:
            n += 1
            name = f"{base}_{n}"
        self._counter[base] = n + 1
        self._used_names.add(name)
        return name

    def _prefix(self) -> str:
        node = self.node
        return (node.outputs[0] if node is not None else "graph") or "graph"

    # -- building ---------------------------------------------------------------------
    def op(self, op_type: str, inputs: list[str], outputs: list[str] | int | None = None, **attrs: Any) -> list[str]:
        """Add one ONNX node; return its output names (fresh ones unless given)."""
        if outputs is None or isinstance(outputs, int):
            outputs = [self.fresh(op_type) for _ in range(outputs or 1)]
        self.nodes.append(self.helper.make_node(op_type, inputs, outputs, name=self._node_name(op_type), **attrs))
        return outputs

    def _node_name(self, op_type: str) -> str:
        base = f"{self._prefix()}/{op_type}"
        n = self._node_counter.get(base, 0)
        self._node_counter[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def op1(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        return self.op(op_type, inputs, [out] if out else None, **attrs)[0]

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """An initializer holding ``value`` (deduplicated by contents)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_names:
            name = f"const/{len(self._const_names)}"
            self.initializers[name] = self.onnx.numpy_helper.from_array(arr, name)
            self._const_names[key] = name
        return self._const_names[key]

    def ints(self, values: list[int] | int) -> str:
        return self.const(values, np.int64)

    def weight(self, node: Node, short: str) -> str:
        """The initializer of the node's parameter ``short`` (``wq``, ``weight``...), named by its irc key."""
        key = node_weight_keys(node, self.types)[short]
        if key not in self.initializers:
            arr = np.asarray(self.weights[key])
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32, copy=False)
            self.initializers[key] = self.onnx.numpy_helper.from_array(np.ascontiguousarray(arr), key)
        return key

    def has_weight(self, node: Node, short: str) -> bool:
        return short in node_weight_keys(node, self.types)

    # -- shapes -----------------------------------------------------------------------
    def type_of(self, value: str) -> TensorType:
        return self.types[value]

    def dim(self, value: str, onnx_value: str, axis: int) -> str:
        """A [1]-shaped int64 holding the size of ``axis``: a constant when irc knows it, else read with Shape."""
        t = self.types[value]
        axis = axis % t.rank
        d = t.shape[axis]
        if isinstance(d, int):
            return self.ints([d])
        return self.op1("Shape", [onnx_value], start=axis, end=axis + 1)

    def size(self, d: Any) -> str | None:
        """A [1]-shaped int64 holding the size ``d`` (an int, or a polynomial in the model's symbols, each
        read off an input's shape); None for a size ONNX cannot compute (an opaque ``//`` or ``max``)."""
        if isinstance(d, int):
            return self.ints([d])
        total = None
        for monomial, coeff in d.terms:
            factors = [self.ints([coeff])] if coeff != 1 or not monomial else []
            for sym in monomial:
                where = self._symbol_axis(sym)
                if where is None:
                    return None
                factors.append(self.op1("Shape", [where[0]], start=where[1], end=where[1] + 1))
            term = factors[0]
            for f in factors[1:]:
                term = self.op1("Mul", [term, f])
            total = term if total is None else self.op1("Add", [total, term])
        return total

    def _symbol_axis(self, sym: str) -> tuple[str, int] | None:
        for node in self.graph.inputs():
            for i, d in enumerate(node.types[0].shape):
                if not isinstance(d, int) and d.terms == ((((sym,), 1)),):
                    return node.outputs[0], i
        return None

    def scalar_dim(self, value: str, onnx_value: str, axis: int) -> str:
        """The size of ``axis`` as an int64 scalar."""
        return self.op1("Squeeze", [self.dim(value, onnx_value, axis), self.ints([0])])

    def linear(self, x: str, w: str, b: str | None = None) -> str:
        """x @ wᵀ (+ b) over the last axis, with irc's [out, in] weight as stored."""
        y = self.op1("MatMul", [x, self.op1("Transpose", [w], perm=[1, 0])])
        return self.op1("Add", [y, b]) if b else y

    def act(self, name: str, x: str) -> str:
        """An activation ffn(act=...) and gemm(act=...) accept (a test checks this table covers their choices)."""
        return ACTS[name](self, x)


def _gelu(ctx: Context, x: str) -> str:
    """0.5·x·(1 + erf(x/√2)): exact GELU (ONNX's Gelu op is opset 20)."""
    erf = ctx.op1("Erf", [ctx.op1("Div", [x, ctx.const(np.sqrt(2.0))])])
    return ctx.op1("Mul", [ctx.op1("Mul", [x, ctx.const(0.5)]), ctx.op1("Add", [erf, ctx.const(1.0)])])


def _gelu_tanh(ctx: Context, x: str) -> str:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    cube = ctx.op1("Mul", [ctx.op1("Mul", [x, x]), x])
    inner = ctx.op1("Add", [x, ctx.op1("Mul", [cube, ctx.const(0.044715)])])
    t = ctx.op1("Tanh", [ctx.op1("Mul", [inner, ctx.const(np.sqrt(2.0 / np.pi))])])
    return ctx.op1("Mul", [ctx.op1("Mul", [x, ctx.const(0.5)]), ctx.op1("Add", [t, ctx.const(1.0)])])


ACTS = {
    "none": lambda ctx, x: x,
    "relu": lambda ctx, x: ctx.op1("Relu", [x]),
    "tanh": lambda ctx, x: ctx.op1("Tanh", [x]),
    "silu": lambda ctx, x: ctx.op1("Mul", [x, ctx.op1("Sigmoid", [x])]),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
}
