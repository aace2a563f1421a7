"""Normalisation layers: LayerNorm and RMSNorm (per token, or LayerNorm over any one axis), GroupNorm and
InstanceNorm (per sample, over channel groups and the spatial axes) and BatchNorm (per channel)."""

from __future__ import annotations

from irc.ops.common import need_float, need_rank, norm_axis
from irc.ops.cost import Cost, numel
from irc.ops.registry import RF_LAST_AXIS, RF_POINTWISE, Attr, OpDef, ShapeError, register, rf_along
from irc.ops.vjps import vjp_batchnorm, vjp_layernorm, vjp_rmsnorm, vjp_window_layer

NORM_INIT = {"gain": "ones", "bias": "zeros", "running_mean": "zeros", "running_var": "ones"}


def layernorm_cost(a, ins, outs) -> Cost:
    # mean (1), centre (1), square and accumulate (2), scale by 1/std (1), then gain and bias
    per = 5 + (a["affine"] + (a["affine"] and a["bias"]))
    return Cost().add("norm", per * numel(outs[0]))


def rmsnorm_cost(a, ins, outs) -> Cost:
    per = 3 + a["affine"]  # square and accumulate (2), scale (1), gain
    return Cost().add("norm", per * numel(outs[0]))


def _same(a, ts):
    need_rank(ts[0], 1, "an input")
    need_float(ts[0])
    if a["eps"] <= 0:
        raise ShapeError(f"eps must be positive, got {a['eps']}")
    return [ts[0]]


def layernorm_axis(a, rank: int) -> int:
    """The axis a LayerNorm normalises: ``axis`` (None: the last, the per-token norm of transformers)."""
    axis = a.get("axis")
    return rank - 1 if axis is None else norm_axis(axis, rank)


def _ln_infer(a, ts):
    out = _same(a, ts)
    layernorm_axis(a, ts[0].rank)  # a ShapeError for an axis out of range
    return out


def _ln_params(a, ts):
    d = ts[0].shape[layernorm_axis(a, ts[0].rank)]
    if not a["affine"]:
        return {}
    return {"gain": (d,), "bias": (d,)} if a["bias"] else {"gain": (d,)}


register(OpDef(
    "layernorm", ("x",),
    (Attr("eps", "float", 1e-5), Attr("affine", "bool", True), Attr("bias", "bool", True),
     # None (the default, omitted from dumps) is the last axis; axis=1 on [B, C, H, W] is ConvNeXt's
     # channels-first LayerNorm: statistics over C at each position, gain and bias of size C
     Attr("axis", "int", None)),
    _ln_infer, _ln_params, doc="(x − mean)/sqrt(var + eps)·gain + bias over one axis (the last by default)",
    cost=lambda node, ins, outs: layernorm_cost(node.attrs, ins, outs), init=lambda a: NORM_INIT,
    # it mixes along its axis only: the field survives unless that axis is spatial
    receptive=rf_along(lambda a, rank: a["axis"] if a.get("axis") is not None else rank - 1),
    classes=frozenset({"norm"}), vjp=vjp_layernorm,
))


def _rms_params(a, ts):
    return {"gain": (ts[0].shape[-1],)} if a["affine"] else {}


register(OpDef(
    "rmsnorm", ("x",), (Attr("eps", "float", 1e-6), Attr("affine", "bool", True)),
    _same, _rms_params, doc="x/sqrt(mean(x²) + eps)·gain over the last axis",
    cost=lambda node, ins, outs: rmsnorm_cost(node.attrs, ins, outs), init=lambda a: NORM_INIT,
    receptive=RF_LAST_AXIS, classes=frozenset({"norm"}), vjp=vjp_rmsnorm,
))


def _bn_infer(a, ts):
    need_rank(ts[0], 2, "an input [B, C, ...]")
    norm_axis(a["axis"], ts[0].rank)
    out = _same(a, ts)
    if not a.get("train"):
        return out
    stats = ts[0].with_shape(_bn_channels(a, ts))
    return out + [stats, stats]  # the batch mean and (unbiased) variance the running averages take in


def batchnorm_cost(node, ins, outs) -> Cost:
    """Inference: one scale and shift per element (the statistics fold). Training: the batch statistics too,
    as LayerNorm counts them (mean, centre, square and accumulate, scale: 5), then gain and bias (2)."""
    return Cost().add("norm", (7 if node.attrs.get("train") else 2) * numel(outs[0]))


def _bn_channels(a, ts):
    t = ts[0]
    return (t.shape[norm_axis(a["axis"], t.rank)],)


register(OpDef(
    "batchnorm", ("x",),
    (Attr("eps", "float", 1e-5), Attr("momentum", "float", 0.1), Attr("axis", "int", 1),
     # training (set by a training driver, irc/ops/grad_train.py): normalise with this batch's statistics and
     # return them (mean, unbiased variance) for the running-average update, which is not differentiated
     Attr("train", "bool", None, doc="training mode: batch statistics, also returned")),
    _bn_infer,
    lambda a, ts: {"gain": _bn_channels(a, ts), "bias": _bn_channels(a, ts)},
    buffers=lambda a, ts: {"running_mean": _bn_channels(a, ts), "running_var": _bn_channels(a, ts)},
    results=lambda a: ("out", "batch_mean", "batch_var") if a.get("train") else ("out",),
    doc="per-channel normalisation with running statistics (eval mode at inference), or with the batch's "
        "(train=true)",
    # inference: the statistics fold into one scale and shift per channel, pointwise everywhere (training:
    # per-channel batch statistics, pointwise for the same reason as GroupNorm's below)
    cost=batchnorm_cost, init=lambda a: NORM_INIT,
    receptive=RF_POINTWISE, classes=frozenset({"batch_norm"}), vjp=vjp_batchnorm,
))


# -- GroupNorm and InstanceNorm: per-sample statistics over channel groups and the spatial axes -----
#
# Cost: LayerNorm's per-element count (mean, centre, square and accumulate, scale: 5), plus gain and
# bias (2) when affine; the statistics are per (sample, group) instead of per token, the work per
# element is the same.
#
# Receptive field: pointwise, on purpose. Each output does depend on every position of its sample
# (through one mean and one variance per group), but that dependence is a per-sample scalar, like the
# scale of a squeeze-excitation block (x · sigmoid(pool(x)), where the pass keeps x's field too): it
# rescales the map without moving or widening any output's window. Declaring it global would end the
# map here (the pass has no "everything" value), and the next convolution would restart at r = 1,
# reporting a U-Net's or a ConvNeXt's field as that of its last few layers. BatchNorm at inference
# and LayerNorm over channels keep the field for the same reason.


def groupnorm_cost(a, ins, outs) -> Cost:
    return Cost().add("norm", (5 + 2 * bool(a["affine"])) * numel(outs[0]))


def _channels(a, ts) -> dict[str, tuple]:
    c = ts[0].shape[1]
    return {"gain": (c,), "bias": (c,)} if a["affine"] else {}


def _gn_infer(a, ts):
    need_rank(ts[0], 2, "an input [B, C, ...]")
    out = _same(a, ts)
    c, g = ts[0].shape[1], a["groups"]
    if not isinstance(c, int):
        raise ShapeError(f"needs a known channel count to split into {g} groups, got {ts[0]}")
    if c % g:
        raise ShapeError(f"{c} channels do not split into {g} groups (C % groups must be 0), got {ts[0]}")
    return out


register(OpDef(
    "groupnorm", ("x",),
    (Attr("groups", "posint"), Attr("eps", "float", 1e-5), Attr("affine", "bool", True)),
    _gn_infer, _channels,
    doc="per sample, (x − mean)/sqrt(var + eps) over each group of C/groups channels and every spatial "
        "position, then gain and bias per channel (nn.GroupNorm)",
    cost=lambda node, ins, outs: groupnorm_cost(node.attrs, ins, outs), init=lambda a: NORM_INIT,
    receptive=RF_POINTWISE, classes=frozenset({"norm"}), vjp=vjp_window_layer,
))


def _in_infer(a, ts):
    need_rank(ts[0], 3, "an input [B, C, spatial...]")
    return _same(a, ts)


register(OpDef(
    "instancenorm", ("x",), (Attr("eps", "float", 1e-5), Attr("affine", "bool", False)),
    _in_infer, _channels,
    doc="per sample and channel, (x − mean)/sqrt(var + eps) over the spatial axes, then optional gain and "
        "bias per channel (nn.InstanceNorm2d without running statistics)",
    cost=lambda node, ins, outs: groupnorm_cost(node.attrs, ins, outs), init=lambda a: NORM_INIT,
    receptive=RF_POINTWISE, classes=frozenset({"norm"}), vjp=vjp_window_layer,
))
