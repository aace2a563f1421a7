"""Bounds on the numbers a ``.arch`` program computes, checked before the work is done.

Constants are exact, so ``1e999999999`` or ``10 ** 10 ** 10`` would build integers of
billions of digits and hang the compiler. Every literal, operator result and built-in
result stays below 10**300 in size (numerator and denominator) — far beyond any
tensor size, which must stay below 2**62 anyway — and symbolic sizes stay small
polynomials.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from irc.dims import Sym

MAX_DIGITS = 300
_LIMIT = 10**MAX_DIGITS
MAX_SYM_TERMS = 1_000
MAX_SYM_DEGREE = 64

_NUMBER = re.compile(r"(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[-+]?\d+))?")


def literal_fits(text: str) -> bool:
    """Whether the NUMBER token ``text`` can be read without building a huge integer."""
    m = _NUMBER.fullmatch(text)
    if m is None:
        return True  # not ours to judge: Fraction reports it
    digits = len(m["int"].lstrip("0")) + len(m["frac"] or "")
    exp = m["exp"] or "0"
    if len(exp.lstrip("+-").lstrip("0")) > 4:  # an exponent of 10,000 or more
        return False
    return digits <= MAX_DIGITS and abs(int(exp)) <= MAX_DIGITS


def power_fits(base: Any, exponent: int) -> bool:
    """Whether ``base ** exponent`` (exact) stays within the bound, judged from the sizes alone."""
    if not isinstance(base, (int, Fraction)) or base in (0, 1, -1):
        return True
    q = Fraction(base)
    biggest = max(abs(q.numerator), q.denominator)
    return abs(exponent) * math.log10(biggest) <= MAX_DIGITS + 1


def in_range(v: Any) -> bool:
    """Whether a computed value is within the bounds (booleans, tensors and such always are)."""
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return -_LIMIT < v < _LIMIT
    if isinstance(v, Fraction):
        return abs(v.numerator) < _LIMIT and v.denominator < _LIMIT
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, Sym):
        return (len(v.terms) <= MAX_SYM_TERMS and all(len(m) <= MAX_SYM_DEGREE for m, _ in v.terms)
                and all(-_LIMIT < c < _LIMIT for _, c in v.terms))
    return True
