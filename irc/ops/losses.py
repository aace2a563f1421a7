"""Losses as ops: a scalar training objective the grad pass differentiates (irc/passes/grad.py).

Both reduce with PyTorch's default ``reduction="mean"``; docs/autodiff.md gives the exact semantics.
"""

from __future__ import annotations

from irc.ops.common import need_float, need_rank, same_dim
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, numel
from irc.ops.registry import Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import vjp_cross_entropy, vjp_mse
from irc.types import INT_DTYPES, TensorType

BACKWARD_KERNELS = "backward kernels: a later step of issue 15"
# the CPU backend has every loss's and backward primitive's kernel (backends/cpu/render/grad_*.py); CUDA not yet
_NA = {"cuda": BACKWARD_KERNELS}
_RF = rf_reset("a loss is one number for the whole batch")


def check_targets(logits: TensorType, targets: TensorType) -> None:
    """Class ids [...] for logits [..., C]: one id per row of logits."""
    need_rank(logits, 1, "logits [..., classes]")
    need_float(logits, "logits")
    if targets.dtype not in INT_DTYPES or targets.rank != logits.rank - 1:
        raise ShapeError(f"expects integer class ids of the shape of logits {logits} without its class axis as "
                         f"targets, got {targets}")
    for a, t in zip(logits.shape[:-1], targets.shape):
        same_dim(a, t, f"targets {targets} do not match logits {logits} (one class id per row)")


def _ce_infer(a, ts):
    check_targets(ts[0], ts[1])
    return [TensorType(ts[0].dtype, ())]


def _ce_cost(node, ins, outs) -> Cost:
    # log-softmax per logit (max, subtract, exp, sum, log: 5) and the mean of the picked entries
    n = numel(ins[0])
    return Cost().add("softmax", SOFTMAX_PER_ELEMENT * n).add("elementwise", numel(ins[1]))


register(OpDef(
    "cross_entropy", ("logits", "targets"), (Attr("ignore_index", "int", -100),), _ce_infer,
    doc="mean over rows whose target is not ignore_index of −log softmax(logits)[target] (class axis last)",
    cost=_ce_cost, receptive=_RF, classes=frozenset({"loss"}), vjp=vjp_cross_entropy, na=_NA,
))


def _mse_infer(a, ts):
    pred, target = ts
    need_float(pred, "prediction")
    need_float(target, "target")
    if pred.rank != target.rank:
        raise ShapeError(f"prediction {pred} and target {target} differ in rank")
    for x, y in zip(pred.shape, target.shape):
        same_dim(x, y, f"prediction {pred} and target {target} differ in shape")
    return [TensorType(pred.dtype, ())]


register(OpDef(
    "mse", ("pred", "target"), (), _mse_infer, doc="mean of (pred − target)² over every element",
    cost=lambda node, ins, outs: Cost().add("elementwise", 3 * numel(ins[0])),  # subtract, square, accumulate
    receptive=_RF, classes=frozenset({"loss"}), vjp=vjp_mse, na=_NA,
))
