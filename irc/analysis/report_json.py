"""The analysis as JSON; the schema (versioned) is documented in docs/analysis-json.md and given as a
JSON Schema in docs/analysis-schema.json. Types are objects ``{"dtype", "shape"}``, as in
``irc compile --emit json``."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from irc.analysis.analyze import Analysis, Row
from irc.analysis.receptive import scalar_or_list
from irc.dims import Sym

ANALYSIS_JSON_VERSION = 2  # 2: types as objects, bytes moved, weight keys, training, performance


def _attr(v: Any) -> Any:
    if isinstance(v, Sym):
        return str(v)
    if isinstance(v, list):
        return [_attr(x) for x in v]
    if isinstance(v, Fraction):
        return int(v) if v.denominator == 1 else float(v)
    return v


def _type(t) -> dict[str, Any]:
    return {"dtype": t.dtype, "shape": [d if isinstance(d, int) else str(d) for d in t.shape]}


def _weight_keys(r: Row, a: Analysis, types: dict) -> list[str]:
    """The keys ``irc run --weights`` reads for this layer (``scope.name``), shared ones included; ``types``
    the graph's value types (computed once for all the layers: a pass over the whole graph each)."""
    from irc.analysis.params import node_params

    node = a.graph.nodes[r.index]
    params, buffers = node_params(node, types)
    return [f"{node.weights}.{k}" if node.weights else k for k in [*params, *buffers]]


def _time(a: Analysis, r: Row) -> dict[str, Any] | None:
    if not a.times:
        return None
    t = a.times[r.index]
    return {"time_s": t.time_s, "bound": t.bound or None, "compute_s": t.compute_s, "memory_s": t.memory_s}


def _layer(r: Row, a: Analysis, types: dict) -> dict[str, Any]:
    return {
        "name": r.name,
        "op": r.op,
        "scope": r.scope,
        "group": r.group,
        "type": _type(r.types[0]),
        "types": [_type(t) for t in r.types],
        "attrs": {k: _attr(v) for k, v in r.attrs.items() if v is not None},
        "params": r.params,
        "buffers": r.buffers,
        "shared_weights": r.shared,
        "weights": r.weights,
        "weight_keys": _weight_keys(r, a, types),
        "macs_forward": r.cost.macs,
        "flops_forward": r.cost.total,
        "flops_forward_by_kind": dict(sorted(r.cost.flops.items())),
        "flops_training": r.flops_training,
        "activation_bytes": r.activation_bytes,
        "receptive_field": scalar_or_list(r.rj[0]) if r.rj else None,
        "jump": scalar_or_list(r.rj[1]) if r.rj else None,
        "bytes_read": r.traffic.read,
        "bytes_weights": r.traffic.weights,
        "bytes_written": r.traffic.written,
        "arithmetic_intensity": round(r.cost.total / r.traffic.total, 4) if r.traffic.total else None,
        "roofline": _time(a, r),
    }


def analysis_to_json(a: Analysis, file: str) -> dict[str, Any]:
    types = a.graph.value_types()
    return {
        "irc_analysis_version": ANALYSIS_JSON_VERSION,
        "model": a.graph.name,
        "file": file,
        "bindings": {b.name: b.value for b in a.bindings},
        "binding_sources": {b.name: b.source for b in a.bindings},
        "binding_notes": {b.name: b.describe() for b in a.bindings},
        "settings": {"dtype": a.options.dtype, "kv_dtype": a.options.kv_dtype, "act_dtype": a.options.act_dtype,
                     "context": a.options.context},
        "totals": a.totals,
        "flops_forward_by_kind": a.flops_by_kind,
        "memory": {"peak_at": a.rows[a.memory.peak_node].name if a.rows else None},
        "receptive_field": None if a.final_rj is None else {
            "receptive_field": scalar_or_list(a.final_rj[0]), "jump": scalar_or_list(a.final_rj[1])},
        "transformer": a.transformer,
        "relu_mlp": a.relu_mlp,
        "groups": [
            {"name": g.name, "layers": g.rows, "params": g.params, "macs_forward": g.macs, "flops_forward": g.flops,
             "flops_training": g.flops_training, "activation_bytes": g.activation_bytes}
            for g in a.groups
        ],
        "training": a.training,
        "performance": a.performance,
        "layers": [_layer(r, a, types) for r in a.rows],
    }
