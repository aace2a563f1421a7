"""Fusion passes: rule tables that rebuild hot patterns from decomposed primitives.

Each pass is selectable by name (``--passes decompose,fuse-attention``); ``fuse`` runs them all
in a sensible order. A rule matches at the *last* node of its pattern, checks that every
intermediate value has no other reader, and replaces the pattern with one fused node.
"""

from __future__ import annotations

import irc.ops.fused_conv  # noqa: F401  (registers conv2d_bn)
import irc.ops.primitives  # noqa: F401  (registers the fused ops)
from irc.graph import Graph, Node
from irc.passes.registry import register_pass
from irc.passes.rewrite import Context, Rewrite, apply_rules

_ACTS = {"relu": "relu", "silu": "silu", "tanh": "tanh"}


def _act_name(node: Node) -> str | None:
    if node.op == "gelu":
        return "gelu" if node.attrs["approx"] == "none" else "gelu_tanh"
    return _ACTS.get(node.op)


# -- attention core ------------------------------------------------------------------------


def _strip_heads_view(ctx: Context, value: str) -> str:
    """Undo the GQA broadcast view (a 4-D → 5-D reshape) to reach the [B, H, T, hd] tensor."""
    r = ctx.prod(value, "reshape")
    if r is not None and len(ctx.types[value].shape) == 5 and len(ctx.types[r.inputs[0]].shape) == 4:
        return r.inputs[0]
    return value


def _unview_bias(ctx: Context, value: str) -> str:
    """The bias before decompose's GQA view of it (a reshape to 5-D): sdpa reads it by head index."""
    r = ctx.prod(value, "reshape")
    if r is not None and len(ctx.types[value].shape) == 5 and len(ctx.types[r.inputs[0]].shape) <= 4:
        return r.inputs[0]
    return value


def fuse_attention_rule(ctx: Context, node: Node) -> Rewrite | None:
    """matmul(softmax([causal_mask]([add](mul(matmul(q, transpose(k)), s), bias))), v) → sdpa(q, k, v[, bias])."""
    if node.op != "matmul":
        return None
    probs, v = node.inputs
    sm = ctx.prod(probs, "softmax")
    if sm is None or not ctx.only_user(probs, node) or sm.attrs["axis"] not in (-1, len(ctx.types[probs].shape) - 1):
        return None
    scores = sm.inputs[0]
    causal, window = False, None
    mask = ctx.prod(scores, "causal_mask")
    if mask is not None:
        if not ctx.only_user(scores, sm):
            return None
        causal, window, scores, reader = True, mask.attrs["window"], mask.inputs[0], mask
    else:
        reader = sm
    bias = None
    added = ctx.prod(scores, "add")
    if added is not None:  # an additive score bias (T5's relative positions, a padding mask)
        if not ctx.only_user(scores, reader):
            return None
        scores, bias, reader = added.inputs[0], _unview_bias(ctx, added.inputs[1]), added
        if len(ctx.types[bias].shape) > 4:
            return None
    scaled = ctx.prod(scores, "mul")
    if scaled is None or scaled.attrs["scalar"] is None or not ctx.only_user(scores, reader):
        return None
    qk = ctx.prod(scaled.inputs[0], "matmul")
    if qk is None or not ctx.only_user(scaled.inputs[0], scaled):
        return None
    q, kt = qk.inputs
    tr = ctx.prod(kt, "transpose")
    rank = len(ctx.types[kt].shape)
    if tr is None or tr.attrs["perm"] != list(range(rank - 2)) + [rank - 1, rank - 2] or not ctx.only_user(kt, qk):
        return None
    q4, k4, v4 = (_strip_heads_view(ctx, x) for x in (q, tr.inputs[0], v))
    if any(len(ctx.types[x].shape) != 4 for x in (q4, k4, v4)):
        return None
    attrs = {"scale": scaled.attrs["scalar"], "causal": causal, "window": window}
    operands = [q4, k4, v4] + ([bias] if bias is not None else [])
    if rank == 5:  # the 5-D context is reshaped back to [B, H, T, hd] by its only reader
        readers = ctx.users.get(node.outputs[0], [])
        if len(readers) != 1 or readers[0].op != "reshape" or node.outputs[0] in ctx.outputs:
            return None
        fused = ctx.node("sdpa", operands, attrs, node, names=list(readers[0].outputs))
        return Rewrite([fused], remove=[readers[0]])
    return Rewrite([ctx.node("sdpa", operands, attrs, node, names=list(node.outputs))])


# -- residual add + norm -----------------------------------------------------------------------


def fuse_add_norm_rule(ctx: Context, node: Node) -> Rewrite | None:
    """norm(x + r) → add_norm(x, r), which also yields x + r (the residual stream)."""
    if node.op not in ("layernorm", "rmsnorm"):
        return None
    axis = node.attrs.get("axis")
    if axis is not None and axis % ctx.types[node.inputs[0]].rank != ctx.types[node.inputs[0]].rank - 1:
        return None  # add_norm normalises rows (the last axis); a channels-first LayerNorm stays apart
    add = ctx.prod(node.inputs[0], "add")
    if add is None or len(add.inputs) != 2 or add.attrs["scalar"] is not None:
        return None
    x, r = add.inputs
    if ctx.types[x] != ctx.types[add.outputs[0]] or ctx.types[r] != ctx.types[x]:
        return None  # broadcasting adds stay apart
    attrs = {"kind": node.op, "eps": node.attrs["eps"], "affine": node.attrs["affine"],
             "bias": node.attrs.get("bias", False)}
    fused = ctx.node("add_norm", [x, r], attrs, node, weights=node.weights,
                     names=[add.outputs[0], node.outputs[0]])
    return Rewrite([fused], remove=[add])


# -- GEMM epilogues ------------------------------------------------------------------------------


def fuse_linear_act_rule(ctx: Context, node: Node) -> Rewrite | None:
    """act(x @ w.T + b) → gemm{act}: the activation runs while the output tile is in registers."""
    act = _act_name(node)
    if act is None:
        return None
    gemm = ctx.prod(node.inputs[0], "gemm")
    if gemm is None or gemm.attrs["act"] != "none" or not ctx.only_user(node.inputs[0], node):
        return None
    return Rewrite([ctx.node("gemm", list(gemm.inputs), {"act": act}, gemm, names=list(node.outputs))])


def fuse_swiglu_rule(ctx: Context, node: Node) -> Rewrite | None:
    """silu(x @ Wg.T) * (x @ Wu.T) → gemm_glu(x, Wg, Wu): both products in one pass over x."""
    if node.op != "mul" or len(node.inputs) != 2:
        return None
    for gate_v, up_v in (node.inputs, node.inputs[::-1]):
        act = ctx.prod(gate_v, "silu")
        if act is None or not ctx.only_user(gate_v, node):
            continue
        g = ctx.prod(act.inputs[0], "gemm")
        u = ctx.prod(up_v, "gemm")
        if g is None or u is None or len(g.inputs) != 2 or len(u.inputs) != 2:
            continue
        if g.attrs["act"] != "none" or u.attrs["act"] != "none" or g.inputs[0] != u.inputs[0]:
            continue
        if not ctx.only_user(act.inputs[0], act) or not ctx.only_user(up_v, node):
            continue
        fused = ctx.node("gemm_glu", [g.inputs[0], g.inputs[1], u.inputs[1]], {"act": "silu"}, node,
                         names=list(node.outputs))
        return Rewrite([fused])
    return None


def fuse_qkv_rule(ctx: Context, node: Node) -> Rewrite | None:
    """Three bias-free projections of one input → one gemm over the concatenated weights."""
    if node.op != "gemm" or len(node.inputs) != 2 or node.attrs["act"] != "none":
        return None
    x = node.inputs[0]
    siblings = [n for n in ctx.users.get(x, []) if n.op == "gemm" and len(n.inputs) == 2
                and n.attrs["act"] == "none" and n.inputs[0] == x and ctx.prod(n.inputs[1], "param")]
    if len(siblings) != 3 or siblings[-1] is not node:
        return None  # fire once, at the last of the three
    fused = ctx.node("gemm_multi", [x] + [n.inputs[1] for n in siblings], {}, siblings[0],
                     names=[n.outputs[0] for n in siblings])
    return Rewrite([fused], remove=siblings[:2])


# -- convolution + inference BatchNorm (+ residual add) (+ ReLU) ---------------------------------------
#
# Four small rules compose the chain as the rewrite engine visits it in graph order: batchnorm(conv2d)
# first becomes conv2d_bn (act=none); a later round absorbs the residual add, then the ReLU, then a max pool.


def _param(ctx: Context, like: Node, name: str, shape: tuple, init: str | None = None) -> Node:
    """A ``param`` node for ``<like.weights>.<name>`` (the key the unfused layer reads); ``init`` when the
    param's default rule (by name and rank) is not the layer's."""
    from irc.passes.decompose import _value_name

    return ctx.node("param", [], {"name": name, "shape": list(shape), "init": init}, like,
                    name=_value_name(f"{like.weights}.{name}"), weights=like.weights)


def fold_bn_rule(ctx: Context, node: Node) -> Rewrite | None:
    """batchnorm(conv2d(x)) (inference, conv without bias, BN over channels) → conv2d_bn: the statistics
    fold into the convolution's weights and bias at load."""
    from irc.ops import get_op
    from irc.runtime.init import feeds_relu

    if node.op != "batchnorm" or node.attrs.get("train") or node.attrs["axis"] % ctx.types[node.inputs[0]].rank != 1:
        return None
    conv = ctx.prod(node.inputs[0], "conv2d")
    if conv is None or conv.attrs["bias"] or not ctx.only_user(node.inputs[0], node) or conv.weights is None:
        return None
    if node.weights is None or ctx.types[conv.inputs[0]].rank != 4:
        return None
    w_shape = get_op("conv2d").param_shapes(conv.attrs, [ctx.types[conv.inputs[0]]])["weight"]
    out = conv.attrs["out"]
    # the weight keeps the rule it had in the unfused graph (He when the chain feeds a rectifier)
    w = _param(ctx, conv, "weight", w_shape, "he" if feeds_relu(ctx.graph, conv, ctx.users) else "xavier")
    # a vector param starts as zeros, a gain or running variance as ones: BatchNorm's own rules
    stats = [_param(ctx, node, name, (out,)) for name in ("gain", "bias", "running_mean", "running_var")]
    attrs = {k: conv.attrs[k] for k in ("out", "kernel", "stride", "padding", "dilation", "groups")}
    attrs.update(eps=node.attrs["eps"], act="none")
    fused = ctx.node("conv2d_bn", [conv.inputs[0], w.outputs[0]] + [s.outputs[0] for s in stats], attrs, conv,
                     names=list(node.outputs))
    return Rewrite([w, *stats, fused])


def _open_conv_bn(ctx: Context, value: str, reader: Node) -> Node | None:
    """The conv2d_bn making ``value`` when it has no residual and no activation yet and ``reader`` is its
    only reader."""
    p = ctx.prod(value, "conv2d_bn")
    if p is None or len(p.inputs) > 6 or p.attrs["act"] != "none" or p.attrs["pool"] is not None:
        return None
    return p if ctx.only_user(value, reader) else None


def fuse_conv_add_rule(ctx: Context, node: Node) -> Rewrite | None:
    """conv2d_bn(x) + r → conv2d_bn(x, res=r): the residual add runs in the convolution's epilogue."""
    if node.op != "add" or len(node.inputs) != 2 or node.attrs["scalar"] is not None:
        return None
    for mine, other in (node.inputs, node.inputs[::-1]):
        p = _open_conv_bn(ctx, mine, node)
        if p is not None and ctx.types[other] == ctx.types[mine] == ctx.types[node.outputs[0]]:
            return Rewrite([ctx.node("conv2d_bn", list(p.inputs) + [other], dict(p.attrs), p,
                                     names=list(node.outputs))])
    return None


def fuse_conv_relu_rule(ctx: Context, node: Node) -> Rewrite | None:
    """relu(conv2d_bn(...)) → conv2d_bn{act=relu}."""
    if node.op != "relu":
        return None
    p = ctx.prod(node.inputs[0], "conv2d_bn")
    if p is None or p.attrs["act"] != "none" or p.attrs["pool"] is not None or not ctx.only_user(node.inputs[0], node):
        return None
    return Rewrite([ctx.node("conv2d_bn", list(p.inputs), {**p.attrs, "act": "relu"}, p, names=list(node.outputs))])


def fuse_conv_pool_rule(ctx: Context, node: Node) -> Rewrite | None:
    """maxpool2d(conv2d_bn(...)) → conv2d_bn{pool=...}: the pool runs on the convolution's epilogue, so its
    full-size input is never written out (ResNet's stem). Only the convolution's reader, dilation 1."""
    if node.op != "maxpool2d" or node.attrs["dilation"] not in (1, [1, 1], (1, 1)):
        return None
    p = ctx.prod(node.inputs[0], "conv2d_bn")
    if p is None or p.attrs["pool"] is not None or not ctx.only_user(node.inputs[0], node):
        return None
    a = node.attrs
    padding = None if a["padding"] in (0, [0, 0], (0, 0)) else a["padding"]
    pool = {"pool": a["kernel"], "pool_stride": a["stride"], "pool_padding": padding}
    return Rewrite([ctx.node("conv2d_bn", list(p.inputs), {**p.attrs, **pool}, p, names=list(node.outputs))])


FUSIONS = {
    "fuse-attention": ([fuse_attention_rule], "Q·Kᵀ → scale → causal mask → softmax → ·V into one sdpa"),
    "fuse-add-norm": ([fuse_add_norm_rule], "residual add + LayerNorm/RMSNorm into one pass yielding both"),
    "fuse-swiglu": ([fuse_swiglu_rule], "silu(x·W_gate) ⊙ (x·W_up) into one gemm_glu"),
    "fuse-linear-act": ([fuse_linear_act_rule], "gemm + bias + activation into one gemm with an epilogue"),
    "fuse-qkv": ([fuse_qkv_rule], "the Q, K, V projections of one input into one gemm_multi"),
}


# The CPU pipeline's convolution fusion, not part of ``fuse``: the CUDA backend renders fuse's graph and has
# no conv2d_bn kernel. The CPU pipeline is ``fuse,fold-bn`` (the benchmarks; ``--passes fuse,fold-bn``).
CPU_FUSIONS = {
    "fold-bn": ([fold_bn_rule, fuse_conv_add_rule, fuse_conv_relu_rule, fuse_conv_pool_rule],
                "inference BatchNorm folded into the preceding conv2d (+ residual add, + ReLU, + max pool) as one "
                "conv2d_bn"),
}


def _make(rules):
    return lambda graph: apply_rules(graph, rules)


for _name, (_rules, _doc) in {**FUSIONS, **CPU_FUSIONS}.items():
    register_pass(_name, _doc)(_make(_rules))


@register_pass("fuse", "decompose, then every fusion: attention, add+norm, swiglu, linear+act, qkv")
def fuse_all(graph: Graph) -> Graph:
    from irc.passes.decompose import decompose

    graph = decompose(graph)  # its rules match only the layers it lowers: a lowered graph passes unchanged
    for rules, _ in FUSIONS.values():
        graph = apply_rules(graph, rules)
    return graph
