"""The IR as JSON (``irc compile --emit json``): the same content as the text form."""

from __future__ import annotations

from typing import Any

from irc.dims import Sym
from irc.graph import Graph

JSON_IR_VERSION = 1


def _attr(v: Any) -> Any:
    if isinstance(v, Sym):
        return str(v)
    if isinstance(v, list):
        return [_attr(x) for x in v]
    return v


def _type(t) -> dict[str, Any]:
    return {"dtype": t.dtype, "shape": [d if isinstance(d, int) else str(d) for d in t.shape]}


def graph_to_json(graph: Graph, with_loc: bool = True) -> dict[str, Any]:
    nodes = []
    for n in graph.nodes:
        item: dict[str, Any] = {
            "outputs": n.outputs, "op": n.op, "inputs": n.inputs,
            "attrs": {k: _attr(v) for k, v in n.attrs.items() if v is not None},
            "types": [_type(t) for t in n.types], "scope": n.scope, "weights": n.weights,
        }
        if with_loc and n.loc is not None:
            item["loc"] = {"file": n.loc.file, "line": n.loc.line, "col": n.loc.col}
        nodes.append(item)
    return {
        "irc_ir_version": JSON_IR_VERSION, "graph": graph.name, "symbols": graph.symbols,
        "bindings": graph.bindings, "nodes": nodes,
        "outputs": [{"name": label, "value": v} for label, v in graph.outputs],
    }
