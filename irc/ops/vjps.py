"""Vector-Jacobian products: the ``vjp=`` entries of the op records.

Each function takes the grad pass's builder (``irc.passes.grad.Builder``), the forward node and
the incoming gradient of each of its results (``None`` for a result nothing downstream reads),
and emits IR nodes through the builder, returning ``{operand index or parameter name: value}``.
It is written in terms of existing ops where they suffice (matmul, transpose, reshape, mul, the
``sum_to`` reduction that undoes broadcasting) and of backward primitives (irc/ops/grad_ops.py)
where they do not. docs/autodiff.md gives each formula and its source.

This module imports no op family, so every family file can name its vjp here.
"""

from __future__ import annotations

from typing import Any

Grads = dict[int | str, str]


def _swap_last(rank: int) -> list[int]:
    return list(range(rank - 2)) + [rank - 1, rank - 2]


# -- shape and pass-through ops ------------------------------------------------------------------


def vjp_pass(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """identity, dropout (the identity the reference runs; docs/autodiff.md), and a sum's operands."""
    return {0: dys[0]}


def vjp_reshape(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """reshape, flatten: the gradient takes the operand's shape back."""
    return {0: b.op("reshape", [dys[0]], {"shape": list(b.type(n.inputs[0]).shape)})}


def vjp_transpose(b: Any, n: Any, dys: list[str | None]) -> Grads:
    perm = n.attrs["perm"]
    rank = len(perm)
    inverse = [0] * rank
    for i, p in enumerate(perm):
        inverse[p % rank] = i
    return {0: b.op("transpose", [dys[0]], {"perm": inverse})}


# -- arithmetic -------------------------------------------------------------------------------


def vjp_add(b: Any, n: Any, dys: list[str | None]) -> Grads:
    dy = dys[0]
    if len(n.inputs) == 1:
        return {0: dy}
    return {0: b.sum_to(dy, n.inputs[0]), 1: b.sum_to(dy, n.inputs[1])}


def vjp_sub(b: Any, n: Any, dys: list[str | None]) -> Grads:
    dy = dys[0]
    if len(n.inputs) == 1:  # x − s, or s − x with reverse=true
        return {0: b.op("mul", [dy], {"scalar": -1.0}) if n.attrs.get("reverse") else dy}
    neg = b.op("mul", [dy], {"scalar": -1.0})
    return {0: b.sum_to(dy, n.inputs[0]), 1: b.sum_to(neg, n.inputs[1])}


def vjp_mul(b: Any, n: Any, dys: list[str | None]) -> Grads:
    dy = dys[0]
    if len(n.inputs) == 1:
        return {0: b.op("mul", [dy], {"scalar": n.attrs["scalar"]})}
    x, y = n.inputs
    grads: Grads = {1: b.sum_to(b.op("mul", [dy, x]), y)}
    grads[0] = b.sum_to(b.op("mul", [dy, y]), x)
    return grads


def vjp_div(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """a/b: da = dy/b, db = −dy·(a/b)/b, reading the forward result a/b."""
    dy, out = dys[0], n.outputs[0]
    if len(n.inputs) == 1:
        if not n.attrs.get("reverse"):
            return {0: b.op("div", [dy], {"scalar": n.attrs["scalar"]})}
        # s/x: d/dx = −s/x² = −(s/x)/x
        t = b.op("div", [b.op("mul", [dy, out]), n.inputs[0]])
        return {0: b.op("mul", [t], {"scalar": -1.0})}
    x, y = n.inputs
    dx = b.sum_to(b.op("div", [dy, y]), x)
    t = b.op("mul", [b.op("div", [b.op("mul", [dy, out]), y])], {"scalar": -1.0})
    return {0: dx, 1: b.sum_to(t, y)}


def vjp_matmul(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """C = A·B batched: dA = dC·Bᵀ, dB = Aᵀ·dC, each summed over the batch axes it was broadcast along."""
    dy = dys[0]
    x, y = n.inputs
    xt, yt = b.type(x), b.type(y)
    da = b.op("matmul", [dy, b.op("transpose", [y], {"perm": _swap_last(yt.rank)})])
    db = b.op("matmul", [b.op("transpose", [x], {"perm": _swap_last(xt.rank)}), dy])
    return {0: b.sum_to(da, x), 1: b.sum_to(db, y)}


def vjp_gemm(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """y = x·Wᵀ + b (W [out, in]): dx = dy·W, dW = dyᵀ·x over every row, db = Σ_rows dy."""
    if n.attrs.get("act", "none") != "none":
        b.refuse(n, "a gemm with a fused activation (differentiate before fusing: --passes grad, not fuse,grad)")
    dy = dys[0]
    x, w = n.inputs[0], n.inputs[1]
    out, width = b.type(w).shape
    grads: Grads = {0: b.op("matmul", [dy, w])}
    rows_dy = b.op("reshape", [dy], {"shape": [-1, out]})
    rows_x = b.op("reshape", [x], {"shape": [-1, width]})
    grads[1] = b.op("matmul", [b.op("transpose", [rows_dy], {"perm": [1, 0]}), rows_x])
    if len(n.inputs) > 2:
        grads[2] = b.sum_to(dy, n.inputs[2])
    return grads


# -- activations and softmax -----------------------------------------------------------------

# the attributes of each activation that its derivative reads (act_grad takes them all, None elsewhere)
ACT_ATTRS = ("slope", "approx", "min", "max", "alpha")


def vjp_activation(b: Any, n: Any, dys: list[str | None]) -> Grads:
    attrs: dict[str, Any] = {"fn": n.op}
    attrs.update({k: n.attrs[k] for k in ACT_ATTRS if k in n.attrs})
    return {0: b.op("act_grad", [n.inputs[0], dys[0]], attrs)}


def vjp_softmax(b: Any, n: Any, dys: list[str | None]) -> Grads:
    return {0: b.op("softmax_grad", [n.outputs[0], dys[0]], {"axis": n.attrs["axis"]})}


def vjp_causal_mask(b: Any, n: Any, dys: list[str | None]) -> Grads:
    return {0: b.op("causal_mask_grad", [dys[0]], {"window": n.attrs.get("window")})}


# -- layers with weights (their backward primitives read the weights at the forward's scope) --------


def _layer_grads(b: Any, n: Any, op: str, operands: list[str], names: tuple[str, ...]) -> Grads:
    """Emit the backward primitive ``op`` with the forward's attributes and weights; its results are
    the input gradient then one per parameter, in the order ``names`` lists them."""
    outs = b.op(op, operands, dict(n.attrs), weights=n.weights, results=len(names))
    outs = outs if isinstance(outs, list) else [outs]
    return {(0 if name == "x" else name): v for name, v in zip(names, outs)}


def vjp_layernorm(b: Any, n: Any, dys: list[str | None]) -> Grads:
    from irc.ops.grad_ops import norm_grad_results

    return _layer_grads(b, n, "layernorm_grad", [n.inputs[0], dys[0]], norm_grad_results(n.attrs))


def vjp_rmsnorm(b: Any, n: Any, dys: list[str | None]) -> Grads:
    from irc.ops.grad_ops import norm_grad_results

    return _layer_grads(b, n, "rmsnorm_grad", [n.inputs[0], dys[0]], norm_grad_results(n.attrs))


def vjp_embedding(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """The table's gradient is a scatter-add of the rows' gradients at their ids (ids get none)."""
    return {"weight": b.op("embedding_grad", [n.inputs[0], dys[0]], {"vocab": n.attrs["vocab"]})}


def vjp_positional(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """x + P[:T]: dx = dy; a learned table's first T rows get Σ_batch dy, the rest zero."""
    grads: Grads = {0: dys[0]}
    if n.attrs["kind"] == "learned":
        grads["weight"] = b.op("position_grad", [dys[0]], {"max_len": n.attrs["max_len"]})
    return grads


def vjp_rel_position_bias(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """bias[0, h, i, j] = W[bucket(j − i), h]: W's gradient scatter-adds dy by bucket (q and k give lengths only)."""
    attrs = {k: n.attrs[k] for k in ("buckets", "max_distance", "bidirectional")}
    return {"weight": b.op("rel_position_bias_grad", [dys[0]], attrs)}


def vjp_param(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """A weight's value: its gradient is the weight's (the pass accumulates every use of one key)."""
    return {n.attrs["name"]: dys[0]}


def vjp_window_layer(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """conv1d/2d, the pools, global_avgpool and batchnorm: ``<op>_grad`` gives dx then each parameter's
    gradient (batchnorm's running statistics are buffers: they get none)."""
    from irc.ops.registry import OPS

    names = ("x", *OPS[n.op].param_shapes(n.attrs, [b.type(n.inputs[0])]))
    return _layer_grads(b, n, f"{n.op}_grad", [n.inputs[0], dys[0]], names)


def lstm_grad_results(attrs: dict[str, Any]) -> tuple[str, ...]:
    return ("x", "weight_ih", "weight_hh", "bias") if attrs.get("bias", True) else ("x", "weight_ih", "weight_hh")


def vjp_lstm(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """Backpropagation through time from the sequence's gradient and, when read, the final states'."""
    if n.attrs.get("layout") == "torch":
        b.refuse(n, "an lstm with layout=torch yet (stacked, bidirectional, two biases): a later step of issue 15")
    dseq, dh, dc = dys
    if dseq is None or (dh is None and dc is not None):
        b.refuse(n, "an lstm whose sequence result is unused (or whose final c is read without its h)")
    operands = [n.inputs[0], dseq] + [d for d in (dh, dc) if d is not None]
    return _layer_grads(b, n, "lstm_grad", operands, lstm_grad_results(n.attrs))


# -- losses -----------------------------------------------------------------------------------


def vjp_cross_entropy(b: Any, n: Any, dys: list[str | None]) -> Grads:
    seed = [dys[0]] if dys[0] is not None else []
    return {0: b.op("cross_entropy_grad", [n.inputs[0], n.inputs[1], *seed],
                    {"ignore_index": n.attrs["ignore_index"]})}


def vjp_mse(b: Any, n: Any, dys: list[str | None]) -> Grads:
    seed = [dys[0]] if dys[0] is not None else []
    dpred = b.op("mse_grad", [n.inputs[0], n.inputs[1], *seed])
    return {0: dpred, 1: b.op("mul", [dpred], {"scalar": -1.0})}


# -- why an op has no vjp yet (its record's na={"grad": ...}) --------------------------------------

GRAD_LOWERED = "decompose lowers it to gemm, matmul and softmax first, and the grad pass differentiates those"
GRAD_FUSED = "a fused op: the grad pass differentiates the graph before fusion"
GRAD_LATER = "its vector-Jacobian product is a later step of issue 15 (docs/autodiff.md lists what is left)"

BINARY_VJPS = {"add": vjp_add, "sub": vjp_sub, "mul": vjp_mul, "div": vjp_div}
