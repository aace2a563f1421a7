"""Forward FLOPs of every op: one function per op, in one table keyed by op name.

Conventions (docs/analysis-json.md spells them out):
- a multiply-add (MAC) is 2 FLOPs; ``linear`` (products with weights: dense, conv,
  projections, recurrent gates, unembedding), ``attention`` (Q·Kᵀ and ·V) and ``matmul``
  (a product of two activations) are counted as exact MACs and reported both ways;
- bias adds, residual adds and other arithmetic are 1 FLOP per result element
  (``elementwise``); an activation function is 1 FLOP per evaluation (``activation``);
  ``norm``, ``softmax`` and ``pool`` use the per-element counts in the functions below;
- ops that only move data cost nothing, on purpose (``_free``).

Every registered op must have an entry (a test walks the registry), so a new op can never
silently count zero; analysing a graph with an op missing here is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from irc.diagnostics import IrcError
from irc.graph import Node
from irc.ops.attention import head_dim, kv_heads
from irc.ops.common import pair
from irc.types import TensorType

MATMUL_KINDS = ("linear", "attention", "matmul")  # FLOPs = 2 × MACs
KINDS = ("linear", "attention", "matmul", "activation", "elementwise", "norm", "softmax", "pool")


@dataclass
class Cost:
    """Forward cost of one node: MACs of its products and FLOPs by kind."""

    macs: int = 0
    flops: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, flops: int) -> Cost:
        if flops:
            self.flops[kind] = self.flops.get(kind, 0) + flops
        return self

    def mac(self, kind: str, macs: int) -> Cost:
        self.macs += macs
        return self.add(kind, 2 * macs)

    @property
    def total(self) -> int:
        return sum(self.flops.values())


CostFn = Callable[[Node, list[TensorType], list[TensorType]], Cost]


def _n(t: TensorType) -> int:
    n = t.numel()
    if not isinstance(n, int):
        raise IrcError(f"cannot count the cost of {t}: bind its symbols with -D")
    return n


def _rows(t: TensorType) -> int:
    """Number of vectors along the last axis (tokens, for [B, T, D])."""
    return _n(t) // t.shape[-1] if t.shape[-1] else 0


# -- dense ------------------------------------------------------------------------


def _linear(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", _rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("elementwise", _n(y) if node.attrs["bias"] else 0)


def _matmul(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    return Cost().mac("matmul", _n(outs[0]) * ins[0].shape[-1])


def _ffn(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    tokens, hidden = _rows(x), node.attrs["hidden"]
    c = Cost().mac("linear", tokens * hidden * (x.shape[-1] + y.shape[-1]))
    c.add("activation", tokens * hidden)
    return c.add("elementwise", tokens * hidden + _n(y) if node.attrs["bias"] else 0)


def _swiglu(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    tokens, hidden = _rows(x), node.attrs["hidden"]
    c = Cost().mac("linear", tokens * hidden * (2 * x.shape[-1] + y.shape[-1]))
    c.add("activation", tokens * hidden)  # silu(gate)
    c.add("elementwise", tokens * hidden)  # ⊙ up
    return c.add("elementwise", 2 * tokens * hidden + _n(y) if node.attrs["bias"] else 0)


# -- convolution and pooling --------------------------------------------------------


def _kernel(node: Node, nd: int) -> tuple[int, ...]:
    k = node.attrs["kernel"]
    return pair(k) if nd == 2 else (k,)


def _conv(nd: int) -> CostFn:
    def cost(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
        y = outs[0]
        taps = 1
        for k in _kernel(node, nd):
            taps *= k
        cin = ins[0].shape[1] // node.attrs["groups"]
        c = Cost().mac("linear", _n(y) * cin * taps)
        return c.add("elementwise", _n(y) if node.attrs["bias"] else 0)
    return cost


def _pool(nd: int) -> CostFn:
    def cost(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
        taps = 1
        for k in _kernel(node, nd):
            taps *= k
        return Cost().add("pool", _n(outs[0]) * taps)  # a compare or add per tap
    return cost


def _global_avgpool(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    return Cost().add("pool", _n(ins[0]))


def _bin_total(size: int, out: int) -> int:
    """Sum of PyTorch adaptive-pool bin widths along one axis."""
    return sum(-((-(i + 1) * size) // out) - (i * size) // out for i in range(out))


def _adaptive_avgpool2d(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x = ins[0]
    oh, ow = pair(node.attrs["size"])
    return Cost().add("pool", x.shape[0] * x.shape[1] * _bin_total(x.shape[2], oh) * _bin_total(x.shape[3], ow))


# -- elementwise, activations, softmax --------------------------------------------------


def _per_element(kind: str, per: int = 1) -> CostFn:
    def cost(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
        return Cost().add(kind, per * _n(outs[0]))
    return cost


def _free(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    """Data movement (views, copies, a gather, inference-time dropout): no arithmetic."""
    return Cost()


SOFTMAX_PER_ELEMENT = 5  # max, subtract, exp, sum, divide

# -- norms ----------------------------------------------------------------------------


def _layernorm(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    # mean (1), centre (1), square and accumulate (2), scale by 1/std (1), then gain and bias
    per = 5 + (node.attrs["affine"] + (node.attrs["affine"] and node.attrs["bias"]))
    return Cost().add("norm", per * _n(outs[0]))


def _rmsnorm(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    per = 3 + node.attrs["affine"]  # square and accumulate (2), scale (1), gain
    return Cost().add("norm", per * _n(outs[0]))


def _batchnorm(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    return Cost().add("norm", 2 * _n(outs[0]))  # inference: statistics fold into one scale and shift


# -- embeddings ------------------------------------------------------------------------


def _unembed(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", _rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("elementwise", _n(y) if node.attrs["bias"] else 0)


# -- attention -------------------------------------------------------------------------


def causal_pairs(t: int, s: int) -> int:
    """(query, key) pairs a top-left-aligned causal mask keeps: query i sees keys 0..i."""
    if t <= s:
        return t * (t + 1) // 2
    return s * (s + 1) // 2 + (t - s) * s


def visible_pairs(t: int, s: int, causal: bool, window: int | None) -> int:
    """(query, key) pairs a mask keeps. A sliding window also hides j <= i − W: for query i that
    is min(i − W + 1, S) keys once i >= W, which sums to causal_pairs(T − W, S)."""
    if not causal:
        return t * s
    hidden = causal_pairs(t - window, s) if window is not None and t > window else 0
    return causal_pairs(t, s) - hidden


def attention_pairs(node: Node, ins: list[TensorType]) -> int:
    """(query, key) pairs per batch element and head that attention actually computes."""
    t = ins[0].shape[1]
    s = ins[1].shape[1] if len(ins) > 1 else t
    return visible_pairs(t, s, node.attrs["causal"], node.attrs.get("window"))


def attention_flops_per_pair(attrs: dict, d_model: int) -> int:
    """FLOPs of Q·Kᵀ and ·V for one (query, key) pair over all heads: 2·2·heads·d_head."""
    return 4 * attrs["heads"] * head_dim(attrs, d_model)


def _attention(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    a = node.attrs
    x = ins[0]
    kv = ins[1] if len(ins) > 1 else x
    b, t, d = x.shape
    s, dkv = kv.shape[1], kv.shape[2]
    hd = head_dim(a, d)
    q_w, kv_w = a["heads"] * hd, kv_heads(a) * hd
    pairs = b * a["heads"] * attention_pairs(node, ins)
    c = Cost().mac("linear", b * t * d * q_w + 2 * b * s * dkv * kv_w + b * t * q_w * d)
    c.mac("attention", 2 * pairs * hd)  # Q·Kᵀ and probabilities·V
    c.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    c.add("elementwise", pairs)  # the score scale
    biases = (a["rel_buckets"] is not None) + (len(ins) > 2)  # T5's table and an attn_bias input
    if biases:
        c.add("elementwise", biases * pairs)
    if a["rope"]:
        c.add("elementwise", 3 * (b * t * q_w + b * s * kv_w))  # x·cos + rotate(x)·sin
    if a["bias"]:
        c.add("elementwise", b * t * q_w + 2 * b * s * kv_w + b * t * d)
    return c


# -- recurrent -----------------------------------------------------------------------------

# per hidden unit and step: activation evaluations, other elementwise FLOPs (bias adds apart)
_RECURRENT_STEP = {
    "rnn": (1, 0),
    "lstm": (5, 4),  # σ i, f, o; tanh g, tanh c · c = f·c + i·g (3) · h = o·tanh c (1)
    "gru": (3, 5),  # σ r, z; tanh n · r⊙h (1) · h = (1 − z)·h + z·n (4)
}


def _recurrent(op: str) -> CostFn:
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[op]

    def cost(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
        b, steps, d = ins[0].shape
        h = node.attrs["hidden"]
        per_step = b * gates * h * (d + h)
        c = Cost().mac("linear", steps * per_step)  # per step × steps
        act, other = _RECURRENT_STEP[op]
        c.add("activation", steps * b * h * act)
        c.add("elementwise", steps * b * h * other)
        if node.attrs["bias"]:
            biases = 2 if op == "gru" and node.attrs["variant"] == "torch" else 1
            c.add("elementwise", steps * b * gates * h * biases)
        return c
    return cost


# -- primitives of the decompose pass and the fused ops of the fusion passes ---------------
# Each counts what its composite counted for the same work, so FLOPs agree before and after
# lowering (the causal attention core agrees once fused: unfused, the full T×S is computed).


def _gemm(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", _rows(x) * x.shape[-1] * y.shape[-1])
    c.add("elementwise", _n(y) if len(ins) > 2 else 0)
    return c.add("activation", _n(y) if node.attrs.get("act", "none") != "none" else 0)


def _gemm_glu(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", 2 * _rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("activation", _n(y)).add("elementwise", _n(y))


def _gemm_multi(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    x = ins[0]
    return Cost().mac("linear", _rows(x) * x.shape[-1] * sum(y.shape[-1] for y in outs))


def _sdpa(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    q, k = ins[0], ins[1]
    b, h, t, hd = q.shape
    s = k.shape[2]
    pairs = b * h * visible_pairs(t, s, node.attrs["causal"], node.attrs.get("window"))
    c = Cost().mac("attention", 2 * pairs * hd)
    c.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    c.add("elementwise", pairs * (2 if len(ins) > 3 else 1))  # the scale (and an additive bias)
    return c


def _add_norm(node: Node, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    norm = _layernorm if node.attrs["kind"] == "layernorm" else _rmsnorm
    return norm(node, ins, outs[1:]).add("elementwise", _n(outs[0]))


FLOP_TABLE: dict[str, CostFn] = {
    "param": _free,
    "gemm": _gemm,
    "gemm_glu": _gemm_glu,
    "gemm_multi": _gemm_multi,
    "rope": _per_element("elementwise", 3),  # x·cos + rotate(x)·sin
    "causal_mask": _free,
    "sdpa": _sdpa,
    "add_norm": _add_norm,
    "input": _free,
    "linear": _linear,
    "matmul": _matmul,
    "ffn": _ffn,
    "swiglu": _swiglu,
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    "maxpool1d": _pool(1),
    "maxpool2d": _pool(2),
    "avgpool1d": _pool(1),
    "avgpool2d": _pool(2),
    "global_avgpool": _global_avgpool,
    "adaptive_avgpool2d": _adaptive_avgpool2d,
    "relu": _per_element("activation"),
    "leaky_relu": _per_element("activation"),
    "gelu": _per_element("activation"),
    "silu": _per_element("activation"),
    "tanh": _per_element("activation"),
    "sigmoid": _per_element("activation"),
    "abs": _per_element("activation"),
    "identity": _free,
    "softmax": _per_element("softmax", SOFTMAX_PER_ELEMENT),
    "dropout": _free,
    "add": _per_element("elementwise"),
    "sub": _per_element("elementwise"),
    "mul": _per_element("elementwise"),
    "div": _per_element("elementwise"),
    "embedding": _free,
    "rel_position_bias": _free,  # a gather from the bucket table
    "unembed": _unembed,
    "positional": _per_element("elementwise"),  # x + P
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm": _batchnorm,
    "attention": _attention,
    "rnn": _recurrent("rnn"),
    "lstm": _recurrent("lstm"),
    "gru": _recurrent("gru"),
    "flatten": _free,
    "reshape": _free,
    "transpose": _free,
    "concat": _free,
    "split": _free,
    "select": _free,
    "slice": _free,
}


def node_cost(node: Node, ins: list[TensorType]) -> Cost:
    from irc.ops import canonical_name

    fn = FLOP_TABLE.get(canonical_name(node.op))
    if fn is None:
        raise IrcError(f"irc analyze has no FLOP formula for op '{node.op}' (add one to irc/analysis/flops.py)",
                       node.loc)
    return fn(node, ins, node.types)


def training_flops(cost: Cost) -> int:
    """Forward + backward: products cost 2× again backward (input and weight gradients), the rest 1×."""
    return sum(f * (3 if kind in MATMUL_KINDS else 2) for kind, f in cost.flops.items())
