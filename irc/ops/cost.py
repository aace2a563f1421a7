"""The forward cost of one node, and the counting helpers the op records' cost functions share.

Conventions (docs/analysis-json.md spells them out):
- a multiply-add (MAC) is 2 FLOPs; ``linear`` (products with weights: dense, conv, projections,
  recurrent gates, unembedding), ``attention`` (Q·Kᵀ and ·V) and ``matmul`` (a product of two
  activations) are counted as exact MACs and reported both ways;
- bias adds, residual adds and other arithmetic are 1 FLOP per result element (``elementwise``); an
  activation function is 1 FLOP per evaluation (``activation``); ``norm``, ``softmax`` and ``pool`` use
  the per-element counts their ops declare;
- ops that only move data cost nothing, on purpose (``free``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from irc.diagnostics import IrcError
from irc.types import TensorType

MATMUL_KINDS = ("linear", "attention", "matmul")  # FLOPs = 2 × MACs
KINDS = ("linear", "attention", "matmul", "activation", "elementwise", "norm", "softmax", "pool")
SOFTMAX_PER_ELEMENT = 5  # max, subtract, exp, sum, divide


@dataclass
class Cost:
    """Forward cost of one node: MACs of its products and FLOPs by kind."""

    macs: int = 0
    flops: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, flops: int) -> Cost:
        if flops:
            self.flops[kind] = self.flops.get(kind, 0) + flops
        return self

    def mac(self, kind: str, macs: int) -> Cost:
        self.macs += macs
        return self.add(kind, 2 * macs)

    @property
    def total(self) -> int:
        return sum(self.flops.values())


CostFn = Callable[[Any, list[TensorType], list[TensorType]], Cost]


@dataclass(frozen=True)
class CacheUse:
    """What one layer keeps per token of a sequence while a decoder generates (an op record's ``kv_cache``).

    ``elements``: numbers cached per token (attention: a key and a value per KV head, 2·kv_heads·d_head;
    multi-head latent attention: its compressed latent and shared RoPE key, d_c + d_R); ``flops_per_pair``:
    what attending from one new query to one cached token costs over all heads; ``window``: a sliding
    window's W (the cache is a rolling buffer of W slots), else None."""

    elements: int
    flops_per_pair: int
    window: int | None = None


def numel(t: TensorType) -> int:
    n = t.numel()
    if not isinstance(n, int):
        raise IrcError(f"cannot count the cost of {t}: bind its symbols with -D")
    return n


def rows(t: TensorType) -> int:
    """Number of vectors along the last axis (tokens, for [B, T, D])."""
    return numel(t) // t.shape[-1] if t.shape[-1] else 0


def per_element(kind: str, per: int = 1) -> CostFn:
    """``per`` FLOPs of ``kind`` for each element of the (first) result."""
    def cost(node: Any, ins: list[TensorType], outs: list[TensorType]) -> Cost:
        return Cost().add(kind, per * numel(outs[0]))
    return cost


def free(node: Any, ins: list[TensorType], outs: list[TensorType]) -> Cost:
    """Data movement (views, copies, a gather, inference-time dropout): no arithmetic."""
    return Cost()


ACTIVATION = per_element("activation")
ELEMENTWISE = per_element("elementwise")


def causal_pairs(t: int, s: int) -> int:
    """(query, key) pairs a top-left-aligned causal mask keeps: query i sees keys 0..i."""
    if t <= s:
        return t * (t + 1) // 2
    return s * (s + 1) // 2 + (t - s) * s


def visible_pairs(t: int, s: int, causal: bool, window: int | None) -> int:
    """(query, key) pairs a mask keeps. A sliding window also hides j <= i − W: for query i that
    is min(i − W + 1, S) keys once i >= W, which sums to causal_pairs(T − W, S)."""
    if not causal:
        return t * s
    hidden = causal_pairs(t - window, s) if window is not None and t > window else 0
    return causal_pairs(t, s) - hidden
