"""Resampling without weights: upsampling by an integer factor, and moving pixels between the
channel and spatial axes (pixel shuffle, ESPCN's sub-pixel convolution, and its inverse).

Each matches torch.nn.functional (interpolate with ``scale_factor``, pixel_shuffle, pixel_unshuffle).
"""

from __future__ import annotations

from fractions import Fraction

from irc.dims import Dim, dim_floordiv
from irc.ops.common import need_float, need_rank, pair
from irc.ops.cost import Cost, free, numel
from irc.ops.registry import Attr, OpDef, Receptive, ShapeError, register, rf_window
from irc.ops.vjps import vjp_pixel_shuffle, vjp_window_layer

_MOVES = frozenset({"data_movement"})
BILINEAR_PER_ELEMENT = 4  # one weighted tap per corner (fvcore's count; torch's flop counter counts none)


def scales(a, rank: int) -> tuple[int, ...]:
    """The integer factor of each spatial axis: one for [B, C, L], two for [B, C, H, W]."""
    return pair(a["scale"]) if rank == 4 else (a["scale"],)


def _upsample_window(a) -> tuple[tuple[int, ...], tuple[Fraction, ...]]:
    """Nearest reads one input pixel per output, bilinear two per axis; outputs are 1/s pixels apart.
    (nd=0: the window spans every axis its scale names — one for [B, C, L], two for [B, C, H, W].)"""
    factors = pair(a["scale"]) if isinstance(a["scale"], list) else (a["scale"],)
    taps = 1 if a["mode"] == "nearest" else 2
    return (taps,) * len(factors), tuple(Fraction(1, s) for s in factors)


def _upsample_infer(a, ts):
    (x,) = ts
    need_rank(x, (3, 4), "an input [B, C, L] or [B, C, H, W]")
    need_float(x)
    problem = None
    if a["mode"] == "bilinear" and x.rank != 4:
        problem = f"mode=bilinear needs an input [B, C, H, W], got {x} (use mode=nearest for [B, C, L])"
    elif x.rank == 3 and isinstance(a["scale"], list):
        problem = f"a pair of scales [h, w] needs an input [B, C, H, W], got {x}"
    elif a["align_corners"] and a["mode"] == "nearest":
        problem = "align_corners=true applies to mode=bilinear only (as in PyTorch)"
    if problem:
        raise ShapeError(problem)
    spatial = tuple(d * s for d, s in zip(x.shape[2:], scales(a, x.rank)))
    return [x.with_shape(x.shape[:2] + spatial)]


def _upsample_cost(node, ins, outs) -> Cost:
    if node.attrs["mode"] == "nearest":
        return Cost()  # a copy of each source element
    return Cost().add("pool", BILINEAR_PER_ELEMENT * numel(outs[0]))


register(OpDef(
    "upsample", ("x",),
    (Attr("scale", "pair", doc="integer factor per spatial axis, or a pair [h, w]"),
     Attr("mode", "enum", "nearest", ("nearest", "bilinear")),
     Attr("align_corners", "bool", False, doc="bilinear: the corner pixels of input and output coincide")),
    _upsample_infer,
    doc="upsample by integer factors, as torch.nn.functional.interpolate(scale_factor=...)",
    cost=_upsample_cost,
    receptive=Receptive("window", nd=0, step=_upsample_window),
    classes=_MOVES, vjp=vjp_window_layer,
))


def _pixel_infer(shuffle: bool):
    def infer(a, ts):
        (x,) = ts
        need_rank(x, 3, "an input [..., C, H, W]")
        r = a["factor"]
        *lead, c, h, w = x.shape
        if shuffle:
            if isinstance(c, int) and c % (r * r):
                raise ShapeError(f"channels {c} are not divisible by factor² = {r * r} ({x})")
            out: tuple[Dim, ...] = (dim_floordiv(c, r * r), h * r, w * r)
        else:
            bad = [(n, d) for n, d in (("height", h), ("width", w)) if isinstance(d, int) and d % r]
            if bad:
                raise ShapeError(f"{bad[0][0]} {bad[0][1]} is not divisible by factor {r} ({x})")
            out = (c * r * r, dim_floordiv(h, r), dim_floordiv(w, r))
        return [x.with_shape(tuple(lead) + out)]
    return infer


register(OpDef(
    "pixel_shuffle", ("x",), (Attr("factor", "posint", doc="upscale factor r"),), _pixel_infer(True),
    doc="[..., C·r², H, W] → [..., C, H·r, W·r]: out[c, h·r + i, w·r + j] = x[c·r² + i·r + j, h, w]",
    # moves channels into space: an output pixel comes from one input pixel, 1/r of a pixel apart
    cost=free, receptive=rf_window(2, lambda a: ((1, 1), (Fraction(1, a["factor"]),) * 2)), classes=_MOVES,
    vjp=vjp_pixel_shuffle,
))

register(OpDef(
    "pixel_unshuffle", ("x",), (Attr("factor", "posint", doc="downscale factor r"),), _pixel_infer(False),
    doc="[..., C, H·r, W·r] → [..., C·r², H, W], the inverse of pixel_shuffle",
    # moves space into channels: an r×r window of stride r, folded into channels
    cost=free, receptive=rf_window(2, lambda a: ((a["factor"],) * 2, (Fraction(a["factor"]),) * 2)),
    classes=_MOVES, vjp=vjp_pixel_shuffle,
))
