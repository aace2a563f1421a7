"""Time bounds from the roofline: each op limited by its FLOPs or by its bytes, on one device.

For each op, time = max(FLOPs / peak, bytes / bandwidth) (Williams, Waterman & Patterson 2009),
with the peaks and the bandwidth scaled by the hardware entry's efficiency factors. Products
(``linear``, ``attention``, ``matmul`` FLOPs) run at the matrix peak of the activation dtype;
elementwise work, norms and softmax at the plain FP32 rate. Ops run one after another, so a
pass takes the sum of its ops' times, and its bound is whichever side holds most of that time.

Prefill is one forward pass over the prompt (the analysed B × T). A decode step is the same
graph at T = 1 whose causal self-attention layers also read the KV cache of the context
(``n − 1`` cached tokens, at most the window) and write one new entry; tokens/s = B / step time.
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.analysis.bytes_moved import Traffic, op_traffic, weight_tables, weight_values
from irc.analysis.flops import MATMUL_KINDS, node_cost
from irc.analysis.hardware import Hardware
from irc.graph import Graph
from irc.ops import get_op
from irc.types import DTYPE_BYTES


@dataclass(frozen=True)
class OpTime:
    name: str
    op: str
    flops: int
    matmul_flops: int
    traffic: Traffic
    kv_read: int  # KV-cache bytes a decode step reads (0 in prefill)
    kv_written: int
    compute_s: float
    memory_s: float

    @property
    def bytes(self) -> int:
        return self.traffic.total + self.kv_read + self.kv_written

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        if not self.flops and not self.bytes:
            return ""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else None


@dataclass(frozen=True)
class PassTime:
    ops: list[OpTime]
    batch: int
    tokens: int  # tokens processed (B·T for prefill, B for a decode step)

    @property
    def time_s(self) -> float:
        return sum(o.time_s for o in self.ops)

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.ops)

    def time_by_bound(self) -> dict[str, float]:
        out = {"compute": 0.0, "memory": 0.0}
        for o in self.ops:
            if o.bound:
                out[o.bound] += o.time_s
        return out

    @property
    def bound(self) -> str:
        t = self.time_by_bound()
        return "compute" if t["compute"] >= t["memory"] else "memory"

    @property
    def weight_bytes(self) -> int:
        return sum(o.traffic.weights for o in self.ops)

    @property
    def kv_bytes(self) -> int:
        return sum(o.kv_read + o.kv_written for o in self.ops)


def pass_time(graph: Graph, hw: Hardware, weight_dtype: str, act_dtype: str, kv_dtype: str,
              decode_context: int | None = None) -> PassTime:
    """Per-op bounds of one forward pass; ``decode_context`` makes it a decode step at that context."""
    types = graph.value_types()
    tables, lowered = weight_tables(graph), weight_values(graph)
    matmul_rate, vector_rate, bandwidth = hw.matmul_peak(act_dtype), hw.vector_peak, hw.bandwidth
    ops: list[OpTime] = []
    batch = tokens = 1
    for node in graph.nodes:
        if node.op == "input" and node.types[0].rank >= 1:
            batch = node.types[0].shape[0]
        ins = [types[v] for v in node.inputs]
        cost = node_cost(node, ins) if node.op != "input" else None
        flops = cost.total if cost else 0
        matmul = sum(f for k, f in cost.flops.items() if k in MATMUL_KINDS) if cost else 0
        kv_read = kv_written = 0
        opdef = get_op(node.op)
        use = opdef.kv_cache(node, ins) if decode_context and opdef and opdef.kv_cache else None
        if use is not None:
            b = ins[0].shape[0]
            cached = min(decode_context, use.window) - 1 if use.window else decode_context - 1
            per_token = use.elements * DTYPE_BYTES[kv_dtype]
            extra = use.flops_per_pair * b * cached  # the graph counted the new key
            flops += extra
            matmul += extra
            kv_read, kv_written = int(per_token * b * cached), int(per_token * b)
        traffic = op_traffic(node, types, weight_dtype, act_dtype, tables, lowered)
        compute_s = matmul / matmul_rate + (flops - matmul) / vector_rate
        memory_s = (traffic.total + kv_read + kv_written) / bandwidth
        ops.append(OpTime(node.outputs[0], node.op, flops, matmul, traffic, kv_read, kv_written, compute_s, memory_s))
    seq = next((n.types[0] for n in graph.inputs() if n.types[0].rank >= 2), None)
    tokens = batch * (seq.shape[1] if seq is not None and not decode_context else 1)
    return PassTime(ops, batch, tokens)


def _pass_dict(p: PassTime) -> dict:
    t = p.time_by_bound()
    return {"batch": int(p.batch), "tokens": int(p.tokens), "time_s": p.time_s, "flops": p.flops, "bytes": p.bytes,
            "weight_bytes": p.weight_bytes, "kv_cache_bytes": p.kv_bytes, "bound": p.bound,
            "compute_bound_time_s": t["compute"], "memory_bound_time_s": t["memory"],
            "tokens_per_s": p.tokens / p.time_s if p.time_s else None}


def performance_report(prefill: PassTime, decode: PassTime | None, hw: Hardware, act_dtype: str,
                       context: int | None, why_no_decode: str | None) -> dict:
    out: dict = {
        "hardware": {"key": hw.key, "name": hw.name, "source": hw.source, "matmul_peak_flops": hw.matmul_peak(act_dtype)
                     / hw.compute_efficiency, "vector_peak_flops": hw.peak["f32"],
                     "memory_bandwidth": hw.memory_bandwidth, "interconnect": hw.interconnect, "memory": hw.memory,
                     "compute_efficiency": hw.compute_efficiency, "bandwidth_efficiency": hw.bandwidth_efficiency},
        "prefill": _pass_dict(prefill),
        "decode": None,
        "decode_unavailable": why_no_decode,
    }
    if decode is not None:
        d = _pass_dict(decode)
        d["context"] = context
        d["weight_bound_time_s"] = decode.weight_bytes / hw.bandwidth  # every weight read once per step
        out["decode"] = d
    return out
