"""ONNX nodes that are irc layers: their weights are initializers and become the layer's parameters.

Conv → conv1d/conv2d, ConvTranspose → conv_transpose1d/2d, BatchNormalization → batchnorm,
LayerNormalization → layernorm, Gemm and MatMul with an initializer → linear (irc's weight is
[out, in]: an ONNX MatMul initializer [in, out] is transposed, a Gemm's follows transB), the pools.
A bias Add right after a MatMul (how exporters spell ``nn.Linear`` on 3-D inputs) joins the linear.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import Importer, maps
from .values import Act, Const, Value


def _weight(imp: Importer, v: Value | None, what: str) -> Const:
    if not isinstance(v, Const) or v.weight is None and v.symbolic:
        raise imp.unmapped(f"its {what} is computed at run time; irc maps it to a layer only when the {what} is an "
                           "initializer")
    return v


def _pads(imp: Importer, attrs: dict[str, Any], nd: int) -> list[int] | str:
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto == "VALID":
        return [0] * nd
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(s != 1 for s in attrs.get("strides", [1] * nd)):
            raise imp.unmapped(f"auto_pad={auto} with a stride other than 1 pads unevenly, which irc's layers "
                               "cannot express")
        return "same"
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    if pads[:nd] != pads[nd:]:
        raise imp.unmapped(f"its padding {pads} differs between the start and end of an axis; irc pads both sides "
                           "alike (put an explicit Pad in front, or export with symmetric padding)")
    return pads[:nd]


def _geometry(imp: Importer, attrs: dict[str, Any], nd: int, kernel: list[int]) -> dict[str, Any]:
    if list(attrs.get("kernel_shape", kernel)) != list(kernel):
        raise imp.error(f"has kernel_shape {list(attrs['kernel_shape'])} but a weight of kernel {kernel}")
    one = (lambda v: v[0]) if nd == 1 else list
    pads = _pads(imp, attrs, nd)
    return {"kernel": one(kernel), "stride": one(attrs.get("strides", [1] * nd)),
            "padding": pads if isinstance(pads, str) else one(pads),
            "dilation": one(attrs.get("dilations", [1] * nd))}


def _spatial(imp: Importer, x: Value, what: str) -> tuple[Act, int]:
    a = imp.act(x)
    nd = a.type.rank - 2
    if nd not in (1, 2):
        raise imp.unmapped(f"irc's {what} layers are 1-D and 2-D; this one is {nd}-D ({a.type})")
    return a, nd


@maps("Conv")
def conv(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, nd = _spatial(imp, ins[0], "convolution")
    w = _weight(imp, ins[1], "weight")
    b = _weight(imp, ins[2], "bias") if len(ins) > 2 and ins[2] is not None else None
    geo = _geometry(imp, attrs, nd, list(w.shape[2:]))
    params = {"weight": w, **({"bias": b} if b is not None else {})}
    return imp.emit(f"conv{nd}d", [x], {"out": w.shape[0], **geo, "groups": attrs.get("group", 1),
                                       "bias": b is not None}, params)


@maps("ConvTranspose")
def conv_transpose(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, nd = _spatial(imp, ins[0], "transposed-convolution")
    w = _weight(imp, ins[1], "weight")
    b = _weight(imp, ins[2], "bias") if len(ins) > 2 and ins[2] is not None else None
    if "output_shape" in attrs:
        raise imp.unmapped("an explicit output_shape is not read by irc; export with pads and output_padding")
    groups = attrs.get("group", 1)
    geo = _geometry(imp, attrs, nd, list(w.shape[2:]))
    if isinstance(geo["padding"], str):
        raise imp.unmapped("auto_pad on a transposed convolution is not read by irc; give explicit pads")
    one = (lambda v: v[0]) if nd == 1 else list
    params = {"weight": w, **({"bias": b} if b is not None else {})}
    return imp.emit(f"conv_transpose{nd}d", [x], {"out": w.shape[1] * groups, **geo, "groups": groups,
                                                 "output_padding": one(attrs.get("output_padding", [0] * nd)),
                                                 "bias": b is not None}, params)


@maps("BatchNormalization")
def batchnorm(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    if attrs.get("training_mode", 0) or len(n.output) > 1 and any(n.output[1:]):
        raise imp.unmapped("it runs in training mode (batch statistics); export the model in eval mode")
    x = imp.act(ins[0])
    names = ("gain", "bias", "running_mean", "running_var")
    params = {k: _weight(imp, v, k.replace("_", " ")) for k, v in zip(names, ins[1:5])}
    return imp.emit("batchnorm", [x], {"eps": float(attrs.get("epsilon", 1e-5)),
                                       "momentum": 1 - float(attrs.get("momentum", 0.9))}, params)


@maps("LayerNormalization")
def layernorm(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axis = attrs.get("axis", -1)
    if axis % x.type.rank != x.type.rank - 1:
        raise imp.unmapped(f"it normalises over axes {axis}.. of {x.type}; irc's layernorm normalises the last axis")
    if any(o for o in n.output[1:]):
        raise imp.unmapped("it also returns the mean and inverse deviation, which irc's layernorm does not")
    params = {"gain": _weight(imp, ins[1], "scale")}
    if len(ins) > 2 and ins[2] is not None:
        params["bias"] = _weight(imp, ins[2], "bias")
    return imp.emit("layernorm", [x], {"eps": float(attrs.get("epsilon", 1e-5)), "bias": "bias" in params}, params)


def _linear(imp: Importer, x: Act, w: Const, b: Const | None) -> list[Value]:
    """x · wᵀ + b with ``w`` already [out, in]."""
    params = {"weight": w, **({"bias": b} if b is not None else {})}
    return imp.emit("linear", [x], {"out": w.shape[0], "bias": b is not None}, params)


def _plain_weight(v: Value | None) -> bool:
    return isinstance(v, Const) and v.weight is not None and len(v.shape) == 2


@maps("Gemm")
def gemm(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    a, bm = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    x = imp.act(a)
    if attrs.get("transA", 0):
        x = imp.emit("transpose", [x], {"perm": [1, 0]})[0]
    if _plain_weight(bm) and alpha == 1.0 and (c is None or beta == 1.0):
        assert isinstance(bm, Const)
        w = bm if attrs.get("transB", 0) else imp._transposed(bm, (1, 0))
        bias = c if isinstance(c, Const) and c.weight is not None and c.shape == (w.shape[0],) else None
        y = _linear(imp, x, w, bias)[0]
        if c is not None and bias is None:
            y = imp.emit("add", [y, imp.act(c)], {})[0]
        return [y]
    w = imp.act(bm)
    if attrs.get("transB", 0):
        w = imp.emit("transpose", [w], {"perm": [1, 0]})[0]
    y = imp.emit("matmul", [x, w], {})[0]
    if alpha != 1.0:
        y = imp.emit("mul", [y], {"scalar": alpha})[0]
    if c is not None:
        cv = imp.act(c)
        if beta != 1.0:
            cv = imp.emit("mul", [cv], {"scalar": beta})[0]
        y = imp.emit("add", [y, cv], {})[0]
    return [y]


@maps("MatMul")
def matmul(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    a, b = ins
    if isinstance(a, Act) and _plain_weight(b) and a.type.rank >= 1:
        assert isinstance(b, Const)
        return _linear(imp, a, imp._transposed(b, (1, 0)), None)  # ONNX's [in, out] is irc's [out, in]ᵀ
    x, y = imp.act(a), imp.act(b)
    if x.type.rank < 2 or y.type.rank < 2:
        raise imp.unmapped(f"a MatMul of a vector ({x.type} @ {y.type}) is not mapped; irc's matmul takes "
                           "matrices")
    return imp.emit("matmul", [x, y], {})


def fold_bias(imp: Importer, n: Any, ins: list[Value]) -> list[Value] | None:
    """Add(MatMul-linear, bias initializer [out]) → that linear with a bias, when the Add is its only reader."""
    if len(ins) != 2:
        return None
    for y, c in ((ins[0], ins[1]), (ins[1], ins[0])):
        if not isinstance(y, Act) or not isinstance(c, Const) or c.weight is None:
            continue
        node = imp.producers.get(y.value)
        if node is None or node.op != "linear" or node.attrs["bias"] or node.outputs[0] != y.value:
            continue
        src = imp.onnx_names.get(y.value)
        if src is None or imp.uses.get(src, 0) != 1 or c.shape != (node.attrs["out"],):
            continue
        node.attrs["bias"] = True
        imp.sources[f"{node.weights}.bias"] = imp._source(c)
        return [y]
    return None


def _pool_attrs(imp: Importer, attrs: dict[str, Any], nd: int) -> dict[str, Any]:
    if attrs.get("ceil_mode", 0):
        raise imp.unmapped("ceil_mode=1 rounds the output size up, which irc's pools do not")
    kernel = list(attrs["kernel_shape"])
    geo = _geometry(imp, attrs, nd, kernel)
    if isinstance(geo["padding"], str):
        raise imp.unmapped("auto_pad on a pool is not read by irc; give explicit pads")
    return geo


@maps("MaxPool")
def maxpool(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, nd = _spatial(imp, ins[0], "pooling")
    if len(n.output) > 1 and n.output[1]:
        raise imp.unmapped("it also returns the argmax indices, which irc's maxpool does not")
    return imp.emit(f"maxpool{nd}d", [x], _pool_attrs(imp, attrs, nd))


@maps("AveragePool")
def avgpool(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, nd = _spatial(imp, ins[0], "pooling")
    geo = _pool_attrs(imp, attrs, nd)
    geo.pop("dilation")
    if list(attrs.get("dilations", [1] * nd)) != [1] * nd:
        raise imp.unmapped("a dilated average pool is not an irc op")
    return imp.emit(f"avgpool{nd}d", [x], {**geo, "count_include_pad": bool(attrs.get("count_include_pad", 0))})


@maps("GlobalAveragePool")
def global_avgpool(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    if x.type.rank != 4:
        raise imp.unmapped(f"irc's global_avgpool takes [N, C, H, W], not {x.type}")
    pooled = imp.emit("global_avgpool", [x], {})[0]
    return imp.emit("reshape", [pooled], {"shape": [*pooled.type.shape, 1, 1]})  # ONNX keeps the 1×1 axes


@maps("ReduceMean")
def reduce_mean(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    """A mean over every spatial axis of [N, C, ...] (``x.mean((2, 3))``, irc's own global_avgpool export)
    is a global average pool; any other reduction has no irc op."""
    x = imp.act(ins[0])
    axes = attrs.get("axes")
    if axes is None and len(ins) > 1 and isinstance(ins[1], Const):  # opset 18: the axes are an input
        axes = [int(a) for a in np.asarray(ins[1].load()).reshape(-1)]
    spatial = list(range(2, x.type.rank))
    if axes is None or sorted(a % x.type.rank for a in axes) != spatial or x.type.rank < 3:
        raise imp.unmapped(f"irc maps a ReduceMean only over every spatial axis of [N, C, ...] (axes {spatial}), "
                           f"not axes {axes} of {x.type}")
    pooled = imp.emit("global_avgpool", [x], {})[0]
    if attrs.get("keepdims", 1):
        return imp.emit("reshape", [pooled], {"shape": [*pooled.type.shape, *([1] * len(spatial))]})
    return [pooled]
