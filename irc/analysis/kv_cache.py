"""KV cache and recurrent state: what a model keeps per sequence while it decodes.

Each layer's record says what it caches (``OpDef.kv_cache``). Causal self-attention caches one key
and one value per token:
    bytes per token = Σ over layers of 2 · kv_heads · d_head · bytes per number
(2·L·d_kv·bytes for a uniform stack: MHA d_kv = d, GQA shares KV heads, MQA keeps one).
Cross-attention caches its encoder keys and values once per sequence; non-causal
self-attention (an encoder) does not decode and caches nothing. A sliding-window layer
(Mistral) keeps only its last W tokens: a rolling buffer of min(n, W) entries. A recurrent
layer keeps a fixed-size state instead, however long the sequence. Multi-head latent attention
(DeepSeek-V2) caches one compressed latent of d_c numbers and one shared RoPE key of d_R per token,
whatever its heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from irc.graph import Graph
from irc.ops.attention import head_dim, is_cross, kv_heads
from irc.ops.registry import get_op, ops_with
from irc.types import DTYPE_BYTES

RECURRENT = ops_with("recurrent")


@dataclass
class KVCache:
    per_token_bytes: int  # summed over causal self-attention layers, one sequence
    cross_bytes: int  # encoder keys and values held by cross-attention, per batch
    cached_layers: int
    recurrent_state_bytes: int  # h (and c) of every recurrent layer, per batch
    windows: list[tuple[int, int]] = field(default_factory=list)  # (bytes per token, W) of sliding layers

    def bytes_at(self, context: int) -> int:
        """One sequence's cache after ``context`` tokens: sliding layers stop growing at W."""
        capped = sum(per * max(context - w, 0) for per, w in self.windows)
        return self.per_token_bytes * context - capped

    @property
    def window(self) -> int | None:
        """The largest sliding window when every cached layer slides (then the cache stops growing)."""
        if self.windows and len(self.windows) == self.cached_layers:
            return max(w for _, w in self.windows)
        return None


def analyse_kv(graph: Graph, kv_dtype: str, act_dtype: str) -> KVCache:
    types = graph.value_types()
    per_number = DTYPE_BYTES[kv_dtype]
    per_token = cross = layers = state = 0
    windows: list[tuple[int, int]] = []
    for node in graph.nodes:
        if node.op in RECURRENT:  # the state a step carries, not a cache
            state += sum(int(t.numel()) for t in node.types[1:]) * int(DTYPE_BYTES[act_dtype])
            continue
        if node.op == "attention" and is_cross(node):
            kv = types[node.inputs[1]]
            width = kv_heads(node.attrs) * head_dim(node.attrs, types[node.inputs[0]].shape[-1])
            cross += int(2 * kv.shape[0] * kv.shape[1] * width * per_number)
            continue
        opdef = get_op(node.op)
        use = opdef.kv_cache(node, [types[v] for v in node.inputs]) if opdef and opdef.kv_cache else None
        if use is None:
            continue
        per_token += int(use.elements * per_number)
        layers += 1
        if use.window is not None:
            windows.append((int(use.elements * per_number), use.window))
    return KVCache(per_token, cross, layers, state, windows)
