"""Values the ``.arch`` evaluator handles, and its numeric built-in functions.

Constants are exact: integers and rationals (``fractions.Fraction``), so
``round_up(8*d/3, 256)`` is 11,008 at d = 4,096 with no float rounding anywhere.
Model symbols (``B``, ``T``) are :class:`irc.dims.Sym` and combine with integers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from lark import Tree

from irc.diagnostics import Loc, format_number
from irc.dims import Sym


@dataclass(frozen=True)
class Tensor:
    """A tensor value: the SSA name it has in the graph."""

    value: str


@dataclass(frozen=True)
class EnumName:
    """A bare name that is not bound to anything: an enum choice such as ``gelu``.

    ``env`` is the scope it was read in, so that an error can suggest a defined name.
    """

    name: str
    loc: Loc
    env: Env | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass
class Instance:
    """A layer built without inputs (``emb = embedding(V, d)``): calling it shares weights."""

    op: str
    attrs: dict[str, Any]
    scope: str
    loc: Loc


@dataclass
class BlockDef:
    name: str
    params: list[tuple[str, Tree | None]]  # (name, default expression)
    body: Tree
    env: Env
    loc: Loc


@dataclass
class Env:
    """Lexical scope: names -> values, with a parent chain, and where each name was defined."""

    parent: Env | None = None
    names: dict[str, Any] = field(default_factory=dict)
    locs: dict[str, Loc] = field(default_factory=dict)

    def define(self, name: str, value: Any, loc: Loc | None) -> None:
        self.names[name] = value
        if loc is not None:
            self.locs[name] = loc

    def defined_at(self, name: str) -> Loc | None:
        env: Env | None = self
        while env is not None:
            if name in env.names:
                return env.locs.get(name)
            env = env.parent
        return None

    def lookup(self, name: str) -> Any:
        env: Env | None = self
        while env is not None:
            if name in env.names:
                return env.names[name]
            env = env.parent
        raise KeyError(name)

    def has(self, name: str) -> bool:
        try:
            self.lookup(name)
        except KeyError:
            return False
        return True

    def all_names(self) -> set[str]:
        out: set[str] = set()
        env: Env | None = self
        while env is not None:
            out |= set(env.names)
            env = env.parent
        return out


Number = Fraction | int | Sym


def is_number(v: Any) -> bool:
    return isinstance(v, (int, Fraction, Sym)) and not isinstance(v, bool)


def simplify(v: Any) -> Any:
    """Rationals that are whole become ints, so printing and checks see plain integers."""
    if isinstance(v, Fraction) and v.denominator == 1:
        return int(v)
    return v


def describe(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, Tensor):
        return "a tensor"
    if isinstance(v, Instance):
        return f"a layer instance ('{v.op}')"
    if isinstance(v, BlockDef):
        return f"a block ('{v.name}')"
    if isinstance(v, Sym):
        return f"the symbolic size {v}"
    if isinstance(v, (int, Fraction)):
        return f"the number {format_number(v)}"
    if isinstance(v, float):
        return f"the number {v!r}"
    if isinstance(v, str):
        return f"the string \"{v}\""
    if isinstance(v, EnumName):
        return f"the name '{v.name}'"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, tuple):
        return f"{len(v)} values"
    if v is None:
        return "none"
    return type(v).__name__


class BuiltinError(Exception):
    pass


def _rational(v: Any, fn: str) -> Fraction:
    if isinstance(v, bool) or not isinstance(v, (int, Fraction, float)):
        raise BuiltinError(f"{fn}() needs numbers, got {describe(v)}")
    return Fraction(v)  # a float (from sqrt) converts exactly


def _round_up(x: Any, m: Any) -> int:
    xr, mr = _rational(x, "round_up"), _rational(m, "round_up")
    if mr <= 0:
        raise BuiltinError(f"round_up() needs a positive multiple, got {mr}")
    return int(math.ceil(xr / mr) * mr)


def _minmax(fn: str, args: list[Any]) -> Any:
    if not args:
        raise BuiltinError(f"{fn}() needs at least one argument")
    vals = [_rational(a, fn) for a in args]
    return simplify(min(vals) if fn == "min" else max(vals))


def _one(fn: str, args: list[Any]) -> Fraction:
    if len(args) != 1:
        raise BuiltinError(f"{fn}() takes 1 argument, got {len(args)}")
    return _rational(args[0], fn)


def call_builtin(fn: str, args: list[Any]) -> Any:
    if fn == "ceil":
        return math.ceil(_one(fn, args))
    if fn == "floor":
        return math.floor(_one(fn, args))
    if fn == "round":
        return round(_one(fn, args))
    if fn == "sqrt":
        x = _one(fn, args)
        if x < 0:
            raise BuiltinError(f"sqrt() needs a number that is not negative, got {format_number(x)}")
        return math.sqrt(x)
    if fn == "round_up":
        if len(args) != 2:
            raise BuiltinError(f"round_up() takes 2 arguments (x, multiple), got {len(args)}")
        return _round_up(args[0], args[1])
    if fn in ("min", "max"):
        return _minmax(fn, args)
    raise AssertionError(fn)


BUILTINS = ("ceil", "floor", "round", "round_up", "min", "max", "sqrt")
