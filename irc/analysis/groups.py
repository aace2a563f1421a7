"""Which block a node belongs to, for per-block subtotals.

Scopes are dotted block-call paths (``decoder.3.attn``); a node with weights has its own
name as the last component, a node without weights carries the enclosing block's scope.
A node's group is its path up to and including the first repeat index (``decoder.3``),
or the outermost block call when nothing is repeated (``stem``); nodes written directly
in the model body have no group ("").
"""

from __future__ import annotations

from irc.graph import Node
from irc.ops import get_op


def block_path(node: Node) -> str:
    opdef = get_op(node.op)
    named = opdef is not None and (opdef.params is not None or opdef.buffers is not None)
    if named:
        return node.scope.rpartition(".")[0]
    return node.scope


def group_of(node: Node) -> str:
    path = block_path(node)
    if not path:
        return ""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]
