"""Multi-head attention (self or cross; MHA, GQA, MQA; causal; RoPE; an additive score bias)
and the T5 relative-position bias that feeds it."""

from __future__ import annotations

from irc.graph import Node
from irc.ops.common import need_float, need_rank
from irc.ops.cost import SOFTMAX_PER_ELEMENT, CacheUse, Cost, free, visible_pairs
from irc.ops.registry import Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import GRAD_LOWERED, vjp_rel_position_bias
from irc.types import TensorType

# T5's relative-position table of an attention with rel_buckets: rel_position_bias's own "weight" under the
# layer's "rel_bias" scope, so the decompose pass's rel_position_bias node reads the very same key
REL_TABLE = "rel_bias.weight"
ROPE_THETA = 10000.0  # RoPE's base when rope_theta is not given (Su et al.; Llama 1/2)
REL_MAX_DISTANCE = 128  # T5's default distance past which relative positions share a bucket


def head_dim(a, d) -> int:
    """The width of one head: head_dim= when given, else the model width over the heads."""
    if a.get("head_dim") is not None:
        return a["head_dim"]
    return d // a["heads"]


BIAS_LETTERS = ("q", "k", "v", "o")  # the projections bias= can name: bias=qvo is Whisper's, bias=qkv Qwen2's


def biased(a, which: str) -> bool:
    """Whether projection ``which`` (q, k, v or o) adds a bias: bias=true all four, false none,
    else the letters given. The only reading of attention's bias attribute: everything calls this."""
    b = a.get("bias")
    return b is True or (isinstance(b, str) and which in b)


def kv_heads(a) -> int:
    """Key/value heads: kv_heads= when given (GQA; 1 is MQA), else one per query head.
    The only place this default is worked out: everything else calls this."""
    return a["kv_heads"] if a.get("kv_heads") is not None else a["heads"]


def score_scale(a, hd) -> float:
    """The factor on Q·Kᵀ: scale= when given, else 1/sqrt(head width), computed as hd**-0.5 (the
    literal decomposed IR prints; the same float32 as 1/math.sqrt(hd) for every width)."""
    return a["scale"] if a.get("scale") is not None else hd**-0.5


def rope_theta(a, key: str = "rope_theta") -> float:
    """RoPE's base (``theta`` on the rope primitive, ``rope_theta`` on attention)."""
    return a[key] if a.get(key) is not None else ROPE_THETA


def rel_max_distance(a) -> int:
    return a["rel_max_distance"] if a.get("rel_max_distance") is not None else REL_MAX_DISTANCE


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
        check_buckets(a["rel_buckets"], rel_max_distance(a), not a["causal"],
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
    p = {}
    for which, shape in (("q", (q_out, d)), ("k", (kv_out, dkv)), ("v", (kv_out, dkv)), ("o", (d, q_out))):
        p[f"w{which}"] = shape
        if biased(a, which):
            p[f"b{which}"] = shape[:1]
    if a["rel_buckets"] is not None:
        p[REL_TABLE] = (a["rel_buckets"], a["heads"])
    return p


def attention_pairs(a, ins: list[TensorType]) -> int:
    """(query, key) pairs per batch element and head that attention actually computes."""
    t = ins[0].shape[1]
    s = ins[1].shape[1] if len(ins) > 1 else t
    return visible_pairs(t, s, a["causal"], a.get("window"))


def flops_per_pair(a, d_model: int) -> int:
    """FLOPs of Q·Kᵀ and ·V for one (query, key) pair over all heads: 2·2·heads·d_head."""
    return 4 * a["heads"] * head_dim(a, d_model)


def _cost(node, ins, outs) -> Cost:
    a = node.attrs
    x = ins[0]
    kv = ins[1] if len(ins) > 1 else x
    b, t, d = x.shape
    s, dkv = kv.shape[1], kv.shape[2]
    hd = head_dim(a, d)
    q_w, kv_w = a["heads"] * hd, kv_heads(a) * hd
    pairs = b * a["heads"] * attention_pairs(a, ins)
    c = Cost().mac("linear", b * t * d * q_w + 2 * b * s * dkv * kv_w + b * t * q_w * d)
    c.mac("attention", 2 * pairs * hd)  # Q·Kᵀ and probabilities·V
    c.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    c.add("elementwise", pairs)  # the score scale
    biases = (a["rel_buckets"] is not None) + (len(ins) > 2)  # T5's table and an attn_bias input
    if biases:
        c.add("elementwise", biases * pairs)
    if a["rope"]:
        c.add("elementwise", 3 * (b * t * q_w + b * s * kv_w))  # x·cos + rotate(x)·sin
    bias_adds = {"q": b * t * q_w, "k": b * s * kv_w, "v": b * s * kv_w, "o": b * t * d}
    added = sum(n for which, n in bias_adds.items() if biased(a, which))  # only the biased projections
    if added:
        c.add("elementwise", added)
    return c


def _kv_cache(node, ins) -> CacheUse | None:
    """Causal self-attention caches a key and a value per KV head per token; cross-attention holds its
    encoder's keys and values once per sequence (irc/analysis/kv_cache.py), an encoder caches nothing."""
    a = node.attrs
    if not a["causal"] or is_cross(node):
        return None
    d = ins[0].shape[-1]
    return CacheUse(2 * kv_heads(a) * head_dim(a, d), flops_per_pair(a, d), a.get("window"))


def _internal(a, ts) -> int:
    """q and the context, k and v, and the full score matrix, as an unfused kernel holds them."""
    x = ts[0]
    kv = ts[1] if len(ts) > 1 else x
    b, t, d = x.shape
    s = kv.shape[1]
    hd = head_dim(a, d)
    return 2 * b * t * a["heads"] * hd + 2 * b * s * kv_heads(a) * hd + b * a["heads"] * t * s


def _init(a) -> dict[str, str]:
    """GPT-2's normal(0.02) for the projections and T5's table, zeros for the biases."""
    return {"wq": "normal", "wk": "normal", "wv": "normal", "wo": "normal", REL_TABLE: "normal",
            "bq": "zeros", "bk": "zeros", "bv": "zeros", "bo": "zeros"}


register(OpDef(
    "attention", ("x", "kv?", "attn_bias?"),
    (
        Attr("heads", "posint"),
        Attr("kv_heads", "posint", None, doc="GQA groups; 1 is MQA; default = heads"),
        Attr("causal", "bool", False),
        Attr("scale", "float", None, doc="score scale; default 1/sqrt(head_dim)"),
        Attr("head_dim", "posint", None),
        Attr("bias", "bool_or_letters", False, BIAS_LETTERS,
             doc="true: all four projections biased; false: none; or some of q, k, v, o (qvo: Whisper, qkv: Qwen2)"),
        Attr("rope", "bool", False),
        Attr("rope_theta", "float", None, doc="default 10000"),
        Attr("rel_buckets", "posint", None, doc="T5 relative-position bias buckets (a [buckets, heads] table)"),
        Attr("rel_max_distance", "posint", None, doc="default 128"),
        Attr("window", "posint", None, doc="sliding window (Mistral): query i sees keys i − window < j <= i"),
    ),
    _infer, _params, aliases=("mha", "multihead_attention"),
    doc="softmax(Q·Kᵀ·scale [+ attn_bias] [+ causal mask])·V with projections wq, wk, wv, wo",
    omitted={"kv": "x"},
    cost=_cost, init=_init, internal=_internal, receptive=rf_reset("mixes every position it attends to"),
    classes=frozenset({"attention", "learned"}), depth=2, na={"grad": GRAD_LOWERED}, kv_cache=_kv_cache,
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
    cost=free,  # a gather from the bucket table
    init=lambda a: {"weight": "normal"}, receptive=rf_reset("a bias over (query, key) pairs"),
    classes=frozenset({"position"}),
    doc="T5's bias[0, h, i, j] = weight[bucket(j − i), h] for queries q and keys k (only their lengths "
        "are read); pass it to attention(..., attn_bias=b) in every layer of the stack", vjp=vjp_rel_position_bias,
))
