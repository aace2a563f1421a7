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
    """identity, dropout at inference (training lowers it to x·dropout_mask(x): mul's vjp then reuses the
    mask), and a sum's operands."""
    return {0: dys[0]}


def vjp_constant(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """A result that does not depend on its operand's values (dropout_mask: a random draw of its shape)."""
    return {}


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


def _axis(b: Any, value: str, axis: int) -> int:
    rank = b.type(value).rank
    return axis + rank if axis < 0 else axis


def vjp_concat(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """The adjoint of joining is cutting: dxs = split(dy) at the operands' sizes along the axis."""
    if len(n.inputs) == 1:
        return {0: dys[0]}
    ax = _axis(b, n.inputs[0], n.attrs["axis"])
    sizes = [b.type(v).shape[ax] for v in n.inputs]
    if all(s == sizes[0] for s in sizes):
        parts: Any = len(sizes)
    elif all(isinstance(s, int) for s in sizes):
        parts = sizes
    else:
        b.refuse(n, f"a concat of unequal symbolic sizes {', '.join(map(str, sizes))} (bind them with -D)")
    outs = b.op("split", [dys[0]], {"parts": parts, "axis": ax}, results=len(sizes))
    return dict(enumerate(outs))


def _offset(b: Any, n: Any, start: Any, what: str) -> int:
    """Where a gradient is placed along an axis: slice_grad needs a number."""
    if not isinstance(start, int):
        b.refuse(n, f"{what} at the symbolic offset {start} (bind the sizes with -D)")
    return start


def vjp_split(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """dx = concat(dparts); a part nothing reads contributes zeros: the others are placed with slice_grad."""
    x = n.inputs[0]
    ax = _axis(b, x, n.attrs["axis"])
    if all(d is not None for d in dys):
        return {0: dys[0] if len(dys) == 1 else b.op("concat", list(dys), {"axis": ax})}
    size, start, acc = b.type(x).shape[ax], 0, None
    for part, dy in zip(n.outputs, dys):
        if dy is not None:
            at = _offset(b, n, start, "a split with an unread part: a part read lies")
            placed = b.op("slice_grad", [dy], {"axis": ax, "start": at, "size": size})
            acc = placed if acc is None else b.op("add", [acc, placed])
        start = start + b.type(part).shape[ax]
    return {0: acc}


def vjp_slice(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """x[start:end] along an axis: dy placed back at start, zeros elsewhere (slice_grad)."""
    x = n.inputs[0]
    ax = _axis(b, x, n.attrs["axis"])
    size = b.type(x).shape[ax]
    start = slice(n.attrs["start"], n.attrs["end"]).indices(size)[0] if isinstance(size, int) else n.attrs["start"]
    return {0: b.op("slice_grad", [dys[0]], {"axis": ax, "start": start, "size": size})}


def vjp_select(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """x[..., index, ...]: dy with the axis back (size 1), placed at index by slice_grad."""
    x = n.inputs[0]
    xt = b.type(x)
    ax = _axis(b, x, n.attrs["axis"])
    size, index = xt.shape[ax], n.attrs["index"]
    if index < 0:
        index = _offset(b, n, index + size, "a select from the end of a symbolic axis: its index lies")
    shape = list(xt.shape[:ax]) + [1] + list(xt.shape[ax + 1:])
    one = b.op("reshape", [dys[0]], {"shape": shape})
    return {0: b.op("slice_grad", [one], {"axis": ax, "start": index, "size": size})}


def vjp_expand(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """Broadcasting's adjoint: sum over the new and the repeated axes."""
    return {0: b.sum_to(dys[0], n.inputs[0])}


def vjp_pixel_shuffle(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """A permutation of elements: its adjoint is the inverse permutation (pixel_unshuffle, and back)."""
    inverse = "pixel_unshuffle" if n.op == "pixel_shuffle" else "pixel_shuffle"
    return {0: b.op(inverse, [dys[0]], {"factor": n.attrs["factor"]})}


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


def vjp_minmax(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """maximum/minimum: dy to the operand that wins, half to each on a tie (torch.maximum's rule), then
    summed over the axes each operand was broadcast along."""
    x, y = n.inputs
    da, db = b.op("minmax_grad", [x, y, dys[0]], {"fn": n.op}, results=2)
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
    """A layer whose backward primitive ``<op>_grad(x, dy)`` carries its attributes and weights (convolutions,
    transposed convolutions, pools, upsampling, the norms): dx, then each parameter's gradient (batchnorm's
    running statistics are buffers: they get none)."""
    from irc.ops.registry import OPS

    names = ("x", *OPS[n.op].param_shapes(n.attrs, [b.type(n.inputs[0])]))
    return _layer_grads(b, n, f"{n.op}_grad", [n.inputs[0], dys[0]], names)


def vjp_batchnorm(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """batchnorm_grad: inference mode (running statistics constant) or, with train=true, through the batch
    mean and variance. The batch statistics a training forward also returns feed the running-average
    update, which is not differentiated."""
    if any(d is not None for d in dys[1:]):
        b.refuse(n, "a batchnorm whose batch statistics are read downstream (they feed the running averages only)")
    return vjp_window_layer(b, n, dys[:1])


def _zeros_like(b: Any, value: str) -> str:
    """0·value: the zero gradient of a result nothing reads (a recurrent layer's outputs are bounded or the
    loss is already not finite, so the product is an exact 0)."""
    return b.op("mul", [value], {"scalar": 0.0})


def vjp_recurrent(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """rnn, lstm, gru (either layout): ``<op>_grad`` backpropagates through time from the sequence's gradient
    and the final states' (a result nothing reads contributes zeros); dx, then each parameter's gradient.
    In training (train=true) the forward's dropout mask goes last, so the backward multiplies the gradient
    between layers by the very mask the forward drew; the mask, a random draw, gets no gradient."""
    from irc.ops.registry import OPS

    last = max(i for i, d in enumerate(dys) if d is not None)  # gradients after the last one read are left out
    grads = [d if d is not None else _zeros_like(b, v) for d, v in zip(dys[:last + 1], n.outputs)]
    operands = [n.inputs[0], *grads, *([n.inputs[1]] if n.attrs.get("train") else [])]
    names = ("x", *OPS[n.op].param_shapes(n.attrs, [b.type(n.inputs[0])]))
    return _layer_grads(b, n, f"{n.op}_grad", operands, names)


def vjp_rope(b: Any, n: Any, dys: list[str | None]) -> Grads:
    """A rotation per position and pair: its adjoint is the rotation by the opposite angle (rope_grad)."""
    return {0: b.op("rope_grad", [dys[0]], {"theta": n.attrs.get("theta")})}


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
