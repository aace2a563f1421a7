"""Primitive ops that the ``decompose`` pass lowers layers to, and the fused ops that the
fusion passes rebuild from them.

After lowering, weights are values: a ``param`` node yields the tensor stored under
``<weights>.<name>``, so the keys of a weights file are the same before and after.
"""

from __future__ import annotations

from irc.ops.common import broadcast, need_float, need_rank, same_dim
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, free, numel, per_element, rows, visible_pairs
from irc.ops.norm import layernorm_cost, rmsnorm_cost
from irc.ops.registry import INIT_RULES, RF_LAST_AXIS, RF_POINTWISE, Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import GRAD_FUSED, vjp_causal_mask, vjp_gemm, vjp_param, vjp_rope
from irc.types import TensorType

# Each cost counts what its composite counted for the same work, so FLOPs agree before and after
# lowering (the causal attention core agrees once fused: unfused, the full T×S is computed).
_PRIMITIVE = frozenset({"primitive"})
_FUSED = frozenset({"fused"})


def _gemm_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", rows(x) * x.shape[-1] * y.shape[-1])
    c.add("elementwise", numel(y) if len(ins) > 2 else 0)
    return c.add("activation", numel(y) if node.attrs.get("act", "none") != "none" else 0)


def _gemm_glu_cost(node, ins, outs) -> Cost:
    x, y = ins[0], outs[0]
    c = Cost().mac("linear", 2 * rows(x) * x.shape[-1] * y.shape[-1])
    return c.add("activation", numel(y)).add("elementwise", numel(y))


def _gemm_multi_cost(node, ins, outs) -> Cost:
    x = ins[0]
    return Cost().mac("linear", rows(x) * x.shape[-1] * sum(y.shape[-1] for y in outs))


def _sdpa_cost(node, ins, outs) -> Cost:
    q, k = ins[0], ins[1]
    b, h, t, hd = q.shape
    s = k.shape[2]
    pairs = b * h * visible_pairs(t, s, node.attrs["causal"], node.attrs.get("window"))
    c = Cost().mac("attention", pairs * (hd + ins[2].shape[3]))  # q·k over hd, p·v over v's width (MLA's differ)
    c.add("softmax", SOFTMAX_PER_ELEMENT * pairs)
    c.add("elementwise", pairs * (2 if len(ins) > 3 else 1))  # the scale (and an additive bias)
    return c


def _add_norm_cost(node, ins, outs) -> Cost:
    norm = layernorm_cost if node.attrs["kind"] == "layernorm" else rmsnorm_cost
    return norm(node.attrs, ins, outs[1:]).add("elementwise", numel(outs[0]))

ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu", "tanh")


def _param_infer(a, ts):
    if any(isinstance(d, int) and d < 1 for d in a["shape"]):
        raise ShapeError(f"a weight's shape {list(a['shape'])} must hold sizes of at least 1")
    return [TensorType("f32", tuple(a["shape"]))]


def _param_rule(a) -> str:
    if a.get("init") is not None:
        return a["init"]
    if a["name"] in ("gain", "running_var"):  # a lowered norm's keys keep the norm's rules
        return "ones"
    return "zeros" if len(a["shape"]) == 1 else "xavier"


register(OpDef(
    "param", (), (Attr("name", "ref"), Attr("shape", "dims"),
                  Attr("init", "enum", None, tuple(INIT_RULES), doc="how it starts; default: ones for a gain or "
                       "running variance, zeros for another vector, Xavier for a matrix")),
    _param_infer,
    lambda a, ts: {a["name"]: tuple(a["shape"])},
    doc="a weight as a value: the tensor stored under <weights>.<name>",
    # a lowered weight keeps the rule of the layer it came from (the weights file is the same)
    cost=free, init=lambda a: {a["name"]: _param_rule(a)},
    receptive=rf_reset("a weight, not an activation"), classes=frozenset({"primitive", "view"}),
    na={"cuda": "a weight slot the CUDA driver binds, not a kernel", "torch_oracle": "holds a weight: nothing to "
        "compute"}, vjp=vjp_param,
))


def _gemm_out(x: TensorType, w: TensorType, b: TensorType | None) -> TensorType:
    need_rank(x, 1, "an input")
    need_float(x)
    need_rank(w, (2,), "a weight [out, in]")
    same_dim(x.shape[-1], w.shape[1], f"contracts {x.shape[-1]} features with a weight {w}")
    if b is not None:
        need_rank(b, (1,), "a bias [out]")
        same_dim(b.shape[0], w.shape[0], f"bias {b} does not match weight {w}")
    return x.with_shape(x.shape[:-1] + (w.shape[0],))


def _gemm_infer(a, ts):
    return [_gemm_out(ts[0], ts[1], ts[2] if len(ts) > 2 else None)]


register(OpDef(
    "gemm", ("x", "w", "b?"), (Attr("act", "enum", "none", ACTS),), _gemm_infer,
    doc="act(x @ w.T + b): a linear layer with its weights as operands and an activation epilogue",
    cost=_gemm_cost, receptive=RF_LAST_AXIS, classes=frozenset({"primitive", "linear", "learned"}), depth=1,
    vjp=vjp_gemm,
))


def _gemm_glu_infer(a, ts):
    x, wg, wu = ts
    g = _gemm_out(x, wg, None)
    if _gemm_out(x, wu, None) != g:
        raise ShapeError(f"gate weight {wg} and up weight {wu} differ")
    return [g]


register(OpDef(
    "gemm_glu", ("x", "w_gate", "w_up"), (Attr("act", "enum", "silu", ("silu", "gelu", "gelu_tanh", "relu")),),
    _gemm_glu_infer,
    doc="act(x @ w_gate.T) * (x @ w_up.T) in one pass (SwiGLU's gated half)",
    cost=_gemm_glu_cost, receptive=RF_LAST_AXIS, classes=frozenset({"fused", "linear", "learned"}), depth=1,
    na={"grad": GRAD_FUSED},
))


def _gemm_multi_infer(a, ts):
    x, *ws = ts
    return [_gemm_out(x, w, None) for w in ws]


register(OpDef(
    "gemm_multi", ("x", "ws*"), (), _gemm_multi_infer,
    results=lambda a: ("q", "k", "v"),
    doc="x @ w_i.T for several weights in one matmul over their concatenation (merged Q, K, V)",
    cost=_gemm_multi_cost, receptive=RF_LAST_AXIS, classes=frozenset({"fused", "linear", "learned"}), depth=1,
    na={"grad": GRAD_FUSED},
))


def _heads_infer(a, ts):
    (x,) = ts
    need_rank(x, (4,), "heads [B, H, T, hd]")
    need_float(x)
    if isinstance(x.shape[-1], int) and x.shape[-1] % 2:
        raise ShapeError(f"rotates pairs of features, but the head width {x.shape[-1]} is odd")
    return [x]


register(OpDef("rope", ("x",), (Attr("theta", "float", None, doc="default 10000"),), _heads_infer,
               doc="rotary position embedding on [B, H, T, hd], rotate-half pairing",
               cost=per_element("elementwise", 3),  # x·cos + rotate(x)·sin
               receptive=rf_reset("sequence positions"), classes=frozenset({"primitive", "position"}),
               vjp=vjp_rope))


def _mask_infer(a, ts):
    (x,) = ts
    need_rank(x, 2, "scores [..., T, S]")
    return [x]


WINDOW = Attr("window", "posint", None, doc="sliding window: query i also loses keys j <= i − window")

register(OpDef("causal_mask", ("x",), (WINDOW,), _mask_infer,
               doc="scores with key j > query i (or j <= i − window) set to −∞ (top-left aligned)",
               cost=free, receptive=RF_POINTWISE, classes=_PRIMITIVE, vjp=vjp_causal_mask))


def _sdpa_infer(a, ts):
    q, k, v = ts[:3]
    if a["window"] is not None and not a["causal"]:
        raise ShapeError("window= slides a causal mask; it needs causal=true")
    for t, what, one in ((q, "queries", "query"), (k, "keys", "key"), (v, "values", "value")):
        need_rank(t, (4,), f"{what} [B, H, T, hd]")
        need_float(t, one)
    if len(ts) > 3:
        need_float(ts[3], "bias")
    h, g = q.shape[1], k.shape[1]
    if isinstance(h, int) and isinstance(g, int) and h % g:
        raise ShapeError(f"{h} query heads are not a multiple of {g} key/value heads")
    same_dim(q.shape[3], k.shape[3], f"query width {q.shape[3]} differs from key width {k.shape[3]}")
    same_dim(k.shape[2], v.shape[2], f"{k.shape[2]} keys but {v.shape[2]} values")
    same_dim(k.shape[1], v.shape[1], f"{k.shape[1]} key heads but {v.shape[1]} value heads")
    same_dim(k.shape[0], v.shape[0], f"key batch {k.shape[0]} differs from value batch {v.shape[0]}")
    if k.shape[0] != 1:  # one key/value batch may serve every query batch
        same_dim(q.shape[0], k.shape[0], f"query batch {q.shape[0]} differs from key/value batch {k.shape[0]}")
    if len(ts) > 3:
        broadcast(ts[3], q.with_shape(q.shape[:3] + (k.shape[2],)), "sdpa")
    return [q.with_shape(q.shape[:3] + (v.shape[3],))]


register(OpDef(
    "sdpa", ("q", "k", "v", "bias?"),
    (Attr("scale", "float"), Attr("causal", "bool", False), WINDOW),
    _sdpa_infer,
    doc="fused attention core softmax(q·kᵀ·scale [+ bias] [causal])·v; GQA by head index, no n×n buffer",
    cost=_sdpa_cost, receptive=rf_reset("mixes every position it attends to"),
    classes=frozenset({"fused", "attention"}), na={"grad": GRAD_FUSED},
))


def _add_norm_infer(a, ts):
    s = broadcast(ts[0], ts[1], "add_norm")
    need_rank(s, 1, "a stream [..., D]")
    need_float(s)
    if s != ts[0]:
        raise ShapeError(f"the residual {ts[1]} must not broaden the stream {ts[0]}")
    return [s, s]


def _add_norm_params(a, ts):
    d = ts[0].shape[-1]
    if not a["affine"]:
        return {}
    if a["kind"] == "rmsnorm" or not a["bias"]:
        return {"gain": (d,)}
    return {"gain": (d,), "bias": (d,)}


register(OpDef(
    "add_norm", ("x", "r"),
    (Attr("kind", "enum", "layernorm", ("layernorm", "rmsnorm")), Attr("eps", "float", 1e-5),
     Attr("affine", "bool", True), Attr("bias", "bool", True)),
    _add_norm_infer, _add_norm_params, results=("sum", "norm"),
    doc="s = x + r and norm(s) in one pass over memory; yields both (the residual stream and its norm)",
    cost=_add_norm_cost, init=lambda a: {"gain": "ones", "bias": "zeros"}, receptive=RF_LAST_AXIS,
    classes=frozenset({"fused", "norm", "residual"}), na={"grad": GRAD_FUSED},
))
