"""The IR text form: one op per line, MLIR layout with HLO-style types.

    %decoder.0.attention = attention %decoder.0.layernorm {heads=12, causal=true} : f32[B,T,768] \
        scope("decoder.0.attention") loc("models/gpt2_small.arch":5:13)

Attributes are printed in the op's declaration order, ``none`` values are left out,
and the text is deterministic, so it serves golden tests; :mod:`irc.ir_parser` reads
it back, and print → parse → print is byte-identical.
"""

from __future__ import annotations

from typing import Any

from irc.dims import Sym
from irc.graph import Graph, Node
from irc.ops import get_op

IR_VERSION = 1


def format_attr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Sym):
        return f'sym("{value}")'
    if isinstance(value, str):
        return value if value.isidentifier() else _quote(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    raise TypeError(f"cannot print attribute value {value!r}")


def format_attrs(node: Node) -> str:
    items = [f"{k}={format_attr(v)}" for k, v in node.attrs.items() if v is not None]
    return "{" + ", ".join(items) + "}" if items else ""


_CONTROL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote(s: str) -> str:
    """A string literal on one line: backslash and quote escaped, control characters (a newline in a
    file name) as \\n, \\t, \\r or \\xNN, so every dump parses back (irc/ir_parser.py decodes them)."""
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    if any(ord(c) < 32 or ord(c) == 127 for c in out):
        out = "".join(_CONTROL_ESCAPES.get(c, f"\\x{ord(c):02x}") if ord(c) < 32 or ord(c) == 127 else c
                      for c in out)
    return '"' + out + '"'


def format_node(node: Node, with_loc: bool = True) -> str:
    lhs = ", ".join(f"%{v}" for v in node.outputs)
    parts = [f"{lhs} = {node.op}"]
    if node.inputs:
        parts.append(", ".join(f"%{v}" for v in node.inputs))
    attrs = format_attrs(node)
    if attrs:
        parts.append(attrs)
    text = " ".join(parts)
    if node.types:
        types = [str(t) for t in node.types]
        text += " : " + (types[0] if len(types) == 1 else "(" + ", ".join(types) + ")")
    if node.scope:
        text += f" scope({_quote(node.scope)})"
    opdef = get_op(node.op)
    default_weights = node.scope if opdef is not None and (opdef.params or opdef.buffers) else None
    if node.weights != default_weights:
        text += f" weights({_quote(node.weights) if node.weights is not None else 'none'})"
    if with_loc and node.loc is not None:
        text += f" loc({_quote(node.loc.file)}:{node.loc.line}:{node.loc.col})"
    return text


def print_graph(graph: Graph, with_loc: bool = True) -> str:
    header = f"graph @{graph.name}({', '.join(graph.symbols)})"
    if graph.bindings:
        header += " bind(" + ", ".join(f"{k}={v}" for k, v in sorted(graph.bindings.items())) + ")"
    lines = [f"// irc IR v{IR_VERSION}", header + " {"]
    lines += ["  " + format_node(n, with_loc) for n in graph.nodes]
    lines += [f"  output {label} = %{value}" for label, value in graph.outputs]
    lines.append("}")
    return "\n".join(lines) + "\n"
