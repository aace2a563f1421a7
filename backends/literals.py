"""The only ways text from a model reaches generated code: string constants and comments.

Names in a model file (values, scopes, weight keys, labels) are data. Generated code never
turns them into identifiers: values become ``v0, v1, ...``, kernels get names built from
fixed tables, and a name appears either as a string constant made by :func:`str_literal`
(checked to be one plain, escaped Python string) or inside a comment made by
:func:`comment_text` (reduced to a strict character set, so it cannot end the comment).
"""

from __future__ import annotations

import ast
import math
import re

# A literal that ``ascii()`` made: one quoted line, every quote and backslash escaped,
# nothing outside printable ASCII.
_SAFE_LITERAL = re.compile(r"""^'(?:[^'\\\x00-\x1f\x7f-\uffff]|\\.)*'$|^"(?:[^"\\\x00-\x1f\x7f-\uffff]|\\.)*"$""")
_COMMENT_CHARS = re.compile(r"[^A-Za-z0-9_.,:=%@()\[\] +\-*/]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def str_literal(text: str) -> str:
    """A Python string constant holding exactly ``text``, safe to splice into source."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    lit = ascii(text)
    if not _SAFE_LITERAL.match(lit) or ast.literal_eval(lit) != text:
        raise ValueError(f"cannot make a safe string constant of {text!r}")
    return lit


def comment_text(text: str, limit: int = 100) -> str:
    """``text`` reduced to characters that cannot leave a ``#`` comment (others become ``?``)."""
    clean = _COMMENT_CHARS.sub("?", str(text))
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def int_literal(value: object) -> str:
    """An integer constant; anything but a real int (bools excluded) is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return str(int(value))


def f32_literal(value: object) -> str:
    """A float32 constant: ``np.float32(<repr>)``, with inf and nan spelled through numpy."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    x = float(value)
    if math.isnan(x):
        return "np.float32(np.nan)"
    if math.isinf(x):
        return "np.float32(np.inf)" if x > 0 else "np.float32(-np.inf)"
    return f"np.float32({x!r})"


def float_literal(value: object) -> str:
    """A Python float constant (float64), with inf and nan spelled as calls."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    x = float(value)
    return repr(x) if math.isfinite(x) else f"float({str(x)!r})"


def tuple_literal(items: list[str]) -> str:
    """A tuple display of items that are already code: ``(a, b)``, ``(a,)``, ``()``."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def shape_literal(shape: tuple[int, ...] | list[int]) -> str:
    return tuple_literal([int_literal(d) for d in shape])


def check_identifier(name: str) -> str:
    """Kernel and variable names are built by irc from fixed tables; check that anyway."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return name
