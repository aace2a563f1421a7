"""Backward primitives of the layers with weights or windows: convolutions (and transposed ones), pools,
upsampling, the per-sample and per-channel norms and the recurrent layers.

Each ``<layer>_grad`` record is derived from its forward record: the same attributes, parameters,
buffers and init rules (it reads the layer's weights at the forward node's ``weights`` scope), operands
``(x, dy)`` and results ``(dx, d<param>...)``. Costs count the backward's arithmetic: a product with a
weight needs two of the forward's MACs (one for dx, one for the weight), docs/autodiff.md lists each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import irc.ops.conv  # noqa: F401  (the forward records each backward derives from)
import irc.ops.grad_attention  # noqa: F401  (sdpa_grad, the fused attention core's backward)
import irc.ops.norm  # noqa: F401
import irc.ops.resample  # noqa: F401
from irc.ops.cost import Cost, numel
from irc.ops.grad_ops import BACKWARD, NA
from irc.ops.recurrent import GATES, passes, torch_layout
from irc.ops.registry import OPS, OpDef, ShapeError, register, rf_reset
from irc.types import TensorType

_RF = rf_reset("a gradient, not a feature map the receptive field follows")


def param_order(fwd: OpDef, a: dict[str, Any], x: TensorType) -> list[str]:
    """The forward op's parameter names (not its buffers: running statistics get no gradient)."""
    return list(fwd.param_shapes(a, [x]))


def _infer(fwd: OpDef) -> Callable:
    """(x, dy, and for a recurrent layer the final states' gradients): each gradient has the type of the
    forward result it belongs to; the results are x's type, then each parameter's."""
    def infer(a, ts):
        x = ts[0]
        ys = fwd.infer(a, [x])
        for dy, y in zip(ts[1:], ys):
            if not dy.is_float or dy.rank != y.rank or any(p != q for p, q in zip(dy.shape, y.shape)):
                raise ShapeError(f"the gradient {dy} does not match the forward result {y} (or is not floating-point)")
        shapes = fwd.param_shapes(a, [x])
        return [x] + [TensorType(x.dtype, tuple(shapes[p])) for p in param_order(fwd, a, x)]
    return infer


def _results(fwd: OpDef) -> Callable[[dict[str, Any]], tuple[str, ...]]:
    def results(a) -> tuple[str, ...]:
        # the parameter names need operand types; shape-independent names are enough for labels
        names = ("dx",) + tuple(f"d{p}" for p in _NAMES.get(fwd.name, lambda a: ())(a))
        return names
    return results


def _recurrent_names(op: str) -> Callable[[dict[str, Any]], tuple[str, ...]]:
    # a recurrent layer's parameter names follow from its attributes alone (the input width only sizes them)
    return lambda a: tuple(OPS[op].param_shapes(a, [TensorType("f32", (1, 1, 1))]))


def _weight_bias(a) -> tuple[str, ...]:
    return ("weight", "bias") if a["bias"] else ("weight",)


def _affine(a) -> tuple[str, ...]:
    return ("gain", "bias") if a["affine"] else ()


_NAMES: dict[str, Callable[[dict[str, Any]], tuple[str, ...]]] = {
    "conv1d": _weight_bias, "conv2d": _weight_bias, "conv_transpose1d": _weight_bias, "conv_transpose2d": _weight_bias,
    "batchnorm": lambda a: ("gain", "bias"), "groupnorm": _affine, "instancenorm": _affine,
    "rnn": _recurrent_names("rnn"), "lstm": _recurrent_names("lstm"), "gru": _recurrent_names("gru"),
}


def _derive(name: str, cost: Callable, doc: str, inputs: tuple[str, ...] = ("x", "dy")) -> OpDef:
    fwd = OPS[name]
    return register(replace(
        fwd, name=f"{name}_grad", inputs=inputs, infer=_infer(fwd), results=_results(fwd), doc=doc, aliases=(),
        extra={}, omitted={}, cost=cost, receptive=_RF, classes=BACKWARD, depth=0, internal=None, na=NA, vjp=None,
    ))


def _twice_forward(name: str) -> Callable:
    """dx and d(weight) each cost the forward's MACs; the bias gradient one add per element of dy."""
    def cost(node, ins, outs) -> Cost:
        fwd = OPS[name]
        y = fwd.infer(node.attrs, ins[:1])[0]
        c = Cost().mac("linear", 2 * fwd.cost(node, ins[:1], [y]).macs)
        return c.add("elementwise", numel(y) if node.attrs.get("bias") else 0)
    return cost


for _nd in (1, 2):
    _derive(f"conv{_nd}d", _twice_forward(f"conv{_nd}d"),
            f"(dx, dweight, dbias) of conv{_nd}d: dx the transposed convolution of dy, dweight the correlation of "
            "x with dy, dbias Σ dy")
    _derive(f"conv_transpose{_nd}d", _twice_forward(f"conv_transpose{_nd}d"),
            f"(dx, dweight, dbias) of conv_transpose{_nd}d: dx the convolution of dy with the weight, dweight the "
            "correlation of dy with x, dbias Σ dy")


def _pool_grad_cost(node, ins, outs) -> Cost:
    """Each tap of each window again (a compare for max, an add for mean) and one write per tap."""
    fwd = OPS[node.op.removesuffix("_grad")]
    y = fwd.infer(node.attrs, ins[:1])[0]
    return Cost().add("pool", 2 * fwd.cost(node, ins[:1], [y]).total)


for _nd in (1, 2):
    _derive(f"maxpool{_nd}d", _pool_grad_cost,
            f"dx of maxpool{_nd}d: each window's dy added at the position of its maximum (the first, on ties)")
    _derive(f"avgpool{_nd}d", _pool_grad_cost,
            f"dx of avgpool{_nd}d: each window's dy divided by its count, added at every position it covers")
_derive("global_avgpool", lambda node, ins, outs: Cost().add("pool", numel(outs[0])),
        "dx of global_avgpool: dy / (number of positions), broadcast over every spatial position")
_derive("adaptive_avgpool2d", _pool_grad_cost,
        "dx of adaptive_avgpool2d: each bin's dy divided by the bin's size, added at every position it covers")


def _upsample_grad_cost(node, ins, outs) -> Cost:
    """Nearest: each output's dy added to its source (1 per element of dy); bilinear: each of its 4 weighted
    taps again (2 × the forward's)."""
    if node.attrs["mode"] == "nearest":
        return Cost().add("pool", numel(ins[1]))
    fwd = OPS["upsample"]
    return Cost().add("pool", 2 * fwd.cost(node, ins[:1], ins[1:2]).total)


_derive("upsample", _upsample_grad_cost,
        "dx of upsample: each output's dy added back to the input pixels it was read from, with its weight")


def _batchnorm_grad_cost(node, ins, outs) -> Cost:
    """Inference: dx (2), dgain (2), dbias (1) per element. Training: LayerNorm's backward count (recompute
    x̂ 5, dx from dx̂ 6, dx̂ = dy·gain 1, dgain 2, dbias 1)."""
    return Cost().add("norm", (15 if node.attrs.get("train") else 5) * numel(outs[0]))


_derive("batchnorm", _batchnorm_grad_cost,
        "(dx, dgain, dbias) of batchnorm: inference mode dx = dy·gain/√(var + eps) with the running statistics; "
        "train=true through the batch mean and variance")


def _group_grad_cost(node, ins, outs) -> Cost:
    """LayerNorm's backward count per element (recompute x̂ 5, dx from dx̂ 6), + 4 with a gain and bias."""
    return Cost().add("norm", (11 + 4 * bool(node.attrs["affine"])) * numel(outs[0]))


_derive("groupnorm", _group_grad_cost,
        "(dx, dgain, dbias) of groupnorm: dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))/σ over each sample's group")
_derive("instancenorm", _group_grad_cost,
        "(dx, dgain, dbias) of instancenorm: groupnorm's backward with one group per channel")


# elementwise FLOPs per hidden unit and step of each recurrence's backward (the gate derivatives and products)
BPTT_FLOPS = {"rnn": 3, "lstm": 12, "gru": 14}


def _recurrent_grad_cost(node, ins, outs) -> Cost:
    """BPTT: dx and dh_{t−1} from the gate gradients, and both weight gradients: twice the forward's MACs;
    the gate derivatives (BPTT_FLOPS per hidden unit and step of every pass); the bias gradient Σ dgates;
    in training, the dropout mask's multiply of each gradient between layers."""
    op = node.op.removesuffix("_grad")
    fwd = OPS[op]
    x = ins[0]
    b, t = x.shape[0], x.shape[1]
    a = node.attrs
    fwd_ins = [x, ins[-1]] if a.get("train") else [x]
    ys = fwd.infer(a, fwd_ins)
    forward = fwd.cost(node, fwd_ins, ys)
    c = Cost().mac("linear", 2 * forward.macs)
    units = b * t * a["hidden"] * (len(passes(a)) if torch_layout(a) else 1)
    c.add("elementwise", BPTT_FLOPS[op] * units + (GATES[op] * units if a["bias"] else 0))
    return c.add("elementwise", numel(ins[-1]) if a.get("train") else 0)


def _recurrent_grad_infer(fwd: OpDef) -> Callable:
    """(x, dseq, the final states' gradients up to the last one read, and with train=true the forward's dropout
    mask last): the results are x's type, then each parameter's."""
    def infer(a, ts):
        x, grads = ts[0], list(ts[1:])
        fwd_ts = [x]
        if a.get("train"):
            if len(grads) < 2:
                raise ShapeError("train=true: the operands are x, the gradients, then the forward's dropout mask")
            fwd_ts.append(grads.pop())
        ys = fwd.infer(a, fwd_ts)
        if len(grads) > len(ys):
            raise ShapeError(f"{len(grads)} gradients for the {len(ys)} results of {fwd.name} (a dropout mask "
                             "operand needs train=true)")
        for dy, y in zip(grads, ys):
            if not dy.is_float or dy.rank != y.rank or any(p != q for p, q in zip(dy.shape, y.shape)):
                raise ShapeError(f"the gradient {dy} does not match the forward result {y} (or is not floating-point)")
        shapes = fwd.param_shapes(a, [x])
        return [x] + [TensorType(x.dtype, tuple(shapes[p])) for p in param_order(fwd, a, x)]
    return infer


def _derive_recurrent(name: str, doc: str, inputs: tuple[str, ...]) -> OpDef:
    # with train=true the last operand is the forward's dropout mask, so the type rule is the layer's own
    derived = _derive(name, _recurrent_grad_cost, doc, inputs=inputs)
    return register(replace(derived, infer=_recurrent_grad_infer(OPS[name])))


_MASKED = "; with train=true the forward's dropout mask last, applied between layers"
_derive_recurrent("lstm", "(dx, then each weight's gradient) of the lstm (either layout) by backpropagation through "
                  "time from dseq (and the final states' dh, dc)" + _MASKED,
                  inputs=("x", "dseq", "dh?", "dc?", "mask?"))
_derive_recurrent("gru", "(dx, then each weight's gradient) of the gru (either variant and layout) by backpropagation "
                  "through time from dseq (and the final state's dh)" + _MASKED, inputs=("x", "dseq", "dh?", "mask?"))
_derive_recurrent("rnn", "(dx, then each weight's gradient) of the rnn (either layout) by backpropagation through "
                  "time from dseq (and the final state's dh)" + _MASKED, inputs=("x", "dseq", "dh?", "mask?"))
