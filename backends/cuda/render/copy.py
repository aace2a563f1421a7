"""One kernel family for every data movement: a strided copy over r axes (``k_copy<r>``).

``dst[toff + Σ i_k·t_k] = src[soff + Σ i_k·s_k]`` for every index ``(i_0 … i_{r−1})`` of the
copied block: transposes (permuted strides), slices and selections (an offset), concat and
split (an offset on one side), broadcasting (stride 0). Sizes and strides are in elements.
Axes of size 1 are dropped and axes contiguous on both sides merged first: each axis left
costs a division per element (64-bit, slow on a GPU), so the kernel has only those.
"""

from __future__ import annotations

from math import prod

from irc.backends.common.kernel import A1, I64, Kernel
from irc.backends.cuda.module import JIT
from irc.backends.cuda.render.context import Ctx

MAX_RANK = 8


def copy_kernel(rank: int) -> Kernel:
    name = f"k_copy{rank}"
    args = ", ".join([f"n{k}" for k in range(rank)] + [f"s{k}" for k in range(rank)] + ["soff"]
                     + [f"t{k}" for k in range(rank)] + ["toff"])
    unravel = "".join(f"        i{k} = r % n{k}\n        r //= n{k}\n" for k in range(rank - 1, 0, -1))
    src = " + ".join(["soff"] + [f"i{k} * s{k}" for k in range(rank)])
    dst = " + ".join(["toff"] + [f"i{k} * t{k}" for k in range(rank)])
    text = (f"{JIT}\ndef {name}(src, dst, total, {args}):\n    i = cuda.grid(1)\n    if i < total:\n"
            f"        r = i\n{unravel}        i0 = r\n        dst[{dst}] = src[{src}]\n")
    return Kernel(name, text, (A1, A1, I64) + (I64,) * (3 * rank + 2))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def simplify(shape: tuple[int, ...], s: tuple[int, ...], t: tuple[int, ...]
             ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Drop axes of size 1; merge an axis into the one before it where both sides are contiguous."""
    axes = [(d, a, b) for d, a, b in zip(shape, s, t) if d != 1]
    merged: list[tuple[int, int, int]] = []
    for d, a, b in axes:
        if merged:
            pd, pa, pb = merged[-1]
            if pa == a * d and pb == b * d:
                merged[-1] = (pd * d, a, b)
                continue
        merged.append((d, a, b))
    if not merged:
        merged = [(1, 0, 0)]
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged)


def copy_launch(ctx: Ctx, src: str, dst: str, shape: tuple[int, ...], sstrides: tuple[int, ...], soff: int,
                tstrides: tuple[int, ...], toff: int) -> None:
    """Copy a block of ``shape`` between two flat arrays with the given element strides."""
    total = prod(shape)
    if total == 0:
        return
    shape, sstrides, tstrides = simplify(shape, sstrides, tstrides)
    if len(shape) > MAX_RANK:
        raise ctx.error(f"moves a block with {len(shape)} strided axes; at most {MAX_RANK} are supported")
    k = ctx.kernel(copy_kernel(len(shape)))
    args = [src, dst, ctx.i(total)] + [ctx.i(d) for d in shape] + [ctx.i(s) for s in sstrides] + [ctx.i(soff)]
    args += [ctx.i(t) for t in tstrides] + [ctx.i(toff)]
    grid, block = ctx.flat_grid(total)
    ctx.launch(k, grid, block, args)
