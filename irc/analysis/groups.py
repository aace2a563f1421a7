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


def fold_key(name: str, depth: int) -> str:
    """The row ``name`` folds into at ``--depth depth``: its first ``depth`` named path parts, with
    every repeat index replaced by ``*`` so the copies of a ``repeat(N)`` block share one row
    (``decoder.3.attn`` is ``decoder.*`` at depth 1 and ``decoder.*.attn`` at depth 2)."""
    out: list[str] = []
    named = 0
    for part in name.split("."):
        if part.isdigit():
            if out:
                out.append("*")
            continue
        if named == depth:
            break
        out.append(part)
        named += 1
    return ".".join(out)
