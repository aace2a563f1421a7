"""ONNX nodes that are irc primitives: activations, arithmetic, softmax and the shape ops.

Constant operands of size one become the ``scalar`` attribute of irc's arithmetic ops; other constants
become ``param`` nodes (an initializer used as a plain operand, such as ViT's position table).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from irc.dims import Dim, prod

from .convert import Importer, maps
from .fold import reshape_target
from .layers import fold_bias
from .values import Act, Const, Value

_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Abs": "abs", "HardSwish": "hardswish",
          "Mish": "mish"}


@maps(*_UNARY)
def unary(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return imp.emit(_UNARY[n.op_type], [imp.act(ins[0])], {})


@maps("Identity", "Dropout")
def identity(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    if n.op_type == "Dropout" and len(n.output) > 1 and n.output[1]:
        raise imp.unmapped("its mask output is read; irc's inference graph has no dropout mask")
    return [ins[0]]


@maps("LeakyRelu")
def leaky_relu(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return imp.emit("leaky_relu", [imp.act(ins[0])], {"slope": float(attrs.get("alpha", 0.01))})


@maps("Elu")
def elu(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return imp.emit("elu", [imp.act(ins[0])], {"alpha": float(attrs.get("alpha", 1.0))})


@maps("HardSigmoid")
def hardsigmoid(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    if not (math.isclose(alpha, 1 / 6, rel_tol=1e-6) and math.isclose(beta, 0.5)):
        raise imp.unmapped(f"alpha={alpha:g}, beta={beta:g}: irc's hardsigmoid is relu6(x + 3)/6 (alpha 1/6, beta "
                           "0.5, as PyTorch's)")
    return imp.emit("hardsigmoid", [imp.act(ins[0])], {})


@maps("Gelu")
def gelu(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    approx = attrs.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return imp.emit("gelu", [imp.act(ins[0])], {"approx": approx})


def _scalar(imp: Importer, v: Value | None) -> float | None:
    if v is None:
        return None
    if not isinstance(v, Const) or v.size != 1 or v.symbolic:
        raise imp.unmapped("its bound is computed at run time; irc's clamp takes constant bounds")
    return float(np.asarray(v.load()).reshape(-1)[0])


@maps("Clip")
def clip(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    if imp.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = _scalar(imp, ins[1] if len(ins) > 1 else None)
        hi = _scalar(imp, ins[2] if len(ins) > 2 else None)
    if lo == 0.0 and hi == 6.0:
        return imp.emit("relu6", [x], {})
    if lo == 0.0 and hi is None:
        return imp.emit("relu", [x], {})
    return imp.emit("clamp", [x], {"min": lo, "max": hi})


@maps("Max", "Min")
def extremum(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    if len(ins) != 2:
        raise imp.unmapped(f"irc's {'maximum' if n.op_type == 'Max' else 'minimum'} takes two operands, not "
                           f"{len(ins)}")
    for a, b in ((ins[0], ins[1]), (ins[1], ins[0])):
        bound = _scalar(imp, b) if isinstance(b, Const) and b.size == 1 and not b.symbolic else None
        if bound is not None and not isinstance(a, Const):  # a bound, not a second tensor: how relu6 exports
            return imp.emit("clamp", [imp.act(a)], {"min": bound} if n.op_type == "Max" else {"max": bound})
    return imp.emit("maximum" if n.op_type == "Max" else "minimum", [imp.act(ins[0]), imp.act(ins[1])], {})


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@maps(*_BINARY)
def binary(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    op = _BINARY[n.op_type]
    if op == "add":
        folded = fold_bias(imp, n, ins)
        if folded is not None:
            return folded
    a, b = ins
    for i, (x, c) in enumerate(((a, b), (b, a))):
        if isinstance(x, Act) and isinstance(c, Const) and c.size == 1 and not c.symbolic \
                and c.dtype.startswith(("f", "bf")) and len(c.shape) <= x.type.rank:
            value = float(np.asarray(c.load()).reshape(-1)[0])
            reverse = i == 1 and op in ("sub", "div")
            return imp.emit(op, [x], {"scalar": value, **({"reverse": True} if reverse else {})})
    return imp.emit(op, [imp.act(a), imp.act(b)], {})


@maps("Neg")
def neg(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return imp.emit("mul", [imp.act(ins[0])], {"scalar": -1.0})


@maps("Softmax")
def softmax(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axis = attrs.get("axis", -1 if imp.opset >= 13 else 1)
    if imp.opset < 13 and axis % x.type.rank != x.type.rank - 1:
        raise imp.unmapped(f"before opset 13 Softmax flattens axes {axis}.. into one; irc's softmax is over one "
                           "axis (export with opset 13 or later, or softmax over the last axis)")
    return imp.emit("softmax", [x], {"axis": axis})


def _sizes(imp: Importer, v: Value | None, what: str) -> list[Dim]:
    if not isinstance(v, Const):
        raise imp.error(f"takes its {what} from a tensor computed at run time: a dynamic shape irc cannot express")
    return [d if not isinstance(d, np.integer) else int(d) for d in np.asarray(v.load()).reshape(-1).tolist()]


def _reshape_to(imp: Importer, x: Act, shape: list[Dim]) -> list[Value]:
    if list(shape) == list(x.type.shape):
        return [x]
    return imp.emit("reshape", [x], {"shape": list(shape)})


@maps("Reshape")
def reshape(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    target = reshape_target(_sizes(imp, ins[1], "shape"), x.type.shape, bool(attrs.get("allowzero", 0)))
    if -1 in target:
        known = prod([d for d in target if d != -1])
        target[target.index(-1)] = x.type.numel() // known
    return _reshape_to(imp, x, target)


@maps("Flatten")
def flatten(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axis = attrs.get("axis", 1) % (x.type.rank + 1) if x.type.rank else 0
    s = x.type.shape
    if axis == 1 and x.type.rank >= 2:
        return imp.emit("flatten", [x], {"start": 1}) if x.type.rank > 2 else [x]
    return _reshape_to(imp, x, [prod(list(s[:axis])), prod(list(s[axis:]))])


def _axes(imp: Importer, ins: list[Value], attrs: dict[str, Any]) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        return [int(a) for a in _sizes(imp, ins[1], "axes")]
    return list(attrs["axes"]) if "axes" in attrs else None


@maps("Unsqueeze")
def unsqueeze(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axes = _axes(imp, ins, attrs) or []
    shape: list[Dim] = list(x.type.shape)
    rank = len(shape) + len(axes)
    for ax in sorted(a % rank for a in axes):
        shape.insert(ax, 1)
    return _reshape_to(imp, x, shape)


@maps("Squeeze")
def squeeze(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axes = _axes(imp, ins, attrs)
    drop = {a % x.type.rank for a in axes} if axes is not None else {i for i, d in enumerate(x.type.shape) if d == 1}
    for a in drop:
        if x.type.shape[a] != 1:
            raise imp.error(f"squeezes axis {a} of {x.type}, whose size is not 1")
    return _reshape_to(imp, x, [d for i, d in enumerate(x.type.shape) if i not in drop])


@maps("Transpose")
def transpose(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    perm = list(attrs.get("perm", reversed(range(x.type.rank))))
    if perm == list(range(x.type.rank)):
        return [x]
    return imp.emit("transpose", [x], {"perm": perm})


@maps("Concat")
def concat(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    parts = [imp.act(v) for v in ins if v is not None]
    if len(parts) == 1:
        return parts
    return imp.emit("concat", parts, {"axis": attrs["axis"]})


@maps("Split")
def split(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    axis = attrs.get("axis", 0)
    if len(ins) > 1 and ins[1] is not None:
        parts: int | list[int] = [int(s) for s in _sizes(imp, ins[1], "split sizes")]
    elif "split" in attrs:
        parts = list(attrs["split"])
    else:
        parts = int(attrs.get("num_outputs", len(n.output)))
        size = x.type.shape[axis]
        if isinstance(size, int) and size % parts:  # ONNX makes the last part smaller; irc splits evenly
            step = -(-size // parts)
            parts = [step] * (parts - 1) + [size - step * (parts - 1)]
    return imp.emit("split", [x], {"parts": parts, "axis": axis}, results=len(n.output))


_END = 2**62  # ONNX writes "to the end" as INT64_MAX (or a large number); irc's slice takes None


@maps("Slice")
def slice_(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    if imp.opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = [int(v) for v in _sizes(imp, ins[1], "starts")], [int(v) for v in _sizes(imp, ins[2], "ends")]
        axes = [int(v) for v in _sizes(imp, ins[3], "axes")] if len(ins) > 3 and ins[3] is not None \
            else list(range(len(starts)))
        steps = [int(v) for v in _sizes(imp, ins[4], "steps")] if len(ins) > 4 and ins[4] is not None \
            else [1] * len(starts)
    if any(s != 1 for s in steps):
        raise imp.unmapped(f"steps {steps}: irc's slice takes contiguous ranges (step 1)")
    for start, end, axis in zip(starts, ends, axes):
        size = x.type.shape[axis % x.type.rank]
        if isinstance(size, int):
            start, end, _ = slice(start, end).indices(size)
            if (start, end) == (0, size):
                continue
        x = imp.emit("slice", [x], {"axis": axis, "start": start, "end": None if end >= _END else end})[0]
    return [x]


@maps("Gather")
def gather(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    data, idx = ins
    axis = attrs.get("axis", 0)
    if isinstance(data, Const) and data.weight is not None and isinstance(idx, Act) and axis == 0 \
            and len(data.shape) == 2:
        return imp.emit("embedding", [idx], {"vocab": data.shape[0], "dim": data.shape[1]}, {"weight": data})
    if not isinstance(idx, Const) or idx.symbolic:
        raise imp.unmapped("it gathers with indices computed at run time; irc maps a Gather with constant indices "
                           "(or a table lookup of an initializer)")
    x = imp.act(data)
    index = np.asarray(idx.load())
    if index.ndim == 0:
        return imp.emit("select", [x], {"axis": axis, "index": int(index)})
    if index.ndim == 1 and index.size == 1:
        i = int(index[0])
        size = x.type.shape[axis % x.type.rank]
        start = i % size if isinstance(size, int) else i
        return imp.emit("slice", [x], {"axis": axis, "start": start, "end": start + 1})
    raise imp.unmapped(f"it gathers {index.size} indices at once; irc maps one index (select) at a time")


def _broadcast(imp: Importer, a: tuple[Dim, ...], b: list[Dim]) -> list[Dim]:
    rank = max(len(a), len(b))
    a2, b2 = [1] * (rank - len(a)) + list(a), [1] * (rank - len(b)) + list(b)
    out: list[Dim] = []
    for x, y in zip(a2, b2):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        else:
            raise imp.error(f"expands [{', '.join(map(str, a))}] to [{', '.join(map(str, b))}], which do not "
                            "broadcast")
    return out


@maps("Expand")
def expand(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    shape = _broadcast(imp, x.type.shape, _sizes(imp, ins[1], "shape"))
    if shape == list(x.type.shape):
        return [x]
    if len(shape) > x.type.rank:
        x = _reshape_to(imp, x, [1] * (len(shape) - x.type.rank) + list(x.type.shape))[0]  # type: ignore[assignment]
    return imp.emit("expand", [x], {"shape": shape})


@maps("Cast")
def cast(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    from .reader import tensor_dtype

    x = imp.act(ins[0])
    if tensor_dtype(attrs["to"], "the Cast's target", None) == x.type.dtype:
        return [x]
    raise imp.unmapped(f"it converts {x.type} to another element type; irc graphs keep one dtype per value")


def _text(v: Any, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


@maps("Resize", "Upsample")
def resize(imp: Importer, n: Any, ins: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = imp.act(ins[0])
    if x.type.rank != 4:
        raise imp.unmapped(f"irc's upsample takes [N, C, H, W], not {x.type}")
    mode = _text(attrs.get("mode"), "nearest")
    coord = _text(attrs.get("coordinate_transformation_mode"), "half_pixel" if n.op_type == "Resize" else "asymmetric")
    scales_in = ins[2] if n.op_type == "Resize" and len(ins) > 2 else ins[1] if n.op_type == "Upsample" else None
    sizes_in = ins[3] if n.op_type == "Resize" and len(ins) > 3 else None
    h, w = x.type.shape[2], x.type.shape[3]
    if sizes_in is not None:
        sizes = _sizes(imp, sizes_in, "sizes")
        if not (isinstance(h, int) and isinstance(w, int)) or sizes[2] % h or sizes[3] % w:
            raise imp.unmapped(f"sizes {sizes} of {x.type} is not a whole-number scale; irc's upsample scales by "
                               "integers")
        scale = [sizes[2] // h, sizes[3] // w]
        if sizes[:2] != list(x.type.shape[:2]):
            raise imp.unmapped("it resizes the batch or channel axis")
    elif scales_in is not None:
        scales = [float(s) for s in np.asarray(_sizes(imp, scales_in, "scales"), dtype=float)]
        if scales[:2] != [1.0, 1.0] or any(s != int(s) or s < 1 for s in scales[2:]):
            raise imp.unmapped(f"scales {scales}: irc's upsample scales H and W by whole numbers")
        scale = [int(scales[2]), int(scales[3])]
    else:
        raise imp.unmapped("it gives neither scales nor sizes")
    if mode == "nearest" and coord in ("asymmetric",) and _text(attrs.get("nearest_mode"), "floor") == "floor":
        return imp.emit("upsample", [x], {"scale": scale, "mode": "nearest"})
    if mode == "linear" and coord in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        return imp.emit("upsample", [x], {"scale": scale, "mode": "bilinear",
                                          "align_corners": coord == "align_corners"})
    raise imp.unmapped(f"mode={mode} with coordinate_transformation_mode={coord} is not one of irc's upsample modes "
                       "(nearest with asymmetric/floor, PyTorch's; bilinear with half_pixel or align_corners)")
