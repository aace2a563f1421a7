"""Convolution and pooling over channels-first tensors ([B, C, L] and [B, C, H, W])."""

from __future__ import annotations

from irc.dims import Dim
from irc.ops.common import conv_out, need_float, need_rank, pair
from irc.ops.registry import Attr, OpDef, ShapeError, register
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
    ))
    register(OpDef(
        f"avgpool{_nd}d", ("x",),
        (Attr("kernel", _k), Attr("stride", _k, None), Attr("padding", _pad, 0),
         Attr("count_include_pad", "bool", True)),
        _pool_infer(_nd), doc=f"{_nd}-D average pooling (stride defaults to the kernel)",
    ))


def _gap_infer(a, ts):
    (x,) = ts
    need_rank(x, 3, "an input [B, C, spatial...]")
    need_float(x)
    return [x.with_shape(x.shape[:2])]


register(OpDef("global_avgpool", ("x",), (), _gap_infer, aliases=("gap",),
               doc="mean over every spatial axis: [B, C, ...] → [B, C]"))


def _adaptive_infer(a, ts):
    (x,) = ts
    need_rank(x, (4,), "an input [B, C, H, W]")
    need_float(x)
    oh, ow = pair(a["size"])
    return [x.with_shape(x.shape[:2] + (oh, ow))]


register(OpDef("adaptive_avgpool2d", ("x",), (Attr("size", "pair"),), _adaptive_infer,
               doc="average pooling to a fixed output size (PyTorch's bin edges)"))
