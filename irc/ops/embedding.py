"""Token embeddings, the unembedding (output head) and positional encodings."""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.cost import ELEMENTWISE, Cost, free, numel, rows
from irc.ops.registry import LOWERED_FOR_CUDA, Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import GRAD_LOWERED, vjp_embedding, vjp_positional
from irc.types import INT_DTYPES


def _unembed_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("elementwise", numel(y) if node.attrs["bias"] else 0)


def _emb_infer(a, ts):
    (ids,) = ts
    if ids.dtype not in INT_DTYPES:
        raise ShapeError(f"expects integer token ids, got {ids}")
    return [ids.__class__("f32", ids.shape + (a["dim"],))]


register(OpDef(
    "embedding", ("ids",), (Attr("vocab", "posint"), Attr("dim", "dim")),
    _emb_infer, lambda a, ts: {"weight": (a["vocab"], a["dim"])},
    doc="table lookup: ids [...] → [..., dim]",
    cost=free, init=lambda a: {"weight": "normal"}, receptive=rf_reset("token ids have no spatial layout"),
    classes=frozenset({"embedding", "learned"}), vjp=vjp_embedding,
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
    cost=_unembed_cost, init=lambda a: {"weight": "normal", "bias": "zeros"},
    receptive=rf_reset("logits over a vocabulary"), classes=frozenset({"head", "linear"}), depth=1,
    na={"cuda": LOWERED_FOR_CUDA, "grad": GRAD_LOWERED},
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
    if a["layout"] is not None and a["kind"] != "sinusoidal":
        raise ShapeError(f"layout={a['layout']} orders the sinusoidal table's columns; a learned table has none")
    if a["layout"] == "concat" and isinstance(d, int) and d < 4:
        raise ShapeError(f"layout=concat spaces D/2 frequencies by log(10000)/(D/2 − 1): it needs a width of at "
                         f"least 4, got {d}")
    return [x]


register(OpDef(
    "positional", ("x",),
    (Attr("kind", "enum", "sinusoidal", ("sinusoidal", "learned")), Attr("max_len", "posint", None),
     Attr("layout", "enum", None, ("interleaved", "concat"),
          doc="sinusoidal columns: interleaved sin/cos (Vaswani; default) or [sin | cos] (Whisper, tensor2tensor)")),
    _pos_infer,
    lambda a, ts: {"weight": (a["max_len"], ts[0].shape[-1])} if a["kind"] == "learned" else {},
    aliases=("position",),
    doc="x + P[:T]: sinusoidal (no parameters) or a learned table [max_len, D]",
    cost=ELEMENTWISE, init=lambda a: {"weight": "normal"}, receptive=rf_reset("sequence positions"),
    classes=frozenset({"position", "embedding"}), vjp=vjp_positional,
))
