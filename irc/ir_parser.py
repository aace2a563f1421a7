"""Read the IR text that :mod:`irc.printer` writes back into a :class:`~irc.graph.Graph`."""

from __future__ import annotations

import re
from typing import Any

from irc.diagnostics import IrcError, Loc, register_source
from irc.dim_parse import DimSyntaxError, parse_dim
from irc.graph import Graph, Node
from irc.ops import AttrError, get_op, normalize_attrs
from irc.types import DTYPE_BYTES, TensorType

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<value>%[A-Za-z_][A-Za-z0-9_.]*)
    | (?P<type>[a-z][a-z0-9]*\[[^\]]*\])
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<number>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|\.\d+(?:[eE][-+]?\d+)?|inf|nan))
    | (?P<name>@?[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[{}()\[\],=:])
    )""",
    re.VERBOSE,
)


class _Line:
    def __init__(self, text: str, lineno: int, file: str):
        self.toks: list[tuple[str, str, int]] = []
        self.file = file
        self.lineno = lineno
        pos = 0
        stripped = text.rstrip()
        while pos < len(stripped):
            m = _TOKEN.match(stripped, pos)
            if not m or m.end() == pos:
                raise IrcError(f"cannot read IR text at {stripped[pos:pos + 20]!r}", Loc(file, lineno, pos + 1))
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind), m.start(kind) + 1))
            pos = m.end()
        self.i = 0

    def loc(self) -> Loc:
        col = self.toks[self.i][2] if self.i < len(self.toks) else (self.toks[-1][2] if self.toks else 1)
        return Loc(self.file, self.lineno, col)

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i][:2] if self.i < len(self.toks) else None

    def next(self, kind: str | None = None, text: str | None = None) -> str:
        if self.i >= len(self.toks):
            raise IrcError(f"unexpected end of line; expected {text or kind}", self.loc())
        k, t, _ = self.toks[self.i]
        if (kind and k != kind) or (text and t != text):
            raise IrcError(f"expected {text or kind}, got '{t}'", self.loc())
        self.i += 1
        return t

    def accept(self, text: str) -> bool:
        p = self.peek()
        if p is not None and p[1] == text:
            self.i += 1
            return True
        return False

    def done(self) -> bool:
        return self.i >= len(self.toks)


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s[1:-1])


def _parse_type(text: str, line: _Line) -> TensorType:
    dtype, _, rest = text.partition("[")
    if dtype not in DTYPE_BYTES:
        raise IrcError(f"unknown dtype '{dtype}'", line.loc())
    body = rest[:-1]
    dims = []
    depth, start = 0, 0
    pieces = []
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(body[start:i])
            start = i + 1
    if body.strip():
        pieces.append(body[start:])
    for p in pieces:
        try:
            dims.append(parse_dim(p))
        except DimSyntaxError as e:
            raise IrcError(str(e), line.loc()) from None
    return TensorType(dtype, tuple(dims))


def _parse_attr_value(line: _Line) -> Any:
    kind_text = line.peek()
    if kind_text is None:
        raise IrcError("expected an attribute value", line.loc())
    kind, text = kind_text
    if text == "[":
        line.next()
        items = []
        while not line.accept("]"):
            items.append(_parse_attr_value(line))
            if not line.accept(","):
                line.next(text="]")
                break
        return items
    line.next()
    if kind == "number":
        return float(text) if any(c in text for c in ".enai") else int(text)
    if kind == "string":
        return _unquote(text)
    if kind == "name":
        if text == "true":
            return True
        if text == "false":
            return False
        if text == "sym":
            line.next(text="(")
            s = _unquote(line.next("string"))
            line.next(text=")")
            try:
                return parse_dim(s)
            except DimSyntaxError as e:
                raise IrcError(str(e), line.loc()) from None
        return text
    raise IrcError(f"unexpected '{text}' in attributes", line.loc())


def _parse_node(line: _Line) -> Node:
    outputs = [line.next("value")[1:]]
    while line.accept(","):
        outputs.append(line.next("value")[1:])
    line.next(text="=")
    op = line.next("name")
    opdef = get_op(op)
    if opdef is None:
        raise IrcError(f"unknown op '{op}'", line.loc())
    inputs: list[str] = []
    if line.peek() and line.peek()[0] == "value":
        inputs.append(line.next("value")[1:])
        while line.accept(","):
            inputs.append(line.next("value")[1:])
    attrs: dict[str, Any] = {}
    if line.accept("{"):
        while not line.accept("}"):
            key = line.next("name")
            line.next(text="=")
            attrs[key] = _parse_attr_value(line)
            if not line.accept(","):
                line.next(text="}")
                break
    try:
        attrs = normalize_attrs(opdef, attrs) if op != "input" else {}
    except AttrError as e:
        raise IrcError(str(e), line.loc(), origin=e.origin) from None
    types: list[TensorType] = []
    if line.accept(":"):
        if line.accept("("):
            types.append(_parse_type(line.next("type"), line))
            while line.accept(","):
                types.append(_parse_type(line.next("type"), line))
            line.next(text=")")
        else:
            types.append(_parse_type(line.next("type"), line))
    scope, weights, loc = "", None, None
    explicit_weights = False
    while not line.done():
        key = line.next("name")
        line.next(text="(")
        if key == "scope":
            scope = _unquote(line.next("string"))
        elif key == "weights":
            explicit_weights = True
            w = line.next()
            weights = None if w == "none" else _unquote(w)
        elif key == "loc":
            f = _unquote(line.next("string"))
            line.next(text=":")
            ln = int(line.next("number"))
            line.next(text=":")
            col = int(line.next("number"))
            loc = Loc(f, ln, col)
        else:
            raise IrcError(f"unknown trailer '{key}'", line.loc())
        line.next(text=")")
    if not explicit_weights and (opdef.params or opdef.buffers):
        weights = scope
    return Node(opdef.name, inputs, outputs, attrs, scope, weights, loc, types)


def parse_ir(text: str, file: str = "<ir>") -> Graph:
    """Parse IR text; errors point at the line and column of the IR file."""
    register_source(file, text)
    graph: Graph | None = None
    closed = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("//"):
            continue
        line = _Line(stripped, lineno, file)
        line.toks = [(k, t, c + len(raw) - len(raw.lstrip())) for k, t, c in line.toks]
        head = line.peek()
        if graph is None:
            line.next(text="graph")
            name = line.next("name")
            if not name.startswith("@"):
                raise IrcError("expected '@name' after 'graph'", line.loc())
            line.next(text="(")
            symbols = []
            while not line.accept(")"):
                symbols.append(line.next("name"))
                if not line.accept(","):
                    line.next(text=")")
                    break
            bindings = {}
            if line.accept("bind"):
                line.next(text="(")
                while not line.accept(")"):
                    k = line.next("name")
                    line.next(text="=")
                    bindings[k] = int(line.next("number"))
                    if not line.accept(","):
                        line.next(text=")")
                        break
            line.next(text="{")
            graph = Graph(name[1:], symbols, bindings=bindings)
        elif head == ("punct", "}"):
            closed = True
        elif head == ("name", "output"):
            line.next()
            label = line.next("name")
            line.next(text="=")
            graph.outputs.append((label, line.next("value")[1:]))
        else:
            graph.nodes.append(_parse_node(line))
    if graph is None or not closed:
        raise IrcError("IR text ends before the graph is closed with '}'", Loc(file, max(1, text.count("\n")), 1))
    return graph
