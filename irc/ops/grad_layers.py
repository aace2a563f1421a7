"""Backward primitives of the layers with weights or windows: convolutions, pools, BatchNorm and the LSTM.

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
import irc.ops.norm  # noqa: F401
import irc.ops.recurrent  # noqa: F401
from irc.ops.cost import Cost, numel
from irc.ops.grad_ops import BACKWARD, NA
from irc.ops.registry import OPS, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import lstm_grad_results
from irc.types import TensorType

_RF = rf_reset("a gradient, not a feature map the receptive field follows")


def param_order(fwd: OpDef, a: dict[str, Any], x: TensorType) -> list[str]:
    """The forward op's parameter names (not its buffers: running statistics get no gradient)."""
    return list(fwd.param_shapes(a, [x]))


def _infer(fwd: OpDef, extra: int = 0) -> Callable:
    def infer(a, ts):
        x, dy = ts[0], ts[1]
        (y,) = fwd.infer(a, [x])[:1]
        if any(not t.is_float for t in ts[1:]) or dy.rank != y.rank or any(p != q for p, q in zip(dy.shape, y.shape)):
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


_NAMES: dict[str, Callable[[dict[str, Any]], tuple[str, ...]]] = {
    "conv1d": lambda a: ("weight", "bias") if a["bias"] else ("weight",),
    "conv2d": lambda a: ("weight", "bias") if a["bias"] else ("weight",),
    "batchnorm": lambda a: ("gain", "bias"),
    "lstm": lambda a: lstm_grad_results(a)[1:],
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
_derive("batchnorm", lambda node, ins, outs: Cost().add("norm", 5 * numel(outs[0])),  # dx (2), dgain (2), dbias
        "(dx, dgain, dbias) of the inference-mode batchnorm: dx = dy·gain/√(var + eps) with the running statistics")


def _lstm_grad_cost(node, ins, outs) -> Cost:
    """BPTT: dx and dh_{t−1} from the gate gradients, and both weight gradients: twice the forward's MACs;
    the gate derivatives ~ 12 elementwise FLOPs per hidden unit and step; the bias gradient Σ dgates."""
    fwd = OPS["lstm"]
    x = ins[0]
    b, t = x.shape[0], x.shape[1]
    ys = fwd.infer(node.attrs, [x])
    c = Cost().mac("linear", 2 * fwd.cost(node, [x], ys).macs)
    units = b * t * node.attrs["hidden"]
    return c.add("elementwise", 12 * units + (4 * units if node.attrs["bias"] else 0))


_derive("lstm", _lstm_grad_cost,
        "(dx, dweight_ih, dweight_hh, dbias) of the lstm by backpropagation through time from dseq (and the final "
        "states' dh, dc)", inputs=("x", "dseq", "dh?", "dc?"))
