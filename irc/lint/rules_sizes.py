"""Parameter-budget lints: FFN tile width (W114), the embedding's share (W115), an untied head (W116)."""

from __future__ import annotations

import math

from irc.graph import Node
from irc.lint.context import LintContext
from irc.lint.numbers import percent
from irc.lint.registry import Finding, rule
from irc.ops.registry import ops_with

TILE = 256  # the chapter rounds d_ff to a multiple of 256 so the matmul tiles cleanly
MIN_TILE = 64  # below WIDE, rounding to 256 would add too much: ask for a multiple of 64
WIDE = 1024
EMBEDDING_MAX_SHARE = 0.5  # a table larger than everything else together "dominates"
UNTIED_MAX_SHARE = 0.10  # an untied head this large is a second copy of the vocabulary table


@rule("IRC-W114", "ffn-width-tile", f"an FFN hidden width off the matmul tile ({TILE} from {WIDE} up, else {MIN_TILE})")
def ffn_tile(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes(*ops_with("ffn")):
        h = node.attrs["hidden"]
        d = ctx.types[node.inputs[0]].shape[-1]
        if not isinstance(h, int) or h < MIN_TILE:
            continue
        tile = TILE if h >= WIDE else MIN_TILE
        if h % tile == 0:
            continue
        tiles = math.ceil(h / tile)
        last = h - (tiles - 1) * tile
        up = tiles * tile
        also = f" and not even of {MIN_TILE}" if tile == TILE and h % MIN_TILE else ""
        matrices = 3 if node.op == "swiglu" else 2
        extra = f" (+{matrices}·{d:,}·{up - h} = {matrices * d * (up - h):,} parameters)" if isinstance(d, int) else ""
        out.append(Finding(
            node,
            f"{node.op} hidden width {h:,} is not a multiple of the {tile}-wide matmul tile{also}",
            f"matmuls run in fixed-size tiles, so {h:,} columns take ceil({h:,}/{tile}) = {tiles} tiles and the "
            f"last is {last}/{tile} full: work paid for and thrown away",
            f"round up: hidden=round_up({h}, {tile}) = {up:,}{extra}, as the chapter's SwiGLU rounds "
            "8·4,096/3 = 10,922.67 to 11,008",
        ))
    return out


@rule("IRC-W115", "embedding-dominates", "embedding tables hold most of the parameters")
def embedding_share(ctx: LintContext) -> list[Finding]:
    owned = ctx.owned
    tables = [n for n in ctx.nodes("embedding")]
    if owned is None or not tables:
        return []
    own, total = owned
    emb = sum(own[n.outputs[0]] for n in tables)
    if not total or emb / total <= EMBEDDING_MAX_SHARE:
        return []
    first = max(tables, key=lambda n: own[n.outputs[0]])
    v, d = first.attrs["vocab"], first.attrs["dim"]
    return [Finding(
        first,
        f"embedding tables hold {percent(emb, total)} of the parameters ({emb:,} of {total:,})",
        f"a {v:,} × {d:,} table is a dictionary each token reads one row of, while the blocks that do the "
        f"computing hold the other {percent(total - emb, total)}; the chapter's 7B model spends 7.5% on its table",
        "spend the parameters in the blocks (params ≈ 12·L·d² + V·d: more layers or a wider d), shrink the "
        "vocabulary, or factorize the table into V × e and e × d with e ≪ d",
    )]


def _output_heads(ctx: LintContext) -> list[Node]:
    """Untied unembeddings, and dense layers onto an embedding's vocabulary that produce an output."""
    vocabularies = {n.attrs["vocab"] for n in ctx.nodes("embedding")}
    heads = [n for n in ctx.nodes("unembed") if n.attrs["tied"] is None]
    heads.extend(n for n in ctx.nodes("linear") if n.attrs["out"] in vocabularies and ctx.is_output_head(n))
    return heads


@rule("IRC-W116", "untied-head", "an untied output head that is a large share of a small model")
def untied_head(ctx: LintContext) -> list[Finding]:
    owned = ctx.owned
    if owned is None:
        return []
    own, total = owned
    out = []
    for head in _output_heads(ctx):
        vocab = head.attrs["vocab"] if head.op == "unembed" else head.attrs["out"]
        tables = [n for n in ctx.upstream_nodes(head.inputs[0])
                  if n.op == "embedding" and n.attrs["vocab"] == vocab]
        params = own[head.outputs[0]]
        if not tables or not total or params / total < UNTIED_MAX_SHARE:
            continue
        table = tables[0]
        d = ctx.types[head.inputs[0]].shape[-1]
        bias = head.attrs["bias"]
        weights = vocab * d
        if d == table.attrs["dim"]:
            fix = (f"tie it: unembed(x, tied={table.weights}{', bias=true' if bias else ''}) reuses the "
                   f"'{table.weights}' table and saves {weights:,} parameters")
        else:
            fix = (f"project to the table's width first, then tie: unembed(linear(x, {table.attrs['dim']}), "
                   f"tied={table.weights})")
        out.append(Finding(
            head,
            f"output head has its own {vocab:,} × {d:,} table: {params:,} parameters, "
            f"{percent(params, total)} of the model",
            "an untied head is a second copy of the vocabulary table; small models nearly always tie input and "
            "output embeddings, and untying pays only in large models whose blocks (12·L·d² in a transformer) "
            f"dwarf V·d, while here V·d is {percent(weights, total)} of the model",
            fix,
        ))
    return out
