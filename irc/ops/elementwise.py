"""Activations, dropout and elementwise arithmetic with broadcasting."""

from __future__ import annotations

from irc.ops.common import broadcast, need_float, norm_axis
from irc.ops.cost import ACTIVATION, ELEMENTWISE, SOFTMAX_PER_ELEMENT, free, per_element
from irc.ops.registry import RF_POINTWISE, Attr, OpDef, ShapeError, register, rf_along
from irc.ops.vjps import BINARY_VJPS, vjp_activation, vjp_minmax, vjp_pass, vjp_softmax


def _same(a, ts):
    need_float(ts[0])
    return [ts[0]]


# name -> (attributes, lint classes)
ACTIVATIONS = {
    "relu": ((), {"rectifier"}),
    "leaky_relu": ((Attr("slope", "float", 0.01),), {"rectifier"}),
    "gelu": ((Attr("approx", "enum", "none", ("none", "tanh")),), set()),
    "silu": ((), set()),
    "tanh": ((), {"saturating"}),
    "sigmoid": ((), {"saturating"}),
    "abs": ((), set()),
}
for _name, (_attrs, _classes) in ACTIVATIONS.items():
    register(OpDef(_name, ("x",), _attrs, _same, doc=f"elementwise {_name}",
                   aliases=("swish",) if _name == "silu" else (),
                   cost=ACTIVATION, receptive=RF_POINTWISE, classes=frozenset({"activation", *_classes}),
                   vjp=vjp_activation))



# Activations real vision and speech models use (MobileNetV2's relu6, MobileNetV3's hard
# swish/sigmoid, EfficientNet's and YOLO's mish, ELU, clamps), each PyTorch's definition
# (docs/semantics.md). Cost: 1 activation FLOP per element, whatever the formula, as every
# activation here. ``saturating``: the output is bounded on the side the gradient dies.
def _bounds_infer(a, ts):
    """clamp and hardtanh: at least one bound, and min <= max (PyTorch's rule for hardtanh)."""
    need_float(ts[0])
    lo, hi = a["min"], a["max"]
    if lo is None and hi is None:
        raise ShapeError("needs at least one bound: min=, max= or both")
    if lo is not None and hi is not None and lo > hi:
        raise ShapeError(f"min={lo:g} is above max={hi:g}: no value lies between the bounds")
    return [ts[0]]


# name -> (attributes, type rule, lint classes)
MORE_ACTIVATIONS = {
    # min(max(x, 0), 6): flat at 0 on the negative side (He init, dead units) and at 6 above
    "relu6": ((), _same, {"rectifier", "saturating"}),
    # min(max(x, min), max): negative inputs keep a value (-1), so not a rectifier
    "hardtanh": ((Attr("min", "float", -1.0), Attr("max", "float", 1.0)), _bounds_infer, {"saturating"}),
    # either bound may be none (omitted): clamp(x, min=0) is relu, clamp(x, 0, 6) is relu6
    "clamp": ((Attr("min", "float", None), Attr("max", "float", None)), _bounds_infer, set()),
    "hardswish": ((), _same, set()),  # x·relu6(x + 3)/6
    "hardsigmoid": ((), _same, {"saturating"}),  # relu6(x + 3)/6
    "mish": ((), _same, set()),  # x·tanh(softplus(x))
    "elu": ((Attr("alpha", "float", 1.0),), _same, set()),  # x if x > 0 else alpha·(exp(x) − 1)
}
for _name, (_attrs, _infer, _classes) in MORE_ACTIVATIONS.items():
    register(OpDef(_name, ("x",), _attrs, _infer, doc=f"elementwise {_name} (PyTorch's definition)",
                   cost=ACTIVATION, receptive=RF_POINTWISE, classes=frozenset({"activation", *_classes}),
                   vjp=vjp_activation))

register(OpDef("identity", ("x",), (), _same, doc="elementwise identity", cost=free, receptive=RF_POINTWISE,
               classes=frozenset({"activation", "pass_through", "view"}), vjp=vjp_pass))


def _softmax_infer(a, ts):
    need_float(ts[0])
    norm_axis(a["axis"], ts[0].rank)
    return [ts[0]]


register(OpDef("softmax", ("x",), (Attr("axis", "int", -1),), _softmax_infer, doc="softmax along an axis",
               cost=per_element("softmax", SOFTMAX_PER_ELEMENT), receptive=rf_along(lambda a, rank: a["axis"]),
               classes=frozenset({"activation"}), vjp=vjp_softmax))


def _dropout_infer(a, ts):
    if not 0.0 <= a["p"] < 1.0:
        raise ShapeError(f"drop probability must be in [0, 1), got {a['p']}")
    return [ts[0]]


# training: irc.ops.grad_train.training_graph lowers it to mul(x, dropout_mask(x, p, seed)), so the backward
# multiplies by the very mask the forward drew (mul's vjp); here, and in the grad of an inference graph, the identity
register(OpDef("dropout", ("x",), (Attr("p", "float", 0.1),), _dropout_infer,
               doc="inverted dropout; the identity at inference", cost=free, receptive=RF_POINTWISE,
               classes=frozenset({"pass_through", "view"}), vjp=vjp_pass))


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
        cost=ELEMENTWISE, receptive=RF_POINTWISE,
        classes=frozenset({"elementwise", "residual"} if _name == "add" else {"elementwise"}), vjp=BINARY_VJPS[_name],
    ))


def _pair_infer(a, ts):
    return [broadcast(ts[0], ts[1], "elementwise")]


# the larger (smaller) of two tensors per element, NumPy broadcasting, the dtype rule of add; NaN
# in either operand gives NaN (torch.maximum, np.maximum). 1 elementwise FLOP per result element.
for _name in ("maximum", "minimum"):
    register(OpDef(_name, ("a", "b"), (), _pair_infer,
                   doc=f"elementwise {_name} of two tensors with NumPy broadcasting (NaN propagates)",
                   cost=ELEMENTWISE, receptive=RF_POINTWISE, classes=frozenset({"elementwise"}),
                   vjp=vjp_minmax))
