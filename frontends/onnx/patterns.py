"""Subgraphs that are one irc op, found before the walk: the exact (erf) GELU and the LayerNorm that
exporters spell out (before ONNX opset 17 had LayerNormalization).

- GELU: ``x · 0.5 · (1 + erf(x / √2))`` appears as Div(x, √2) (or Mul(x, 1/√2)) → Erf → Add 1 → Mul x →
  Mul 0.5, the 0.5 sometimes applied to x first; the tanh form (``nn.GELU(approximate="tanh")``) puts
  tanh(√(2/π)·(x + 0.044715·x³)) in place of the erf.
- LayerNorm: ReduceMean(x) → Sub → Pow 2 → ReduceMean → Add eps → Sqrt → Div, then an optional Mul by a
  gain initializer and Add of a bias initializer, over the last axis.

Each intermediate must feed only the next node (the centred value feeds Pow and Div), so nothing else
reads a value the fused op no longer computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .values import Const, Value

_TOL = 1e-6


@dataclass
class Fused:
    """One irc op standing for a subgraph: applied to the ONNX value ``x``, its weights named by initializer."""

    op: str
    x: str
    attrs: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)


def _scalars(nodes: Any, values: dict[str, Value]) -> dict[str, float]:
    """Values of size-one constants: initializers and ``Constant`` nodes."""
    from onnx import helper, numpy_helper

    out: dict[str, float] = {}
    for name, v in values.items():
        if isinstance(v, Const) and v.size == 1 and v.dtype.startswith(("f", "bf")):
            out[name] = float(np.asarray(v.load()).reshape(-1)[0])
    for n in nodes:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    arr = numpy_helper.to_array(helper.get_attribute_value(a))
                    if arr.size == 1 and np.issubdtype(arr.dtype, np.floating):
                        out[n.output[0]] = float(arr.reshape(-1)[0])
                elif a.name == "value_float":
                    out[n.output[0]] = float(a.f)
    return out


class _Graph:
    """Producers, users and scalar constants of the ONNX nodes, for the matchers."""

    def __init__(self, nodes: list, values: dict[str, Value], outputs: set[str]):
        self.nodes = nodes
        self.scalars = _scalars(nodes, values)
        self.values = values
        self.producer = {o: i for i, n in enumerate(nodes) for o in n.output}
        self.users: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            for v in n.input:
                self.users.setdefault(v, []).append(i)
        for o in outputs:  # a graph output is read from outside: it has a user the matchers cannot see
            self.users.setdefault(o, []).append(-1)

    def near(self, name: str, value: float) -> bool:
        return name in self.scalars and abs(self.scalars[name] - value) <= _TOL * max(1.0, abs(value))

    def only_user(self, name: str) -> int | None:
        u = self.users.get(name, [])
        return u[0] if len(u) == 1 and u[0] >= 0 else None

    @staticmethod
    def other(n: Any, name: str) -> str | None:
        rest = [v for v in n.input if v != name]
        return rest[0] if len(n.input) == 2 and len(rest) == 1 else None

    def initializer(self, name: str | None) -> bool:
        v = self.values.get(name or "")
        return isinstance(v, Const) and v.weight is not None


def find_patterns(nodes: Any, values: dict[str, Value], outputs: set[str]) -> tuple[dict[int, Fused], set[int]]:
    """({index of a pattern's last node: the op it becomes}, indices of the patterns' other nodes)."""
    nodes = list(nodes)
    if not any(n.op_type in ("Erf", "Tanh", "ReduceMean") for n in nodes):
        return {}, set()
    g = _Graph(nodes, values, outputs)
    fused: dict[int, Fused] = {}
    skipped: set[int] = set()
    _gelus(g, fused, skipped)
    _layernorms(g, fused, skipped)
    return fused, skipped


def _scaled_by(g: _Graph, n: Any, value: float) -> str | None:
    """The operand ``n`` multiplies by the scalar ``value`` (a Mul; ``1/value`` for a Div), else None."""
    if len(n.input) != 2:
        return None
    if n.op_type == "Div" and g.near(n.input[1], 1 / value):
        return n.input[0]
    if n.op_type == "Mul":
        for a, b in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
            if g.near(b, value):
                return a
    return None


def _gelu_tail(g: _Graph, x: str, inner: int) -> tuple[int, list[int]] | None:
    """``0.5 · x · (1 + inner)`` after node ``inner`` (the Erf or Tanh): (the last node, the others)."""
    nodes, only_user, other = g.nodes, g.only_user, g.other
    a = only_user(nodes[inner].output[0])
    if a is None or nodes[a].op_type != "Add" or not g.near(other(nodes[a], nodes[inner].output[0]) or "", 1.0):
        return None
    m = only_user(nodes[a].output[0])
    if m is None or nodes[m].op_type != "Mul":
        return None
    partner = other(nodes[m], nodes[a].output[0])
    if partner == x:  # (x · (1 + f)) · 0.5
        h = only_user(nodes[m].output[0])
        if h is None or _scaled_by(g, nodes[h], 0.5) != nodes[m].output[0]:
            return None
        return h, [a, m]
    if partner in g.producer and only_user(partner) == m:  # (x · 0.5) · (1 + f)
        half = g.producer[partner]
        if _scaled_by(g, nodes[half], 0.5) == x:
            return m, [a, half]
    return None


def _gelus(g: _Graph, fused: dict[int, Fused], skipped: set[int]) -> None:
    """Erf GELU: f = erf(x/√2); tanh GELU: f = tanh(√(2/π)·(x + 0.044715·x³)), x³ as Pow(x, 3) or x·x·x."""
    nodes, producer, only_user = g.nodes, g.producer, g.only_user
    for e, n in enumerate(nodes):
        if n.op_type not in ("Erf", "Tanh") or n.input[0] not in producer:
            continue
        d = producer[n.input[0]]
        if only_user(nodes[d].output[0]) != e:
            continue
        if n.op_type == "Erf":
            x = _scaled_by(g, nodes[d], 1 / math.sqrt(2))
            inner = [d]
        else:
            found = _tanh_argument(g, d)
            if found is None:
                continue
            x, inner = found
        if x is None:
            continue
        tail = _gelu_tail(g, x, e)
        if tail is None:
            continue
        last, others = tail
        fused[last] = Fused("gelu", x, {} if n.op_type == "Erf" else {"approx": "tanh"})
        skipped.update([*inner, e, *others])


def _tanh_argument(g: _Graph, d: int) -> tuple[str, list[int]] | None:
    """√(2/π)·(x + 0.044715·x³) ending at node ``d``: (x, the nodes that compute it)."""
    nodes, producer, only_user, other = g.nodes, g.producer, g.only_user, g.other
    s_name = _scaled_by(g, nodes[d], math.sqrt(2 / math.pi))
    if s_name is None or s_name not in producer or only_user(s_name) != d:
        return None
    s = producer[s_name]
    if nodes[s].op_type != "Add" or len(nodes[s].input) != 2:
        return None
    for x, c in ((nodes[s].input[0], nodes[s].input[1]), (nodes[s].input[1], nodes[s].input[0])):
        if c not in producer or only_user(c) != s:
            continue
        k = producer[c]
        cube = _scaled_by(g, nodes[k], 0.044715)
        if cube is None or cube not in producer or only_user(cube) != k:
            continue
        p = producer[cube]
        if nodes[p].op_type == "Pow" and nodes[p].input[0] == x and g.near(nodes[p].input[1], 3.0):
            return x, [d, s, k, p]
        if nodes[p].op_type == "Mul":
            sq = other(nodes[p], x)
            if sq in producer and only_user(sq) == p and list(nodes[producer[sq]].input) == [x, x]:
                return x, [d, s, k, p, producer[sq]]
    return None


def _last_axis(g: _Graph, n: Any) -> bool:
    """A ReduceMean over the last axis only, keeping it (axes as an attribute, or from opset 18 an input)."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    if attrs.get("keepdims", 1) != 1:
        return False
    if len(n.input) > 1:
        v = g.values.get(n.input[1])
        if v is None:  # a Constant node: read it from the graph
            i = g.producer.get(n.input[1])
            if i is None or g.nodes[i].op_type != "Constant":
                return False
            from onnx import numpy_helper

            axes = [int(a) for a in numpy_helper.to_array(g.nodes[i].attribute[0].t).reshape(-1)]
        elif isinstance(v, Const):
            axes = [int(a) for a in np.asarray(v.load()).reshape(-1)]
        else:
            return False
    else:
        axes = list(attrs.get("axes", []))
    return axes == [-1]


def _layernorms(g: _Graph, fused: dict[int, Fused], skipped: set[int]) -> None:
    nodes, only_user, other = g.nodes, g.only_user, g.other
    for m1, mean in enumerate(nodes):
        if mean.op_type != "ReduceMean" or not _last_axis(g, mean):
            continue
        x = mean.input[0]
        sub = only_user(mean.output[0])
        if sub is None or nodes[sub].op_type != "Sub" or list(nodes[sub].input) != [x, mean.output[0]]:
            continue
        d = nodes[sub].output[0]
        readers = sorted(g.users.get(d, []))
        if len(readers) != 2 or min(readers) < 0:
            continue
        kinds = {nodes[i].op_type: i for i in readers}
        if set(kinds) != {"Pow", "Div"}:
            continue
        pw, dv = kinds["Pow"], kinds["Div"]
        if list(nodes[pw].input)[0] != d or not g.near(nodes[pw].input[1], 2.0):
            continue
        m2 = only_user(nodes[pw].output[0])
        if m2 is None or nodes[m2].op_type != "ReduceMean" or not _last_axis(g, nodes[m2]):
            continue
        ad = only_user(nodes[m2].output[0])
        eps_name = other(nodes[ad], nodes[m2].output[0]) if ad is not None and nodes[ad].op_type == "Add" else None
        if eps_name is None or eps_name not in g.scalars:
            continue
        sq = only_user(nodes[ad].output[0])
        if sq is None or nodes[sq].op_type != "Sqrt" or only_user(nodes[sq].output[0]) != dv \
                or list(nodes[dv].input) != [d, nodes[sq].output[0]]:
            continue
        pattern, last, weights = [m1, sub, pw, m2, ad, sq, dv], dv, {}
        mul = only_user(nodes[dv].output[0])
        if mul is not None and nodes[mul].op_type == "Mul" and g.initializer(other(nodes[mul], nodes[dv].output[0])):
            weights["gain"] = other(nodes[mul], nodes[dv].output[0])
            pattern.append(mul)
            last = mul
            add = only_user(nodes[mul].output[0])
            bias = other(nodes[add], nodes[mul].output[0]) if add is not None else None
            if add is not None and nodes[add].op_type == "Add" and g.initializer(bias):
                weights["bias"] = bias  # type: ignore[assignment]
                pattern.append(add)
                last = add
        attrs = {"eps": g.scalars[eps_name], "affine": "gain" in weights, "bias": "bias" in weights}
        fused[last] = Fused("layernorm", x, attrs, weights)  # type: ignore[arg-type]
        skipped.update(i for i in pattern if i != last)
