"""The mixture of experts' backward (irc/ops/grad_moe.py): ``moe_grad(x, dy)`` -> dx and every weight's gradient.

The routing is the forward's own (backends/numpy_ref/experts.py: ``route``, the same stable top-k), so the
gradient flows to exactly the experts the forward chose. Per routed expert e and its tokens (rows r, slot j of
their top k, weight w = the routed weight):

    q = dy·W_down,  dw = q·hidden (= dy·FFN_e(x)),  dhidden = w·q,  dW_down = (w·dy)ᵀ·hidden,
    gated: dgate = dhidden·up·act′(gate), dup = dhidden·act(gate); plain: dpre = dhidden·act′(pre),
    dW_in = dpreᵀ·x for each input matrix, dx += Σ dpre·W_in.

Then the k weights' gradients go back through the routing: w = scale·g/Σg (norm_topk) or scale·g, with g the
chosen softmax probabilities: dg = (scale/s)·(dw − Σ dw·g/s) or scale·dw; dp is dg at the chosen experts and 0
elsewhere; dlogits = p·(dp − Σ p·dp); drouter = dlogitsᵀ·x, dx += dlogits·router. The shared experts are one
FFN over every row with weight 1.
"""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.dense import affine
from irc.backends.numpy_ref.elementwise import ACT, softmax
from irc.backends.numpy_ref.experts import expert_weight, route
from irc.backends.numpy_ref.grad import act_derivative
from irc.graph import Node
from irc.ops.grad_moe import param_names


def _act_prime(name: str, v: np.ndarray) -> np.ndarray:
    """act′ of moe's activation names (gelu_tanh is act_grad's gelu with approx=tanh)."""
    if name == "gelu_tanh":
        return act_derivative("gelu", v, {"approx": "tanh"})
    return act_derivative(name, v, {})


def ffn_grad(x: np.ndarray, dy: np.ndarray, coef: np.ndarray | None, a: dict, w: dict, e: int | None,
             grads: dict) -> tuple[np.ndarray, np.ndarray]:
    """The gradient of coef·FFN_e(x) on the rows x (routed expert e, or the shared experts for e None with coef
    None, i.e. 1): adds the matrices' gradients into ``grads`` (at row e of a stacked matrix); returns (dx of
    these rows, dy·FFN_e(x) per row)."""
    act = ACT[a["act"]]
    names = ("gate", "up", "down") if a["gated"] else ("w1", "w2")
    ws = [expert_weight(w, name, e) for name in names]
    pre = affine(x, ws[0])
    if a["gated"]:
        up = affine(x, ws[1])
        hidden = act(pre) * up
    else:
        hidden = act(pre)
    q = dy @ ws[-1]  # [rows, h]: dy back through the down matrix, before the weight
    dcoef = (q * hidden).sum(axis=-1)
    dh = q if coef is None else q * coef[:, None]
    dout = dy if coef is None else dy * coef[:, None]
    if a["gated"]:
        dpre = dh * up * _act_prime(a["act"], pre)
        dup = dh * act(pre)
        parts = [(names[0], dpre, ws[0]), (names[1], dup, ws[1])]
    else:
        parts = [(names[0], dh * _act_prime(a["act"], pre), ws[0])]
    dx = np.zeros_like(x)
    for name, dp, wm in parts:
        _add(grads, name, e, dp.T @ x)
        dx += dp @ wm
    _add(grads, names[-1], e, dout.T @ hidden)
    return dx, dcoef


def _key(name: str, e: int | None) -> str:
    if e is None:
        return f"shared_{name}"
    return name if name in ("w1", "w2") else f"w_{name}"


def _add(grads: dict, name: str, e: int | None, g: np.ndarray) -> None:
    key = _key(name, e)
    if e is None:
        grads[key] += g
    else:
        grads[key][e] += g


def routing_grad(probs: np.ndarray, chosen: np.ndarray, dw: np.ndarray, norm_topk: bool, scale: float
                 ) -> np.ndarray:
    """dlogits [n, E] from the gradients dw [n, k] of the k routed weights (w = scale·g/Σg or scale·g, g the
    chosen probabilities of p = softmax(logits)); the choice itself has no gradient."""
    c = probs.dtype.type(scale)
    g = np.take_along_axis(probs, chosen, axis=-1)
    if norm_topk:
        s = g.sum(axis=-1, keepdims=True)
        dg = c / s * (dw - (dw * g).sum(axis=-1, keepdims=True) / s)
    else:
        dg = c * dw
    dp = np.zeros_like(probs)
    np.put_along_axis(dp, chosen, dg, axis=-1)
    return probs * (dp - (probs * dp).sum(axis=-1, keepdims=True))


def moe_grad(node: Node, args, w):
    a = node.attrs
    x, dy = args
    d = x.shape[-1]
    x2, dy2 = x.reshape(-1, d), dy.reshape(-1, d)
    grads = {name: np.zeros_like(w[name]) for name in param_names(a)}
    chosen, weights = route(x2, w["router"], a["top_k"], a["norm_topk"], a["scale"])
    dx = np.zeros_like(x2)
    dw = np.zeros_like(weights)
    for e in range(a["experts"]):
        rows, slot = np.nonzero(chosen == e)  # the tokens routed to e (each once), and where e is in their top k
        if rows.size:
            gx, dcoef = ffn_grad(x2[rows], dy2[rows], weights[rows, slot], a, w, e, grads)
            dx[rows] += gx
            dw[rows, slot] = dcoef
    if any(k.startswith("shared_") for k in w):
        gx, _ = ffn_grad(x2, dy2, None, a, w, None, grads)
        dx += gx
    probs = softmax(affine(x2, w["router"]), axis=-1)
    dlogits = routing_grad(probs, chosen, dw, a["norm_topk"], a["scale"])
    grads["router"] = dlogits.T @ x2
    dx += dlogits @ w["router"]
    return (dx.reshape(x.shape), *(grads[name] for name in param_names(a)))


OPS = {"moe_grad": moe_grad}
