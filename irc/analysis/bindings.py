"""Default values for symbols the user left unbound, chosen by where each symbol sits.

Costs need concrete sizes. A symbol on axis 0 of an input is the batch (default 1); the
length of token ids [B, T], of a sequence [B, T, D] or of a channels-first signal [B, C, L]
(a rank-3 input that feeds a 1-D convolution or pool) is a sequence length (default
``--context`` when given, else the context the model declares — a model-level constant named
``ctx``, ``context``, ``n_ctx``, ``max_len``, ``max_seq_len`` or ``max_position_embeddings``
(Llama-2's 4,096) — else its learned-position table length, else ``DEFAULT_SEQUENCE``); the
spatial axes of an image [B, C, H, W] are image sides (default
``DEFAULT_SPATIAL``, the ImageNet 224). Any other symbol must be bound with -D.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from irc.diagnostics import SOURCES, IrcError, Loc
from irc.dims import dim_symbols
from irc.graph import Graph, Node
from irc.ops import get_op

DEFAULT_BATCH = 1
DEFAULT_SEQUENCE = 1024
DEFAULT_SPATIAL = 224
DEFAULTS_NOTE = (f"unbound batch sizes default to {DEFAULT_BATCH}, sequence lengths to --context, the model's "
                 f"declared context (const ctx = N), its position table or {DEFAULT_SEQUENCE}, image sides to "
                 f"{DEFAULT_SPATIAL}")
CONTEXT_NAMES = ("ctx", "context", "n_ctx", "n_positions", "max_len", "max_seq_len", "max_position_embeddings")


@dataclass(frozen=True)
class Binding:
    name: str
    value: int
    source: str  # "-D", "bound" (already in an IR dump), a flag, "context", or the default's role
    origin: str = ""  # for "context": the constant and where it is declared (``ctx at m.arch:8:51``)

    def describe(self, explicit: bool = False) -> str:
        """``T=4,096 (the model's ctx at m.arch:8:51)``; ``explicit`` also names -D and IR bindings."""
        if self.source in ("-D", "bound"):
            where = {"-D": "-D", "bound": "bound in the IR"}[self.source]
            return f"{self.name}={self.value:,} ({where})" if explicit else f"{self.name}={self.value:,}"
        if self.source.startswith("--"):
            return f"{self.name}={self.value:,} ({self.source})"
        if self.source == "context":
            return f"{self.name}={self.value:,} (the model's {self.origin})"
        return f"{self.name}={self.value:,} (default {self.source})"


def _reads_signal(op: str) -> bool:
    """An op that reads a channels-first [B, C, L] signal: a 1-D window (its record says so) or a global pool."""
    opdef = get_op(op)
    rule = opdef.receptive if opdef is not None else None
    return rule is not None and ((rule.kind == "window" and rule.nd == 1) or rule.kind == "global")

# role of each axis, by input layout; axes past the list are "other" unless the layout repeats its last role
_AXIS_ROLES = {
    "tokens": ("batch", "sequence"),  # integer ids [B, T]
    "sequence": ("batch", "sequence", "other"),  # [B, T, D]
    "signal": ("batch", "other", "sequence"),  # channels-first 1-D [B, C, L]
    "image": ("batch", "sequence", "spatial"),  # [B, C, H, W]: a symbolic axis 1 is a length ([B, T, H, D])
    "features": ("batch", "other"),  # [B, D]
}


def input_layouts(graph: Graph) -> list[tuple[Node, str]]:
    """Each input with its layout: tokens, sequence, signal, image or features."""
    users = graph.users()
    out: list[tuple[Node, str]] = []
    for node in graph.inputs():
        t = node.types[0]
        if not t.is_float:
            kind = "tokens"
        elif t.rank >= 4:
            kind = "image"
        elif t.rank == 3:
            consumers = {u.op for u in users.get(node.outputs[0], [])}
            kind = "signal" if any(_reads_signal(op) for op in consumers) else "sequence"
        else:
            kind = "features"
        out.append((node, kind))
    return out


def symbol_roles(graph: Graph) -> dict[str, str]:
    """Role of each symbol in the input types: batch, sequence, spatial or other (first seen wins)."""
    roles: dict[str, str] = {}
    for node, kind in input_layouts(graph):
        axis_roles = _AXIS_ROLES[kind]
        for axis, d in enumerate(node.types[0].shape):
            if axis < len(axis_roles):
                role = axis_roles[axis]
            else:
                role = "spatial" if kind == "image" else "other"
            for s in sorted(dim_symbols(d)):
                roles.setdefault(s, role)
    return roles


def _position_table_length(graph: Graph) -> int | None:
    lengths = [n.attrs["max_len"] for n in graph.nodes
               if n.op == "positional" and isinstance(n.attrs.get("max_len"), int)]
    return min(lengths) if lengths else None


def symbol_loc(graph: Graph, name: str) -> Loc | None:
    """Where ``name`` is declared in the model's header (``model m(B, T)``), else the model's name."""
    loc = graph.loc
    text = SOURCES.get(loc.file) if loc else None
    if loc is None or text is None:
        return loc
    lines = text.split("\n")
    if not 1 <= loc.line <= len(lines):
        return loc
    line = lines[loc.line - 1]
    header = re.match(r"[^(]*\(([^)]*)\)", line[loc.col - 1:])
    if header:
        for m in re.finditer(r"\w+", header.group(1)):
            if m.group() == name:
                col = loc.col + header.start(1) + m.start()
                return Loc(loc.file, loc.line, col, loc.line, col + len(name))
    return loc


def _number(tree, known: dict[str, int]) -> int | None:
    """The value of a constant expression built from numbers and earlier constants, else None."""
    from fractions import Fraction

    kind = getattr(tree, "data", None)
    kids = getattr(tree, "children", [])
    if kind == "number":
        try:
            v = Fraction(str(kids[0]))
        except (ValueError, ZeroDivisionError):
            return None
        return int(v) if v.denominator == 1 else None
    if kind == "name":
        return known.get(str(kids[0]))
    ops = {"mul": lambda a, b: a * b, "add": lambda a, b: a + b, "sub": lambda a, b: a - b}
    if kind in ops and len(kids) == 2:
        a, b = _number(kids[0], known), _number(kids[1], known)
        return ops[kind](a, b) if a is not None and b is not None else None
    return None


def declared_context(graph: Graph, given: dict[str, int]) -> tuple[int, str] | None:
    """The context the model declares (``const ctx = 4096`` in its body): (tokens, 'ctx at file:line:col').

    Read from the model's own source, so IR dumps (which keep no constants) have none; a -D override
    of the constant wins."""
    loc = graph.loc
    text = SOURCES.get(loc.file) if loc is not None else None
    if text is None or loc.file.endswith(".ir"):
        return None
    from irc.frontends.arch.parse import parse_text

    try:
        tree = parse_text(text, loc.file)
    except IrcError:
        return None
    for model in tree.children:
        if getattr(model, "data", None) != "model_def" or str(model.children[0]) != graph.name:
            continue
        known: dict[str, int] = {}
        for stmt in model.children[2].children:
            if getattr(stmt, "data", None) != "const_stmt":
                continue
            for item in stmt.children:
                name_tok, expr = item.children
                name = str(name_tok)
                value = given[name] if name in given else _number(expr, known)
                if value is None:
                    continue
                known[name] = value
                if name in CONTEXT_NAMES and 0 < value < 2**62:
                    line, col = getattr(name_tok, "line", loc.line), getattr(name_tok, "column", 1)
                    return value, f"{name} at {loc.file}:{line}:{col}"
    return None


def default_bindings(graph: Graph, given: dict[str, int], context: int | None) -> list[Binding]:
    """Bindings for every symbol of ``graph``: the given ones, then defaults by role."""
    roles = symbol_roles(graph)
    out = [Binding(name, value, "-D") for name, value in given.items()]
    out += [Binding(name, value, "bound") for name, value in graph.bindings.items() if name not in given]
    given = {**graph.bindings, **given}  # an IR dump may carry bindings of its own
    declared = None if context else declared_context(graph, given)
    table = None if context or declared else _position_table_length(graph)
    sequence = context or (declared[0] if declared else None) or table or DEFAULT_SEQUENCE
    sequence_source = "--context" if context else "context" if declared else "sequence"
    defaults = {"batch": DEFAULT_BATCH, "sequence": sequence, "spatial": DEFAULT_SPATIAL}
    for name in graph.symbols:
        if name in given:
            continue
        role = roles.get(name, "other")
        if role not in defaults:
            why = ("sizes no input, so no default can be chosen for it" if name not in roles
                   else "is not a batch, sequence or image size, so it has no default")
            raise IrcError(f"symbol '{name}' {why}; bind it with -D {name}=VALUE", symbol_loc(graph, name),
                           notes=[f"costs need every size; {DEFAULTS_NOTE}"])
        if role == "sequence":
            out.append(Binding(name, sequence, sequence_source, declared[1] if declared and not context else ""))
            continue
        out.append(Binding(name, defaults[role], role))
    order = {name: i for i, name in enumerate(graph.symbols)}
    return sorted(out, key=lambda b: (order.get(b.name, len(order)), b.name))
