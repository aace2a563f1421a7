"""Arithmetic on constants and symbolic sizes: exact, bounded, and with errors at the operator.

Numbers are ints and Fractions (exact), floats only where ``sqrt`` made one; symbolic
sizes are :class:`irc.dims.Sym` polynomials, which take integers only.
"""

from __future__ import annotations

import operator
from fractions import Fraction
from typing import Any

from irc.diagnostics import IrcError, Loc, format_number
from irc.dims import Sym, dim_floordiv, exact_div
from irc.frontends.arch.limits import MAX_DIGITS, MAX_SYM_DEGREE, in_range, power_fits
from irc.frontends.arch.values import describe, is_number, simplify

OP_TEXT = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "matmul": "@", "pow": "**"}


def out_of_range(what: str, loc: Loc) -> IrcError:
    return IrcError(f"{what} is out of range: irc's numbers are limited to {MAX_DIGITS} digits", loc)


def checked(value: Any, what: str, loc: Loc) -> Any:
    """``value`` if it is within the bounds of irc's numbers, else an error about ``what``."""
    if not in_range(value):
        raise out_of_range(what, loc)
    return value


def arith(kind: str, a: Any, b: Any, loc: Loc) -> Any:
    """``a <op> b`` for numbers and symbolic sizes; ``loc`` is the operator's."""
    op = OP_TEXT[kind]
    if kind == "matmul":
        raise IrcError(f"'@' needs two tensors, got {describe(a)} and {describe(b)}", loc)
    for v in (a, b):
        if not (is_number(v) or isinstance(v, float)):
            raise IrcError(f"cannot apply '{op}' to {describe(v)}", loc)
    if isinstance(a, Sym) or isinstance(b, Sym):
        return checked(_symbolic(kind, a, b, loc), f"the result of '{op}'", loc)
    try:
        if isinstance(a, float) or isinstance(b, float):
            result = _floats(kind, float(a), float(b), loc)
        else:
            result = _exact(kind, Fraction(a), Fraction(b), loc)
    except ZeroDivisionError:
        raise IrcError("division by zero", loc) from None
    except OverflowError:
        raise out_of_range(f"the result of '{op}'", loc) from None
    return checked(simplify(result), f"the result of '{op}'", loc)


# the operators that mean the same on exact rationals and on floats; '**' differs and is below
_PLAIN = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
          "floordiv": operator.floordiv, "mod": operator.mod}


def _exact(kind: str, a: Fraction, b: Fraction, loc: Loc) -> Fraction | int:
    if kind in _PLAIN:
        return _PLAIN[kind](a, b)
    assert kind == "pow"
    if b.denominator != 1:
        raise IrcError("'**' needs an integer exponent", loc)
    if not power_fits(a, int(b)):
        raise out_of_range(f"{format_number(a)} ** {format_number(b)}", loc)
    return a ** int(b)


def _floats(kind: str, a: float, b: float, loc: Loc) -> float:
    if kind in _PLAIN:
        return _PLAIN[kind](a, b)
    result = a**b
    if isinstance(result, complex):
        raise IrcError(f"'**' of the negative number {a!r} to a fractional power has no real value", loc)
    return result


def _symbolic(kind: str, a: Any, b: Any, loc: Loc) -> Any:
    op = OP_TEXT[kind]
    sym = a if isinstance(a, Sym) else b
    for v in (a, b):
        if isinstance(v, float) or (isinstance(v, Fraction) and v.denominator != 1):
            raise IrcError(f"cannot apply '{op}' to the symbolic size {sym} and the non-integer "
                           f"{format_number(v) if isinstance(v, Fraction) else repr(v)}", loc)
    a, b = simplify(a), simplify(b)
    if kind == "add":
        return a + b
    if kind == "sub":
        return a - b
    if kind == "mul":
        return a * b
    if kind == "pow":
        if isinstance(b, Sym):
            raise IrcError(f"'**' needs a constant exponent, got the symbolic size {b}", loc)
        if not 0 <= b <= MAX_SYM_DEGREE:
            raise IrcError(f"'**' raises a symbolic size to whole powers 0 to {MAX_SYM_DEGREE}, got {b}", loc)
        result: Any = 1
        for _ in range(b):
            result = result * a
        return result
    if b == 0:
        raise IrcError("division by zero", loc)
    quotient = exact_div(a, b)
    if kind == "div":
        if quotient is None:
            names = " and ".join(sorted(set().union(*(d.symbols() for d in (a, b) if isinstance(d, Sym)))))
            raise IrcError(f"{_text(a)} / {_text(b)} is not a whole number for every value of {names}; "
                           "use '//' for floor division", loc)
        return quotient
    if kind == "floordiv":
        return quotient if quotient is not None else dim_floordiv(a, b)
    assert kind == "mod"
    if quotient is None:
        raise IrcError(f"'%' is not defined for symbolic sizes ({_text(a)} % {_text(b)})", loc)
    return 0


def _text(d: Any) -> str:
    return str(d) if not isinstance(d, Sym) or len(d.terms) == 1 else f"({d})"
