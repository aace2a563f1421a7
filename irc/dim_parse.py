"""Parse the printed form of a dimension back into a :data:`irc.dims.Dim`.

Grammar (what :class:`irc.dims.Sym` prints): integers, names, ``+ - * //``,
parentheses, ``max(a, b)`` and ``min(a, b)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from irc.dims import Dim, Sym, dim_floordiv, dim_max, dim_min

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*(),]))")
MAX_DIGITS = 30  # sizes stay below 2**62 (19 digits); longer numbers are typos or attacks
MAX_DEPTH = 100  # irc prints a handful of levels; far deeper would overflow Python's stack


class DimSyntaxError(ValueError):
    """A dimension that does not parse; ``pos`` is the 0-based offset of the problem in its text."""

    def __init__(self, message: str, pos: int = 0):
        super().__init__(message)
        self.pos = pos


def _tokens(text: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            bad = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise DimSyntaxError(f"bad dimension {text.strip()!r}: unexpected {text[bad]!r}", bad)
        tok = m.group(m.lastindex or 0)
        start = m.start(m.lastindex or 0)
        if tok.isdigit() and len(tok) > MAX_DIGITS:
            raise DimSyntaxError(f"size {tok[:20]}... in dimension has more than {MAX_DIGITS} digits", start)
        out.append((tok, start))
        pos = m.end()
    return out


def parse_dim(text: str, env: Mapping[str, Dim] | None = None) -> Dim:
    """Parse ``text``; names found in ``env`` are replaced by their values."""
    toks = _tokens(text)
    if not toks:
        raise DimSyntaxError("empty dimension", 0)
    env = env or {}
    pos = 0
    depth = 0  # parentheses, max/min and unary minus open: each level is a Python call
    shown = repr(text.strip())

    def where() -> int:
        return toks[pos][1] if pos < len(toks) else len(text.rstrip())

    def peek() -> str | None:
        return toks[pos][0] if pos < len(toks) else None

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(toks):
            raise DimSyntaxError(f"dimension {shown} ends early" + (f"; expected {expected!r}" if expected else ""),
                                 where())
        tok = toks[pos][0]
        if expected is not None and tok != expected:
            raise DimSyntaxError(f"expected {expected!r} in dimension {shown}, got {tok!r}", where())
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
            if op == "//" and rhs == 0:
                raise DimSyntaxError(f"division by zero in dimension {shown}", where())
            value = value * rhs if op == "*" else dim_floordiv(value, rhs)
        return value

    def unary() -> Dim:
        nonlocal depth
        if peek() == "-":
            take()
            depth += 1
            if depth > MAX_DEPTH:
                raise DimSyntaxError(f"dimension nests deeper than {MAX_DEPTH} levels", toks[pos - 1][1])
            value = -unary()
            depth -= 1
            return value
        return atom()

    def atom() -> Dim:
        nonlocal pos, depth
        tok = take()
        if tok == "(" or (tok in ("max", "min") and peek() == "("):
            depth += 1
            if depth > MAX_DEPTH:
                raise DimSyntaxError(f"dimension nests deeper than {MAX_DEPTH} levels", toks[pos - 1][1])
        if tok == "(":
            value = expr()
            take(")")
            depth -= 1
            return value
        if tok.isdigit():
            return int(tok)
        if tok in ("max", "min") and peek() == "(":
            take("(")
            a = expr()
            take(",")
            b = expr()
            take(")")
            depth -= 1
            return dim_max(a, b) if tok == "max" else dim_min(a, b)
        if tok[0].isalpha() or tok[0] == "_":
            return env[tok] if tok in env else Sym.var(tok)
        pos -= 1
        raise DimSyntaxError(f"unexpected {tok!r} in dimension {shown}", where())

    value = expr()
    if pos != len(toks):
        raise DimSyntaxError(f"unexpected {toks[pos][0]!r} after the end of dimension {shown}", where())
    return value
