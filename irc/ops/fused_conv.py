"""The fused convolution the ``fold-bn`` pass builds: conv2d → inference BatchNorm (→ + residual) (→ ReLU).

Its weights are operands (``param`` values, as after ``decompose``): the convolution's weight and the
BatchNorm's gain, bias, running mean and running variance, keys unchanged. The op means exactly the
unfused chain; a backend folds the statistics into the weights once, at load:
``s = gain / sqrt(var + eps)``, ``w' = w · s`` (per output channel), ``b' = bias − mean · s``, and runs
``act(conv(x, w') + b' [+ res])`` with bias, residual and activation as the GEMM's epilogue.
"""

from __future__ import annotations

from irc.ops.common import need_float, need_rank, pair, same_dim
from irc.ops.conv import _spatial
from irc.ops.cost import Cost, numel
from irc.ops.registry import Attr, OpDef, ShapeError, register, rf_window
from irc.ops.vjps import GRAD_FUSED

FUSED_ACTS = ("none", "relu")


def _conv_bn_infer(a, ts):
    x, w, *stats = ts[:6]
    need_rank(x, (4,), "an input [B, C, H, W]")
    need_float(x)
    need_rank(w, (4,), "a weight [out, in/groups, kh, kw]")
    kh, kw = pair(a["kernel"])
    groups = a["groups"]
    c = x.shape[1]
    if isinstance(c, int) and c % groups:
        raise ShapeError(f"input channels {c} are not divisible by groups={groups}")
    if isinstance(a["out"], int) and a["out"] % groups:
        raise ShapeError(f"output channels {a['out']} are not divisible by groups={groups}")
    cin = c // groups if isinstance(c, int) else w.shape[1]
    want = (a["out"], cin, kh, kw)
    for got, expect in zip(w.shape, want):
        same_dim(got, expect, f"weight {w} does not match out={a['out']}, kernel={kh}×{kw} and {c} input "
                              f"channels in {groups} group(s)")
    for name, t in zip(("gain", "bias", "running mean", "running variance"), stats):
        need_rank(t, (1,), f"a BatchNorm {name} [out]")
        same_dim(t.shape[0], a["out"], f"BatchNorm {name} {t} does not match out={a['out']}")
    y = x.with_shape((x.shape[0], a["out"]) + _spatial(a, x, 2))
    if len(ts) > 6:
        res = ts[6]
        if res.shape != y.shape:
            raise ShapeError(f"the residual {res} must have the result's shape {y} (no broadcasting)")
    return [y]


def _conv_bn_cost(node, ins, outs) -> Cost:
    """What runs once the statistics are folded: the convolution's MACs, the bias (1 per element), the
    residual add (1) and the activation (1)."""
    y = outs[0]
    kh, kw = pair(node.attrs["kernel"])
    c = Cost().mac("linear", numel(y) * (ins[0].shape[1] // node.attrs["groups"]) * kh * kw)
    c.add("elementwise", numel(y) * (2 if len(ins) > 6 else 1))
    return c.add("activation", numel(y) if node.attrs["act"] != "none" else 0)


register(OpDef(
    "conv2d_bn", ("x", "w", "gain", "bias", "mean", "var", "res?"),
    (
        Attr("out", "posint", doc="output channels"),
        Attr("kernel", "pair"),
        Attr("stride", "pair", 1),
        Attr("padding", "pair_or_enum", 0, ("same", "valid")),
        Attr("dilation", "pair", 1),
        Attr("groups", "posint", 1),
        Attr("eps", "float", 1e-5, doc="the BatchNorm's eps"),
        Attr("act", "enum", "none", FUSED_ACTS, doc="applied after the residual add"),
    ),
    _conv_bn_infer,
    doc="act(batchnorm(conv2d(x, w); gain, bias, mean, var) [+ res]): inference BatchNorm folded into the "
        "convolution's weights and bias at load, residual and activation as its epilogue",
    cost=_conv_bn_cost, receptive=rf_window(2),
    classes=frozenset({"fused", "conv", "window", "batch_norm", "residual"}), depth=1,
    na={"grad": GRAD_FUSED,
        "cuda": "made only by the fold-bn pass of the CPU pipeline; CUDA renders fuse's graph, where conv2d and "
                "batchnorm stay apart"},
))
