"""An ONNX graph to an irc Graph, node by node (the per-op mappings are in ``layers.py`` and ``ops.py``).

Each irc node carries the ONNX node's position as its location (``model.onnx:57:1`` is the 57th node)
and the node's name, made a dotted path, as its scope; layer weights live under that scope. Which
initializer (and transpose) each irc weight key reads is recorded in ``Importer.sources``, which
``weights.py`` uses to hand ``irc run`` the initializers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import IrcError, quote, raise_site
from irc.graph import Graph, Node
from irc.ops import AttrError, ShapeError, get_op, normalize_attrs

from .fold import CannotFold, fold
from .patterns import find_patterns
from .reader import input_type, node_loc, tensor_dtype
from .values import Act, Const, Value, known


@dataclass
class Source:
    """Where the array of one irc weight key comes from: an initializer (transposed by ``perm``), or a
    constant array of the file (a ``Constant`` node)."""

    weight: str | None
    perm: tuple[int, ...] | None = None
    array: np.ndarray | None = None


Mapper = Callable[["Importer", Any, list[Value], dict[str, Any]], list[Value]]
MAPPERS: dict[str, Mapper] = {}


def maps(*op_types: str) -> Callable[[Mapper], Mapper]:
    def register(fn: Mapper) -> Mapper:
        for t in op_types:
            MAPPERS[t] = fn
        return fn
    return register


def _ident(text: str, fallback: str, scope: bool = False) -> str:
    """A name irc prints and parses back: an exporter's ``/encoder/layers.0/ln_1/LayerNormalization`` path
    becomes the dotted scope ``encoder.layers.0.ln_1.LayerNormalization``. A scope may start with a digit
    (``0.Conv``, from an nn.Sequential); a value name starts with a letter or ``_``."""
    out = re.sub(r"[^A-Za-z0-9_.]", "_", text.replace("/", ".")).strip("._")
    out = re.sub(r"\.{2,}", ".", out)
    if not out:
        return fallback
    if not scope and not (out[0].isalpha() or out[0] == "_"):
        out = f"_{out}"
    return out



def _claim(base: str, taken: set[str]) -> str:
    """``base``, else ``base_2``, ``base_3``…: the first name not in ``taken``, which it joins."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


@dataclass
class Importer:
    path: Path
    model: Any
    values: dict[str, Value] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    graph: Graph = field(default_factory=lambda: Graph(""))
    index: int = 0
    proto: Any = None
    uses: dict[str, int] = field(default_factory=dict)
    producers: dict[str, Node] = field(default_factory=dict)
    onnx_names: dict[str, str] = field(default_factory=dict)  # irc value -> the ONNX value first bound to it
    _names: set[str] = field(default_factory=set)
    _scopes: set[str] = field(default_factory=set)
    _params: dict[tuple, Act] = field(default_factory=dict)

    @property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 1)

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.model.graph
        self.graph = Graph(_ident(Path(self.path).stem, "model").replace(".", "_"))
        self.graph.loc = node_loc(self.path, 0)
        for init in g.initializer:
            self.values[init.name] = self._initializer(init)
        for n in g.node:
            for v in n.input:
                self.uses[v] = self.uses.get(v, 0) + 1
        for o in g.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        for i, value in enumerate(v for v in g.input if v.name not in self.values):
            t = input_type(self.path, value, i)
            for s in sorted(t.symbols()):
                if s not in self.graph.symbols:
                    self.graph.symbols.append(s)
            name = self._value_name(value.name)
            self.graph.nodes.append(Node("input", [], [name], {}, "", None, node_loc(self.path, 0), [t]))
            self.values[value.name] = Act(name, t)
        fused, skipped = find_patterns(g.node, self.values, {o.name for o in g.output})
        for self.index, self.proto in enumerate(g.node):
            if self.index in skipped:
                continue
            if self.index in fused:
                f = fused[self.index]
                weights = {k: self.values[v] for k, v in f.weights.items()}
                outs: list[Value] = list(self.emit(f.op, [self.act(self._value(f.x))], f.attrs, weights))  # type: ignore
            else:
                outs = self._node()
            for name, v in zip(self.proto.output, outs):
                if name:
                    self.values[name] = v
                    if isinstance(v, Act):
                        self.onnx_names.setdefault(v.value, name)
        for o in g.output:
            v = self.values.get(o.name)
            if not isinstance(v, Act):
                raise IrcError(f"graph output '{quote(o.name)}' is a constant, not computed from the inputs; irc "
                               "models compute their outputs", self.graph.loc)
            label = _ident(o.name.removesuffix("_output_0"), "output").replace(".", "_")  # a label has no dots
            if label in {lb for lb, _ in self.graph.outputs}:
                label = f"{label}_{len(self.graph.outputs)}"
            self.graph.outputs.append((label, v.value))
        return self.graph

    def _initializer(self, init: Any) -> Const:
        from onnx import numpy_helper

        dtype = tensor_dtype(init.data_type, f"initializer '{quote(init.name)}'", None)
        return Const(tuple(int(d) for d in init.dims), dtype, lambda: numpy_helper.to_array(init), weight=init.name)

    def _value(self, name: str) -> Value:
        if name not in self.values:
            raise self.error(f"reads '{quote(name)}', which no earlier node, input or initializer defines "
                             "(the graph is not in topological order, or is missing a value)")
        return self.values[name]

    def _node(self) -> list[Value]:
        n = self.proto
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.domain not in ("", "ai.onnx"):
            raise self.unmapped(f"it is in the operator domain '{quote(n.domain)}', which irc does not read")
        if n.op_type == "Constant":
            return [self._constant(attrs)]
        ins: list[Value] = [self._value(v) if v else None for v in n.input]  # type: ignore[misc]
        present = [v for v in ins if v is not None]
        if n.op_type == "Shape" and isinstance(ins[0], Act):
            shape = list(ins[0].type.shape)[attrs.get("start", 0):attrs.get("end", None)]
            return [known(np.array(shape, dtype=object), "i64")]
        if n.op_type in ("Transpose", "Identity") and isinstance(ins[0], Const) and ins[0].weight is not None:
            return [self._transposed(ins[0], attrs.get("perm"))]
        # constants fold at import time, except arithmetic on float weights: that stays in the graph, on params
        weights = any(isinstance(v, Const) and v.weight is not None and v.dtype.startswith(("f", "bf"))
                      for v in present)
        if present and all(isinstance(v, Const) for v in present) and not (weights and n.op_type in MAPPERS):
            arrays = [v.load() if isinstance(v, Const) else None for v in ins]
            try:
                results = fold(n.op_type, arrays, attrs, n, self.opset)
            except CannotFold as e:
                raise self.error(f"is a dynamic shape irc cannot express: {e}") from None
            return [known(r, _dtype_of(r)) for r in results]
        mapper = MAPPERS.get(n.op_type)
        if mapper is None:
            raise self.unmapped("irc has no mapping for this op type")
        return mapper(self, n, ins, attrs)

    def _constant(self, attrs: dict[str, Any]) -> Const:
        from onnx import numpy_helper

        if "value" in attrs:
            array = numpy_helper.to_array(attrs["value"])
        elif "value_float" in attrs or "value_int" in attrs:
            array = np.array(attrs.get("value_float", attrs.get("value_int")))
        elif "value_floats" in attrs or "value_ints" in attrs:
            array = np.array(attrs.get("value_floats", attrs.get("value_ints")))
        else:
            raise self.unmapped(f"a Constant with {', '.join(attrs) or 'no value'} is not read by irc")
        return known(array, _dtype_of(array))

    def _transposed(self, c: Const, perm: Any) -> Const:
        rank = len(c.shape)
        p = tuple(perm) if perm is not None else (tuple(reversed(range(rank))) if self.proto.op_type == "Transpose"
                                                  else tuple(range(rank)))
        before = c.perm or tuple(range(rank))
        total = tuple(before[i] for i in p)
        loader = c.loader
        return Const(tuple(c.shape[i] for i in p), c.dtype, lambda: np.transpose(loader(), p), c.weight,
                     None if total == tuple(range(rank)) else total)

    # -- building irc nodes ------------------------------------------------------------------
    def scope(self) -> str:
        return _claim(_ident(self.proto.name or f"{self.proto.op_type}_{self.index}", "node", scope=True),
                      self._scopes)

    def _value_name(self, text: str) -> str:
        return _claim(_ident(text, "v"), self._names)

    def emit(self, op: str, inputs: list[Act], attrs: dict[str, Any], weights: dict[str, Const] | None = None,
             results: int = 1, scope: str | None = None, name: str | None = None) -> list[Act]:
        """Append one irc node (typed now, so later mappings can read its shape); ``weights`` maps its
        parameter names to the constants they read."""
        opdef = get_op(op)
        if opdef is None:
            raise self.unmapped(f"irc's op '{op}' is not available in this build")
        types = [a.type for a in inputs]
        try:
            full = normalize_attrs(opdef, attrs)
            result = opdef.infer(full, types)
            expected = {**opdef.param_shapes(full, types), **opdef.buffer_shapes(full, types)}
        except (ShapeError, AttrError) as e:
            raise self.error(f"maps to irc's '{op}', which refuses it: {e}") from None
        sc = scope if scope is not None else self.scope()
        base = name or (self.proto.output[0] if self.proto is not None and self.proto.output else op)
        base = base.removesuffix("_output_0")  # torch's exporter ends every value name with it
        outs = [self._value_name(base if i == 0 else f"{base}_{i}") for i in range(results)]
        has_weights = bool(opdef.params or opdef.buffers)
        node = Node(opdef.name, [a.value for a in inputs], outs, full, sc, sc if has_weights else None,
                    node_loc(self.path, self.index), list(result))
        for pname, const in (weights or {}).items():
            want = tuple(expected.get(pname, ()))
            if want != const.shape:
                raise self.error(f"maps to irc's '{op}', which needs its {pname} as "
                                 f"[{', '.join(map(str, want))}], but {const.describe()} is given")
            self.sources[f"{sc}.{pname}"] = self._source(const)
        self.graph.nodes.append(node)
        for v in outs:
            self.producers[v] = node
        return [Act(v, t) for v, t in zip(outs, result)]

    def _source(self, c: Const) -> Source:
        if c.weight is not None:
            return Source(c.weight, c.perm)
        return Source(None, None, c.load())

    def act(self, v: Value) -> Act:
        """An operand as an irc value: a constant becomes a ``param`` node (once per initializer and transpose)."""
        if isinstance(v, Act):
            return v
        if v.symbolic:
            raise self.error(f"uses {v.describe()} of symbolic sizes as a tensor: a dynamic shape irc cannot "
                             "express")
        if v.dtype not in ("f32", "f64", "f16", "bf16"):
            raise self.unmapped(f"it uses {v.describe()} as a tensor operand; irc computes on float tensors (integer "
                                "constants are read only as sizes, axes and indices)")
        cache_key = (v.weight, v.perm) if v.weight is not None else None
        if cache_key is not None and cache_key in self._params:
            return self._params[cache_key]
        label = v.weight if v.weight is not None else f"{self.proto.name or self.proto.op_type}.const"
        if v.perm is not None:
            label += ".T"
        full = _ident(label, "param", scope=True)
        owner, _, leaf = full.rpartition(".")
        owner = owner or "param"
        scope, k = owner, 1
        while f"{scope}.{leaf}" in self.sources:
            k += 1
            scope = f"{owner}_{k}"
        shape = list(v.shape) or [1]
        out = self.emit("param", [], {"name": leaf, "shape": shape}, scope=scope, name=label)[0]
        node = self.graph.nodes[-1]
        node.weights = scope
        src = self._source(v)
        if not v.shape and src.array is not None:
            src.array = src.array.reshape(1)
        self.sources[f"{scope}.{leaf}"] = src
        if cache_key is not None:
            self._params[cache_key] = out
        return out

    # -- errors ------------------------------------------------------------------------------
    def _inputs_text(self) -> str:
        parts = []
        for name in self.proto.input:
            v = self.values.get(name) if name else None
            if v is None:
                parts.append(f"'{quote(name)}'" if name else "(none)")
            elif isinstance(v, Act):
                parts.append(f"'{quote(name)}': {v.type}")
            else:
                parts.append(f"'{quote(name)}': {v.describe()}")
        return ", ".join(parts) or "none"

    def error(self, message: str, origin: str | None = None) -> IrcError:
        """An error about the node being imported, naming it, its op type and its inputs. Its origin is the
        line that raises it (for the error catalogue), not this helper."""
        n = self.proto
        return IrcError(f"ONNX node '{quote(n.name or n.op_type + '_' + str(self.index))}' ({n.op_type}) "
                        f"{message}", node_loc(self.path, self.index),
                        notes=[f"its inputs: {self._inputs_text()}"], origin=origin or raise_site())

    def unmapped(self, why: str) -> IrcError:
        return self.error(f"cannot be imported: {why}", raise_site())


def _dtype_of(array: np.ndarray) -> str:
    if array.dtype == object:
        return "i64"
    kinds = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.float16): "f16",
             np.dtype(np.int64): "i64", np.dtype(np.int32): "i32", np.dtype(np.bool_): "bool"}
    return kinds.get(array.dtype, "f32" if np.issubdtype(array.dtype, np.floating) else "i64")


def import_model(path: Path, model: Any) -> tuple[Graph, dict[str, Source]]:
    """The irc graph of an ONNX ModelProto, and where each of its weights comes from."""
    from . import layers, ops  # noqa: F401  (register the mappings)

    imp = Importer(path, model)
    graph = imp.run()
    return graph, imp.sources
