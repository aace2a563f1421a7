"""Ops that only move data: flatten, reshape, transpose, concat, split, select, slice."""

from __future__ import annotations

from irc.backends.onnx.context import INT64_MAX, Context
from irc.diagnostics import IrcError
from irc.graph import Node


def _flatten(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    rank = ctx.type_of(node.inputs[0]).rank
    s, e = node.attrs.get("start", 1) % rank, node.attrs.get("end", -1) % rank
    if s == 1 and e == rank - 1:  # ONNX Flatten makes 2-D: [:axis] and [axis:] merged
        return [ctx.op1("Flatten", xs, axis=1)]
    parts = []
    if s > 0:
        parts.append(ctx.op1("Shape", xs, start=0, end=s))
    parts.append(ctx.ints([-1]))
    if e + 1 < rank:
        parts.append(ctx.op1("Shape", xs, start=e + 1))
    return [ctx.op1("Reshape", [xs[0], ctx.op1("Concat", parts, axis=0)])]


def _reshape(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    out = node.types[0].shape
    if all(isinstance(d, int) for d in out):
        return [ctx.op1("Reshape", [xs[0], ctx.ints(list(out))])]
    wanted = list(node.attrs["shape"])
    symbolic = [i for i, d in enumerate(wanted) if not isinstance(d, int)]
    if len(symbolic) == 1 and -1 not in wanted:  # the one symbolic size is whatever is left over
        wanted[symbolic[0]] = -1
    if all(isinstance(d, int) for d in wanted):
        return [ctx.op1("Reshape", [xs[0], ctx.ints(wanted)])]
    sizes = [ctx.size(d) for d in wanted]  # each symbolic size computed from the inputs' shapes
    bad = next((d for d, s in zip(wanted, sizes) if s is None), None)
    if bad is not None:
        raise IrcError(f"onnx export: 'reshape' to {node.types[0]} needs the size {bad}, which ONNX cannot "
                       "compute from the inputs' shapes; bind its symbols with -D", node.loc)
    return [ctx.op1("Reshape", [xs[0], ctx.op1("Concat", sizes, axis=0)])]


def _split(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    axis = int(node.attrs.get("axis", -1))
    parts = node.attrs["parts"]
    if isinstance(parts, list):
        return ctx.op("Split", [xs[0], ctx.ints([int(p) for p in parts])], len(parts), axis=axis)
    size = ctx.type_of(node.inputs[0]).shape[axis]
    if isinstance(size, int):
        return ctx.op("Split", [xs[0], ctx.ints([size // parts] * parts)], parts, axis=axis)
    return ctx.op("Split", [xs[0]], parts, axis=axis)  # equal parts of a symbolic size


def _slice(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    end = a.get("end")
    return [ctx.op1("Slice", [xs[0], ctx.ints([int(a.get("start", 0))]),
                              ctx.ints([INT64_MAX if end is None else int(end)]), ctx.ints([int(a["axis"])])])]


OPS = {
    "flatten": _flatten,
    "reshape": _reshape,
    "transpose": lambda ctx, node, xs: [ctx.op1("Transpose", xs, perm=[int(p) for p in node.attrs["perm"]])],
    "concat": lambda ctx, node, xs: [ctx.op1("Concat", xs, axis=int(node.attrs.get("axis", -1)))],
    "split": _split,
    "select": lambda ctx, node, xs: [ctx.op1("Gather", [xs[0], ctx.ints(int(node.attrs["index"]))],
                                             axis=int(node.attrs["axis"]))],
    "slice": _slice,
}
