"""Dense layers: linear, matmul, the plain FFN and SwiGLU."""

from __future__ import annotations

from irc.ops.common import broadcast, need_float, need_rank, promote
from irc.ops.cost import Cost, numel, rows
from irc.ops.registry import LOWERED_FOR_CUDA, RF_LAST_AXIS, Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import GRAD_LOWERED, vjp_matmul
from irc.types import TensorType


def _linear_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("elementwise", numel(y) if node.attrs["bias"] else 0)


def _matmul_cost(node, ins, outs) -> Cost:
    return Cost().mac("matmul", numel(outs[0]) * ins[0].shape[-1])


def _ffn_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    tokens, hidden = rows(x), node.attrs["hidden"]
    c = Cost().mac("linear", tokens * hidden * (x.shape[-1] + y.shape[-1]))
    c.add("activation", tokens * hidden)
    return c.add("elementwise", tokens * hidden + numel(y) if node.attrs["bias"] else 0)


def _swiglu_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    tokens, hidden = rows(x), node.attrs["hidden"]
    c = Cost().mac("linear", tokens * hidden * (2 * x.shape[-1] + y.shape[-1]))
    c.add("activation", tokens * hidden)  # silu(gate)
    c.add("elementwise", tokens * hidden)  # ⊙ up
    return c.add("elementwise", 2 * tokens * hidden + numel(y) if node.attrs["bias"] else 0)


def _hidden_rows(a, ts) -> int:
    return ts[0].numel() // ts[0].shape[-1] * a["hidden"]


def _ffn_init(a) -> dict[str, str]:
    # the first matrix feeds the activation: He for a ReLU FFN, GPT-2's normal(0.02) otherwise
    return {"w1": "he" if a["act"] == "relu" else "normal", "w2": "normal", "b1": "zeros", "b2": "zeros"}


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
    cost=_linear_cost, init=lambda a: {"weight": "fan", "bias": "zeros"}, receptive=RF_LAST_AXIS,
    classes=frozenset({"linear", "learned"}), depth=1, na={"cuda": LOWERED_FOR_CUDA, "grad": GRAD_LOWERED},
))


def _matmul_infer(a, ts):
    x, y = ts
    need_rank(x, 2, "a left operand")
    need_rank(y, 2, "a right operand")
    k1, k2 = x.shape[-1], y.shape[-2]
    if k1 != k2:
        if isinstance(k1, int) and isinstance(k2, int):
            raise ShapeError(f"inner sizes differ ({k1} and {k2}): {x} @ {y}")
        raise ShapeError(f"cannot show that the inner sizes {k1} and {k2} are equal: {x} @ {y}")
    bx, by = x.shape[:-2], y.shape[:-2]
    try:
        batch = broadcast(TensorType(x.dtype, bx), TensorType(x.dtype, by), "matmul").shape
    except ShapeError:
        raise ShapeError(f"batch dimensions {_dims(bx)} and {_dims(by)} do not broadcast") from None
    dtype = x.dtype if x.dtype == y.dtype else promote(x.dtype, y.dtype, "matmul", x, y)
    return [TensorType(dtype, batch + (x.shape[-2], y.shape[-1]))]


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


register(OpDef("matmul", ("a", "b"), (), _matmul_infer, doc="batched matrix product with broadcasting",
               cost=_matmul_cost, receptive=rf_reset("mixes positions of both operands"),
               classes=frozenset({"learned"}), vjp=vjp_matmul))


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
    cost=_ffn_cost, init=_ffn_init, receptive=RF_LAST_AXIS, classes=frozenset({"linear", "learned", "ffn"}), depth=2,
    na={"cuda": LOWERED_FOR_CUDA, "grad": GRAD_LOWERED},
    internal=lambda a, ts: 2 * _hidden_rows(a, ts),  # the hidden layer before and after its activation
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
    cost=_swiglu_cost, init=lambda a: {k: "normal" if k.startswith("w") else "zeros" for k in
                                       ("w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")},
    receptive=RF_LAST_AXIS, classes=frozenset({"linear", "learned", "ffn"}), depth=2,
    na={"cuda": LOWERED_FOR_CUDA, "grad": GRAD_LOWERED},
    internal=lambda a, ts: 3 * _hidden_rows(a, ts),  # gate, up and their product
))
