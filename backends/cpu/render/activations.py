"""Activation functions as float32 expressions of ``v`` (``p`` is the op's one parameter).

Constants are ``np.float32(...)`` on purpose: a bare float literal is float64 in numba and
would promote the whole expression.
"""

from __future__ import annotations

ACT_EXPR: dict[str, str] = {
    "relu": "np.float32(0.0) if v < np.float32(0.0) else v",
    "leaky_relu": "v * p if v < np.float32(0.0) else v",
    "gelu": "np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.erf(v * np.float32(0.7071067811865476))))",
    "gelu_tanh": "np.float32(0.5) * v * (np.float32(1.0) + np.tanh(np.float32(0.7978845608028654)"
                 " * (v + np.float32(0.044715) * v * v * v)))",
    "silu": "v / (np.float32(1.0) + np.exp(-v))",
    "tanh": "np.tanh(v)",
    "sigmoid": "np.float32(1.0) / (np.float32(1.0) + np.exp(-v))",
    "abs": "abs(v)",
}

SIGMOID = "np.float32(1.0) / (np.float32(1.0) + np.exp(-({x})))"


def act_expr(name: str) -> str:
    """The expression for ``name``; a KeyError for anything not in the table."""
    return ACT_EXPR[name]


def sigmoid(x: str) -> str:
    return SIGMOID.format(x=x)
