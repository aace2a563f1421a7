"""Activation memory: bytes per value, peak live bytes by liveness, activations saved for training.

A value is a buffer unless its op only re-views its input (``ALIASES``); a view extends
the life of the buffer it views. Composite ops also hold intermediates of their own
(``internal_elements``): attention's q, k, v, probabilities and context, an FFN's hidden
layer, recurrent gates. Those live while the op runs (they count toward the peak) and are
what backpropagation keeps (they count toward the saved activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.graph import Graph, Node
from irc.ops.attention import head_dim, kv_heads
from irc.types import DTYPE_BYTES, TensorType

# ops whose result shares its input's buffer (inference-time dropout is the identity)
ALIASES = frozenset({"flatten", "reshape", "transpose", "select", "slice", "split", "dropout", "identity"})


def value_bytes(t: TensorType, act_dtype: str) -> int:
    """Bytes of a value: floating-point activations at ``act_dtype``, integers at their own width."""
    per = DTYPE_BYTES[act_dtype] if t.is_float else DTYPE_BYTES[t.dtype]
    return int(t.numel() * per)


def internal_elements(node: Node, ins: list[TensorType]) -> int:
    """Elements a composite op materialises besides its result."""
    op, a = node.op, node.attrs
    if op == "attention":
        x = ins[0]
        kv = ins[1] if len(ins) > 1 else x
        b, t, d = x.shape
        s = kv.shape[1]
        hd = head_dim(a, d)
        q_and_context = 2 * b * t * a["heads"] * hd
        k_and_v = 2 * b * s * kv_heads(a) * hd
        probs = b * a["heads"] * t * s  # the full score matrix, as an unfused kernel holds it
        return q_and_context + k_and_v + probs
    if op in ("ffn", "swiglu"):
        rows = ins[0].numel() // ins[0].shape[-1]
        return (2 if op == "ffn" else 3) * rows * a["hidden"]  # pre/post activation; gate, up, product
    if op in ("rnn", "lstm", "gru"):
        b, steps, _ = ins[0].shape
        per_unit = {"rnn": 1, "lstm": 6, "gru": 4}[op]  # gates (+ c_t and tanh c_t; + r⊙h)
        return b * steps * a["hidden"] * per_unit
    return 0


@dataclass
class Memory:
    activation_bytes: int  # every buffer the forward pass creates, none freed
    peak_live_bytes: int  # the most held at once, freeing each buffer after its last use
    peak_node: int  # index of the node where the peak occurs
    saved_for_training_bytes: int  # buffers and intermediates backpropagation keeps


def analyse_memory(graph: Graph, act_dtype: str) -> Memory:
    nodes = graph.nodes
    n = len(nodes)
    types = graph.value_types()
    root: dict[str, str] = {}
    born: dict[str, int] = {}
    size: dict[str, int] = {}
    last: dict[str, int] = {}
    internal = [0] * n
    elem = int(DTYPE_BYTES[act_dtype])
    for i, node in enumerate(nodes):
        for v in node.inputs:
            last[root[v]] = i
        if node.op in ALIASES:
            for v in node.outputs:
                root[v] = root[node.inputs[0]]
            continue
        for v, t in zip(node.outputs, node.types):
            root[v] = v
            born[v] = i
            size[v] = value_bytes(t, act_dtype)
            last.setdefault(v, i)
        if node.op != "input":
            internal[i] = elem * internal_elements(node, [types[v] for v in node.inputs])
    for _, v in graph.outputs:
        last[root[v]] = n - 1
    # sweep: a buffer is live from the node that makes it to its last use, inclusive
    delta = [0] * (n + 1)
    for v, b in born.items():
        delta[b] += size[v]
        delta[last[v] + 1] -= size[v]
    live, peak, peak_at = 0, 0, 0
    for i in range(n):
        live += delta[i]
        if live + internal[i] > peak:
            peak, peak_at = live + internal[i], i
    act_bytes = sum(size.values())
    return Memory(act_bytes, peak, peak_at, act_bytes + sum(internal))
