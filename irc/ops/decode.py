"""Incremental decoding: attention over an explicit KV cache, positions at an offset, and an
encoder-decoder's cross-attention split into its once-per-sequence keys/values and its queries.

The decode pass (irc/passes/decode.py) derives a model's prefill and one-token step graphs by
replacing each causal self-attention layer with ``cached_attention`` and each positional
encoding with ``positional_at``. Both read the same weights, under the same keys, as the layers
they replace (the parameter rules below are attention's and positional's own), so a weight file
of the model runs its decode graphs unchanged.

The cache is an IR value: per layer K and V of shape [B, kv_heads, slots, head_dim] at the
cache's dtype (f32 or f16). ``pos`` [B] is how many tokens each row already holds, so the new
tokens of row b sit at absolute positions pos[b] .. pos[b] + T − 1 (RoPE and learned tables
are read there). A layer without a window keeps position p in slot p; a sliding-window layer
(Mistral) keeps a rolling buffer of W slots, position p in slot p mod W.
"""

from __future__ import annotations

from irc.ops.attention import _rel_infer, check_score_bias, head_dim, kv_heads
from irc.ops.cost import ELEMENTWISE, SOFTMAX_PER_ELEMENT, Cost, causal_pairs, free, numel
from irc.ops.registry import OPS, Attr, OpDef, ShapeError, register, rf_reset
from irc.types import INT_DTYPES, TensorType

CACHE_DTYPES = ("f32", "f16")  # what a cache may be stored in (the compute dtype is the activations')
# the decode ops exist only at inference: training differentiates the model's own layers (attention,
# positional), which these replace in the decode graphs alone
NO_GRAD = "an inference-only decoding op: training differentiates the layers it replaces, never the cache"
NO_CUDA = " (decoding runs on the numpy reference and the CPU backend)"

# attention's attributes that a cached layer keeps (causal is implied; a T5 bias comes in as the
# attn_bias operand, one column per cache slot, from rel_position_bias_at)
_KEPT = ("heads", "kv_heads", "scale", "head_dim", "bias", "rope", "rope_theta", "window")


def _attention_attrs(a) -> dict:
    """The attrs as attention's own record reads them (for its parameter and init rules)."""
    return {**{k: a.get(k) for k in _KEPT}, "causal": True, "rel_buckets": None, "rel_max_distance": None}


def cache_slots(a, ctx):
    """Slots a layer's cache holds for a context of ``ctx`` tokens: W for a sliding window (a rolling
    buffer; min(W, ctx) when ctx is known), else ctx."""
    w = a.get("window")
    if w is None:
        return ctx
    return min(w, ctx) if isinstance(ctx, int) else w


def _need_positions(t: TensorType, batch, what: str) -> None:
    if t.dtype not in INT_DTYPES or t.rank != 1 or (t.shape[0] != batch and t.shape[0] != 1):
        raise ShapeError(f"{what} holds one integer per row: expected i32[{batch}], got {t}")


def _cached_infer(a, ts):
    x, kc, vc, pos = ts[:4]
    OPS["attention"].infer(_attention_attrs(a), [x])  # attention's own checks of heads, widths and rope
    b, _, d = x.shape
    g, hd = kv_heads(a), head_dim(a, d)
    for name, c in (("k_cache", kc), ("v_cache", vc)):
        want = (b, g, kc.shape[2] if kc.rank == 4 else "slots", hd)
        dtype = kc.dtype if kc.dtype in CACHE_DTYPES else "f32"
        if c.dtype != dtype or tuple(c.shape) != want:
            raise ShapeError(f"{name} {c} does not match the layer: expected {dtype}"
                             f"[{', '.join(str(v) for v in want)}] (B, kv_heads={g}, slots, head_dim={hd}; "
                             f"stored as {' or '.join(CACHE_DTYPES)}, both caches alike)")
    w = a["window"]
    if w is not None and isinstance(kc.shape[2], int) and kc.shape[2] > w:
        raise ShapeError(f"a window={w} layer keeps a rolling buffer of at most {w} slots, got {kc.shape[2]}")
    _need_positions(pos, b, "pos")
    _need_positions(ts[4], b, "valid")
    if len(ts) > 5:  # T5's decoder bias, one column per cache slot (absolute key position)
        if w is not None:
            raise ShapeError("a score bias indexes keys by absolute position; a window's rolling buffer has none")
        check_score_bias(ts[5], (b, a["heads"], x.shape[1], kc.shape[2]))
    return [x, kc, vc]


def _cached_params(a, ts):
    return OPS["attention"].param_shapes(_attention_attrs(a), [ts[0]])


def _cached_cost(node, ins, outs) -> Cost:
    """At a full cache: the projections of the T new tokens, and each new query against every slot
    plus the causal part of the new tokens (an upper bound: a step reads only the filled slots)."""
    a = node.attrs
    x, kc = ins[0], ins[1]
    b, t, d = x.shape
    hd = head_dim(a, d)
    q_w, kv_w = a["heads"] * hd, kv_heads(a) * hd
    pairs = b * a["heads"] * (t * kc.shape[2] + causal_pairs(t, t))
    c = Cost().mac("linear", b * t * d * (q_w + 2 * kv_w) + b * t * q_w * d)
    c.mac("attention", 2 * pairs * hd)
    c.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    c.add("elementwise", pairs * (2 if len(ins) > 5 else 1))  # the score scale (and a bias)
    if a["rope"]:
        c.add("elementwise", 3 * b * t * (q_w + kv_w))
    return c


register(OpDef(
    "cached_attention", ("x", "k_cache", "v_cache", "pos", "valid", "attn_bias?"),
    (
        Attr("heads", "posint"),
        Attr("kv_heads", "posint", None, doc="GQA groups; 1 is MQA; default = heads"),
        Attr("scale", "float", None, doc="score scale; default 1/sqrt(head_dim)"),
        Attr("head_dim", "posint", None),
        Attr("bias", "bool_or_letters", False, ("q", "k", "v", "o")),
        Attr("rope", "bool", False),
        Attr("rope_theta", "float", None, doc="default 10000"),
        Attr("window", "posint", None, doc="sliding window: the cache is a rolling buffer of W slots"),
    ),
    _cached_infer, _cached_params, results=("out", "k_cache", "v_cache"),
    doc="causal attention of T new tokens at positions pos..pos+T−1 over the cached keys and values and "
        "their own (+ attn_bias[..., key position]); writes the valid[b] real ones of each row into the cache",
    cost=_cached_cost, init=lambda a: OPS["attention"].init_rules(_attention_attrs(a)),
    receptive=rf_reset("mixes every position it attends to"), classes=frozenset({"attention", "learned", "decode"}),
    depth=2,
    na={"cuda": "the CUDA backend has no cached-attention kernel yet" + NO_CUDA,
        "grad": NO_GRAD},
))


def _pos_at_infer(a, ts):
    x, pos = ts
    OPS["positional"].infer(a, [x])  # positional's own checks of the table and the width
    _need_positions(pos, x.shape[0], "pos")
    return [x]


register(OpDef(
    "positional_at", ("x", "pos"),
    (Attr("kind", "enum", "sinusoidal", ("sinusoidal", "learned")), Attr("max_len", "posint", None),
     Attr("layout", "enum", None, ("interleaved", "concat"))),
    _pos_at_infer,
    lambda a, ts: {"weight": (a["max_len"], ts[0].shape[-1])} if a["kind"] == "learned" else {},
    doc="x[b, t] + P[pos[b] + t]: positional's table read from each row's offset",
    cost=ELEMENTWISE, init=lambda a: {"weight": "normal"}, receptive=rf_reset("sequence positions"),
    classes=frozenset({"position", "embedding", "decode"}),
    na={"cuda": "the CUDA backend has no positional_at kernel yet" + NO_CUDA,
        "grad": NO_GRAD},
))


# -- encoder-decoder models: cross-attention's keys and values come from the encoder, once per sequence


def _proj(a, which: str, ts) -> dict:
    """attention's parameters ``which`` (q/o or k/v) for queries ts[0] and memory ts[-1]."""
    shapes = OPS["attention"].param_shapes({**_attention_attrs(a), "causal": False}, [ts[0], ts[-1]])
    return {k: v for k, v in shapes.items() if k[1] in which}


def _cross_kv_infer(a, ts):
    (mem,) = ts
    OPS["attention"].infer({**_attention_attrs(a), "causal": False}, [mem])  # the heads and widths
    b, s, _ = mem.shape
    out = TensorType(a["dtype"], (b, kv_heads(a), s, a["head_dim"]))
    return [out, out]


def _cross_kv_cost(node, ins, outs) -> Cost:
    mem = ins[0]
    return Cost().mac("linear", 2 * numel(mem) * kv_heads(node.attrs) * node.attrs["head_dim"])


register(OpDef(
    "cross_kv", ("memory",),
    (Attr("heads", "posint"), Attr("kv_heads", "posint", None), Attr("head_dim", "posint"),
     Attr("bias", "bool_or_letters", False, ("q", "k", "v", "o")),
     Attr("dtype", "enum", "f32", CACHE_DTYPES, doc="how the keys and values are stored")),
    _cross_kv_infer, lambda a, ts: _proj(a, "kv", ts), results=("k", "v"),
    doc="a cross-attention layer's keys and values of the encoder output [B, S, D]: [B, kv_heads, S, head_dim] "
        "each, computed once per sequence (wk, wv under the layer's own keys)",
    cost=_cross_kv_cost, init=lambda a: OPS["attention"].init_rules(_attention_attrs(a)),
    receptive=rf_reset("an encoder's keys and values"), classes=frozenset({"attention", "linear", "decode"}), depth=1,
    na={"cuda": "the CUDA backend has no cross_kv kernel yet" + NO_CUDA,
        "grad": NO_GRAD},
))


def _cross_infer(a, ts):
    x, k, v = ts[:3]
    OPS["attention"].infer({**_attention_attrs(a), "causal": False}, [x])
    want = (x.shape[0], kv_heads(a), k.shape[2] if k.rank == 4 else "S", head_dim(a, x.shape[-1]))
    for name, c in (("k", k), ("v", v)):
        if c.dtype not in CACHE_DTYPES or tuple(c.shape) != want:
            raise ShapeError(f"cross {name} {c} does not match the layer: expected [{', '.join(map(str, want))}] "
                             f"(B, kv_heads, S, head_dim) in {' or '.join(CACHE_DTYPES)}")
    if len(ts) > 3:  # the source's padding mask (0 or -inf per key), or any additive bias
        check_score_bias(ts[3], (x.shape[0], a["heads"], x.shape[1], k.shape[2]))
    return [x]


def _cross_cost(node, ins, outs) -> Cost:
    a = node.attrs
    x, k = ins[0], ins[1]
    b, t, d = x.shape
    hd = head_dim(a, d)
    pairs = b * a["heads"] * t * k.shape[2]
    c = Cost().mac("linear", 2 * b * t * d * a["heads"] * hd).mac("attention", 2 * pairs * hd)
    return c.add("softmax", SOFTMAX_PER_ELEMENT * pairs).add("elementwise", pairs * (2 if len(ins) > 3 else 1))


register(OpDef(
    "cached_cross_attention", ("x", "k", "v", "attn_bias?"),
    (Attr("heads", "posint"), Attr("kv_heads", "posint", None), Attr("scale", "float", None),
     Attr("head_dim", "posint", None), Attr("bias", "bool_or_letters", False, ("q", "k", "v", "o"))),
    _cross_infer, lambda a, ts: _proj(a, "qo", ts[:3]),
    doc="cross-attention of the queries x [B, T, D] over keys and values cross_kv made: "
        "softmax(q·kᵀ·scale + attn_bias)·v, then wo (wq, wo under the layer's own keys); attn_bias "
        "[B|1, heads|1, T|1, S] is the source's padding mask when the encoder's rows differ in length",
    cost=_cross_cost, init=lambda a: OPS["attention"].init_rules(_attention_attrs(a)),
    receptive=rf_reset("mixes every position it attends to"),
    classes=frozenset({"attention", "learned", "decode"}), depth=2,
    na={"cuda": "the CUDA backend has no cached_cross_attention kernel yet" + NO_CUDA,
        "grad": NO_GRAD},
))


def _rel_at_infer(a, ts):
    x, pos = ts
    (full,) = _rel_infer(a, [x])  # rel_position_bias's own checks of the buckets
    _need_positions(pos, x.shape[0], "pos")
    return [full.with_shape((x.shape[0], a["heads"], x.shape[1], a["keys"]))]


register(OpDef(
    "rel_position_bias_at", ("q", "pos"),
    (Attr("heads", "posint"), Attr("buckets", "posint", 32), Attr("max_distance", "posint", 128),
     Attr("bidirectional", "bool", False), Attr("keys", "dim", doc="key positions 0..keys−1 (the cache's slots)")),
    _rel_at_infer, lambda a, ts: {"weight": (a["buckets"], a["heads"])},
    doc="T5's bias for queries at pos[b]..pos[b]+T−1 against keys at positions 0..keys−1: "
        "bias[b, h, t, j] = weight[bucket(j − pos[b] − t), h]",
    cost=free, init=lambda a: {"weight": "normal"}, receptive=rf_reset("a bias over (query, key) pairs"),
    classes=frozenset({"position", "decode"}),
    na={"cuda": "the CUDA backend has no rel_position_bias_at kernel yet" + NO_CUDA,
        "grad": NO_GRAD},
))
