"""Backward primitives: the ops the vector-Jacobian products (irc/ops/vjps.py) emit where existing
ops do not suffice. Each takes the forward values it needs and the incoming gradient ``dy``; a
layer's backward reads the layer's weights at the forward node's ``weights`` scope (its ``params``
are the layer's), so parameter counts and weight files are unchanged by the grad pass.

Costs count the backward's own arithmetic (docs/autodiff.md lists each count), so the FLOPs of a
grad graph are the exact training FLOPs of one step (forward + backward).
"""

from __future__ import annotations

from typing import Any

from irc.dims import Dim
from irc.ops.common import broadcast, need_float, norm_axis, same_dim
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, free, numel, per_element
from irc.ops.elementwise import ACTIVATIONS, MORE_ACTIVATIONS, _dropout_infer
from irc.ops.losses import _NA, check_targets
from irc.ops.norm import NORM_INIT, _ln_infer, _ln_params, _rms_params, _same, layernorm_axis
from irc.ops.primitives import _heads_infer
from irc.ops.registry import RF_POINTWISE, Attr, OpDef, ShapeError, register, rf_along, rf_reset
from irc.ops.vjps import vjp_constant
from irc.types import TensorType

SECOND_ORDER = "second-order gradients: a later step of issue 15"
NA = {**_NA, "grad": SECOND_ORDER}
BACKWARD = frozenset({"backward"})
_RF = rf_reset("a gradient, not a feature map the receptive field follows")


def _need_same(x: TensorType, dy: TensorType, what: str = "input") -> None:
    need_float(x, what)
    need_float(dy, "gradient")
    if x.rank != dy.rank:
        raise ShapeError(f"the gradient {dy} does not match the {what} {x}")
    for a, b in zip(x.shape, dy.shape):
        same_dim(a, b, f"the gradient {dy} does not match the {what} {x}")


# -- sum_to: the adjoint of broadcasting ----------------------------------------------------------


def _sum_to_infer(a, ts):
    (dy,) = ts
    need_float(dy, "gradient")
    shape = tuple(a["shape"])
    target = TensorType(dy.dtype, shape)
    fits = -1 not in shape and len(shape) <= dy.rank
    if fits:
        try:
            fits = broadcast(target, dy, "sum_to").shape == dy.shape
        except ShapeError:
            fits = False
    if not fits:
        raise ShapeError(f"cannot sum {dy} to [{','.join(str(d) for d in shape)}]: the shape must broadcast to the "
                         "gradient's (sizes, no -1, at most its rank)")
    return [target]


register(OpDef(
    "sum_to", ("dy",), (Attr("shape", "dims"),), _sum_to_infer,
    doc="sum over the axes along which `shape` was broadcast to dy's shape (NumPy rules)",
    cost=lambda node, ins, outs: Cost().add("elementwise", numel(ins[0]) - numel(outs[0])),
    receptive=_RF, classes=BACKWARD, na=NA,
))


# -- activations and softmax ------------------------------------------------------------------


def _act_infer(a, ts):
    x, dy = ts
    _need_same(x, dy)
    return [x]


_ACT_NAMES = tuple(sorted({*ACTIVATIONS, *MORE_ACTIVATIONS}))
register(OpDef(
    "act_grad", ("x", "dy"),
    (Attr("fn", "enum", choices=_ACT_NAMES, doc="the activation (not act=, which names a fused one)"),
     Attr("slope", "float", None), Attr("approx", "enum", None, ("none", "tanh")),
     Attr("min", "float", None), Attr("max", "float", None), Attr("alpha", "float", None)),
    _act_infer, doc="dy·fn′(x) for the named activation (its forward attributes alongside)",
    # the derivative evaluated (1 activation FLOP) times dy (1 elementwise)
    cost=lambda node, ins, outs: Cost().add("activation", numel(outs[0])).add("elementwise", numel(outs[0])),
    receptive=RF_POINTWISE, classes=BACKWARD, na=NA,
))


def _softmax_grad_infer(a, ts):
    y, dy = ts
    _need_same(y, dy, "softmax output")
    norm_axis(a["axis"], y.rank)
    return [y]


register(OpDef(
    "softmax_grad", ("y", "dy"), (Attr("axis", "int", -1),), _softmax_grad_infer,
    doc="y·(dy − Σ_axis y·dy), reading the softmax's output y",
    cost=lambda node, ins, outs: Cost().add("softmax", 4 * numel(outs[0])),  # y·dy, sum, subtract, ·y
    receptive=rf_along(lambda a, rank: a["axis"]), classes=BACKWARD, na=NA,
))


def _mask_grad_infer(a, ts):
    (dy,) = ts
    need_float(dy, "gradient")
    if dy.rank < 2:
        raise ShapeError(f"expects scores' gradient [..., T, S], got {dy}")
    return [dy]


register(OpDef(
    "causal_mask_grad", ("dy",), (Attr("window", "posint", None),), _mask_grad_infer,
    doc="dy with the entries causal_mask hid (key j > query i, or j <= i − window) set to 0",
    cost=free, receptive=RF_POINTWISE, classes=BACKWARD, na=NA,
))


# -- norms ------------------------------------------------------------------------------------


def norm_grad_results(attrs: dict[str, Any]) -> tuple[str, ...]:
    """The input, then each parameter of a layernorm (or rmsnorm) with these attributes."""
    names = ["x"]
    if attrs.get("affine"):
        names.append("gain")
        if attrs.get("bias", False):
            names.append("bias")
    return tuple(names)


def _norm_grad_infer(forward_infer, params):
    def infer(a, ts):
        x, dy = ts
        _need_same(x, dy)
        forward_infer(a, [x])
        shapes = params(a, [x])
        return [x] + [TensorType(x.dtype, tuple(shapes[p])) for p in norm_grad_results(a)[1:]]
    return infer


def _norm_grad_cost(recompute: int, combine: int):
    """Recompute x̂ (``recompute`` per element), dx from dx̂ (``combine``), dx̂ = dy·gain (1), dgain += dy·x̂ (2),
    dbias += dy (1)."""
    def cost(node, ins, outs) -> Cost:
        a = node.attrs
        per = recompute + combine + 3 * bool(a.get("affine")) + bool(a.get("affine") and a.get("bias", False))
        return Cost().add("norm", per * numel(outs[0]))
    return cost


def _ln_results(a) -> tuple[str, ...]:
    return tuple(f"d{n}" for n in norm_grad_results(a))


def _rms_attrs(a) -> dict[str, Any]:
    return {**a, "bias": False}


register(OpDef(
    "layernorm_grad", ("x", "dy"),
    (Attr("eps", "float", 1e-5), Attr("affine", "bool", True), Attr("bias", "bool", True), Attr("axis", "int", None)),
    _norm_grad_infer(_ln_infer, _ln_params), _ln_params, results=_ln_results,
    doc="(dx, dgain, dbias) of layernorm: dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))/σ along its axis",
    cost=_norm_grad_cost(5, 6), init=lambda a: NORM_INIT,
    receptive=rf_along(lambda a, rank: layernorm_axis(a, rank)), classes=BACKWARD, na=NA,
))

register(OpDef(
    "rmsnorm_grad", ("x", "dy"), (Attr("eps", "float", 1e-6), Attr("affine", "bool", True)),
    _norm_grad_infer(_same, _rms_params), _rms_params, results=lambda a: _ln_results(_rms_attrs(a)),
    doc="(dx, dgain) of rmsnorm: dx = (dx̂ − x̂·mean(dx̂·x̂))/rms over the last axis",
    cost=_norm_grad_cost(3, 5), init=lambda a: NORM_INIT,
    receptive=rf_along(lambda a, rank: rank - 1), classes=BACKWARD, na=NA,
))


# -- tables -----------------------------------------------------------------------------------


def _emb_grad_infer(a, ts):
    ids, dy = ts
    need_float(dy, "gradient")
    if ids.is_float or dy.rank != ids.rank + 1 or any(x != y for x, y in zip(ids.shape, dy.shape)):
        raise ShapeError(f"expects integer token ids and a gradient of their shape plus a feature axis, got {ids} "
                         f"and {dy}")
    return [TensorType(dy.dtype, (a["vocab"], dy.shape[-1]))]


register(OpDef(
    "embedding_grad", ("ids", "dy"), (Attr("vocab", "posint"),), _emb_grad_infer,
    doc="the table's gradient [vocab, D]: row v is Σ of dy over the positions whose id is v (scatter-add)",
    cost=lambda node, ins, outs: Cost().add("elementwise", numel(ins[1])), receptive=_RF, classes=BACKWARD, na=NA,
))


def _pos_grad_infer(a, ts):
    (dy,) = ts
    need_float(dy, "gradient")
    t: Dim = dy.shape[1] if dy.rank == 3 else 0
    if dy.rank != 3 or (isinstance(t, int) and t > a["max_len"]):
        raise ShapeError(f"expects the gradient of [B, T, D] with T at most max_len={a['max_len']}, got {dy}")
    return [TensorType(dy.dtype, (a["max_len"], dy.shape[2]))]


register(OpDef(
    "position_grad", ("dy",), (Attr("max_len", "posint"),), _pos_grad_infer,
    doc="a learned position table's gradient [max_len, D]: row t < T is Σ_batch dy[:, t], the rest 0",
    cost=lambda node, ins, outs: Cost().add("elementwise", numel(ins[0])), receptive=_RF, classes=BACKWARD, na=NA,
))


# -- losses -----------------------------------------------------------------------------------


def _need_seed(ts: list[TensorType]) -> None:
    if len(ts) > 2 and ts[2].rank != 0:
        raise ShapeError(f"the loss's gradient must be a scalar, got {ts[2]}")


def _ce_grad_infer(a, ts):
    check_targets(ts[0], ts[1])
    _need_seed(ts)
    return [ts[0]]


register(OpDef(
    "cross_entropy_grad", ("logits", "targets", "dloss?"), (Attr("ignore_index", "int", -100),), _ce_grad_infer,
    doc="(softmax(logits) − onehot(target))·dloss/N on rows whose target is kept (N of them), 0 on ignored rows",
    # softmax again (5), subtract the one-hot and scale (2) per logit
    cost=lambda node, ins, outs: Cost().add("softmax", SOFTMAX_PER_ELEMENT * numel(ins[0]))
    .add("elementwise", 2 * numel(ins[0])),
    receptive=_RF, classes=BACKWARD, na=NA,
))


def _mse_grad_infer(a, ts):
    from irc.ops.losses import _mse_infer

    _mse_infer(a, ts[:2])
    _need_seed(ts)
    return [ts[0]]


register(OpDef(
    "mse_grad", ("pred", "target", "dloss?"), (), _mse_grad_infer,
    doc="2·(pred − target)·dloss/N, N the number of elements (the target's gradient is its negation)",
    cost=lambda node, ins, outs: Cost().add("elementwise", 2 * numel(ins[0])),  # subtract, scale
    receptive=_RF, classes=BACKWARD, na=NA,
))


# -- T5's relative-position table ----------------------------------------------------------------


def _rel_grad_infer(a, ts):
    (dy,) = ts
    need_float(dy, "gradient")
    if dy.rank != 4 or dy.shape[0] != 1:
        raise ShapeError(f"expects the gradient of a bias [1, heads, T, S], got {dy}")
    return [TensorType(dy.dtype, (a["buckets"], dy.shape[1]))]


register(OpDef(
    "rel_position_bias_grad", ("dy",),
    (Attr("buckets", "posint", 32), Attr("max_distance", "posint", 128), Attr("bidirectional", "bool", True)),
    _rel_grad_infer,
    doc="the bucket table's gradient [buckets, heads]: row k is Σ of dy[0, h, i, j] over the pairs whose "
        "relative position j − i falls in bucket k (scatter-add)",
    cost=lambda node, ins, outs: Cost().add("elementwise", numel(ins[0])), receptive=_RF, classes=BACKWARD, na=NA,
))


# -- shape ops, maximum/minimum and RoPE ------------------------------------------------------------


def _slice_grad_infer(a, ts):
    (dy,) = ts
    need_float(dy, "gradient")
    ax = norm_axis(a["axis"], dy.rank)
    end = a["start"] + dy.shape[ax]
    size = a["size"]
    if isinstance(size, int) and isinstance(end, int) and end > size:
        raise ShapeError(f"the gradient {dy} placed at {a['start']} along axis {ax} ends at {end}, past the size "
                         f"{size}")
    return [dy.with_shape(dy.shape[:ax] + (size,) + dy.shape[ax + 1:])]


register(OpDef(
    "slice_grad", ("dy",), (Attr("axis", "int"), Attr("start", "nonneg"), Attr("size", "dim")), _slice_grad_infer,
    doc="the adjoint of slice (and select, split): zeros of `size` along the axis with dy placed at `start`",
    cost=free, receptive=_RF, classes=BACKWARD | {"data_movement"}, na=NA,
))


def _minmax_grad_infer(a, ts):
    x, y, dy = ts
    need_float(dy, "gradient")
    out = broadcast(x, y, "minmax_grad")
    if out.shape != dy.shape:
        raise ShapeError(f"the gradient {dy} does not match the broadcast operands {out}")
    return [dy, dy]


register(OpDef(
    "minmax_grad", ("a", "b", "dy"), (Attr("fn", "enum", choices=("maximum", "minimum")),), _minmax_grad_infer,
    results=("da", "db"),
    doc="(da, db) of maximum/minimum at the broadcast shape: dy where the operand wins, dy/2 to each on a tie",
    # a compare per element, then a select (or halving) per result
    cost=lambda node, ins, outs: Cost().add("elementwise", 3 * numel(outs[0])),
    receptive=RF_POINTWISE, classes=BACKWARD, na=NA,
))


def _rope_grad_infer(a, ts):
    need_float(ts[0], "gradient")
    return _heads_infer(a, ts)


register(OpDef(
    "rope_grad", ("dy",), (Attr("theta", "float", None, doc="default 10000"),), _rope_grad_infer,
    doc="the adjoint of rope: each pair rotated back by its angle, dy·cos − rotate_half(dy)·sin",
    cost=per_element("elementwise", 3), receptive=_RF, classes=BACKWARD, na=NA,
))


# -- training-mode dropout ---------------------------------------------------------------------------


def _dropout_mask_infer(a, ts):
    need_float(ts[0])
    if len(ts) > 1 and (ts[1].is_float or ts[1].rank != 0):
        raise ShapeError(f"the step of a dropout mask is an integer scalar, got {ts[1]}")
    return _dropout_infer(a, ts[:1])  # dropout's rule for p


register(OpDef(
    "dropout_mask", ("x", "step?"), (Attr("p", "float", 0.1), Attr("seed", "int", 0)), _dropout_mask_infer,
    doc="a mask of x's shape: 0 with probability p, else 1/(1 − p), drawn from `seed` (and the integer scalar "
        "`step` when given: a training loop feeds its step, so one compiled graph draws new masks every step; "
        "training-mode dropout is x·dropout_mask(x), so the backward reuses the mask through mul's vjp)",
    cost=lambda node, ins, outs: Cost().add("elementwise", numel(outs[0])),  # a draw and a compare per element
    receptive=rf_reset("a random draw, not a feature map"), classes=frozenset({"primitive"}), na=_NA,
    vjp=vjp_constant,
))
