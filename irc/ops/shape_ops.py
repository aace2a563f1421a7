"""Ops that only move data: flatten, reshape, transpose, concat, split."""

from __future__ import annotations

from irc.dims import Dim, Sym, dim_floordiv, prod
from irc.ops.common import need_rank, norm_axis, same_dim
from irc.ops.cost import free
from irc.ops.registry import RF_PERMUTE, RF_POINTWISE, Attr, OpDef, ShapeError, register, rf_along, rf_reset
from irc.ops.vjps import vjp_concat, vjp_expand, vjp_reshape, vjp_select, vjp_slice, vjp_split, vjp_transpose

_AXIS = rf_along(lambda a, rank: a["axis"])  # keeps the field unless the axis is a spatial one
_MOVES = frozenset({"data_movement"})
_VIEW = frozenset({"data_movement", "view"})  # the result re-views its input's buffer


def _flatten(a, ts):
    (x,) = ts
    need_rank(x, 1, "an input")
    s = norm_axis(a["start"], x.rank)
    e = norm_axis(a["end"], x.rank)
    if e < s:
        raise ShapeError(f"end axis {a['end']} comes before start axis {a['start']}")
    return [x.with_shape(x.shape[:s] + (prod(x.shape[s:e + 1]),) + x.shape[e + 1:])]


register(OpDef("flatten", ("x",), (Attr("start", "int", 1), Attr("end", "int", -1)), _flatten,
               doc="merge axes start..end into one", cost=free, classes=_VIEW,
               receptive=rf_reset("merges axes (tracked no further)"), vjp=vjp_reshape))


def _reshape(a, ts):
    (x,) = ts
    shape: list[Dim] = list(a["shape"])
    total = prod(x.shape)
    if shape.count(-1) > 1:
        count = {2: "two", 3: "three"}.get(shape.count(-1), str(shape.count(-1)))
        raise ShapeError(f"the shape {_fmt(shape)} has {count} -1 entries; at most one is allowed")
    known = prod([d for d in shape if d != -1])
    if -1 in shape:
        rest = dim_floordiv(total, known)
        if isinstance(rest, int) and isinstance(total, int) and rest * known != total:
            raise ShapeError(f"cannot reshape {x} ({total} elements) into {_fmt(shape)}")
        if rest * known != total:  # symbolic: the -1 must divide exactly for every size
            raise ShapeError(f"cannot infer the -1 of {_fmt(shape)}: {x} holds {total} elements, not a whole "
                             f"multiple of {known} for every size (bind sizes with -D, or spell the shape out)")
        shape[shape.index(-1)] = rest
    elif isinstance(total, int) and isinstance(known, int) and total != known:
        raise ShapeError(f"cannot reshape {x} ({total} elements) into {_fmt(shape)} ({known} elements)")
    elif isinstance(total, Sym) != isinstance(known, Sym) or (isinstance(total, Sym) and total != known):
        raise ShapeError(f"cannot show that {x} and {_fmt(shape)} hold the same number of elements")
    return [x.with_shape(tuple(shape))]


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


register(OpDef("reshape", ("x",), (Attr("shape", "dims"),), _reshape, doc="same elements, new shape (one -1 allowed)",
               cost=free, classes=_VIEW, receptive=rf_reset("regroups axes (tracked no further)"), vjp=vjp_reshape))


def _transpose(a, ts):
    (x,) = ts
    perm = a["perm"]
    if sorted(norm_axis(p, x.rank) for p in perm) != list(range(x.rank)) or len(perm) != x.rank:
        raise ShapeError(f"perm {perm} is not a permutation of the {x.rank} axes of {x}")
    return [x.with_shape(tuple(x.shape[norm_axis(p, x.rank)] for p in perm))]


register(OpDef("transpose", ("x",), (Attr("perm", "ints"),), _transpose, aliases=("permute",),
               doc="permute axes", cost=free, classes=_VIEW, receptive=RF_PERMUTE, vjp=vjp_transpose))


def _concat(a, ts):
    if not ts:
        raise ShapeError("needs at least one tensor to join")
    first = ts[0]
    ax = norm_axis(a["axis"], first.rank)
    total: Dim = 0
    for t in ts:
        if t.rank != first.rank:
            raise ShapeError(f"operands have different ranks: {first} and {t}")
        if t.dtype != first.dtype:
            raise ShapeError(f"operands have different dtypes: {first} and {t}")
        for i, (d1, d2) in enumerate(zip(first.shape, t.shape)):
            if i != ax:
                same_dim(d1, d2, f"operands differ off the concatenation axis: {first} and {t}")
        total = total + t.shape[ax]
    return [first.with_shape(first.shape[:ax] + (total,) + first.shape[ax + 1:])]


register(OpDef("concat", ("xs*",), (Attr("axis", "int", -1),), _concat, aliases=("cat",),
               doc="join tensors along an axis", cost=free, classes=_MOVES, receptive=_AXIS, vjp=vjp_concat))


def _split_sizes(a, size: Dim) -> list[Dim]:
    parts = a["parts"]
    if isinstance(parts, list):
        if isinstance(size, int) and sum(parts) != size:
            raise ShapeError(f"split sizes {parts} add up to {sum(parts)}, not {size}")
        return list(parts)
    if isinstance(size, int) and size % parts:
        raise ShapeError(f"axis of size {size} does not split into {parts} equal parts")
    return [dim_floordiv(size, parts)] * parts


def _split(a, ts):
    (x,) = ts
    ax = norm_axis(a["axis"], x.rank)
    return [x.with_shape(x.shape[:ax] + (s,) + x.shape[ax + 1:]) for s in _split_sizes(a, x.shape[ax])]


def _split_results(a) -> tuple[str, ...]:
    n = len(a["parts"]) if isinstance(a["parts"], list) else a["parts"]
    return tuple(f"part{i}" for i in range(n))


MAX_SPLIT = 4096  # results are named one by one; a typo such as split(x, 10**9) must not hang


register(OpDef("split", ("x",), (Attr("parts", "int_or_ints", most=MAX_SPLIT), Attr("axis", "int", -1)), _split,
               results=_split_results, doc="split into equal parts or given sizes", cost=free, classes=_VIEW,
               receptive=_AXIS, vjp=vjp_split))


def _select(a, ts):
    (x,) = ts
    ax = norm_axis(a["axis"], x.rank)
    size = x.shape[ax]
    idx = a["index"]
    if isinstance(size, int) and not -size <= idx < size:
        raise ShapeError(f"index {idx} is out of range for axis {a['axis']} of size {size}")
    return [x.with_shape(x.shape[:ax] + x.shape[ax + 1:])]


register(OpDef("select", ("x",), (Attr("axis", "int"), Attr("index", "int")), _select,
               doc="take one index along an axis and drop it (x[:, 0] is select(x, axis=1, index=0))",
               cost=free, classes=_VIEW, receptive=_AXIS, vjp=vjp_select))


def _slice(a, ts):
    (x,) = ts
    ax = norm_axis(a["axis"], x.rank)
    size = x.shape[ax]
    start, end = a["start"], a["end"]
    if not isinstance(size, int):
        if end is None or start < 0 or end < 0:
            raise ShapeError(f"slicing symbolic axis {size} needs explicit non-negative start and end")
        if end <= start:
            raise ShapeError(f"slice [{start}:{end}] of axis {a['axis']} (size {size}) is empty")
        return [x.with_shape(x.shape[:ax] + (end - start,) + x.shape[ax + 1:])]
    s, e, _ = slice(start, end).indices(size)
    if e <= s:
        raise ShapeError(f"slice [{start}:{end}] of axis {a['axis']} (size {size}) is empty")
    return [x.with_shape(x.shape[:ax] + (e - s,) + x.shape[ax + 1:])]


register(OpDef("slice", ("x",), (Attr("axis", "int"), Attr("start", "int", 0), Attr("end", "int", None)), _slice,
               doc="x[start:end] along an axis (Python semantics; end defaults to the end)",
               cost=free, classes=_VIEW, receptive=_AXIS, vjp=vjp_slice))


def _expand_axis(i: int, lead: int, size: Dim | None, want: Dim) -> tuple[Dim | None, str]:
    """The size of result axis ``i`` (``size`` is the input's, None for a new leading axis) and,
    when the broadcast is impossible, why."""
    if size is None:
        return (None, f"axis {i} is new, so -1 has no size to keep there; give its size") if want == -1 else (want, "")
    if want == -1 or want == size:
        return size, ""
    if size == 1:
        return want, ""
    return None, (f"the input's axis {i - lead} has size {size}, which cannot become {want}: only a size of 1 "
                  f"broadcasts (keep it with {size} or -1)")


def _expand(a, ts):
    (x,) = ts
    shape = list(a["shape"])
    lead = len(shape) - x.rank
    out: list[Dim] = []
    why = f"the shape has {len(shape)} axes, fewer than the input's {x.rank}" if lead < 0 else ""
    for i, want in enumerate(shape if lead >= 0 else []):
        size, why = _expand_axis(i, lead, x.shape[i - lead] if i >= lead else None, want)
        if why:
            break
        out.append(size)
    if why:
        raise ShapeError(f"cannot expand {x} to {_fmt(shape)}: {why}")
    return [x.with_shape(tuple(out))]


register(OpDef("expand", ("x",), (Attr("shape", "dims"),), _expand, aliases=("broadcast_to",),
               doc="broadcast to a shape (torch.Tensor.expand): axes of size 1 repeat, -1 keeps a size, new axes "
                   "may lead",
               cost=free, classes=_MOVES, receptive=RF_POINTWISE, vjp=vjp_expand))


def _input(a, ts):
    raise AssertionError("input types are set by the frontend")


register(OpDef("input", (), (), _input, doc="a model input", cost=free, classes=frozenset({"input"}),
               receptive=rf_reset("an untracked input: r = j = 1 where a window first reads it"),
               na={**{col: "an input is the array the caller passes, bound by each driver: nothing to compute"
                   for col in ("numpy", "cpu", "cuda", "torch_oracle")},
                   "grad": "a graph input: the grad pass names its gradient grad.<input>, nothing to differentiate"}))
_ = need_rank
