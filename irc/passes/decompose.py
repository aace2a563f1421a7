"""Lower the chapter's layers to primitives: weights become ``param`` values, projections
become ``gemm``, attention becomes its matmuls, scale, mask and softmax.

Fusion (irc/passes/fuse.py) then rebuilds the hot patterns from these primitives, as TVM
and XLA do. Parameters and FLOPs are the same before and after (a test checks both).
"""

from __future__ import annotations

from typing import Any

import irc.ops.primitives  # noqa: F401  (registers the primitive ops)
from irc.graph import Graph, Node
from irc.ops.attention import REL_TABLE, head_dim, kv_heads, rel_max_distance, score_scale
from irc.passes.names import dotted_name
from irc.passes.registry import register_pass
from irc.passes.rewrite import Context, Rewrite, apply_rules

_ACT_OPS: dict[str, tuple[str, dict[str, Any]]] = {
    "relu": ("relu", {}),
    "gelu": ("gelu", {"approx": "none"}),
    "gelu_tanh": ("gelu", {"approx": "tanh"}),
    "silu": ("silu", {}),
    "tanh": ("tanh", {}),
}
REL_SCOPE = REL_TABLE.removesuffix(".weight")  # the scope whose "weight" is an attention's own T5 table


def _value_name(text: str) -> str:
    """A valid IR value name from a weight key: scopes read from IR text may hold any character."""
    name = dotted_name(text)
    return name if name[0].isalpha() or name[0] == "_" else f"w_{name}"


class _Emit:
    """Collects the nodes one layer lowers to, all at the layer's scope and location."""

    def __init__(self, ctx: Context, layer: Node):
        self.ctx, self.layer, self.nodes = ctx, layer, []

    def op(self, op: str, inputs: list[str], attrs: dict[str, Any] | None = None, name: str | None = None,
           weights: str | None = None, exact: bool = False) -> str:
        node = self.ctx.node(op, inputs, dict(attrs or {}), self.layer, name=name, weights=weights,
                             names=[name] if exact and name else None)
        self.nodes.append(node)
        return node.outputs[0]

    def param(self, name: str, shape: tuple, weights: str | None = None) -> str:
        scope = weights or self.layer.weights
        return self.op("param", [], {"name": name, "shape": list(shape)},
                       name=_value_name(f"{scope}.{name}"), weights=scope)

    def gemm(self, x: str, w: str, b: str | None, result_of: Node | None = None) -> str:
        """A gemm; ``result_of`` makes it take over that layer's result name."""
        if result_of is not None:
            return self.op("gemm", [x, w] + ([b] if b else []), {"act": "none"}, name=result_of.outputs[0],
                           exact=True)
        return self.op("gemm", [x, w] + ([b] if b else []), {"act": "none"})

    def done(self) -> Rewrite:
        return Rewrite(self.nodes)


def _shapes(ctx: Context, node: Node) -> dict[str, tuple]:
    from irc.ops import get_op

    opdef = get_op(node.op)
    return opdef.param_shapes(node.attrs, [ctx.types[v] for v in node.inputs])


def _params(e: _Emit, shapes: dict[str, tuple], *names: str) -> list[str | None]:
    return [e.param(n, shapes[n]) if n in shapes else None for n in names]


def _linear(ctx: Context, node: Node) -> Rewrite | None:
    if node.op != "linear":
        return None
    e = _Emit(ctx, node)
    w, b = _params(e, _shapes(ctx, node), "weight", "bias")
    e.gemm(node.inputs[0], w, b, result_of=node)
    return e.done()


def _ffn(ctx: Context, node: Node) -> Rewrite | None:
    if node.op != "ffn":
        return None
    e = _Emit(ctx, node)
    w1, b1, w2, b2 = _params(e, _shapes(ctx, node), "w1", "b1", "w2", "b2")
    act, attrs = _ACT_OPS[node.attrs["act"]]
    h = e.gemm(node.inputs[0], w1, b1)
    h = e.op(act, [h], attrs)
    e.gemm(h, w2, b2, result_of=node)
    return e.done()


def _swiglu(ctx: Context, node: Node) -> Rewrite | None:
    if node.op != "swiglu":
        return None
    e = _Emit(ctx, node)
    wg, bg, wu, bu, wd, bd = _params(e, _shapes(ctx, node), "w_gate", "b_gate", "w_up", "b_up", "w_down", "b_down")
    x = node.inputs[0]
    gate = e.op("silu", [e.gemm(x, wg, bg)])
    h = e.op("mul", [gate, e.gemm(x, wu, bu)])
    e.gemm(h, wd, bd, result_of=node)
    return e.done()


def _unembed(ctx: Context, node: Node) -> Rewrite | None:
    if node.op != "unembed":
        return None
    e = _Emit(ctx, node)
    shapes = _shapes(ctx, node)
    x = node.inputs[0]
    d = ctx.types[x].shape[-1]
    if node.attrs["tied"] is not None:
        w = e.param("weight", (node.attrs["vocab"], d), weights=node.attrs["tied"])
    else:
        w = e.param("weight", shapes["weight"])
    (b,) = _params(e, shapes, "bias")
    e.gemm(x, w, b, result_of=node)
    return e.done()


def _attention(ctx: Context, node: Node, tables: bool = False) -> Rewrite | None:
    """An attention layer as its matmuls; one with its own T5 table only with ``tables`` (the grad pass's
    rule): inference keeps that layer whole, whose kernels read the table without a T×S bias tensor."""
    if node.op != "attention" or (node.attrs["rel_buckets"] is not None and not tables):
        return None
    a = node.attrs
    e = _Emit(ctx, node)
    wq, bq, wk, bk, wv, bv, wo, bo = _params(e, _shapes(ctx, node), "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo")
    x = node.inputs[0]
    kv = node.inputs[1] if len(node.inputs) > 1 else x
    b, t, d = ctx.types[x].shape
    bkv, s = ctx.types[kv].shape[:2]  # bkv is b, or 1: one key/value sequence for every query
    h, g, hd = a["heads"], kv_heads(a), head_dim(a, d)
    if a["scale"] is None and not isinstance(hd, int):
        return None  # the default scale 1/√d_head needs a number: the layer stays whole until d is bound

    def heads(v: str, n: int, batch, length, name: str) -> str:
        v = e.op("reshape", [v], {"shape": [batch, length, n, hd]})
        return e.op("transpose", [v], {"perm": [0, 2, 1, 3]}, name=f"{node.outputs[0]}.{name}")

    q = heads(e.gemm(x, wq, bq), h, b, t, "q")
    k = heads(e.gemm(kv, wk, bk), g, bkv, s, "k")
    v = heads(e.gemm(kv, wv, bv), g, bkv, s, "v")
    if a["rope"]:
        q = e.op("rope", [q], {"theta": a["rope_theta"]})
        k = e.op("rope", [k], {"theta": a["rope_theta"]})
    scale = score_scale(a, hd)
    if g != h:  # GQA: query head j reads key head j // (h/g); broadcast, never copy
        q = e.op("reshape", [q], {"shape": [b, g, h // g, t, hd]})
        k = e.op("reshape", [k], {"shape": [bkv, g, 1, s, hd]})
        v = e.op("reshape", [v], {"shape": [bkv, g, 1, s, hd]})
    rank = 5 if g != h else 4
    kt = e.op("transpose", [k], {"perm": list(range(rank - 2)) + [rank - 1, rank - 2]})
    scores = e.op("mul", [e.op("matmul", [q, kt])], {"scalar": float(scale)}, name=f"{node.outputs[0]}.scores")
    bias, shape, now = None, (), ()  # the bias value, its [B|1, H|1, T|1, S|1] view, its shape now
    if len(node.inputs) > 2:  # the additive bias operand
        bias = node.inputs[2]
        now = tuple(ctx.types[bias].shape)
        shape = (1,) * (4 - len(now)) + now
    if a["rel_buckets"] is not None:  # the layer's own T5 table: rel_position_bias reading the same key
        table = e.op("rel_position_bias", [x] + ([kv] if kv != x else []),
                     {"heads": h, "buckets": a["rel_buckets"], "max_distance": rel_max_distance(a),
                      "bidirectional": not a["causal"]}, weights=f"{node.weights}.{REL_SCOPE}")
        if bias is not None and now != shape:
            bias = e.op("reshape", [bias], {"shape": list(shape)})
        bias = table if bias is None else e.op("add", [bias, table])
        shape = now = (shape[0] if shape else 1, h, t, s)
    if bias is not None:
        if g != h:  # 5-D under GQA
            groups = (g, h // g) if shape[1] != 1 else (1, 1)
            shape = (shape[0], *groups, *shape[2:])
        if shape != now:
            bias = e.op("reshape", [bias], {"shape": list(shape)})
        scores = e.op("add", [scores, bias])
    if a["causal"]:
        scores = e.op("causal_mask", [scores], {"window": a["window"]})
    probs = e.op("softmax", [scores], {"axis": -1}, name=f"{node.outputs[0]}.probs")
    ctx_name = f"{node.outputs[0]}.ctx"
    ctx_v = e.op("matmul", [probs, v], name=None if g != h else ctx_name)
    if g != h:
        ctx_v = e.op("reshape", [ctx_v], {"shape": [b, h, t, hd]}, name=ctx_name)
    merged = e.op("transpose", [ctx_v], {"perm": [0, 2, 1, 3]})
    merged = e.op("reshape", [merged], {"shape": [b, t, h * hd]})
    e.gemm(merged, wo, bo, result_of=node)
    return e.done()


def _mla(ctx: Context, node: Node) -> Rewrite | None:
    """Multi-head latent attention as gemms, the latents' RMSNorms, slices, RoPE and attention's matmuls.

    RoPE there pairs adjacent features (x[2i], x[2i+1]); the rope primitive pairs x[i] with x[i + r/2].
    Both query and key RoPE parts are first permuted evens-then-odds, which turns one pairing into the
    other; the same permutation of both sides leaves every score q·k unchanged."""
    if node.op != "mla":
        return None
    from irc.ops.mla import mla_scale, mla_theta, qk_dim

    a = node.attrs
    e = _Emit(ctx, node)
    shapes = _shapes(ctx, node)
    x = node.inputs[0]
    b, t, _ = ctx.types[x].shape
    h, n, r, c, v = a["heads"], a["nope_dim"], a["rope_dim"], a["kv_lora"], a["v_dim"]

    def norm(value: str, which: str) -> str:
        return e.op("rmsnorm", [value], {"eps": a["eps"]}, weights=f"{node.weights}.{which}")

    def heads(value: str, width: int) -> str:  # [B, T, H·width] -> [B, H, T, width]
        value = e.op("reshape", [value], {"shape": [b, t, h, width]})
        return e.op("transpose", [value], {"perm": [0, 2, 1, 3]})

    def part(value: str, start: int, end: int, axis: int = 3) -> str:
        return e.op("slice", [value], {"axis": axis, "start": start, "end": end})

    def rope(value: str, lead: int) -> str:  # [B, lead, T, r], adjacent pairs -> rotate-half pairs, rotated
        value = e.op("reshape", [value], {"shape": [b, lead, t, r // 2, 2]})
        value = e.op("transpose", [value], {"perm": [0, 1, 2, 4, 3]})
        value = e.op("reshape", [value], {"shape": [b, lead, t, r]})
        return e.op("rope", [value], {"theta": mla_theta(a)})

    if a["q_lora"] is None:
        q = e.gemm(x, e.param("wq", shapes["wq"]), None)
    else:
        q = e.gemm(norm(e.gemm(x, e.param("wq_a", shapes["wq_a"]), None), "q_norm"),
                   e.param("wq_b", shapes["wq_b"]), None)
    q = heads(q, qk_dim(a))
    q = e.op("concat", [part(q, 0, n), rope(part(q, n, n + r), h)], {"axis": 3}, name=f"{node.outputs[0]}.q")
    latent = e.gemm(x, e.param("wkv_a", shapes["wkv_a"]), None)
    ckv = norm(part(latent, 0, c, axis=2), "kv_norm")
    k_rope = e.op("reshape", [part(latent, c, c + r, axis=2)], {"shape": [b, t, 1, r]})
    k_rope = rope(e.op("transpose", [k_rope], {"perm": [0, 2, 1, 3]}), 1)
    kv = heads(e.gemm(ckv, e.param("wkv_b", shapes["wkv_b"]), None), n + v)
    k = e.op("concat", [part(kv, 0, n), e.op("expand", [k_rope], {"shape": [b, h, t, r]})], {"axis": 3},
             name=f"{node.outputs[0]}.k")
    kt = e.op("transpose", [k], {"perm": [0, 1, 3, 2]})
    scores = e.op("mul", [e.op("matmul", [q, kt])], {"scalar": float(mla_scale(a))},
                  name=f"{node.outputs[0]}.scores")
    if a["causal"]:
        scores = e.op("causal_mask", [scores], {"window": a["window"]})
    probs = e.op("softmax", [scores], {"axis": -1}, name=f"{node.outputs[0]}.probs")
    ctx_v = e.op("matmul", [probs, part(kv, n, n + v)], name=f"{node.outputs[0]}.ctx")
    merged = e.op("reshape", [e.op("transpose", [ctx_v], {"perm": [0, 2, 1, 3]})], {"shape": [b, t, h * v]})
    e.gemm(merged, e.param("wo", shapes["wo"]), None, result_of=node)
    return e.done()


def _attention_with_table(ctx: Context, node: Node) -> Rewrite | None:
    return _attention(ctx, node, tables=True)


RULES = [_linear, _ffn, _swiglu, _unembed, _attention, _mla]
# what the grad pass lowers: every layer, an attention with its own T5 table too (rel_position_bias over its key)
GRAD_RULES = [_linear, _ffn, _swiglu, _unembed, _attention_with_table, _mla]


@register_pass("decompose", "lower layers to primitives: param, gemm, matmul, softmax, reshape, ...")
def decompose(graph: Graph) -> Graph:
    return apply_rules(graph, RULES, max_rounds=2)
