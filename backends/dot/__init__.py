"""Graphviz pictures of an irc graph (``irc compile --emit dot|svg|png``).

One box per op (its name, op, the attributes that differ from their defaults, parameters and
FLOPs), the value's type on every edge, block scopes as clusters and ``repeat(N)`` blocks as
clusters titled ``name × N``. ``--depth N`` draws each scope nested deeper than N as one box
with the totals of its ops, so GPT-2 at ``--depth 1`` is its twelve blocks in one cluster.
``svg`` and ``png`` run Graphviz's ``dot`` program on the DOT text.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from irc.analysis.units import si
from irc.backends.dot.view import Cluster, Costs, build_tree, node_costs, repeats, shown_attrs
from irc.diagnostics import IrcError, UsageError
from irc.graph import Graph

INSTALL_HINT = ("install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; "
                "conda: conda install graphviz), or write DOT with --emit dot and render it elsewhere")
_COLORS = {"repeat": "#eef3fb", "block": "#f7f7f7"}


def _q(text: str) -> str:
    """A DOT double-quoted string ("\\n" breaks lines)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _cost_line(c: Costs) -> str:
    parts = []
    if c.params:
        parts.append(f"{si(c.params, '').replace(' ', '')} params")
    if c.flops:
        parts.append(si(c.flops, "FLOP"))
    return " · ".join(parts)


def emit_source(graph: Graph, depth: int | None = None, **_: Any) -> str:
    if depth is not None and depth < 0:
        raise UsageError(f"--depth must be 0 or more, got {depth}")
    costs, assumed = node_costs(graph)
    types = graph.value_types()
    root, box_of = build_tree(graph, depth)
    repeated = repeats(graph)
    nodes = {n.outputs[0]: n for n in graph.nodes}

    # totals of the collapsed boxes
    totals: dict[str, Costs] = {}
    for n in graph.nodes:
        box = box_of[n.outputs[0]]
        if box.startswith("scope:"):
            t = totals.setdefault(box, Costs())
            c = costs.get(n.outputs[0], Costs(0, 0, 1))
            t.params, t.flops, t.ops = t.params + c.params, t.flops + c.flops, t.ops + 1

    def box_stmt(box: str) -> str:
        if box.startswith("scope:"):
            t = totals[box]
            path = box[len("scope:"):]
            summary = " · ".join(p for p in (f"{t.ops} ops", _cost_line(t)) if p)
            lines = [f"{path} × {repeated[path]}" if path in repeated else path, summary]
            return f"{_q(box)} [label={_q(chr(10).join(lines))}, style=\"filled,bold\", fillcolor=\"#dde8f7\"];"
        n = nodes[box]
        if n.op == "input":
            return f"{_q(box)} [label={_q(f'{box}{chr(10)}{types[box]}')}, shape=ellipse, fillcolor=\"#e8f5e9\"];"
        head = n.op + (f" {{{shown_attrs(n)}}}" if shown_attrs(n) else "")
        lines = [box, head]
        c = costs.get(box)
        if c is not None and _cost_line(c):
            lines.append(_cost_line(c))
        return f"{_q(box)} [label={_q(chr(10).join(lines))}];"

    out = [f"digraph {_q(graph.name)} {{"]
    title = f"{graph.name}({', '.join(graph.symbols)})" if graph.symbols else graph.name
    if assumed:
        title += f"\nFLOPs at {assumed}"
    out += [f"  graph [label={_q(title)}, labelloc=t, fontname=\"Helvetica\", rankdir=TB];",
            "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", fontname=\"Helvetica\", "
            "fontsize=10];",
            "  edge [fontname=\"Helvetica\", fontsize=9, color=\"#555555\"];"]

    def emit_cluster(c: Cluster, indent: str) -> None:
        for box in c.members:
            out.append(indent + box_stmt(box))
        for child in c.children.values():
            n = repeated.get(child.path)
            label = f"{child.path} × {n}" if n else child.path
            kind = "repeat" if n else "block"
            out.append(f"{indent}subgraph {_q('cluster_' + child.path)} {{")
            out.append(f"{indent}  label={_q(label)}; style=\"rounded,filled\"; fillcolor=\"{_COLORS[kind]}\"; "
                       f"color=\"#8899aa\";" + (" penwidth=2;" if n else ""))
            emit_cluster(child, indent + "  ")
            out.append(f"{indent}}}")

    emit_cluster(root, "  ")
    seen: set[tuple[str, str, str]] = set()
    for n in graph.nodes:
        dst = box_of[n.outputs[0]]
        for v in n.inputs:
            src = box_of[v]
            if src == dst or (src, dst, v) in seen:
                continue
            seen.add((src, dst, v))
            out.append(f"  {_q(src)} -> {_q(dst)} [label={_q(str(types[v]))}];")
    for label, v in graph.outputs:
        out.append(f"  {_q('output:' + label)} [label={_q(f'output {label}{chr(10)}{types[v]}')}, shape=ellipse, "
                   "fillcolor=\"#fff3e0\"];")
        out.append(f"  {_q(box_of[v])} -> {_q('output:' + label)};")
    out.append("}")
    return "\n".join(out) + "\n"


def render(dot_text: str, kind: str) -> bytes:
    """Graphviz's picture of ``dot_text`` as ``svg`` or ``png``."""
    program = shutil.which("dot")
    if program is None:
        raise IrcError(f"--emit {kind} needs Graphviz's 'dot' program, which is not on PATH: {INSTALL_HINT}")
    result = subprocess.run([program, f"-T{kind}"], input=dot_text.encode("utf-8"), capture_output=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        why = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise IrcError(f"Graphviz's dot failed (exit {result.returncode}): {why[0] if why else 'no message'}")
    return result.stdout


def write_file(graph: Graph, path: str, kind: str, depth: int | None = None, **_: Any) -> None:
    from irc.output_files import write_atomically

    data = render(emit_source(graph, depth), kind)
    write_atomically(path, lambda f: f.write(data))
