"""The mixture of experts' backward primitive ``moe_grad`` and moe's vector-Jacobian product.

``moe_grad(x, dy)`` is derived from the ``moe`` record (irc/ops/moe.py) the way irc/ops/grad_layers.py derives
the layers' backwards: the same attributes, parameters and init rules (it reads the layer's weights at the
forward node's ``weights`` scope), operands ``(x, dy)`` and results ``(dx, drouter, d<expert matrix>...,
d<shared matrix>...)`` in the record's parameter order.

The top-k choice is a step function of the router's scores: it has no gradient. Each token's gradient goes
to its k chosen experts (their matrices and its input) and, through the weights those experts' outputs are
multiplied by, to the chosen router probabilities: back through the renormalisation over the k
(``norm_topk``) or the scale factor, then the softmax over every expert, to the router matrix and to x. The
shared experts get a dense FFN's gradient. docs/autodiff.md gives the formulas.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import irc.ops.moe  # noqa: F401  (the forward record moe_grad derives from)
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, rows
from irc.ops.grad_ops import BACKWARD, NA
from irc.ops.moe import shared_hidden
from irc.ops.registry import OPS, ShapeError, register, rf_reset
from irc.types import TensorType

# the forward softmax's per-element work, less the exp: its backward p·(dp − Σ p·dp) is 4 per element
_SOFTMAX_GRAD = SOFTMAX_PER_ELEMENT - 1


def param_names(a: dict[str, Any]) -> tuple[str, ...]:
    """moe's parameter names in its record's order (they follow from the attributes; the width only sizes them)."""
    return tuple(OPS["moe"].param_shapes(a, [TensorType("f32", (1,))]))


def _infer(a, ts):
    x, dy = ts
    (y,) = OPS["moe"].infer(a, [x])  # moe's own checks of x and the attributes
    if not dy.is_float or dy.rank != y.rank or any(p != q for p, q in zip(dy.shape, y.shape)):
        raise ShapeError(f"the gradient {dy} does not match the forward result {y} (or is not floating-point)")
    shapes = OPS["moe"].param_shapes(a, [x])
    return [x] + [TensorType(x.dtype, tuple(s)) for s in shapes.values()]


def _cost(node, ins, outs) -> Cost:
    """What a token's backward computes, as the forward's count does (only its k routed experts):

    - each product with a weight twice (the input's gradient and the weight's): the router's n·E·d, and the
      k routed experts' and the shared ones' (k·h + hs)·m·d per token (m matrices each: 3 gated, 2 not);
    - the k weights' gradients dy·FFN_e(x) = (dy·W_down)·hidden: k·h MACs per token, no second down product;
    - per hidden unit act′ (and act again when gated, for the up branch), then dh = w·q on the routed ones,
      and dgate = dh·up·act′, dup = dh·act(gate) when gated (3), dpre = dh·act′ when not (1);
    - the router: the softmax's backward (4 per score); through the renormalisation Σ dw·g and the k
      (dw − Σ)·scale/s (4 per chosen expert), or the scale alone (1);
    - summing dx over the router, the k experts and the shared ones.

    As the recurrent backwards' counts (docs/autodiff.md), this is the backward's own arithmetic: the kernels
    recompute the routing and the experts' hidden layers (the values moe's ``internal`` counts as saved for
    the backward), which an implementation that keeps them does not."""
    a = node.attrs
    x = ins[0]
    n, d = rows(x), x.shape[-1]
    e, k, h, hs = a["experts"], a["top_k"], a["hidden"], shared_hidden(a)
    gated = a["gated"]
    units = n * (k * h + hs)
    c = Cost().mac("linear", 2 * n * e * d)
    c.mac("linear", 2 * units * (3 if gated else 2) * d)
    c.mac("linear", n * k * h)
    c.add("activation", (2 if gated else 1) * units)
    c.add("elementwise", n * k * h + (3 if gated else 1) * units)
    c.add("softmax", _SOFTMAX_GRAD * n * e)
    if a["norm_topk"]:
        c.add("elementwise", 4 * n * k)
    elif a["scale"] != 1.0:
        c.add("elementwise", n * k)
    return c.add("elementwise", n * (k + (1 if hs else 0)) * d)


MOE_GRAD = register(replace(
    OPS["moe"], name="moe_grad", inputs=("x", "dy"), infer=_infer,
    results=lambda a: ("dx",) + tuple(f"d{p}" for p in param_names(a)),
    doc="(dx, drouter, then each expert matrix's and shared matrix's gradient) of moe: dy to each token's k chosen "
        "experts and through their router probabilities (the top-k choice has no gradient), dense through the "
        "shared experts",
    aliases=(), extra={}, omitted={}, cost=_cost, receptive=rf_reset("a gradient, not a feature map the receptive "
                                                                      "field follows"),
    classes=BACKWARD, depth=0, internal=None, vjp=None, na=NA,
))


def vjp_moe(b: Any, n: Any, dys: list[str | None]) -> dict[int | str, str]:
    """moe: ``moe_grad(x, dy)`` with the forward's attributes and weights gives dx, then each parameter's gradient
    (the grad pass sums them over every use of a shared weight key)."""
    names = ("x", *OPS["moe"].param_shapes(n.attrs, [b.type(n.inputs[0])]))
    outs = b.op("moe_grad", [n.inputs[0], dys[0]], dict(n.attrs), weights=n.weights, results=len(names))
    return {(0 if name == "x" else name): v for name, v in zip(names, outs)}
