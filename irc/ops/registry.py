"""The op registry: every op's operands, attributes, result types and parameters.

An op is declared once, with its attribute schema and two pure functions over
types: ``infer`` (operand types -> result types) and ``params`` (operand types ->
parameter shapes).  Every pass, the frontend and the IR parser consult this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from irc.diagnostics import did_you_mean, format_number, raise_site
from irc.dims import Dim, Sym, never_positive
from irc.types import TensorType

# integer attributes stay in int64 range, like every size
MAX_INT = 2**62


class ShapeError(Exception):
    """Raised by an op's ``infer``; the shape pass adds the op and source location."""

    def __init__(self, message: str):
        super().__init__(message)
        self.origin = raise_site()


class AttrError(Exception):
    """An attribute value of the wrong kind; the caller adds the location."""

    def __init__(self, message: str):
        super().__init__(message)
        self.origin = raise_site()


_REQUIRED = object()


class Quoted(str):
    """A string the user wrote in quotes, as opposed to a bare name such as ``gelu``."""


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str  # see check_attr
    default: Any = _REQUIRED
    choices: tuple[str, ...] = ()
    doc: str = ""
    most: int | None = None  # an upper bound for integer kinds (split's parts)

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


Infer = Callable[[dict[str, Any], list[TensorType]], list[TensorType]]
ParamFn = Callable[[dict[str, Any], list[TensorType]], dict[str, tuple[Dim, ...]]]


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]  # names of tensor operands; trailing '?' marks optional, '*' variadic
    attrs: tuple[Attr, ...]
    infer: Infer
    params: ParamFn | None = None
    buffers: ParamFn | None = None
    results: Callable[[dict[str, Any]], tuple[str, ...]] | tuple[str, ...] = ("out",)
    doc: str = ""
    aliases: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # an optional input left out before one given by keyword takes another input's value:
    # attention(x, attn_bias=b) is attention(x, x, b), self-attention with keys and values from x
    omitted: dict[str, str] = field(default_factory=dict)

    @property
    def min_inputs(self) -> int:
        return sum(1 for i in self.inputs if not i.endswith(("?", "*")))

    @property
    def max_inputs(self) -> int | None:
        if any(i.endswith("*") for i in self.inputs):
            return None
        return len(self.inputs)

    def result_names(self, attrs: dict[str, Any]) -> tuple[str, ...]:
        return self.results(attrs) if callable(self.results) else self.results

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def param_shapes(self, attrs: dict[str, Any], types: list[TensorType]) -> dict[str, tuple[Dim, ...]]:
        return self.params(attrs, types) if self.params else {}

    def buffer_shapes(self, attrs: dict[str, Any], types: list[TensorType]) -> dict[str, tuple[Dim, ...]]:
        return self.buffers(attrs, types) if self.buffers else {}


OPS: dict[str, OpDef] = {}
_ALIASES: dict[str, str] = {}


def op_names() -> set[str]:
    """Every name a layer can be called by: op names and their aliases."""
    return (set(OPS) | set(_ALIASES)) - {"input"}


def register(op: OpDef) -> OpDef:
    OPS[op.name] = op
    for alias in op.aliases:
        _ALIASES[alias] = op.name
    return op


def canonical_name(name: str) -> str:
    return _ALIASES.get(name, name)


def get_op(name: str) -> OpDef | None:
    return OPS.get(canonical_name(name))


# -- attribute checking -----------------------------------------------------------


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return None


def describe_value(value: Any) -> str:
    """An attribute value as the user wrote it: ``1.5``, ``true``, ``none``, ``the string "four"``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, Fraction)):
        return format_number(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Quoted):
        return f'the string "{value}"'
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    if isinstance(value, Sym):
        return f"the symbolic size {value}"
    return type(value).__name__


def _values_of(d: Sym) -> str:
    return "value of " + " and ".join(sorted(d.symbols()))


def _bounded(where: str, attr: Attr, iv: int) -> int:
    if abs(iv) >= MAX_INT:
        raise AttrError(f"{where} must be below 2**62, got {iv}")
    if attr.most is not None and iv > attr.most:
        raise AttrError(f"{where} must be at most {attr.most:,}, got {iv:,}")
    return iv


def check_attr(op: str, attr: Attr, value: Any) -> Any:
    """Return ``value`` converted to the attribute's kind, or raise AttrError."""
    kind = attr.kind
    where = f"attribute '{attr.name}' of '{op}'"
    if value is None and attr.default is None:
        return None
    if kind in ("int", "posint", "nonneg"):
        iv = _as_int(value)
        if iv is None:
            raise AttrError(f"{where} must be an integer, got {describe_value(value)}")
        if kind == "posint" and iv <= 0:
            raise AttrError(f"{where} must be positive, got {iv}")
        if kind == "nonneg" and iv < 0:
            raise AttrError(f"{where} must be non-negative, got {iv}")
        return _bounded(where, attr, iv)
    if kind == "dim":  # a positive size that may be symbolic
        if isinstance(value, Sym):
            if never_positive(value):
                raise AttrError(f"{where} must be a positive size, got {describe_value(value)}, "
                                f"which is below 1 for every {_values_of(value)}")
            return value
        iv = _as_int(value)
        if iv is None or iv <= 0:
            raise AttrError(f"{where} must be a positive size, got {describe_value(value)}")
        return _bounded(where, attr, iv)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise AttrError(f"{where} must be a number, got {describe_value(value)}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise AttrError(f"{where} must be true or false, got {describe_value(value)}")
        return value
    if kind == "enum":
        if not isinstance(value, str) or value not in attr.choices:
            raise AttrError(f"{where} must be one of {', '.join(attr.choices)}; got {describe_value(value)}"
                            + (did_you_mean(value, attr.choices) if isinstance(value, str) else ""))
        return str(value)
    if kind in ("int_or_enum", "pair_or_enum"):
        if isinstance(value, str):
            if value not in attr.choices:
                choices = ", ".join(attr.choices)
                raise AttrError(f"{where} must be an integer or one of {choices}; got {describe_value(value)}"
                                + did_you_mean(value, attr.choices))
            return str(value)
        return check_attr(op, Attr(attr.name, "pair_nonneg" if kind == "pair_or_enum" else "nonneg"), value)
    if kind in ("pair", "pair_nonneg"):
        base = "posint" if kind == "pair" else "nonneg"
        if isinstance(value, list):
            if len(value) != 2:
                raise AttrError(f"{where} must be an integer or a pair [h, w], got a list of {len(value)}")
            return [check_attr(op, Attr(attr.name, base), v) for v in value]
        return check_attr(op, Attr(attr.name, base), value)
    if kind == "ints":
        if not isinstance(value, list):
            raise AttrError(f"{where} must be a list of integers, got {describe_value(value)}")
        out = []
        for v in value:
            iv = _as_int(v)
            if iv is None:
                raise AttrError(f"{where} must be a list of integers, but it holds {describe_value(v)}")
            out.append(_bounded(where, Attr(attr.name, "int"), iv))
        return out
    if kind == "int_or_ints":  # a list is as long as its source text: only a count needs the bound
        if isinstance(value, list):
            return check_attr(op, Attr(attr.name, "ints"), value)
        return check_attr(op, Attr(attr.name, "posint", most=attr.most), value)
    if kind == "dims":  # a shape: ints, -1 or symbols
        if not isinstance(value, list):
            raise AttrError(f"{where} must be a list of sizes, got {describe_value(value)}")
        out = []
        for v in value:
            if isinstance(v, Sym):
                if never_positive(v):
                    raise AttrError(f"{where} must hold positive sizes or -1, but it holds {describe_value(v)}, "
                                    f"which is below 1 for every {_values_of(v)}")
                out.append(v)
                continue
            iv = _as_int(v)
            if iv is None or (iv <= 0 and iv != -1):
                raise AttrError(f"{where} must hold positive sizes or -1, but it holds {describe_value(v)}")
            out.append(_bounded(where, Attr(attr.name, "int"), iv))
        return out
    if kind == "ref":  # the name of a layer instance whose weights are reused
        if not isinstance(value, str):
            raise AttrError(f"{where} must name a layer instance, got {describe_value(value)}")
        return str(value)
    raise AssertionError(f"unknown attribute kind {kind}")


def normalize_attrs(opdef: OpDef, given: dict[str, Any]) -> dict[str, Any]:
    """Check ``given`` against the schema and fill defaults, in declaration order."""
    for name in given:
        if opdef.attr(name) is None:
            names = [a.name for a in opdef.attrs if a.name != "tied_dim"]
            hint = did_you_mean(name, names) or f" (it takes: {', '.join(names) or 'none'})"
            raise AttrError(f"'{opdef.name}' has no attribute '{name}'{hint}")
    out: dict[str, Any] = {}
    for a in opdef.attrs:
        if a.name in given:
            out[a.name] = check_attr(opdef.name, a, given[a.name])
        elif a.required:
            raise AttrError(f"'{opdef.name}' needs attribute '{a.name}'")
        else:
            out[a.name] = a.default
    return out
