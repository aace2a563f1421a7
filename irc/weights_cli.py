"""``irc weights MODEL``: every weight the model reads, with its shape, dtype, init rule and layer.

The keys are exactly those ``irc run --weights`` checks a file against (parameters, then
buffers; a tied head reads its embedding's key, so it adds none). ``--template OUT`` writes a
file with every key, initialised from ``--seed`` by the rules listed, which a converter can
fill in. With a weight map next to the model (``irc import`` writes one), each row also
names the checkpoint tensor it is made from.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import prod
from pathlib import Path
from typing import Any

from irc.diagnostics import UsageError
from irc.graph import Graph

WEIGHTS_JSON_VERSION = 1


def weight_rows(graph: Graph) -> list[dict[str, Any]]:
    """One row per key: key, shape, dtype, init rule, the layer (node) that owns it, its op, and kind."""
    from irc.analysis.params import weight_table
    from irc.ops import get_op
    from irc.ops.registry import INIT_RULES
    from irc.runtime.init import feeds_relu
    from irc.runtime.weights import WEIGHT_DTYPE, expected_weights, node_weight_keys

    expected = expected_weights(graph)
    _, buffers = weight_table(graph)
    types = graph.value_types()
    users = graph.users()
    rows: dict[str, dict[str, Any]] = {}
    for node in graph.nodes:
        opdef = get_op(node.op)
        rules = opdef.init_rules(node.attrs) if opdef is not None else {}
        for name, key in node_weight_keys(node, types).items():
            if key in rows or node.weights is None or not key.startswith(f"{node.weights}."):
                continue  # shared or tied: listed once, at its owner
            rule = rules.get(name, "")
            if rule == "fan":
                rule = "he" if feeds_relu(graph, node, users) else "xavier"
            rows[key] = {"key": key, "shape": list(expected[key]), "dtype": str(WEIGHT_DTYPE),
                         "numel": prod(expected[key]), "init": rule, "init_doc": INIT_RULES.get(rule, ""),
                         "layer": node.weights, "op": node.op, "kind": "buffer" if key in buffers else "parameter"}
    return [rows[k] for k in expected]


def cmd_weights(args: argparse.Namespace) -> int:
    if args.template is not None and Path(args.template).suffix not in (".safetensors", ".npz"):
        raise UsageError(f"--template: the template is a .safetensors or .npz file, got '{args.template}'")
    from irc.runtime.cli import load_bound_graph  # unbound sizes take irc analyze's defaults, with a note

    graph = load_bound_graph(args)
    rows = weight_rows(graph)
    sources = _sources(args.file, rows)
    if args.template is not None:
        from irc.runtime.init import init_weights
        from irc.runtime.weights import save_weights

        save_weights(args.template, init_weights(graph, args.seed))
        print(f"irc: wrote {args.template}: {len(rows)} weights, initialised from seed {args.seed}", file=sys.stderr)
    if args.json:
        doc = {"version": WEIGHTS_JSON_VERSION, "model": graph.name,
               "bindings": {k: graph.bindings[k] for k in graph.symbols if k in graph.bindings},
               "total": sum(r["numel"] for r in rows), "weights": [_json_row(r, sources) for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
    _print_table(graph, rows, sources)
    return 0


def _json_row(row: dict[str, Any], sources: dict[str, str]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "init_doc"}
    if row["key"] in sources:
        out["source"] = sources[row["key"]]
    return out


def _sources(model: str, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each key's checkpoint tensor(s), from the weight map next to the model, if there is one."""
    from irc.runtime.weight_map import describe_sources, load_map, map_path_for

    path = map_path_for(model)
    if not path.is_file():
        return {}
    return describe_sources(load_map(path), [r["key"] for r in rows])


def _print_table(graph: Graph, rows: list[dict[str, Any]], sources: dict[str, str]) -> None:
    shapes = ["[" + ", ".join(str(d) for d in r["shape"]) + "]" for r in rows]
    cols = [("key", [r["key"] for r in rows]), ("shape", shapes), ("dtype", [r["dtype"] for r in rows]),
            ("init", [r["init"] for r in rows]), ("layer", [f"{r['layer']} ({r['op']})" for r in rows])]
    if sources:
        cols.append(("from", [sources.get(r["key"], "") for r in rows]))
    widths = [max([len(name), *(len(v) for v in values)]) for name, values in cols]
    binds = ", ".join(f"{k}={graph.bindings[k]}" for k in graph.symbols if k in graph.bindings)
    print(f"model {graph.name}({binds}): {len(rows)} weights, {sum(r['numel'] for r in rows):,} elements")
    print("  ".join(name.ljust(w) for (name, _), w in zip(cols, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for i in range(len(rows)):
        print("  ".join(values[i].ljust(w) for (_, values), w in zip(cols, widths)).rstrip())
    used = sorted({r["init"] for r in rows if r["init"]})
    if used:
        from irc.ops.registry import INIT_RULES

        print("init rules:")
        for rule in used:
            print(f"  {rule}: {INIT_RULES.get(rule, '')}")
