"""Token embeddings, the unembedding (output head) and positional encodings."""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.registry import Attr, OpDef, ShapeError, register
from irc.types import INT_DTYPES


def _emb_infer(a, ts):
    (ids,) = ts
    if ids.dtype not in INT_DTYPES:
        raise ShapeError(f"expects integer token ids, got {ids}")
    return [ids.__class__("f32", ids.shape + (a["dim"],))]


register(OpDef(
    "embedding", ("ids",), (Attr("vocab", "posint"), Attr("dim", "dim")),
    _emb_infer, lambda a, ts: {"weight": (a["vocab"], a["dim"])},
    doc="table lookup: ids [...] → [..., dim]",
))


def _unembed_infer(a, ts):
    (x,) = ts
    need_rank(x, 1, "an input")
    need_float(x)
    if a["tied"] is not None and a["tied_dim"] is not None and a["tied_dim"] != x.shape[-1]:
        raise ShapeError(
            f"tied to '{a['tied']}', whose rows have {a['tied_dim']} features, but the input has {x.shape[-1]}"
        )
    return [x.with_shape(x.shape[:-1] + (a["vocab"],))]


def _unembed_params(a, ts):
    p = {} if a["tied"] is not None else {"weight": (a["vocab"], ts[0].shape[-1])}
    if a["bias"]:
        p["bias"] = (a["vocab"],)
    return p


register(OpDef(
    "unembed", ("x",),
    (Attr("vocab", "posint"), Attr("tied", "ref", None), Attr("tied_dim", "dim", None), Attr("bias", "bool", False)),
    _unembed_infer, _unembed_params, aliases=("lm_head",),
    doc="logits = x·Eᵀ; tied=emb reuses that embedding's table (counted once)",
))


def _pos_infer(a, ts):
    (x,) = ts
    need_rank(x, (3,), "a sequence [B, T, D]")
    need_float(x)
    t, d = x.shape[1], x.shape[2]
    if a["kind"] == "learned" and a["max_len"] is None:
        raise ShapeError("kind=learned needs max_len")
    if a["max_len"] is not None and isinstance(t, int) and t > a["max_len"]:
        raise ShapeError(f"sequence length {t} exceeds max_len={a['max_len']}")
    if a["kind"] == "sinusoidal" and isinstance(d, int) and d % 2:
        raise ShapeError(f"sinusoidal encoding needs an even width, got {d}")
    return [x]


register(OpDef(
    "positional", ("x",),
    (Attr("kind", "enum", "sinusoidal", ("sinusoidal", "learned")), Attr("max_len", "posint", None)),
    _pos_infer,
    lambda a, ts: {"weight": (a["max_len"], ts[0].shape[-1])} if a["kind"] == "learned" else {},
    aliases=("position",),
    doc="x + P[:T]: sinusoidal (no parameters) or a learned table [max_len, D]",
))
