"""Transformer figures: FLOPs per token against 2N and 6N, and the attention crossover.

Per token and per layer a block spends its parameter matmuls (24·d² FLOPs for MHA with a
4d FFN) plus, at context n, about 4·n·d FLOPs on Q·Kᵀ and ·V. The crossover — the context
at which attention costs as much as the parameter matmuls — is read off the model itself:
    n* = (weight-matmul FLOPs per token in the attention blocks)
         / (Q·Kᵀ and ·V FLOPs per token per key, summed over their attention layers)
which is 24·d²/(4·d) = 6d for the chapter's block.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from irc.analysis.flops import attention_flops_per_pair
from irc.ops.registry import ops_with

if TYPE_CHECKING:
    from irc.analysis.analyze import Row

EMBEDDINGS = ops_with("embedding")


def _number(q: Fraction) -> int | float:
    return int(q) if q.denominator == 1 else round(float(q), 3)


def transformer_figures(rows: list[Row], totals: dict[str, Any], context: int | None) -> dict[str, Any] | None:
    attention = [r for r in rows if r.op == "attention"]
    if not attention:
        return None
    blocks = {r.group for r in attention if r.group}
    in_blocks = [r for r in rows if r.group in blocks] if blocks else rows
    tokens = totals["tokens"]
    n_params = totals["params_active"]  # the rules' N is what a token uses: a mixture of experts' active count
    layers = len(blocks) if blocks else len(attention)
    # an attention result has its queries' shape, so its last axis is the model width
    per_pair = sum(attention_flops_per_pair(r.attrs, r.types[0].shape[-1]) for r in attention
                   if r.group in blocks or not blocks)
    linear_per_token = Fraction(sum(r.cost.flops.get("linear", 0) for r in in_blocks), tokens)
    crossover = linear_per_token / per_pair
    out: dict[str, Any] = {
        "layers": layers,
        "d_model": attention[0].types[0].shape[-1],
        "params_in_blocks": sum(r.params for r in in_blocks),
        "params_embedding": sum(r.params for r in rows if r.op in EMBEDDINGS),  # token tables and learned positions
        "flops_forward_per_token": totals["flops_forward_per_token"],
        "two_n": 2 * n_params,
        "forward_vs_2n": round(totals["flops_forward"] / (tokens * 2 * n_params), 4) if n_params else None,
        "flops_training_per_token": totals["flops_training_per_token"],
        "six_n": 6 * n_params,
        "training_vs_6n": round(totals["flops_training"] / (tokens * 6 * n_params), 4) if n_params else None,
        "matmul_flops_per_token_per_layer": _number(linear_per_token / layers),
        "attention_flops_per_token_per_layer_per_key": _number(Fraction(per_pair, layers)),
        "attention_crossover_tokens": round(crossover),
    }
    if context:
        window = totals.get("kv_cache_window_tokens")
        keys = min(context, window) if window else context  # a sliding window reads at most W keys
        out["context_tokens"] = context
        out["attention_flops_per_token_at_context"] = per_pair * keys
        share = per_pair * keys / (per_pair * keys + linear_per_token)
        out["attention_share_at_context"] = round(float(share), 4)
    return out

