"""The fused convolution the ``fold-bn`` pass builds: conv2d → inference BatchNorm (→ + residual) (→ ReLU)
(→ max pool).

Its weights are operands (``param`` values, as after ``decompose``): the convolution's weight and the
BatchNorm's gain, bias, running mean and running variance, keys unchanged. The op means exactly the
unfused chain; a backend folds the statistics into the weights once, at load:
``s = gain / sqrt(var + eps)``, ``w' = w · s`` (per output channel), ``b' = bias − mean · s``, and runs
``act(conv(x, w') + b' [+ res])`` with bias, residual and activation as the GEMM's epilogue. With ``pool``
set, a max pool (kernel ``pool``, stride ``pool_stride`` or the kernel, padding ``pool_padding``, dilation 1)
follows: ResNet's stem, whose full-size activation (25.7 MB at B = 8) need then never be written out.
"""

from __future__ import annotations

from fractions import Fraction

from irc.ops.common import need_float, need_rank, pair, same_dim
from irc.ops.conv import _spatial
from irc.ops.cost import Cost, numel
from irc.ops.registry import Attr, OpDef, ShapeError, register, rf_window
from irc.ops.vjps import GRAD_FUSED
from irc.types import TensorType

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
            raise ShapeError(f"the residual {res} must have the convolution's shape {y} (no broadcasting)")
    if a["pool"] is None:
        if a["pool_stride"] is not None or a["pool_padding"] is not None:
            raise ShapeError("pool_stride and pool_padding need a pool kernel (pool=...)")
        return [y]
    for k, p in zip(pair(a["pool"]), pool_geometry(a)[2]):
        if 2 * p > k:
            raise ShapeError(f"pool padding {p} must be at most half the pool kernel {k}")
    return [y.with_shape(y.shape[:2] + _spatial(_pool_attrs(a), y, 2))]


def conv_result(a, ts) -> TensorType:
    """The type of a conv2d_bn's convolution before its pool (its residual's type)."""
    return _conv_bn_infer({**a, "pool": None, "pool_stride": None, "pool_padding": None}, ts)[0]


def _pool_attrs(a) -> dict:
    """The max pool's attributes as maxpool2d names them."""
    return {"kernel": a["pool"], "stride": a["pool_stride"], "padding": a["pool_padding"] or 0, "dilation": 1}


def pool_geometry(a) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(kernel, stride, padding) of a conv2d_bn's max pool, each (rows, columns); kernel (1, 1) when none."""
    if a["pool"] is None:
        return (1, 1), (1, 1), (0, 0)
    k = pair(a["pool"])
    return k, pair(a["pool_stride"]) if a["pool_stride"] is not None else k, pair(a["pool_padding"] or 0)


def _conv_pool_window(a) -> tuple[tuple[int, ...], tuple[Fraction, ...]]:
    """The convolution's window and the pool's after it as one: pool taps k2 at the convolution's stride s1
    widen its span d·(k1 − 1) + 1 by (k2 − 1)·s1, and the strides multiply."""
    (pk, ps, _), ks, ss, ds = pool_geometry(a), pair(a["kernel"]), pair(a["stride"]), pair(a["dilation"])
    spans = tuple(d * (k - 1) + 1 + (q - 1) * s for k, s, d, q in zip(ks, ss, ds, pk))
    return spans, tuple(Fraction(s * t) for s, t in zip(ss, ps))


def _conv_bn_cost(node, ins, outs) -> Cost:
    """What runs once the statistics are folded: the convolution's MACs, the bias (1 per element), the
    residual add (1) and the activation (1), on the convolution's result; then the pool's compare per tap
    of each of its outputs (as maxpool2d counts them)."""
    a = node.attrs
    y = outs[0]
    if a["pool"] is not None:
        y = conv_result(a, ins)
    kh, kw = pair(a["kernel"])
    c = Cost().mac("linear", numel(y) * (ins[0].shape[1] // a["groups"]) * kh * kw)
    c.add("elementwise", numel(y) * (2 if len(ins) > 6 else 1))
    c.add("activation", numel(y) if a["act"] != "none" else 0)
    pk = pool_geometry(a)[0]
    return c.add("pool", numel(outs[0]) * pk[0] * pk[1]) if a["pool"] is not None else c


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
        Attr("pool", "pair", None, doc="a max pool's kernel, applied after the activation (none by default)"),
        Attr("pool_stride", "pair", None, doc="the max pool's stride (its kernel by default)"),
        Attr("pool_padding", "pair_nonneg", None, doc="the max pool's padding, never chosen (0 by default)"),
    ),
    _conv_bn_infer,
    doc="[maxpool](act(batchnorm(conv2d(x, w); gain, bias, mean, var) [+ res])): inference BatchNorm folded into "
        "the convolution's weights and bias at load, residual, activation and max pool as its epilogue",
    cost=_conv_bn_cost, receptive=rf_window(2, _conv_pool_window),
    classes=frozenset({"fused", "conv", "window", "batch_norm", "residual", "pool"}), depth=1,
    na={"grad": GRAD_FUSED,
        "cuda": "made only by the fold-bn pass of the CPU pipeline; CUDA renders fuse's graph, where conv2d and "
                "batchnorm stay apart"},
))
