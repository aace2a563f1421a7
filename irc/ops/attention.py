"""Multi-head attention (self or cross; MHA, GQA, MQA; causal; RoPE; an additive score bias)
and the T5 relative-position bias that feeds it."""

from __future__ import annotations

from irc.graph import Node
from irc.ops.common import need_float, need_rank
from irc.ops.registry import Attr, OpDef, ShapeError, register
from irc.types import TensorType


def head_dim(a, d) -> int:
    if a["head_dim"] is not None:
        return a["head_dim"]
    return d // a["heads"] if isinstance(d, int) else d // a["heads"]


def kv_heads(a) -> int:
    return a["kv_heads"] if a["kv_heads"] is not None else a["heads"]


def is_cross(node: Node) -> bool:
    """Keys and values from another sequence (attention(x, x, bias) is self-attention)."""
    return len(node.inputs) > 1 and node.inputs[1] != node.inputs[0]


def check_score_bias(bias: TensorType, scores: tuple) -> None:
    """An additive bias must broadcast to the scores [B, heads, T, S] without growing them."""
    need_float(bias, "attention bias")
    need_rank(bias, (2, 3, 4), "an attention bias [B|1, heads|1, T|1, S|1]")
    for have, want in zip(bias.shape[::-1], scores[::-1]):
        if have != 1 and have != want:
            raise ShapeError(f"attention bias {bias} does not broadcast to the scores "
                             f"[{', '.join(str(d) for d in scores)}] (B, heads, T, S)")


def _queries_and_keys(ts: list[TensorType], keys: str) -> tuple[TensorType, TensorType]:
    """The [B, T, D] queries and the [B, S, D] sequence the keys come from (the queries when absent)."""
    x = ts[0]
    kv = ts[1] if len(ts) > 1 else x
    need_rank(x, (3,), "queries [B, T, D]")
    need_rank(kv, (3,), f"{keys} [B, S, D]")
    return x, kv


def _infer(a, ts):
    x, kv = _queries_and_keys(ts, "keys/values")
    need_float(x)
    d = x.shape[-1]
    h, g = a["heads"], kv_heads(a)
    if h % g:
        raise ShapeError(f"heads={h} is not a multiple of kv_heads={g}")
    if a["head_dim"] is None and isinstance(d, int) and d % h:
        raise ShapeError(f"model width {d} is not divisible by heads={h}")
    if a["rope"] and isinstance(d, int) and head_dim(a, d) % 2:
        raise ShapeError(f"rope needs an even head dimension, got {head_dim(a, d)}")
    if a["window"] is not None and not a["causal"]:
        raise ShapeError("window= slides the causal mask (query i sees keys i − window < j <= i); "
                         "it needs causal=true")
    if x.shape[0] != kv.shape[0] and kv.shape[0] != 1:
        raise ShapeError(f"query batch {x.shape[0]} differs from key/value batch {kv.shape[0]} (keys and values "
                         "of batch 1 are shared by every query sequence)")
    if a["rel_buckets"] is not None:  # bidirectional buckets unless causal (the layer's own T5 table)
        check_buckets(a["rel_buckets"], a["rel_max_distance"] or 128, not a["causal"],
                      ("rel_buckets", "rel_max_distance"))
    if len(ts) > 2:
        check_score_bias(ts[2], (x.shape[0], a["heads"], x.shape[1], kv.shape[1]))
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
    "attention", ("x", "kv?", "attn_bias?"),
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
        Attr("window", "posint", None, doc="sliding window (Mistral): query i sees keys i − window < j <= i"),
    ),
    _infer, _params, aliases=("mha", "multihead_attention"),
    doc="softmax(Q·Kᵀ·scale [+ attn_bias] [+ causal mask])·V with projections wq, wk, wv, wo",
    omitted={"kv": "x"},
))


# -- T5's relative-position bias: one table per stack, its [1, heads, T, S] bias fed to every layer


def check_buckets(buckets: int, max_distance: int, bidirectional: bool, names: tuple[str, str] = ("buckets",
                  "max_distance")) -> None:
    """T5's bucketing needs one exact bucket at least, and room above it for the log-spaced ones."""
    exact = (buckets // 2 if bidirectional else buckets) // 2  # distances with a bucket each
    if exact < 1:
        raise ShapeError(f"{names[0]}={buckets} leaves no bucket per distance: T5's scheme needs at least "
                         f"{4 if bidirectional else 2}{' when bidirectional' if bidirectional else ''}")
    if max_distance <= exact:
        raise ShapeError(f"{names[1]}={max_distance} must be greater than {exact}: distances 0..{exact - 1} "
                         f"have a bucket each and the log-spaced buckets cover {exact}..{names[1]}")


def _rel_infer(a, ts):
    q, k = _queries_and_keys(ts, "keys")
    check_buckets(a["buckets"], a["max_distance"], a["bidirectional"])
    return [TensorType("f32", (1, a["heads"], q.shape[1], k.shape[1]))]


register(OpDef(
    "rel_position_bias", ("q", "k?"),
    (
        Attr("heads", "posint"),
        Attr("buckets", "posint", 32),
        Attr("max_distance", "posint", 128),
        Attr("bidirectional", "bool", True, doc="false for causal self-attention (T5's decoder)"),
    ),
    _rel_infer, lambda a, ts: {"weight": (a["buckets"], a["heads"])},
    aliases=("relative_position_bias",),
    doc="T5's bias[0, h, i, j] = weight[bucket(j − i), h] for queries q and keys k (only their lengths "
        "are read); pass it to attention(..., attn_bias=b) in every layer of the stack",
))
