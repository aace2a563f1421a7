"""The fused attention core's backward primitive: ``sdpa_grad``, the flash-style gradient of ``sdpa``.

``sdpa_grad(q, k, v, o, dy)`` gives ``(dq, dk, dv)`` of ``o = softmax(q·kᵀ·scale [causal])·v`` from the
forward's operands, its output ``o`` and the output's gradient ``dy``, recomputing the scores tile by tile
(FlashAttention-2's backward, Dao 2023, Algorithm 2): per query row the softmax statistics again (the row
maximum and denominator), ``D = Σ dy·o``, then per tile ``P = exp(s − L)``, ``dv += Pᵀ·dy``,
``dP = dy·vᵀ``, ``dS = P·(dP − D)``, ``dq += scale·dS·k``, ``dk += scale·dSᵀ·q``. No T×S matrix is kept.
Query head h reads key/value head h // (H/G): the gradients of a key/value head sum over its query heads.

The grad pass differentiates attention through its decomposed matmuls (docs/autodiff.md); the
``flash-grad`` pass (irc/passes/grad_flash.py) rewrites each attention core of a differentiated graph,
forward and backward, into ``sdpa`` + ``sdpa_grad``, which the CPU backend's training step runs.
"""

from __future__ import annotations

from irc.ops.common import need_float, same_dim
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, visible_pairs
from irc.ops.grad_ops import BACKWARD, NA
from irc.ops.primitives import WINDOW
from irc.ops.registry import OPS, Attr, OpDef, ShapeError, register, rf_reset


def _sdpa_grad_infer(a, ts):
    q, k, v, o, dy = ts
    (want,) = OPS["sdpa"].infer(a, [q, k, v])  # sdpa's own rules for q, k, v
    for t, what in ((o, "the forward's output"), (dy, "the output's gradient")):
        need_float(t, what)
        if t.rank != want.rank:
            raise ShapeError(f"{what} {t} does not match sdpa's output {want}")
        for x, y in zip(t.shape, want.shape):
            same_dim(x, y, f"{what} {t} does not match sdpa's output {want}")
    return [q, k, v]


def _sdpa_grad_cost(node, ins, outs) -> Cost:
    """Per visible (query, key) pair: the scores twice (the row statistics, then each tile's P), dP = dy·vᵀ,
    dv += Pᵀ·dy, dq += dS·k and dk += dSᵀ·q (4·hd + 2·hv MACs); the statistics' softmax work again, then
    exp(s − L) and dS = P·(dP − D) (4); and D = Σ dy·o per query row (2 per element of o)."""
    q, k, v = ins[0], ins[1], ins[2]
    b, h, t, hd = q.shape
    hv = v.shape[3]
    pairs = b * h * visible_pairs(t, k.shape[2], node.attrs["causal"], node.attrs.get("window"))
    return (Cost().mac("attention", pairs * (4 * hd + 2 * hv)).add("softmax", (SOFTMAX_PER_ELEMENT + 4) * pairs)
            .add("elementwise", 2 * b * h * t * hv))


register(OpDef(
    "sdpa_grad", ("q", "k", "v", "o", "dy"), (Attr("scale", "float"), Attr("causal", "bool", False), WINDOW),
    _sdpa_grad_infer, results=("dq", "dk", "dv"),
    doc="(dq, dk, dv) of sdpa (no bias) from its operands, its output o and dy: flash-style, the scores "
        "recomputed per tile, no T×S buffer; a key/value head's gradients sum over its query heads",
    cost=_sdpa_grad_cost, receptive=rf_reset("a gradient, not a feature map the receptive field follows"),
    classes=BACKWARD, na=NA,
))
