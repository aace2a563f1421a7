"""Activations, dropout and elementwise arithmetic with broadcasting."""

from __future__ import annotations

from irc.ops.common import broadcast, need_float, norm_axis
from irc.ops.registry import Attr, OpDef, ShapeError, register


def _same(a, ts):
    need_float(ts[0])
    return [ts[0]]


ACTIVATIONS = {
    "relu": (),
    "leaky_relu": (Attr("slope", "float", 0.01),),
    "gelu": (Attr("approx", "enum", "none", ("none", "tanh")),),
    "silu": (),
    "tanh": (),
    "sigmoid": (),
    "abs": (),
    "identity": (),
}
for _name, _attrs in ACTIVATIONS.items():
    register(OpDef(_name, ("x",), _attrs, _same, doc=f"elementwise {_name}",
                   aliases=("swish",) if _name == "silu" else ()))


def _softmax_infer(a, ts):
    need_float(ts[0])
    norm_axis(a["axis"], ts[0].rank)
    return [ts[0]]


register(OpDef("softmax", ("x",), (Attr("axis", "int", -1),), _softmax_infer, doc="softmax along an axis"))


def _dropout_infer(a, ts):
    if not 0.0 <= a["p"] < 1.0:
        raise ShapeError(f"drop probability must be in [0, 1), got {a['p']}")
    return [ts[0]]


register(OpDef("dropout", ("x",), (Attr("p", "float", 0.1),), _dropout_infer,
               doc="inverted dropout; the identity at inference"))


def _binary_infer(a, ts):
    if len(ts) == 2:
        if a["scalar"] is not None:
            raise ShapeError("takes either two tensors or a tensor and a scalar, not both")
        return [broadcast(ts[0], ts[1], "elementwise")]
    if a["scalar"] is None:
        raise ShapeError("needs a second operand: a tensor or a scalar")
    return [ts[0]]


for _name in ("add", "sub", "mul", "div"):
    register(OpDef(
        _name, ("a", "b?"),
        (Attr("scalar", "float", None), Attr("reverse", "bool", None)),
        _binary_infer,
        doc=f"elementwise {_name} with NumPy broadcasting (or with a scalar; reverse=true puts it first)",
    ))
