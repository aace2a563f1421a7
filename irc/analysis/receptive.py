"""Receptive field r and jump j of every spatial value, per spatial axis.

The chapter's recurrence, r updated with the incoming j before j advances:
    r_l = r_{l-1} + (k_eff - 1)·j_{l-1},   j_l = j_{l-1}·s_l,   k_eff = d·(k - 1) + 1.
Tracking starts at the first convolution or pool (an untracked input has r = j = 1). What every
other op does is declared in its record (``OpDef.receptive``): pointwise ops pass the field on,
an op that mixes along one axis keeps it unless that axis is spatial, a transpose moves the spatial
axes with it (ConvNeXt's channel-last blocks), a global pool ends the map. Where branches meet (a
residual add, a channel concat) r is the largest over the branches and the jumps must agree.
Padding never enters. Upsampling (a transposed convolution, upsample, pixel_shuffle) divides the
jump: j becomes a fraction of an input pixel, and r is reported rounded up to whole pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ops import get_op
from irc.ops.common import pair
from irc.ops.registry import Receptive
from irc.types import TensorType

RJ = tuple[tuple[int, ...], tuple[int | float, ...]]  # (r per axis, j per axis)


@dataclass(frozen=True)
class Field:
    """The field of one value: which of its axes are spatial, and r and j along each."""

    axes: tuple[int, ...]
    r: tuple[Fraction | int, ...]  # exact: a jump below 1 pixel (after upsampling) makes them fractions
    j: tuple[Fraction | int, ...]

    @property
    def rj(self) -> RJ:
        """r in whole input pixels; j in input pixels, a fraction after upsampling (0.5: two outputs a pixel)."""
        return tuple(math.ceil(r) for r in self.r), tuple(_number(j) for j in self.j)


def _number(v: Fraction | int) -> int | float:
    return int(v) if Fraction(v).denominator == 1 else float(v)


def _per_axis(value, nd: int) -> tuple[int, ...]:
    return pair(value) if nd == 2 else (value,)


def window_of(node: Node, nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(effective kernel, stride) per axis."""
    a = node.attrs
    ks = _per_axis(a["kernel"], nd)
    stride = a["stride"] if a["stride"] is not None else a["kernel"]
    ds = _per_axis(a.get("dilation", 1), nd)
    return tuple(d * (k - 1) + 1 for k, d in zip(ks, ds)), _per_axis(stride, nd)


def _step(f: Field, kernels: tuple[int, ...], strides: tuple[int, ...], axes: tuple[int, ...]) -> Field:
    r = tuple(ri + (k - 1) * ji for ri, k, ji in zip(f.r, kernels, f.j))  # the incoming j, first
    return Field(axes, r, tuple(ji * s for ji, s in zip(f.j, strides)))


def _incoming(known: Field | None, axes: tuple[int, ...]) -> Field:
    """The field entering a window op over ``axes``: an untracked input is the image itself, r = j = 1."""
    if known is not None and known.axes == axes:
        return known
    return Field(axes, (1,) * len(axes), (1,) * len(axes))


def _fmt(v: tuple[int, ...]) -> str:
    return str(v[0]) if len(set(v)) == 1 else "×".join(str(x) for x in v)


def _merge(node: Node, ins: list[tuple[str, TensorType, Field]], out: TensorType) -> Field | None:
    """The field where tracked operands meet (their axes already in the result's numbering)."""
    if not ins:
        return None
    axes = ins[0][2].axes
    ins = [x for x in ins if x[2].axes == axes]
    r = tuple(max(f.r[i] for _, _, f in ins) for i in range(len(axes)))
    spatial_out = tuple(out.shape[a] for a in axes)
    # a 1×1 map broadcast over the result carries no jump of its own
    full = [(n, t, f) for n, t, f in ins if tuple(t.shape[a - (out.rank - t.rank)] for a in axes) == spatial_out]
    jumps = {f.j for _, _, f in full}
    if len(jumps) > 1 and all(s == 1 for s in spatial_out):
        jumps = {max(jumps)}  # one output position: no neighbour to be a jump away from
    if len(jumps) > 1:
        listed = "; ".join(f"'{n}' {t} has jump {_fmt(f.j)}" for n, t, f in full)
        raise IrcError(f"receptive field: the branches that meet at '{node.op}' have different jumps (input pixels "
                       "between neighbouring outputs), so no single receptive field describes the result",
                       node.loc, notes=[listed])
    j = next(iter(jumps)) if jumps else ins[0][2].j
    return Field(axes, r, j)


def _aligned(f: Field, t: TensorType, out: TensorType) -> Field:
    """``f`` with its axes numbered as in a result of rank ``out.rank`` (broadcasting aligns the right)."""
    shift = out.rank - t.rank
    return Field(tuple(a + shift for a in f.axes), f.r, f.j)


def _adaptive(node: Node, t: TensorType, known: Field | None) -> Field | None:
    axes = (t.rank - 2, t.rank - 1)
    sizes = t.shape[2:]
    outs = pair(node.attrs["size"])
    if outs == (1, 1):
        return None  # a global pool (squeeze-excitation's): the result is no longer a map
    if any(not isinstance(s, int) or s % o for s, o in zip(sizes, outs)):
        return None  # uneven bins: no single kernel and stride describe it
    k = tuple(s // o for s, o in zip(sizes, outs))
    return _step(_incoming(known, axes), k, k, axes)


def _along(node: Node, rule: Receptive, types: dict[str, TensorType], fields: dict[str, Field]) -> Field | None:
    """An op that mixes along one axis keeps the field when that axis is not spatial."""
    assert rule.axis is not None
    tracked = []
    for v in node.inputs:
        if v not in fields:
            continue
        t, f = types[v], fields[v]
        ax = rule.axis(node.attrs, t.rank) % t.rank
        if ax in f.axes:
            return None
        if node.type.rank == t.rank - 1:  # select drops its axis: the later ones move up
            tracked.append((v, node.type, Field(tuple(a - (a > ax) for a in f.axes), f.r, f.j)))
        else:
            tracked.append((v, t, _aligned(f, t, node.type)))
    return _merge(node, tracked, node.type)


def _node_field(node: Node, types: dict[str, TensorType], fields: dict[str, Field]) -> Field | None:
    opdef = get_op(node.op)
    rule = opdef.receptive if opdef is not None else None
    if rule is None or not node.types:
        return None
    kind = rule.kind
    if kind == "window":
        out_rank = node.type.rank
        nd = rule.nd or out_rank - 2  # 0: every axis after batch and channels
        axes = tuple(range(out_rank - nd, out_rank))
        if rule.step is not None:
            kernels, strides = rule.step(node.attrs)
            if len(kernels) == 1 < nd:  # one factor for every spatial axis
                kernels, strides = kernels * nd, strides * nd
        else:
            kernels, strides = window_of(node, nd)
            x = types[node.inputs[0]]
            if all(s == 1 for s in node.type.shape[-nd:]) and all(
                    isinstance(n, int) and k >= n for k, n in zip(kernels, x.shape[-nd:])):
                return None  # a window over the whole map (an exported global pool): global, like global_avgpool
        return _step(_incoming(fields.get(node.inputs[0]), axes), kernels, strides, axes)
    if kind == "adaptive":
        return _adaptive(node, types[node.inputs[0]], fields.get(node.inputs[0]))
    if kind == "pointwise":
        tracked = [(v, types[v], _aligned(fields[v], types[v], node.type)) for v in node.inputs if v in fields]
        return _merge(node, tracked, node.type)
    if kind == "along":
        return _along(node, rule, types, fields)
    if kind == "permute":
        f = fields.get(node.inputs[0])
        if f is None:
            return None
        rank = types[node.inputs[0]].rank
        perm = [p % rank for p in node.attrs["perm"]]
        moved = sorted(zip((perm.index(a) for a in f.axes), f.r, f.j))
        return Field(tuple(a for a, _, _ in moved), tuple(r for _, r, _ in moved), tuple(j for _, _, j in moved))
    return None  # global, reset


def receptive_fields(graph: Graph) -> dict[str, RJ]:
    """(r, j) per spatial axis for every value downstream of a convolution or pool."""
    types = graph.value_types()
    fields: dict[str, Field] = {}
    for node in graph.nodes:
        f = _node_field(node, types, fields)
        if f is not None:
            for v in node.outputs:
                fields[v] = f
    return {v: f.rj for v, f in fields.items()}


def scalar_or_list(v: tuple[int, ...]) -> int | list[int]:
    """One number when every axis agrees (the usual square kernels), else one per axis."""
    return v[0] if len(set(v)) == 1 else list(v)
