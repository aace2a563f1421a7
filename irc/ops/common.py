"""Shape helpers shared by the op families."""

from __future__ import annotations

from irc.dims import Dim, dim_floordiv
from irc.ops.registry import ShapeError
from irc.types import TensorType


def need_rank(t: TensorType, ranks: tuple[int, ...] | int, what: str) -> None:
    ok = t.rank in ranks if isinstance(ranks, tuple) else t.rank >= ranks
    if not ok:
        want = " or ".join(str(r) for r in ranks) if isinstance(ranks, tuple) else f"at least {ranks}"
        raise ShapeError(f"expects {what} of rank {want}, got {t}")


def need_float(t: TensorType, what: str = "input") -> None:
    if not t.is_float:
        raise ShapeError(f"expects a floating-point {what}, got {t}")


def same_dim(a: Dim, b: Dim, message: str) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ShapeError(message)
    if not isinstance(a, int) and not isinstance(b, int) and a != b:
        raise ShapeError(message)
    if isinstance(a, int) != isinstance(b, int):
        raise ShapeError(message + " (one size is symbolic)")


def broadcast(a: TensorType, b: TensorType, op: str) -> TensorType:
    """NumPy broadcasting of two shapes."""
    ra, rb = a.shape[::-1], b.shape[::-1]
    out: list[Dim] = []
    for i in range(max(len(ra), len(rb))):
        da = ra[i] if i < len(ra) else 1
        db = rb[i] if i < len(rb) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise ShapeError(f"cannot broadcast {a} with {b}: sizes {da} and {db} differ")
    dtype = a.dtype if a.dtype == b.dtype else promote(a.dtype, b.dtype, op, a, b)
    return TensorType(dtype, tuple(out[::-1]))


# floating-point widths in PyTorch's promotion lattice (torch.promote_types)
_FLOAT_RANK = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def promote(x: str, y: str, op: str, a: TensorType, b: TensorType) -> str:
    """PyTorch's rule for two float dtypes: the wider one; f16 with bf16 meets at f32."""
    if x in _FLOAT_RANK and y in _FLOAT_RANK:
        if _FLOAT_RANK[x] == _FLOAT_RANK[y]:
            return "f32"  # f16 and bf16: neither holds the other
        return x if _FLOAT_RANK[x] > _FLOAT_RANK[y] else y
    raise ShapeError(f"mixes dtypes {x} and {y}: {a} and {b}")


def conv_out(size: Dim, kernel: int, stride: int, pad_total: int, dilation: int) -> Dim:
    """floor((size + pad - dilation*(kernel-1) - 1) / stride) + 1"""
    span = dilation * (kernel - 1) + 1
    inner = size + pad_total - span
    if isinstance(inner, int) and inner < 0:
        raise ShapeError(
            f"input size {size} (padded {size + pad_total}) is smaller than the kernel's span {span}"
        )
    # floor(inner/stride) + 1 == floor((inner + stride)/stride): the second form keeps
    # symbolic sizes simple (a 2x2 pool of H is H//2, not ((H - 2)//2) + 1)
    return dim_floordiv(inner + stride, stride)


def pair(v: int | list[int]) -> tuple[int, int]:
    return (v[0], v[1]) if isinstance(v, list) else (v, v)


def per_axis(v: int | list[int] | tuple[int, ...], nd: int) -> tuple[int, ...]:
    """A kernel, stride, padding or dilation attribute as one int per spatial axis (``3`` is ``(3, 3)`` in 2-D).
    The backends and exporters read conv and pool attributes through this one rule."""
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),) * nd


def norm_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return a
