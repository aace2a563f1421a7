"""Multi-head attention (self or cross; MHA, GQA, MQA; causal; RoPE)."""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.registry import Attr, OpDef, ShapeError, register


def head_dim(a, d) -> int:
    if a["head_dim"] is not None:
        return a["head_dim"]
    return d // a["heads"] if isinstance(d, int) else d // a["heads"]


def kv_heads(a) -> int:
    return a["kv_heads"] if a["kv_heads"] is not None else a["heads"]


def _infer(a, ts):
    x = ts[0]
    kv = ts[1] if len(ts) > 1 else x
    need_rank(x, (3,), "queries [B, T, D]")
    need_rank(kv, (3,), "keys/values [B, S, D]")
    need_float(x)
    d = x.shape[-1]
    h, g = a["heads"], kv_heads(a)
    if h % g:
        raise ShapeError(f"heads={h} is not a multiple of kv_heads={g}")
    if a["head_dim"] is None and isinstance(d, int) and d % h:
        raise ShapeError(f"model width {d} is not divisible by heads={h}")
    if a["rope"] and isinstance(d, int) and head_dim(a, d) % 2:
        raise ShapeError(f"rope needs an even head dimension, got {head_dim(a, d)}")
    if x.shape[0] != kv.shape[0] and 1 not in (x.shape[0], kv.shape[0]):
        raise ShapeError(f"query batch {x.shape[0]} differs from key/value batch {kv.shape[0]}")
    return [x]


def _params(a, ts):
    x = ts[0]
    kv = ts[1] if len(ts) > 1 else x
    d, dkv = x.shape[-1], kv.shape[-1]
    hd = head_dim(a, d)
    q_out = a["heads"] * hd
    kv_out = kv_heads(a) * hd
    p = {"wq": (q_out, d)}
    if a["bias"]:
        p["bq"] = (q_out,)
    p["wk"] = (kv_out, dkv)
    if a["bias"]:
        p["bk"] = (kv_out,)
    p["wv"] = (kv_out, dkv)
    if a["bias"]:
        p["bv"] = (kv_out,)
    p["wo"] = (d, q_out)
    if a["bias"]:
        p["bo"] = (d,)
    if a["rel_buckets"] is not None:
        p["rel_bias"] = (a["rel_buckets"], a["heads"])
    return p


register(OpDef(
    "attention", ("x", "kv?"),
    (
        Attr("heads", "posint"),
        Attr("kv_heads", "posint", None, doc="GQA groups; 1 is MQA; default = heads"),
        Attr("causal", "bool", False),
        Attr("scale", "float", None, doc="score scale; default 1/sqrt(head_dim)"),
        Attr("head_dim", "posint", None),
        Attr("bias", "bool", False),
        Attr("rope", "bool", False),
        Attr("rope_theta", "float", None, doc="default 10000"),
        Attr("rel_buckets", "posint", None, doc="T5 relative-position bias buckets (a [buckets, heads] table)"),
        Attr("rel_max_distance", "posint", None, doc="default 128"),
    ),
    _infer, _params, aliases=("mha", "multihead_attention"),
    doc="softmax(Q·Kᵀ·scale [+ causal mask])·V with projections wq, wk, wv, wo",
))
