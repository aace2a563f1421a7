"""Hostile values the mutators substitute: numbers, wrong types, names, unicode, snippets."""

from __future__ import annotations

from functools import lru_cache

# Numbers where a size or an attribute goes: edge cases, int32/int64/uint64 limits, float
# overflow, more digits than Python converts to text by default (4300), exact rationals,
# symbols in a number's place, and arithmetic that divides by zero.
NUMBERS = (
    "0", "1", "2", "3", "7", "-1", "-7", "0.5", "1.5", "0.0", "-0.0", ".5", "5.", "1e5", "3e0", "1e-9", "1e-300",
    "255", "256", "1023", "65537", "2147483647", "2147483648", "4294967296",
    "4611686018427387903", "4611686018427387904", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "99999999999999999999999999999", "1e18", "1e19", "1e30", "1e308", "1e309", "1e400",
    "1e5000", "2**62", "2**63", "2**64", "2**100", "10**30", "-(2**63)", "(1/3)", "(2/3)*3", "1/0", "0//0", "7%0",
    "0**-1", "B", "-B", "B*T", "B//0", "B-B", "B/3", "１", "٣",
)

WRONG_TYPES = (
    "true", "false", "none", '"x"', '""', '"transformer.arch"', "[]", "[1, 2]", "[[1]]", "[1, 2, 3, 4, 5]",
    "[-1]", "[0, 0]", "[B, -1]", "gelu", "same", "learned", "emb", "x", "linear", "relu", "B", "sqrt(2)", "2.5",
    "linear(4)", "embedding(10, 4)", "max()", "round_up(B, 8)",
)

KEYWORDS = ("model", "block", "const", "input", "output", "return", "use", "repeat", "true", "false", "none")
DTYPES = ("f16", "bf16", "f32", "f64", "i32", "i64", "i8", "bool", "int8", "f8", "u8")
PLAIN_NAMES = ("x", "y", "h", "B", "T", "H", "W", "d", "emb", "main", "_", "__", "x_1", "ceil", "floor", "round",
               "round_up", "min", "max", "sqrt", "é", "ｘ", "x\u200b", "ℌ")

UNICODE = (
    "é", "\u00a0", "\u200b", "\u2028", "\u2029", "\u202e", "\U0001F600", "\x00", "\x0c", "\x0b", "\x85", "\t",
    "\r", "\r\n", "\ufeff", "١", "𝟘", "ﬁ", "Ａ", "\x1c", "\\", "\ud800",
)

SNIPPETS = (
    "{", "}", "(", ")", "[", "]", ",", "=", ";", ":", "\n", "#", '"', "**", "//", "@", "-", "...",
    "model m(B) {", "block b(x) {", "return", "output", "input", "const", "use", "repeat(3)", 'use "main.arch"',
    "const q = 1", "output z = x", "input q: f32[B]", "f32[", "f32[B, 4]", "x = x", "a, b = x", "output y",
    "return x, x", "block x(x) { return x }", "(x=1)", "[,]", "f(x=", "repeat(0) b(x)",
)


@lru_cache(maxsize=1)
def op_names() -> tuple[str, ...]:
    """Every op name and alias in the registry, and every enum choice an attribute takes."""
    from irc.ops import OPS

    names: set[str] = set()
    for op in OPS.values():
        names.add(op.name)
        names.update(op.aliases)
        for a in op.attrs:
            names.add(a.name)
            names.update(a.choices)
    return tuple(sorted(names))


def names() -> tuple[str, ...]:
    return KEYWORDS + DTYPES + PLAIN_NAMES + op_names()
