"""Default values for symbols the user left unbound, chosen by where each symbol sits.

Costs need concrete sizes. A symbol on axis 0 of an input is the batch (default 1); the
length of token ids [B, T], of a sequence [B, T, D] or of a channels-first signal [B, C, L]
(a rank-3 input that feeds a 1-D convolution or pool) is a sequence length (default
``--context`` when given, else the model's learned-position table length, else
``DEFAULT_SEQUENCE``); the spatial axes of an image [B, C, H, W] are image sides (default
``DEFAULT_SPATIAL``, the ImageNet 224). Any other symbol must be bound with -D.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from irc.diagnostics import SOURCES, IrcError, Loc
from irc.dims import dim_symbols
from irc.graph import Graph, Node

DEFAULT_BATCH = 1
DEFAULT_SEQUENCE = 1024
DEFAULT_SPATIAL = 224
DEFAULTS_NOTE = (f"unbound batch sizes default to {DEFAULT_BATCH}, sequence lengths to --context, the position "
                 f"table or {DEFAULT_SEQUENCE}, image sides to {DEFAULT_SPATIAL}")


@dataclass(frozen=True)
class Binding:
    name: str
    value: int
    source: str  # "-D", "bound" (already in an IR dump), or the default's role: batch, sequence, spatial

    def describe(self) -> str:
        if self.source in ("-D", "bound"):
            return f"{self.name}={self.value:,}"
        return f"{self.name}={self.value:,} (default {self.source})"


SIGNAL_CONSUMERS = frozenset({"conv1d", "maxpool1d", "avgpool1d", "global_avgpool"})

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
            kind = "signal" if consumers & SIGNAL_CONSUMERS else "sequence"
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
                return Loc(loc.file, loc.line, loc.col + header.start(1) + m.start())
    return loc


def default_bindings(graph: Graph, given: dict[str, int], context: int | None) -> list[Binding]:
    """Bindings for every symbol of ``graph``: the given ones, then defaults by role."""
    roles = symbol_roles(graph)
    out = [Binding(name, value, "-D") for name, value in given.items()]
    out += [Binding(name, value, "bound") for name, value in graph.bindings.items() if name not in given]
    given = {**graph.bindings, **given}  # an IR dump may carry bindings of its own
    sequence = context or _position_table_length(graph) or DEFAULT_SEQUENCE
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
        out.append(Binding(name, defaults[role], role))
    order = {name: i for i, name in enumerate(graph.symbols)}
    return sorted(out, key=lambda b: (order.get(b.name, len(order)), b.name))
