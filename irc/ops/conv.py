"""Convolution and pooling over channels-first tensors ([B, C, L] and [B, C, H, W])."""

from __future__ import annotations

from fractions import Fraction

from irc.dims import Dim
from irc.ops.common import conv_out, need_float, need_rank, pair
from irc.ops.cost import Cost, numel
from irc.ops.registry import RF_ADAPTIVE, RF_GLOBAL, Attr, OpDef, ShapeError, register, rf_window
from irc.ops.vjps import vjp_window_layer
from irc.types import TensorType


def _padding_total(padding, kernel: int, dilation: int, stride: int) -> int:
    if padding == "valid":
        return 0
    if padding == "same":
        if stride != 1:
            raise ShapeError("padding=same needs stride=1 (as in PyTorch); give an explicit padding")
        return dilation * (kernel - 1)
    return 2 * padding


def _spatial(a, x: TensorType, nd: int, kernel_key: str = "kernel") -> tuple[Dim, ...]:
    ks = pair(a[kernel_key]) if nd == 2 else (a[kernel_key],)
    stride = a["stride"] if a["stride"] is not None else a[kernel_key]
    ss = pair(stride) if nd == 2 else (stride,)
    dil = a.get("dilation", 1)
    ds = pair(dil) if nd == 2 else (dil,)
    pads = a["padding"]
    ps = pair(pads) if (nd == 2 and not isinstance(pads, str)) else ((pads,) * nd)
    out = []
    for i in range(nd):
        total = _padding_total(ps[i], ks[i], ds[i], ss[i])
        out.append(conv_out(x.shape[2 + i], ks[i], ss[i], total, ds[i]))
    return tuple(out)


def _conv_infer(nd):
    def infer(a, ts):
        (x,) = ts
        need_rank(x, (nd + 2,), "an input [B, C, " + ("L]" if nd == 1 else "H, W]"))
        need_float(x)
        c = x.shape[1]
        g = a["groups"]
        if isinstance(c, int) and c % g:
            raise ShapeError(f"input channels {c} are not divisible by groups={g}")
        if a["out"] % g if isinstance(a["out"], int) else False:
            raise ShapeError(f"output channels {a['out']} are not divisible by groups={g}")
        return [x.with_shape((x.shape[0], a["out"]) + _spatial(a, x, nd))]
    return infer


def _conv_params(nd):
    def params(a, ts):
        c = ts[0].shape[1]
        ks = pair(a["kernel"]) if nd == 2 else (a["kernel"],)
        cin = c // a["groups"] if isinstance(c, int) else c
        p: dict[str, tuple[Dim, ...]] = {"weight": (a["out"], cin) + ks}
        if a["bias"]:
            p["bias"] = (a["out"],)
        return p
    return params


def _taps(a, nd: int) -> int:
    k = pair(a["kernel"]) if nd == 2 else (a["kernel"],)
    out = 1
    for v in k:
        out *= v
    return out


def _conv_cost(nd):
    def cost(node, ins, outs) -> Cost:
        y = outs[0]
        cin = ins[0].shape[1] // node.attrs["groups"]
        c = Cost().mac("linear", numel(y) * cin * _taps(node.attrs, nd))
        return c.add("elementwise", numel(y) if node.attrs["bias"] else 0)
    return cost


def _pool_cost(nd):
    def cost(node, ins, outs) -> Cost:
        return Cost().add("pool", numel(outs[0]) * _taps(node.attrs, nd))  # a compare or add per tap
    return cost


def _bin_total(size: int, out: int) -> int:
    """Sum of PyTorch adaptive-pool bin widths along one axis."""
    return sum(-((-(i + 1) * size) // out) - (i * size) // out for i in range(out))


def _adaptive_cost(node, ins, outs) -> Cost:
    x = ins[0]
    oh, ow = pair(node.attrs["size"])
    return Cost().add("pool", x.shape[0] * x.shape[1] * _bin_total(x.shape[2], oh) * _bin_total(x.shape[3], ow))


def _tconv_window(nd: int):
    """An output position of a transposed convolution gathers the inputs i with o + p − t·d = i·s: a span
    of ceil((d·(k − 1) + 1)/s) inputs, and neighbouring outputs are 1/s input pixels apart."""
    def step(a) -> tuple[tuple[int, ...], tuple[Fraction, ...]]:
        per = (lambda v: pair(v)) if nd == 2 else (lambda v: (v,))
        ks, ss, ds = per(a["kernel"]), per(a["stride"]), per(a["dilation"])
        spans = tuple(-(-(d * (k - 1) + 1) // s) for k, s, d in zip(ks, ss, ds))
        return spans, tuple(Fraction(1, s) for s in ss)
    return step


for _nd in (1, 2):
    _k = "pair" if _nd == 2 else "posint"
    register(OpDef(
        f"conv{_nd}d", ("x",),
        (
            Attr("out", "posint", doc="output channels"),
            Attr("kernel", _k),
            Attr("stride", _k, 1),
            Attr("padding", "pair_or_enum" if _nd == 2 else "int_or_enum", 0, ("same", "valid")),
            Attr("dilation", _k, 1),
            Attr("groups", "posint", 1),
            Attr("bias", "bool", True),
        ),
        _conv_infer(_nd), _conv_params(_nd),
        doc=f"{_nd}-D convolution, weight [out, in/groups, k...] (PyTorch layout)",
        cost=_conv_cost(_nd), init=lambda a: {"weight": "fan", "bias": "zeros"}, receptive=rf_window(_nd),
        classes=frozenset({"conv", "window"} | ({"position"} if _nd == 1 else set())), depth=1, vjp=vjp_window_layer,
    ))


def _pool_infer(nd):
    def infer(a, ts):
        (x,) = ts
        need_rank(x, (nd + 2,), "an input [B, C, " + ("L]" if nd == 1 else "H, W]"))
        need_float(x)
        ks = pair(a["kernel"]) if nd == 2 else (a["kernel"],)
        pads = pair(a["padding"]) if nd == 2 else (a["padding"],)
        for k, p in zip(ks, pads):
            if 2 * p > k:
                raise ShapeError(f"padding {p} must be at most half the kernel {k}")
        return [x.with_shape(x.shape[:2] + _spatial(a, x, nd))]
    return infer


for _nd in (1, 2):
    _k = "pair" if _nd == 2 else "posint"
    _pad = "pair_nonneg" if _nd == 2 else "nonneg"
    register(OpDef(
        f"maxpool{_nd}d", ("x",),
        (Attr("kernel", _k), Attr("stride", _k, None), Attr("padding", _pad, 0), Attr("dilation", _k, 1)),
        _pool_infer(_nd), doc=f"{_nd}-D max pooling (stride defaults to the kernel)",
        cost=_pool_cost(_nd), receptive=rf_window(_nd), classes=frozenset({"pool", "window"}), vjp=vjp_window_layer,
    ))
    register(OpDef(
        f"avgpool{_nd}d", ("x",),
        (Attr("kernel", _k), Attr("stride", _k, None), Attr("padding", _pad, 0),
         Attr("count_include_pad", "bool", True)),
        _pool_infer(_nd), doc=f"{_nd}-D average pooling (stride defaults to the kernel)",
        cost=_pool_cost(_nd), receptive=rf_window(_nd), classes=frozenset({"pool", "window"}), vjp=vjp_window_layer,
    ))


def _gap_infer(a, ts):
    (x,) = ts
    need_rank(x, 3, "an input [B, C, spatial...]")
    need_float(x)
    return [x.with_shape(x.shape[:2])]


register(OpDef("global_avgpool", ("x",), (), _gap_infer, aliases=("gap",),
               doc="mean over every spatial axis: [B, C, ...] → [B, C]",
               cost=lambda node, ins, outs: Cost().add("pool", numel(ins[0])), receptive=RF_GLOBAL,
               classes=frozenset({"pool"}), vjp=vjp_window_layer))


def _adaptive_infer(a, ts):
    (x,) = ts
    need_rank(x, (4,), "an input [B, C, H, W]")
    need_float(x)
    oh, ow = pair(a["size"])
    return [x.with_shape(x.shape[:2] + (oh, ow))]


register(OpDef("adaptive_avgpool2d", ("x",), (Attr("size", "pair"),), _adaptive_infer,
               doc="average pooling to a fixed output size (PyTorch's bin edges)",
               cost=_adaptive_cost, receptive=RF_ADAPTIVE, classes=frozenset({"pool", "window"}),
               vjp=vjp_window_layer))


# -- transposed convolution (torch.nn.ConvTranspose{1,2}d) ------------------------------------------


def _geometry(a, nd: int) -> tuple[tuple[int, ...], ...]:
    """kernel, stride, padding, output_padding, dilation: one value per spatial axis."""
    keys = ("kernel", "stride", "padding", "output_padding", "dilation")
    return tuple(pair(a[k]) if nd == 2 else (a[k],) for k in keys)


def transposed_size(size: Dim, k: int, s: int, p: int, op: int, d: int) -> Dim:
    """(size − 1)·s − 2·p + d·(k − 1) + output_padding + 1, PyTorch's ConvTranspose output size."""
    return (size - 1) * s - 2 * p + d * (k - 1) + op + 1


def _tconv_infer(nd: int):
    def infer(a, ts):
        (x,) = ts
        need_rank(x, (nd + 2,), "an input [B, C, " + ("L]" if nd == 1 else "H, W]"))
        need_float(x)
        c, g = x.shape[1], a["groups"]
        bad = [(what, n) for what, n in (("input", c), ("output", a["out"])) if isinstance(n, int) and n % g]
        if bad:
            raise ShapeError(f"{bad[0][0]} channels {bad[0][1]} are not divisible by groups={g}")
        out: list[Dim] = []
        for i, (k, s, p, op, d) in enumerate(zip(*_geometry(a, nd))):
            size = transposed_size(x.shape[2 + i], k, s, p, op, d)
            if op >= max(s, d) or (isinstance(size, int) and size < 1):
                problem = (f"output_padding {op} must be smaller than stride {s} or dilation {d}"
                           if op >= max(s, d) else f"the output would have size {size}")
                raise ShapeError(f"{problem} (axis {2 + i} of {x}: (in − 1)·stride − 2·padding + "
                                 "dilation·(kernel − 1) + output_padding + 1, as in PyTorch)")
            out.append(size)
        return [x.with_shape((x.shape[0], a["out"]) + tuple(out))]
    return infer


def _tconv_params(nd: int):
    def params(a, ts):
        c = ts[0].shape[1]
        p: dict[str, tuple[Dim, ...]] = {"weight": (c, a["out"] // a["groups"]) + _geometry(a, nd)[0]}
        if a["bias"]:
            p["bias"] = (a["out"],)
        return p
    return params


def _tconv_cost(nd: int):
    def cost(node, ins, outs) -> Cost:
        # each input element scatters into out/groups channels × every tap (fvcore's and
        # torch.utils.flop_counter's count: batch · prod(weight) · prod(input spatial))
        per = node.attrs["out"] // node.attrs["groups"] * _taps(node.attrs, nd)
        c = Cost().mac("linear", numel(ins[0]) * per)
        return c.add("elementwise", numel(outs[0]) if node.attrs["bias"] else 0)
    return cost


for _nd in (1, 2):
    _k = "pair" if _nd == 2 else "posint"
    _pad = "pair_nonneg" if _nd == 2 else "nonneg"
    register(OpDef(
        f"conv_transpose{_nd}d", ("x",),
        (
            Attr("out", "posint", doc="output channels"),
            Attr("kernel", _k),
            Attr("stride", _k, 1),
            Attr("padding", _pad, 0, doc="removed from each side of the full output"),
            Attr("output_padding", _pad, 0, doc="added to one side (the end) of the output"),
            Attr("dilation", _k, 1),
            Attr("groups", "posint", 1),
            Attr("bias", "bool", True),
        ),
        _tconv_infer(_nd), _tconv_params(_nd),
        doc=f"{_nd}-D transposed convolution (the gradient of conv{_nd}d), weight [in, out/groups, k...] "
            "(PyTorch layout)",
        # fan: the weight's axis 1 (out/groups) times the taps is fan_in, as torch's
        # _calculate_fan_in_and_fan_out reads the transposed layout
        cost=_tconv_cost(_nd), init=lambda a: {"weight": "fan", "bias": "zeros"},
        receptive=rf_window(_nd, _tconv_window(_nd)),
        classes=frozenset({"conv", "window"}), depth=1, vjp=vjp_window_layer,
    ))
