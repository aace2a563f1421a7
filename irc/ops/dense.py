"""Dense layers: linear, matmul, the plain FFN and SwiGLU."""

from __future__ import annotations

from irc.ops.common import broadcast, need_float, need_rank, same_dim
from irc.ops.registry import Attr, OpDef, ShapeError, register
from irc.types import TensorType


def _linear_infer(a, ts):
    (x,) = ts
    need_rank(x, 1, "an input")
    need_float(x)
    return [x.with_shape(x.shape[:-1] + (a["out"],))]


def _linear_params(a, ts):
    d = ts[0].shape[-1]
    p = {"weight": (a["out"], d)}
    if a["bias"]:
        p["bias"] = (a["out"],)
    return p


register(OpDef(
    "linear", ("x",),
    (Attr("out", "dim", doc="output features"), Attr("bias", "bool", True)),
    _linear_infer, _linear_params, aliases=("dense",),
    doc="y = x·Wᵀ + b over the last axis (weight [out, in], PyTorch layout)",
))


def _matmul_infer(a, ts):
    x, y = ts
    need_rank(x, 2, "a left operand")
    need_rank(y, 2, "a right operand")
    same_dim(x.shape[-1], y.shape[-2], f"contracts {x.shape[-1]} with {y.shape[-2]}: {x} @ {y}")
    batch = broadcast(x.with_shape(x.shape[:-2]), y.with_shape(y.shape[:-2]), "matmul")
    return [TensorType(batch.dtype, batch.shape + (x.shape[-2], y.shape[-1]))]


register(OpDef("matmul", ("a", "b"), (), _matmul_infer, doc="batched matrix product with broadcasting"))


def _ffn_infer(a, ts):
    (x,) = ts
    need_rank(x, 1, "an input")
    need_float(x)
    out = a["out"] if a["out"] is not None else x.shape[-1]
    return [x.with_shape(x.shape[:-1] + (out,))]


def _ffn_params(a, ts):
    d = ts[0].shape[-1]
    out = a["out"] if a["out"] is not None else d
    p = {"w1": (a["hidden"], d)}
    if a["bias"]:
        p["b1"] = (a["hidden"],)
    p["w2"] = (out, a["hidden"])
    if a["bias"]:
        p["b2"] = (out,)
    return p


register(OpDef(
    "ffn", ("x",),
    (
        Attr("hidden", "dim"),
        Attr("act", "enum", "gelu", ("relu", "gelu", "gelu_tanh", "silu", "tanh")),
        Attr("bias", "bool", True),
        Attr("out", "dim", None),
    ),
    _ffn_infer, _ffn_params, aliases=("mlp",),
    doc="position-wise feed-forward: linear(hidden) → act → linear(out)",
))


def _swiglu_params(a, ts):
    d = ts[0].shape[-1]
    out = a["out"] if a["out"] is not None else d
    p = {"w_gate": (a["hidden"], d), "w_up": (a["hidden"], d), "w_down": (out, a["hidden"])}
    if a["bias"]:
        p = {"w_gate": (a["hidden"], d), "b_gate": (a["hidden"],), "w_up": (a["hidden"], d),
             "b_up": (a["hidden"],), "w_down": (out, a["hidden"]), "b_down": (out,)}
    return p


register(OpDef(
    "swiglu", ("x",),
    (Attr("hidden", "dim"), Attr("bias", "bool", False), Attr("out", "dim", None)),
    _ffn_infer, _swiglu_params,
    doc="(silu(x·W_gateᵀ) ⊙ x·W_upᵀ)·W_downᵀ — three matrices",
))


def _check_not_int(x: TensorType) -> None:
    if not x.is_float:
        raise ShapeError(f"expects floating-point input, got {x}")
