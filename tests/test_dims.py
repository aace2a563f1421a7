"""Symbolic dimensions: polynomial arithmetic, opaque atoms, printing and parsing back.

The oracle for every symbolic result is plain Python integer arithmetic on the same
expression with the symbols bound: ``subs(d, env)`` must equal it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irc.dim_parse import DimSyntaxError, parse_dim
from irc.dims import Dim, Sym, dim_ceildiv, dim_floordiv, dim_max, dim_min, dim_symbols, exact_div, prod, subs
from irc.types import TensorType

B, T, H = Sym.var("B"), Sym.var("T"), Sym.var("H")


def test_polynomial_identities() -> None:
    assert T + T == 2 * T
    assert T - T == 0 and isinstance(T - T, int)
    assert (T + 1) * (T - 1) == T * T - 1
    assert B * T == T * B
    assert 3 + T - 3 == T
    assert (2 * T) // 2 == T
    assert (4 * T + 6) // 2 == 2 * T + 3
    assert T // 1 == T
    assert -T + 2 * T == T
    assert hash(B * T) == hash(T * B)


@pytest.mark.parametrize("dim, text", [
    (T, "T"), (T + 1, "T + 1"), (2 * T + 1, "2*T + 1"), (B * T, "B*T"), (T - 1, "T - 1"), (-T, "-T"),
    (3 - T, "-T + 3"), (T * T, "T*T"), (768 * B * T, "768*B*T"), (B * T + T + 2, "B*T + T + 2"),
])
def test_printed_form(dim: Dim, text: str) -> None:
    assert str(dim) == text
    assert parse_dim(text) == dim


def test_inexact_floor_division_is_an_opaque_atom_that_reevaluates() -> None:
    half = dim_floordiv(T - 1, 2) + 1  # conv k3 s2 p1
    assert isinstance(half, Sym)
    assert str(half) == "((T - 1)//2) + 1"
    assert parse_dim(str(half)) == half
    for t in (1, 2, 7, 224, 225):
        assert subs(half, {"T": t}) == (t - 1) // 2 + 1
    twice = dim_floordiv(half - 1, 2) + 1
    assert [subs(twice, {"T": t}) for t in (31, 32, 224)] == [8, 8, 56]


def test_max_min_and_ceildiv() -> None:
    assert dim_max(3, 5) == 5 and dim_min(3, 5) == 3
    assert dim_max(T, T) == T and dim_min(B, B) == B
    m = dim_max(T, B)
    assert str(m) == "(max(T, B))"
    assert subs(m, {"T": 3, "B": 9}) == 9
    assert subs(dim_min(T, 3), {"T": 10}) == 3
    assert dim_ceildiv(7, 2) == 4 and dim_ceildiv(8, 2) == 4
    assert subs(dim_ceildiv(T, 4), {"T": 9}) == 3


def test_subs_partial_keeps_the_rest_symbolic() -> None:
    d = B * T + 2 * T
    assert subs(d, {"T": 10}) == 10 * B + 20
    assert subs(d, {"B": 2, "T": 10}) == 40
    assert dim_symbols(d) == {"B", "T"}
    assert dim_symbols(7) == set()


def test_parse_with_environment() -> None:
    assert parse_dim("B*T + 1", {"T": 4}) == 4 * B + 1
    assert parse_dim("max(T, 3)", {"T": 8}) == 8
    assert parse_dim(" 12 ") == 12


@pytest.mark.parametrize("text", ["T +", "3 $", "max(T)", "(T", "T)", "*T", ""])
def test_parse_errors(text: str) -> None:
    with pytest.raises(DimSyntaxError):
        parse_dim(text)


def test_tensor_type_text_numel_and_subs() -> None:
    t = TensorType("f32", (B, T, 768))
    assert str(t) == "f32[B,T,768]"
    assert t.numel() == 768 * B * T
    assert t.subs({"T": 4}) == TensorType("f32", (B, 4, 768))
    assert t.symbols() == {"B", "T"}
    assert str(TensorType("i32", ())) == "i32[]"
    assert prod([2, 3, T]) == 6 * T


# -- property: arbitrary expressions agree with integer arithmetic ------------------------

Expr = tuple  # ("int", n) | ("sym", name) | (op, left, right) | ("floordiv", left, k)
_BIN: dict[str, Callable[[Dim, Dim], Dim]] = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                                              "max": dim_max, "min": dim_min}
_INT: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                                              "max": max, "min": min}

leaves = st.one_of(st.integers(0, 40).map(lambda n: ("int", n)), st.sampled_from("BTH").map(lambda s: ("sym", s)))
exprs = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(list(_BIN)), inner, inner),
        st.tuples(st.just("floordiv"), inner, st.integers(1, 7)),
    ),
    max_leaves=8,
)


def _build(e: Expr) -> Dim:
    if e[0] == "int":
        return e[1]
    if e[0] == "sym":
        return Sym.var(e[1])
    if e[0] == "floordiv":
        return dim_floordiv(_build(e[1]), e[2])
    return _BIN[e[0]](_build(e[1]), _build(e[2]))


def _eval(e: Expr, env: dict[str, int]) -> int:
    if e[0] == "int":
        return e[1]
    if e[0] == "sym":
        return env[e[1]]
    if e[0] == "floordiv":
        return _eval(e[1], env) // e[2]
    return _INT[e[0]](_eval(e[1], env), _eval(e[2], env))


@settings(max_examples=300, deadline=None)
@given(exprs, st.integers(1, 50), st.integers(1, 50), st.integers(1, 50))
def test_symbolic_results_match_integer_arithmetic(e: Expr, b: int, t: int, h: int) -> None:
    env = {"B": b, "T": t, "H": h}
    d = _build(e)
    assert subs(d, env) == _eval(e, env)
    again = parse_dim(str(d))
    assert again == d
    assert str(again) == str(d)
    assert subs(again, env) == _eval(e, env)


# -- division by a symbolic size: exact when it divides, an opaque atom otherwise -----------

polys = st.recursive(
    st.one_of(st.integers(1, 9).map(lambda n: ("int", n)), st.sampled_from("BTH").map(lambda s: ("sym", s))),
    lambda inner: st.tuples(st.sampled_from(["+", "*"]), inner, inner),
    max_leaves=5,
)


def test_exact_symbolic_division() -> None:
    assert (768 * B * T) // (12 * B * T) == 64
    assert (768 * B * T) // B == 768 * T
    assert (B * B - 1) // (B - 1) == B + 1
    assert exact_div(2 * B * T + 2 * B, T + 1) == 2 * B
    assert exact_div(T, 3) is None and exact_div(B * T + 1, B) is None
    assert dim_floordiv(0, T) == 0


@settings(max_examples=300, deadline=None)
@given(polys, polys, st.integers(1, 30), st.integers(1, 30), st.integers(1, 30))
def test_symbolic_division_matches_integer_arithmetic(p: Expr, d: Expr, b: int, t: int, h: int) -> None:
    env = {"B": b, "T": t, "H": h}
    num, den = _build(p), _build(d)
    assert subs(dim_floordiv(num * den, den), env) == _eval(p, env)  # p*d // d is p, exactly
    assert exact_div(num * den, den) == num
    q = dim_floordiv(num, den)
    assert subs(q, env) == _eval(p, env) // _eval(d, env)
    assert parse_dim(str(q)) == q
