"""Activation functions as float32 expressions of ``v`` (``p`` is the op's one parameter).

Constants are ``np.float32(...)`` on purpose: a bare float literal is float64 in numba and
would promote the whole expression. Transcendentals go through the vectorising device
functions of :mod:`.mathfns` (``fexp``, ``ftanh``, ``ferf``); a renderer that writes an
expression registers what it calls with :func:`act` (or :func:`register`).
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts
from irc.backends.cpu.render import mathfns

ACT_EXPR: dict[str, str] = {
    "none": "v",
    "relu": "np.float32(0.0) if v < np.float32(0.0) else v",
    "leaky_relu": "v * p if v < np.float32(0.0) else v",
    "gelu": "np.float32(0.5) * v * (np.float32(1.0) + ferf(v * np.float32(0.7071067811865476)))",
    "gelu_tanh": "np.float32(0.5) * v * (np.float32(1.0) + ftanh(np.float32(0.7978845608028654)"
                 " * (v + np.float32(0.044715) * v * v * v)))",
    "silu": "v / (np.float32(1.0) + fexp(-v))",
    "tanh": "ftanh(v)",
    "sigmoid": "np.float32(1.0) / (np.float32(1.0) + fexp(-v))",
    "abs": "abs(v)",
}

SIGMOID = "np.float32(1.0) / (np.float32(1.0) + fexp(-({x})))"


def register(parts: ModuleParts, expr: str) -> str:
    """Register the device functions ``expr`` calls; return ``expr``."""
    for name in mathfns.uses_in(expr):
        mathfns.use(parts, name)
    return expr


def act_expr(name: str) -> str:
    """The expression for ``name``; a KeyError for anything not in the table."""
    return ACT_EXPR[name]


def act(parts: ModuleParts, name: str) -> str:
    """The expression for ``name``, its device functions registered in ``parts``."""
    return register(parts, ACT_EXPR[name])


def sigmoid(parts: ModuleParts, x: str) -> str:
    return register(parts, SIGMOID.format(x=x))


def tanh(parts: ModuleParts, x: str) -> str:
    return register(parts, f"ftanh({x})")
