"""Mixture of experts and multi-head latent attention in standard ONNX (opset 17).

ONNX has no routed-expert op in its default domain (ORT's com.microsoft.MoE is one runtime's), so ``moe``
exports densely: every expert runs on every token as one batched MatMul over the stacked [E, ...] weights,
and a [N, E] gate matrix, zero but for each token's top k (TopK + ScatterElements), weighs them. The result
is exact; the cost is E/k times the routed FLOPs, the price of a file any ONNX runtime reads. ``mla``
exports as its equations: projections, the latents' RMSNorms, RoPE on adjacent pairs (as the rotate-half
RoPE of permuted features, as decompose lowers it) and attention's MatMul/Softmax pattern.
"""

from __future__ import annotations

from irc.backends.onnx.context import Context
from irc.backends.onnx.ops_attention import rope, sdpa
from irc.graph import Node
from irc.ops.mla import mla_scale, mla_theta, qk_dim


def _matrix(ctx: Context, node: Node, name: str, shared: bool) -> str:
    """The shared experts' [out, in] matrix, or the routed experts' [E, out, in] stack transposed to
    [E, in, out] for a batched MatMul."""
    if shared:
        return ctx.op1("Transpose", [ctx.weight(node, f"shared_{name}")], perm=[1, 0])
    stacked = ctx.weight(node, name if name in ("w1", "w2") else f"w_{name}")
    return ctx.op1("Transpose", [stacked], perm=[0, 2, 1])


def _ffn(ctx: Context, node: Node, x: str, shared: bool) -> str:
    """FFN(x) for x [N, d]: [N, d] for the shared experts, [E, N, d] for every routed one at once."""
    act = node.attrs["act"]
    if node.attrs["gated"]:
        gate = ctx.act(act, ctx.op1("MatMul", [x, _matrix(ctx, node, "gate", shared)]))
        hidden = ctx.op1("Mul", [gate, ctx.op1("MatMul", [x, _matrix(ctx, node, "up", shared)])])
        return ctx.op1("MatMul", [hidden, _matrix(ctx, node, "down", shared)])
    hidden = ctx.act(act, ctx.op1("MatMul", [x, _matrix(ctx, node, "w1", shared)]))
    return ctx.op1("MatMul", [hidden, _matrix(ctx, node, "w2", shared)])


def _moe(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    d = int(ctx.type_of(node.inputs[0]).shape[-1])
    x2 = ctx.op1("Reshape", [xs[0], ctx.ints([-1, d])])  # [N, d]
    probs = ctx.op1("Softmax", [ctx.linear(x2, ctx.weight(node, "router"))], axis=-1)  # [N, E]
    top, chosen = ctx.op("TopK", [probs, ctx.ints([int(a["top_k"])])], 2, axis=-1, largest=1, sorted=1)
    if a["norm_topk"]:
        top = ctx.op1("Div", [top, ctx.op1("ReduceSum", [top, ctx.ints([-1])], keepdims=1)])
    if float(a["scale"]) != 1.0:
        top = ctx.op1("Mul", [top, ctx.const(float(a["scale"]))])
    gates = ctx.op1("ScatterElements", [ctx.op1("ConstantOfShape", [ctx.op1("Shape", [probs])]), chosen, top], axis=1)
    gates = ctx.op1("Unsqueeze", [ctx.op1("Transpose", [gates], perm=[1, 0]), ctx.ints([2])])  # [E, N, 1]
    out = ctx.op1("ReduceSum", [ctx.op1("Mul", [gates, _ffn(ctx, node, x2, shared=False)]), ctx.ints([0])], keepdims=0)
    if ctx.has_weight(node, "shared_down") or ctx.has_weight(node, "shared_w2"):
        out = ctx.op1("Add", [out, _ffn(ctx, node, x2, shared=True)])
    return [ctx.op1("Reshape", [out, ctx.op1("Shape", [xs[0]])])]


def _rms(ctx: Context, x: str, gain: str, eps: float) -> str:
    ms = ctx.op1("ReduceMean", [ctx.op1("Mul", [x, x])], axes=[-1], keepdims=1)
    return ctx.op1("Mul", [ctx.op1("Div", [x, ctx.op1("Sqrt", [ctx.op1("Add", [ms, ctx.const(eps)])])]), gain])


def _rope_pairs(ctx: Context, x: str, r: int, theta: float, t: str) -> str:
    """RoPE on adjacent pairs of [B, L, T, r]: features permuted evens-then-odds, then rotate-half RoPE
    (the scores q·k, the only thing that reads them, are unchanged by one permutation of both sides)."""
    x = ctx.op1("Reshape", [x, ctx.ints([0, 0, 0, r // 2, 2])])
    x = ctx.op1("Reshape", [ctx.op1("Transpose", [x], perm=[0, 1, 2, 4, 3]), ctx.ints([0, 0, 0, r])])
    return rope(ctx, x, r, theta, t)


def _part(ctx: Context, x: str, start: int, end: int, axis: int) -> str:
    return ctx.op1("Slice", [x, ctx.ints([start]), ctx.ints([end]), ctx.ints([axis])])


def _mla(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    a = node.attrs
    x = xs[0]
    h, n, r, c, v = (int(a[k]) for k in ("heads", "nope_dim", "rope_dim", "kv_lora", "v_dim"))
    eps, theta = float(a["eps"]), mla_theta(a)
    t = ctx.scalar_dim(node.inputs[0], x, 1)
    if a["q_lora"] is None:
        q = ctx.linear(x, ctx.weight(node, "wq"))
    else:
        q_latent = _rms(ctx, ctx.linear(x, ctx.weight(node, "wq_a")), ctx.weight(node, "q_norm.gain"), eps)
        q = ctx.linear(q_latent, ctx.weight(node, "wq_b"))
    q = ctx.op1("Transpose", [ctx.op1("Reshape", [q, ctx.ints([0, 0, h, qk_dim(a)])])], perm=[0, 2, 1, 3])
    q = ctx.op1("Concat", [_part(ctx, q, 0, n, 3), _rope_pairs(ctx, _part(ctx, q, n, n + r, 3), r, theta, t)], axis=-1)
    latent = ctx.linear(x, ctx.weight(node, "wkv_a"))  # [B, T, c + r]
    ckv = _rms(ctx, _part(ctx, latent, 0, c, 2), ctx.weight(node, "kv_norm.gain"), eps)
    k_rope = ctx.op1("Unsqueeze", [_part(ctx, latent, c, c + r, 2), ctx.ints([1])])  # [B, 1, T, r]
    k_rope = ctx.op1("Expand", [_rope_pairs(ctx, k_rope, r, theta, t), ctx.ints([1, h, 1, 1])])
    kv = ctx.linear(ckv, ctx.weight(node, "wkv_b"))
    kv = ctx.op1("Transpose", [ctx.op1("Reshape", [kv, ctx.ints([0, 0, h, n + v])])], perm=[0, 2, 1, 3])
    k = ctx.op1("Concat", [_part(ctx, kv, 0, n, 3), k_rope], axis=-1)
    out = sdpa(ctx, q, k, _part(ctx, kv, n, n + v, 3), h, h, qk_dim(a), mla_scale(a), None, bool(a["causal"]),
               a.get("window"), t, t)
    merged = ctx.op1("Reshape", [ctx.op1("Transpose", [out], perm=[0, 2, 1, 3]), ctx.ints([0, 0, -1])])
    return [ctx.linear(merged, ctx.weight(node, "wo"))]


OPS = {"moe": _moe, "mla": _mla}
