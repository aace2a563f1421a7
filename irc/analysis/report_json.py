"""The analysis as JSON; the schema (versioned) is documented in docs/analysis-json.md."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from irc.analysis.analyze import Analysis, Row
from irc.analysis.receptive import scalar_or_list
from irc.dims import Sym

ANALYSIS_JSON_VERSION = 1


def _attr(v: Any) -> Any:
    if isinstance(v, Sym):
        return str(v)
    if isinstance(v, list):
        return [_attr(x) for x in v]
    if isinstance(v, Fraction):
        return int(v) if v.denominator == 1 else float(v)
    return v


def _type(t) -> str:
    return str(t)


def _layer(r: Row) -> dict[str, Any]:
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
        "macs_forward": r.cost.macs,
        "flops_forward": r.cost.total,
        "flops_forward_by_kind": dict(sorted(r.cost.flops.items())),
        "flops_training": r.flops_training,
        "activation_bytes": r.activation_bytes,
        "receptive_field": scalar_or_list(r.rj[0]) if r.rj else None,
        "jump": scalar_or_list(r.rj[1]) if r.rj else None,
    }


def analysis_to_json(a: Analysis, file: str) -> dict[str, Any]:
    return {
        "irc_analysis_version": ANALYSIS_JSON_VERSION,
        "model": a.graph.name,
        "file": file,
        "bindings": {b.name: b.value for b in a.bindings},
        "binding_sources": {b.name: b.source for b in a.bindings},
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
        "layers": [_layer(r) for r in a.rows],
    }
