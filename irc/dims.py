"""Symbolic tensor dimensions.

A dimension is a plain ``int`` or a :class:`Sym`: an integer polynomial over named
symbols (``B``, ``T``, ``2*T + 1``, ``B*T``).  Operations that leave the polynomial
ring (floor division that does not divide evenly, ``max`` of two symbols) produce an
*opaque atom*: a symbol whose name is the printed expression, so that printing and
parsing it again yields the same atom.  This is all shape inference needs, and it is
orders of magnitude faster to import and evaluate than a general CAS.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Union

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers; () is the constant


class Sym:
    """An integer polynomial in named symbols; immutable and hashable."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms: tuple[tuple[Monomial, int], ...] = tuple(
            sorted(((m, c) for m, c in terms.items() if c != 0), key=_term_key)
        )

    @staticmethod
    def var(name: str) -> Sym:
        return Sym({(name,): 1})

    # -- algebra -------------------------------------------------------------
    def _dict(self) -> dict[Monomial, int]:
        return dict(self.terms)

    def __add__(self, other: Dim) -> Dim:
        out = self._dict()
        for m, c in _as_terms(other):
            out[m] = out.get(m, 0) + c
        return _norm(out)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return _norm({m: -c for m, c in self.terms})

    def __sub__(self, other: Dim) -> Dim:
        return self + (-other)

    def __rsub__(self, other: Dim) -> Dim:
        return (-self) + other

    def __mul__(self, other: Dim) -> Dim:
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _as_terms(other):
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return _norm(out)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        exact = _exact_quotient(self, other)
        if exact is not None:
            return exact
        if isinstance(other, Sym):
            reduced = _cancel_monomial(self, other)
            if reduced is not None:
                return reduced
        if isinstance(other, int):
            if other == 1:
                return self
            if other != 0 and all(c % other == 0 for _, c in self.terms):
                return _norm({m: c // other for m, c in self.terms})
            nested = self._nested_floordiv()
            if nested is not None and other > 0 and nested[1] * other < 2**62:
                # floor((floor(p/a) + c)/b) == floor((p + c*a)/(a*b)) for integers, a, b > 0; folded
                # only while a*b stays a size (so the printed IR keeps numbers its parser reads)
                inner, a, c = nested
                return (inner + c * a) // (a * other)
        if isinstance(other, int) and other != 0:
            common = math.gcd(other, *(c for _, c in self.terms))
            if common > 1:  # floor(g*p / (g*k)) == floor(p / k)
                return _norm({m: c // common for m, c in self.terms}) // (other // common)
        left = str(self) if self._is_atom() else f"({self})"
        if not isinstance(other, int):
            right = str(other) if other._is_atom() else f"({other})"
            return opaque(f"{left}//{right}")
        atom = opaque(f"{left}//{other}")
        if other > 0:
            _FLOORDIV_ATOMS[atom.terms[0][0][0]] = (self, other)
        return atom

    def _nested_floordiv(self) -> tuple[Dim, int, int] | None:
        """If self is ``(p//a) + c``, return (p, a, c)."""
        atoms = [(m, c) for m, c in self.terms if m]
        if len(atoms) != 1 or len(atoms[0][0]) != 1 or atoms[0][1] != 1:
            return None
        known = _FLOORDIV_ATOMS.get(atoms[0][0][0])
        if known is None:
            return None
        const = sum(c for m, c in self.terms if not m)
        return known[0], known[1], const

    def _is_atom(self) -> bool:
        """A single symbol or an already-parenthesised opaque atom, with coefficient 1."""
        return len(self.terms) == 1 and len(self.terms[0][0]) == 1 and self.terms[0][1] == 1

    def __rfloordiv__(self, other: Dim) -> Dim:
        if other == 0:
            return 0
        return opaque(f"{other}//{self}" if self._is_atom() else f"{other}//({self})")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sym):
            return self.terms == other.terms
        return False

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        return f"Sym({self})"

    def __str__(self) -> str:
        parts: list[str] = []
        for m, c in self.terms:
            body = "*".join(_atom_text(s) for s in m)
            if not m:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)}*{body}"
            if not parts:
                parts.append(text if c > 0 else f"-{text}")
            else:
                parts.append(("+ " if c > 0 else "- ") + text)
        return " ".join(parts) if parts else "0"

    def symbols(self) -> set[str]:
        return {s for m, _ in self.terms for s in m}

    def subs(self, env: Mapping[str, Dim]) -> Dim:
        """Substitute symbols by dims; opaque atoms are re-evaluated from their text."""
        total: Dim = 0
        for m, c in self.terms:
            term: Dim = c
            for s in m:
                term = term * _subs_symbol(s, env)
            total = total + term
        return total


Dim = Union[int, Sym]

# opaque atom name -> (numerator, positive divisor) for atoms made by floor division
_FLOORDIV_ATOMS: dict[str, tuple[Dim, int]] = {}


def _term_key(t: tuple[Monomial, int]) -> tuple[int, Monomial]:
    # highest degree first, then by name, constant last
    m = t[0]
    return (-len(m), m) if m else (1, ())


def _as_terms(d: Dim) -> tuple[tuple[Monomial, int], ...]:
    if isinstance(d, Sym):
        return d.terms
    return (((), int(d)),)


def _norm(terms: dict[Monomial, int]) -> Dim:
    terms = {m: c for m, c in terms.items() if c != 0}
    if not terms:
        return 0
    if set(terms) == {()}:
        return terms[()]
    return Sym(terms)


def _leading(terms: dict[Monomial, int]) -> tuple[Monomial, int]:
    """The leading term in graded lexicographic order (a monomial order, so division ends)."""
    degree = max(len(m) for m in terms)
    # among monomials of one degree, the smaller sorted tuple has more of the first symbols
    m = min(m for m in terms if len(m) == degree)
    return m, terms[m]


def _divide_monomial(m: Monomial, by: Monomial) -> Monomial | None:
    """``m / by`` when ``by`` divides ``m``, else None."""
    left = Counter(m)
    left.subtract(Counter(by))
    if any(n < 0 for n in left.values()):
        return None
    return tuple(sorted(left.elements()))


def _exact_quotient(p: Dim, d: Dim) -> Dim | None:
    """``q`` with ``p == q*d`` as polynomials (so ``p // d == q`` for every binding), or None.

    Multivariate long division by leading terms; it succeeds exactly when ``d`` divides ``p``.
    """
    if isinstance(d, int) and d == 0:
        return None
    rest = dict(_as_terms(p))
    rest = {m: c for m, c in rest.items() if c}
    divisor = {m: c for m, c in _as_terms(d) if c}
    lead_m, lead_c = _leading(divisor)
    quotient: dict[Monomial, int] = {}
    while rest:
        m, c = _leading(rest)
        qm = _divide_monomial(m, lead_m)
        if qm is None or c % lead_c:
            return None
        qc = c // lead_c
        quotient[qm] = quotient.get(qm, 0) + qc
        for dm, dc in divisor.items():
            key = tuple(sorted(qm + dm))
            rest[key] = rest.get(key, 0) - qc * dc
            if rest[key] == 0:
                del rest[key]
    return _norm(quotient)


def _cancel_monomial(p: Sym, d: Sym) -> Dim | None:
    """``(m*p') // (c*m)`` is ``p' // c``: sizes are positive, so a common monomial cancels."""
    if len(d.terms) != 1 or d.terms[0][1] <= 0:
        return None
    m, c = d.terms[0]
    reduced: dict[Monomial, int] = {}
    for pm, pc in p.terms:
        rm = _divide_monomial(pm, m)
        if rm is None:
            return None
        reduced[rm] = pc
    return dim_floordiv(_norm(reduced), c)


def _atom_text(name: str) -> str:
    return name


def opaque(text: str) -> Sym:
    """An atom standing for a non-polynomial expression, named by its text."""
    return Sym({("(" + text + ")",): 1})


def _subs_symbol(name: str, env: Mapping[str, Dim]) -> Dim:
    if name in env:
        return env[name]
    if name.startswith("("):
        # opaque atom: re-evaluate its text under the new bindings
        from irc.dim_parse import parse_dim

        return parse_dim(name, env)
    return Sym.var(name)


def is_concrete(d: Dim) -> bool:
    return isinstance(d, int)


def dim_floordiv(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return a // b  # Sym.__floordiv__ or Sym.__rfloordiv__


def dim_ceildiv(a: Dim, b: Dim) -> Dim:
    return -dim_floordiv(-a, b)


def dim_max(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a == b:
        return a
    return opaque(f"max({a}, {b})")


def dim_min(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if a == b:
        return a
    return opaque(f"min({a}, {b})")


def dim_str(d: Dim) -> str:
    return str(d)


def dim_symbols(d: Dim) -> set[str]:
    return d.symbols() if isinstance(d, Sym) else set()


def subs(d: Dim, env: Mapping[str, Dim]) -> Dim:
    return d.subs(env) if isinstance(d, Sym) else d


def prod(dims: tuple[Dim, ...] | list[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when ``b`` divides ``a`` for every binding of the symbols, else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b != 0 and a % b == 0 else None
    return _exact_quotient(a, b)


def never_positive(d: Dim) -> bool:
    """True when ``d`` is below 1 for every binding of its symbols to sizes (integers >= 1).

    Only decided for polynomials in plain symbols with no positive coefficient (such as
    ``-B`` or ``2 - 2*T``); an opaque atom can be negative, so its sign is not judged.
    """
    if isinstance(d, int):
        return d < 1
    if any(s.startswith("(") for m, _ in d.terms for s in m):
        return False
    # each monomial is at least 1, so the value is at most the sum of the coefficients
    return all(c <= 0 for m, c in d.terms if m) and sum(c for _, c in d.terms) < 1
