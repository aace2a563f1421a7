"""Normalisation layers: LayerNorm and RMSNorm (per token) and BatchNorm (per channel)."""

from __future__ import annotations

from irc.ops.common import need_float, need_rank, norm_axis
from irc.ops.registry import Attr, OpDef, ShapeError, register


def _same(a, ts):
    need_rank(ts[0], 1, "an input")
    need_float(ts[0])
    if a["eps"] <= 0:
        raise ShapeError(f"eps must be positive, got {a['eps']}")
    return [ts[0]]


def _ln_params(a, ts):
    d = ts[0].shape[-1]
    if not a["affine"]:
        return {}
    return {"gain": (d,), "bias": (d,)} if a["bias"] else {"gain": (d,)}


register(OpDef(
    "layernorm", ("x",),
    (Attr("eps", "float", 1e-5), Attr("affine", "bool", True), Attr("bias", "bool", True)),
    _same, _ln_params, doc="(x − mean)/sqrt(var + eps)·gain + bias over the last axis",
))


def _rms_params(a, ts):
    return {"gain": (ts[0].shape[-1],)} if a["affine"] else {}


register(OpDef(
    "rmsnorm", ("x",), (Attr("eps", "float", 1e-6), Attr("affine", "bool", True)),
    _same, _rms_params, doc="x/sqrt(mean(x²) + eps)·gain over the last axis",
))


def _bn_infer(a, ts):
    need_rank(ts[0], 2, "an input [B, C, ...]")
    norm_axis(a["axis"], ts[0].rank)
    return _same(a, ts)


def _bn_channels(a, ts):
    t = ts[0]
    return (t.shape[norm_axis(a["axis"], t.rank)],)


register(OpDef(
    "batchnorm", ("x",),
    (Attr("eps", "float", 1e-5), Attr("momentum", "float", 0.1), Attr("axis", "int", 1)),
    _bn_infer,
    lambda a, ts: {"gain": _bn_channels(a, ts), "bias": _bn_channels(a, ts)},
    buffers=lambda a, ts: {"running_mean": _bn_channels(a, ts), "running_var": _bn_channels(a, ts)},
    doc="per-channel normalisation with running statistics (eval mode at inference)",
))
