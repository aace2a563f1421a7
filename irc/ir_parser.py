"""Read the IR text that :mod:`irc.printer` writes back into a :class:`~irc.graph.Graph`.

Every error points at the line and column of the IR file. A node written without a
``loc(...)`` trailer gets its own IR line as location (as MLIR does), so later errors
about it — from verification or shape inference — point into the ``.ir`` file too.
"""

from __future__ import annotations

import re
from typing import Any

from irc.diagnostics import IrcError, Loc, did_you_mean, register_source, where
from irc.dim_parse import DimSyntaxError, parse_dim
from irc.dims import never_positive
from irc.graph import Graph, Node
from irc.ops import AttrError, get_op, normalize_attrs
from irc.ops.registry import op_names
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
MAX_NUMBER_CHARS = 40  # every number irc prints is shorter; int() of thousands of digits is slow or refused
_KINDS = {"value": "a value (%name)", "type": "a type such as f32[B,8]", "string": "a string",
          "number": "a number", "name": "a name"}
TRAILERS = ("scope", "weights", "loc")


class _Line:
    """The tokens of one IR line, with their 1-based columns in the line as written."""

    def __init__(self, text: str, lineno: int, file: str):
        self.toks: list[tuple[str, str, int]] = []
        self.file = file
        self.lineno = lineno
        self.end = len(text.rstrip()) + 1
        pos = 0
        while pos < len(text) and text[pos:].strip():
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                bad = pos + len(text[pos:]) - len(text[pos:].lstrip())
                raise IrcError(f"unexpected character {text[bad]!r}", Loc(file, lineno, bad + 1))
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind), m.start(kind) + 1))
            pos = m.end()
        self.i = 0

    def loc(self) -> Loc:
        """Where the next token is, spanning it (the end of the line when there is none)."""
        if self.i >= len(self.toks):
            return Loc(self.file, self.lineno, self.end)
        return self.at(self.i)

    def at(self, i: int) -> Loc:
        _, text, col = self.toks[i]
        return Loc(self.file, self.lineno, col, self.lineno, col + len(text))

    def rest(self) -> Loc:
        """From the next token to the end of the line: a node's own location when it has no loc(...)."""
        col = self.toks[self.i][2] if self.i < len(self.toks) else self.end
        return Loc(self.file, self.lineno, col, self.lineno, self.end)

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i][:2] if self.i < len(self.toks) else None

    def next(self, kind: str | None = None, text: str | None = None, what: str | None = None) -> str:
        want = what or (f"'{text}'" if text else _KINDS.get(kind or "", "more"))
        if self.i >= len(self.toks):
            raise IrcError(f"the line ends early; expected {want}", self.loc())
        k, t, _ = self.toks[self.i]
        if (kind and k != kind) or (text and t != text):
            raise IrcError(f"expected {want}, got '{t}'", self.loc())
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


_ESCAPED = {"n": "\n", "t": "\t", "r": "\r"}


def _unquote(s: str) -> str:
    """The printer's string literal decoded: \\\\ and \\" , and \\n, \\t, \\r, \\xNN for control characters."""
    def one(m: re.Match) -> str:
        e = m.group(1)
        return chr(int(e[1:], 16)) if len(e) == 3 else _ESCAPED.get(e, e)
    return re.sub(r"\\(x[0-9a-fA-F]{2}|.)", one, s[1:-1])


def _number(line: _Line) -> int | float:
    """The next token, a number short enough to convert."""
    loc = line.loc()
    text = line.next("number")
    if len(text) > MAX_NUMBER_CHARS:
        raise IrcError(f"number {text[:20]}... is too long ({len(text)} characters)", loc)
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _integer(line: _Line) -> int:
    loc = line.loc()
    value = _number(line)
    if not isinstance(value, int):
        raise IrcError(f"expected an integer, got {value!r}", loc)
    return value


def _parse_type(text: str, line: _Line, col: int) -> TensorType:
    """``f32[B,8]`` written at column ``col``; dimension errors point at their character."""
    dtype, _, rest = text.partition("[")
    if dtype not in DTYPE_BYTES:
        raise IrcError(f"unknown dtype '{dtype}'{did_you_mean(dtype, DTYPE_BYTES)}",
                       Loc(line.file, line.lineno, col, line.lineno, col + len(dtype)))
    body = rest[:-1]
    body_col = col + len(dtype) + 1
    depth, start = 0, 0
    pieces: list[tuple[str, int]] = []
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append((body[start:i], start))
            start = i + 1
    if body.strip():
        pieces.append((body[start:], start))
    dims = []
    for piece, offset in pieces:
        try:
            dims.append(parse_dim(piece))
        except DimSyntaxError as e:
            raise IrcError(str(e), Loc(line.file, line.lineno, body_col + offset + e.pos)) from None
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
    if kind == "number":
        return _number(line)
    loc = line.loc()
    line.next()
    if kind == "string":
        return _unquote(text)
    if kind == "name":
        if text == "true":
            return True
        if text == "false":
            return False
        if text == "sym":
            line.next(text="(")
            col = line.loc().col + 1  # the dimension starts after the opening quote
            s = _unquote(line.next("string"))
            line.next(text=")")
            try:
                return parse_dim(s)
            except DimSyntaxError as e:
                raise IrcError(str(e), Loc(line.file, line.lineno, col + e.pos)) from None
        return text
    raise IrcError(f"unexpected '{text}' in attributes", loc)


class _Reader:
    """Parses the lines of one graph, checking SSA form as it goes."""

    def __init__(self, file: str):
        self.file = file
        self.defined: dict[str, Loc] = {}  # value -> where it was defined
        self.labels: dict[str, Loc] = {}  # output label -> where it was declared

    def use(self, line: _Line) -> str:
        loc = line.loc()
        value = line.next("value")[1:]
        if value not in self.defined:
            raise IrcError(f"%{value} is used before it is defined", loc)
        return value

    def result(self, line: _Line, results: dict[str, Loc]) -> str:
        loc = line.loc()
        value = line.next("value")[1:]
        first = self.defined.get(value) or results.get(value)
        if first is not None:
            raise IrcError(f"value %{value} is defined twice", loc,
                           notes=[f"first defined at {where(first, self.file)}"])
        results[value] = loc
        return value

    def node(self, line: _Line) -> Node:
        here = line.rest()
        results: dict[str, Loc] = {}  # defined once the operands are read: a node cannot use its own result
        outputs = [self.result(line, results)]
        while line.accept(","):
            outputs.append(self.result(line, results))
        line.next(text="=")
        op_loc = line.loc()
        op = line.next("name", what="an op name")
        opdef = get_op(op)
        if opdef is None:
            raise IrcError(f"unknown op '{op}'{did_you_mean(op, op_names())}", op_loc)
        inputs: list[str] = []
        if line.peek() and line.peek()[0] == "value":
            inputs.append(self.use(line))
            while line.accept(","):
                inputs.append(self.use(line))
        attrs: dict[str, Any] = {}
        attr_locs: dict[str, Loc] = {}
        if line.accept("{"):
            while not line.accept("}"):
                key_loc = line.loc()
                key = line.next("name")
                attr_locs[key] = key_loc
                line.next(text="=")
                attrs[key] = _parse_attr_value(line)
                if not line.accept(","):
                    line.next(text="}")
                    break
        try:
            attrs = normalize_attrs(opdef, attrs) if op != "input" else {}
        except AttrError as e:
            bad = next((k for k in attrs if f"'{k}'" in str(e)), None)
            raise IrcError(str(e), attr_locs.get(bad, op_loc) if bad else op_loc, origin=e.origin) from None
        types: list[TensorType] = []
        type_loc = line.loc()
        if line.accept(":"):
            if line.accept("("):
                types.append(self.type(line))
                while line.accept(","):
                    types.append(self.type(line))
                line.next(text=")")
            else:
                types.append(self.type(line))
        if op == "input":  # an input's type is its only definition: it must be there and sized
            if len(types) != 1:
                raise IrcError(f"input %{outputs[0]} needs one type, as in ': f32[B,T]'", type_loc)
            for d in types[0].shape:
                if never_positive(d):
                    raise IrcError(f"input %{outputs[0]} has the size {d}, which is never positive", type_loc)
        scope, weights, loc = "", None, None
        explicit_weights = False
        while not line.done():
            key_loc = line.loc()
            key = line.next("name")
            if key not in TRAILERS:
                raise IrcError(f"unknown trailer '{key}'{did_you_mean(key, TRAILERS)} "
                               f"(a node ends with scope(...), weights(...) and loc(...))", key_loc)
            line.next(text="(")
            if key == "scope":
                scope = _unquote(line.next("string"))
            elif key == "weights":
                explicit_weights = True
                w = line.next()
                weights = None if w == "none" else _unquote(w)
            else:
                f = _unquote(line.next("string"))
                line.next(text=":")
                ln = _integer(line)
                line.next(text=":")
                col = _integer(line)
                loc = Loc(f, ln, col)
            line.next(text=")")
        if not explicit_weights and (opdef.params or opdef.buffers):
            weights = scope
        self.defined.update(results)
        return Node(opdef.name, inputs, outputs, attrs, scope, weights, loc or here, types)

    def type(self, line: _Line) -> TensorType:
        col = line.loc().col
        return _parse_type(line.next("type"), line, col)

    def header(self, line: _Line) -> Graph:
        line.next(text="graph")
        name_loc = line.loc()
        name = line.next("name")
        if not name.startswith("@"):
            raise IrcError("expected '@name' after 'graph'", name_loc)
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
                bindings[k] = _integer(line)
                if not line.accept(","):
                    line.next(text=")")
                    break
        line.next(text="{")
        graph = Graph(name[1:], symbols, bindings=bindings)
        graph.loc = name_loc
        return graph

    def output(self, line: _Line, graph: Graph) -> None:
        line.next()
        label_loc = line.loc()
        label = line.next("name")
        if label in self.labels:
            raise IrcError(f"output '{label}' is declared twice", label_loc,
                           notes=[f"first declared at {where(self.labels[label], self.file)}"])
        self.labels[label] = label_loc
        line.next(text="=")
        loc = line.loc()
        value = line.next("value")[1:]
        if value not in self.defined:
            raise IrcError(f"output {label} = %{value} is not defined", loc)
        graph.outputs.append((label, value))


def parse_ir(text: str, file: str = "<ir>") -> Graph:
    """Parse IR text; errors point at the line and column of the IR file."""
    register_source(file, text)
    reader = _Reader(file)
    graph: Graph | None = None
    opened: Loc | None = None
    closed = False
    lines = [ln.removesuffix("\r") for ln in text.split("\n")]  # as render() numbers them
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("//"):
            continue
        line = _Line(raw, lineno, file)
        if closed:
            raise IrcError("text after the graph's closing '}'", line.loc())
        head = line.peek()
        if graph is None:
            graph = reader.header(line)
            opened = Loc(file, lineno, line.toks[line.i - 1][2])
        elif head == ("punct", "}"):
            closed = True
            line.next()
        elif head == ("name", "output"):
            reader.output(line, graph)
        elif head is not None and head[0] != "value":
            raise IrcError(f"expected a node (%name = op ...) or 'output', got '{head[1]}'"
                           + did_you_mean(head[1], ["output"]), line.loc())
        else:
            graph.nodes.append(reader.node(line))
        if not line.done():
            raise IrcError(f"unexpected '{line.toks[line.i][1]}' at the end of the line", line.loc())
    if graph is None:
        raise IrcError("the file holds no graph; expected 'graph @name(...) {'", Loc(file, 1, 1))
    if not closed:
        last = len(lines) or 1
        end = Loc(file, last, len(lines[-1].rstrip()) + 1 if lines else 1)
        assert opened is not None
        raise IrcError(f"unexpected end of file; expected '}}' to close the graph opened at "
                       f"{opened.line}:{opened.col}", end)
    return graph
