"""Writing the module: names, weight access and the per-node lines, from the per-op renderer tables.

A renderer (``backends/torch/ops_*.py``) is ``fn(r, node, xs) -> str``: a Python expression over the
operand expressions ``xs`` computing the node (a tuple for several results). It reads weights with
``r.w(node, "wq")`` (an attribute path whose dotted name is irc's weight key, so ``state_dict``
keys are irc's), sizes with ``r.dim`` and asks for helper functions with ``r.need``.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

from irc.backends.torch.helpers import HELPERS
from irc.graph import Graph, Node
from irc.runtime.weights import node_weight_keys
from irc.types import TensorType

# names the generated file defines or imports: a value never takes one
RESERVED = {"torch", "F", "nn", "math", "self", "Scope", "Model", "add_weight", "OUTPUTS", "INPUTS"}


def literal(value: Any) -> str:
    """A Python literal for an attribute value (floats with repr, so they read back exactly)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    try:
        return repr(float(value)) if value.denominator != 1 else str(int(value))  # a Fraction
    except AttributeError:
        return repr(value)


def weight_expr(key: str) -> str:
    """``self["a"]["0"]["b"].weight`` for the key ``a.0.b.weight``: the model and its scopes are
    ModuleDicts, so a scope may have any name (``forward``, ``keys``...) without shadowing a method."""
    *path, name = key.split(".")
    expr = "self" + "".join(f"[{seg!r}]" for seg in path)
    return f"{expr}.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"getattr({expr}, {name!r})"


class Renderer:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.types = graph.value_types()
        self.helpers: set[str] = set()
        self.names: dict[str, str] = {}
        self._taken: set[str] = set(RESERVED) | set(HELPERS)
        self.symbols_used: dict[str, Node] = {}  # symbol -> the first node whose code reads it

    def name(self, value: str) -> str:
        """The Python variable of an irc value (``pre_ln_decoder.0.h`` -> ``pre_ln_decoder_0_h``)."""
        if value not in self.names:
            base = re.sub(r"\W", "_", value) or "v"
            if base[0].isdigit() or keyword.iskeyword(base) or base in self._taken:
                base = f"v_{base}"
            candidate, n = base, 1
            while candidate in self._taken:
                n += 1
                candidate = f"{base}_{n}"
            self._taken.add(candidate)
            self.names[value] = candidate
        return self.names[value]

    def need(self, helper: str) -> None:
        self.helpers.add(helper)

    def w(self, node: Node, short: str) -> str:
        return weight_expr(node_weight_keys(node, self.types)[short])

    def has(self, node: Node, short: str) -> bool:
        return short in node_weight_keys(node, self.types)

    def has_any(self, node: Node) -> bool:
        return bool(node_weight_keys(node, self.types))

    def w_or_none(self, node: Node, short: str) -> str:
        return self.w(node, short) if self.has(node, short) else "None"

    def type_of(self, value: str) -> TensorType:
        return self.types[value]

    def dim(self, value: str, x: str, axis: int) -> str:
        """The size of ``axis`` of ``value``: a literal when irc knows it, else ``x.shape[axis]``."""
        t = self.types[value]
        d = t.shape[axis % t.rank]
        return str(d) if isinstance(d, int) else f"{x}.shape[{axis % t.rank}]"

    def size_expr(self, node: Node, d: Any) -> str:
        """A symbolic size as Python over the model's symbols (bound from the inputs' shapes in forward)."""
        if isinstance(d, int):
            return str(d)
        from irc.dims import dim_symbols

        for sym in sorted(dim_symbols(d)):
            self.symbols_used.setdefault(sym, node)
        return str(d)
