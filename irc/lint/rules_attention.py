"""Attention lints: position (IRC-W101) and the score scale (IRC-W102)."""

from __future__ import annotations

import math

from irc.graph import Node
from irc.lint.context import LintContext
from irc.lint.numbers import fixed, sci, sig
from irc.lint.registry import Finding, rule
from irc.ops.attention import head_dim, is_cross
from irc.ops.registry import ops_with

POSITION_SOURCES = ops_with("position")  # learned or fixed tables, relative biases, convolutions, recurrences


def gives_position(node: Node) -> bool:
    """Ops that let later layers tell positions apart."""
    if node.op == "attention":
        return bool(node.attrs.get("rope")) or node.attrs.get("rel_buckets") is not None
    return node.op in POSITION_SOURCES


@rule("IRC-W101", "attention-no-position", "self-attention with no positional information upstream")
def no_position(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes("attention"):
        if is_cross(node) or gives_position(node):
            continue
        upstream = [n for v in node.inputs[::2] for n in ctx.upstream_nodes(v)]  # x, and an attn_bias
        if any(gives_position(n) for n in upstream):
            continue
        if not any(n.op == "embedding" for n in upstream):
            continue  # a float sequence input may carry positions added by the caller
        n_tokens = ctx.types[node.inputs[0]].shape[1]
        tokens = f"the {n_tokens:,} tokens" if isinstance(n_tokens, int) else "the tokens"
        if node.attrs["causal"]:
            why = (f"self-attention is permutation-equivariant (reorder {tokens} and Q, K, V and the output "
                   "reorder with them) and only the causal mask breaks the symmetry here, so word order can at "
                   "best be inferred from how many tokens each position sees")
        else:
            why = (f"self-attention is permutation-equivariant: reorder {tokens} and Q, K, V, the scores and "
                   "the output reorder with them, so this model cannot tell 'the dog bit the man' from "
                   "'the man bit the dog'")
        out.append(Finding(
            node,
            "attention has no positional information: no positional encoding, rope or relative bias upstream",
            why,
            "inject position: positional(x, sinusoidal) or positional(x, learned, max_len=N) after the "
            "embedding, or attention(..., rope=true) in every layer",
        ))
    return out


UNIT_GRAD = 1 / (1 + math.exp(-1)) * (1 - 1 / (1 + math.exp(-1)))  # p(1−p) at a one-sd gap of 1: 0.1966
TOLERANCE = 0.10  # a scale within 10% of 1/√d_k is taken as intended


def _smaller(grad: float) -> str:
    """How much smaller than at unit sd a gradient is: 5.2e17× at scale=15 and d_k=8; at scale=1e200 it is 0."""
    if grad == 0:
        return "it underflows to 0"
    ratio = UNIT_GRAD / grad
    return f"{sig(ratio) if ratio < 1e15 else f'{ratio:.1e}'.replace('e+', 'e')}× smaller"


@rule("IRC-W102", "attention-scale", "attention scores scaled by something other than 1/√d_k")
def scale(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes("attention"):
        s = node.attrs.get("scale")
        d = ctx.types[node.inputs[0]].shape[-1]
        if s is None or not isinstance(d, int):
            continue
        dk = head_dim(node.attrs, d)
        sd = s * math.sqrt(dk)  # sd of the scaled scores for unit-variance q and k
        if abs(sd - 1) <= TOLERANCE:
            continue
        right = 1 / math.sqrt(dk)
        base = (f"with unit-variance q and k, Var(q·k) = d_k = {dk}, so raw scores have sd √{dk} = "
                f"{math.sqrt(dk):.1f}" + (" and unscaled they keep it" if s == 1 else
                                          f", and times {s:.4g} they have sd {sd:.2g}"))
        if sd > 1:
            tail = math.exp(-sd)  # 1 − p as e^−sd / (1 + e^−sd): no cancellation once p rounds to 1
            p, q = 1 / (1 + tail), tail / (1 + tail)
            grad = p * q
            mechanism = (f"{base}: two keys one sd apart get weights {p:.5f} and {sci(q)} (near one-hot) and "
                         f"the gradient through them is p(1−p) = {sci(grad)} instead of {fixed(UNIT_GRAD)} at unit "
                         f"sd ({_smaller(grad)}), so the attention pattern freezes where initialization put it")
            what = "sharpens the softmax"
        else:
            mechanism = (f"{base}: a one-sd gap between two keys changes their weights by only "
                         f"e^{sd:.3g} = {math.exp(sd):.2f}×, so every token attends almost uniformly and the "
                         "layer computes a global average with no content signal")
            what = "flattens the softmax"
        fix = f"drop scale= to get irc's default 1/√d_k = 1/√{dk} = {right:.4g}"
        if s == 1:
            fix += (" (T5 omits the scale and folds 1/√d_k into W_q's initialization instead; irc's "
                    "initializer draws N(0, 0.02) for every attention matrix and does not)")
        out.append(Finding(node, f"attention scale={s:g} with d_k = {dk} {what} (1/√d_k = {right:.4g})",
                           mechanism, fix))
    return out
