"""Activations, softmax, dropout and broadcasting arithmetic as ONNX ops."""

from __future__ import annotations

import numpy as np

from irc.backends.onnx.context import SCALAR_TYPES, Context
from irc.graph import Node

_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}


def _unary(op_type: str):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        return [ctx.op1(op_type, [xs[0]])]
    return export


def _act(name: str):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        return [ctx.act(name, xs[0])]
    return export


def _binary(op: str):
    def export(ctx: Context, node: Node, xs: list[str]) -> list[str]:
        if len(xs) == 2:
            return [ctx.op1(_BINARY[op], xs)]
        t = ctx.type_of(node.inputs[0])
        kind = SCALAR_TYPES.get(t.dtype)
        s = ctx.const(kind(node.attrs["scalar"]) if kind else float(node.attrs["scalar"]), kind or np.float32)
        return [ctx.op1(_BINARY[op], [s, xs[0]] if node.attrs.get("reverse") else [xs[0], s])]
    return export


def _gelu(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.act("gelu_tanh" if node.attrs.get("approx") == "tanh" else "gelu", xs[0])]


def _softmax(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    """A row irc's reference cannot normalize (all −∞, or holding a NaN) is zeros there; ONNX's is NaN."""
    p = ctx.op1("Softmax", xs[:1], axis=int(node.attrs.get("axis", -1)))
    return [ctx.op1("Where", [ctx.op1("IsNaN", [p]), ctx.const(0.0), p])]


def _leaky_relu(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    return [ctx.op1("LeakyRelu", xs[:1], alpha=float(node.attrs.get("slope", 0.01)))]


OPS = {
    "relu": _unary("Relu"),
    "tanh": _unary("Tanh"),
    "sigmoid": _unary("Sigmoid"),
    "abs": _unary("Abs"),
    "identity": _unary("Identity"),
    "dropout": _unary("Identity"),  # inference: the identity (ONNX Dropout in eval mode is too, but says less)
    "silu": _act("silu"),
    "gelu": _gelu,
    "leaky_relu": _leaky_relu,
    "softmax": _softmax,
    **{op: _binary(op) for op in _BINARY},
}
