"""Parse the printed form of a dimension back into a :data:`irc.dims.Dim`.

Grammar (what :class:`irc.dims.Sym` prints): integers, names, ``+ - * //``,
parentheses, ``max(a, b)`` and ``min(a, b)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from irc.dims import Dim, Sym, dim_floordiv, dim_max, dim_min

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*(),]))")


class DimSyntaxError(ValueError):
    pass


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise DimSyntaxError(f"bad dimension {text!r} at column {pos + 1}")
        out.append(m.group(m.lastindex or 0))
        pos = m.end()
    return out


def parse_dim(text: str, env: Mapping[str, Dim] | None = None) -> Dim:
    """Parse ``text``; names found in ``env`` are replaced by their values."""
    toks = _tokens(text)
    env = env or {}
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(toks):
            raise DimSyntaxError(f"unexpected end of dimension {text!r}")
        tok = toks[pos]
        if expected is not None and tok != expected:
            raise DimSyntaxError(f"expected {expected!r} in dimension {text!r}, got {tok!r}")
        pos += 1
        return tok

    def expr() -> Dim:
        value = term()
        while peek() in ("+", "-"):
            op = take()
            rhs = term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term() -> Dim:
        value = unary()
        while peek() in ("*", "//"):
            op = take()
            rhs = unary()
            value = value * rhs if op == "*" else dim_floordiv(value, rhs)
        return value

    def unary() -> Dim:
        if peek() == "-":
            take()
            return -unary()
        return atom()

    def atom() -> Dim:
        tok = take()
        if tok == "(":
            value = expr()
            take(")")
            return value
        if tok.isdigit():
            return int(tok)
        if tok in ("max", "min") and peek() == "(":
            take("(")
            a = expr()
            take(",")
            b = expr()
            take(")")
            return dim_max(a, b) if tok == "max" else dim_min(a, b)
        if tok[0].isalpha() or tok[0] == "_":
            return env[tok] if tok in env else Sym.var(tok)
        raise DimSyntaxError(f"unexpected {tok!r} in dimension {text!r}")

    value = expr()
    if pos != len(toks):
        raise DimSyntaxError(f"trailing {toks[pos]!r} in dimension {text!r}")
    return value
