"""Normalization lints: the final norm (W103), post-LN depth (W104), BatchNorm misuse (W105, W106)."""

from __future__ import annotations

import math

from irc.analysis.groups import group_of
from irc.graph import Node
from irc.lint.context import NORMS, RECURRENT, LintContext
from irc.lint.registry import Finding, rule
from irc.ops.registry import ops_with

POST_LN_MAX_LAYERS = 12  # BERT-base depth; deeper post-LN stacks need warmup and careful init


def _heads(ctx: LintContext) -> list[tuple[Node | None, str]]:
    """(head node, the value it reads) for each output head; (None, value) for a bare output."""
    heads: list[tuple[Node | None, str]] = [(n, n.inputs[0]) for n in ctx.nodes("unembed")]
    heads.extend((n, n.inputs[0]) for n in ctx.nodes("linear") if ctx.is_output_head(n))
    heads.extend((None, v) for v in ctx.output_values())
    return heads


def _trunk(ctx: LintContext, value: str) -> list[Node]:
    """The residual adds along the trunk that ends at ``value``, last first."""
    adds = []
    while (node := ctx.producer(value)) is not None and (parts := ctx.residual(node)) is not None:
        adds.append(node)
        value = parts[0]
    return adds


def _norm_in_branch(ctx: LintContext, add: Node) -> str | None:
    skip, branch = ctx.residual(add)
    return next((n.op for n in ctx.between(skip, branch) if n.op in NORMS), None)


def _blocks(adds: list[Node]) -> int:
    groups = {group_of(a) for a in adds} - {""}
    return len(groups) if groups else max(len(adds) // 2, 1)


@rule("IRC-W103", "prenorm-no-final-norm", "a pre-LN residual stream reaches the output head un-normalized")
def final_norm(ctx: LintContext) -> list[Finding]:
    out = []
    seen: set[str] = set()
    for head, value in _heads(ctx):
        x = ctx.back_through(value)
        adds = _trunk(ctx, x)
        if len(adds) < 2 or x in seen:
            continue
        norms = [op for op in (_norm_in_branch(ctx, a) for a in adds) if op]
        if len(norms) < 2:
            continue
        seen.add(x)
        n_adds, blocks = len(adds), _blocks(adds)
        var = 1 + n_adds
        per = n_adds / blocks
        growth = f"1 + 2L = 1 + 2·{blocks}" if per == 2 else f"1 + {n_adds}"
        target = f"'{head.op}'" if head is not None else "the output"
        norm = norms[0]
        call = f"{head.op}({norm}(x), ...)" if head is not None else f"{norm}(x) as the output"
        out.append(Finding(
            head or adds[0],
            f"pre-LN stack of {blocks} blocks reaches {target} with no final norm",
            f"nothing normalizes the residual stream and each of its {n_adds} residual adds contributes a "
            f"roughly unit-variance branch, so it arrives with variance {growth} = {var} (sd √{var} = "
            f"{math.sqrt(var):.2f}), about {round(math.sqrt(var))}× the scale the head was initialized for",
            f"normalize once after the last block: {call}",
        ))
    return out


@rule("IRC-W104", "postnorm-deep", f"a post-LN stack deeper than {POST_LN_MAX_LAYERS} layers")
def post_ln_depth(ctx: LintContext) -> list[Finding]:
    # post-LN: the norm replaces the stream (the add feeds nothing else); a pre-LN norm
    # reads the stream while the add also carries on as the next block's skip
    post = [n for n in ctx.nodes(*NORMS)
            if (p := ctx.producer(n.inputs[0])) is not None and ctx.residual(p) is not None
            and all(u is n for u in ctx.users.get(p.outputs[0], []))]
    if not post:
        return []
    groups = {group_of(n) for n in post} - {""}
    attention = [n for n in post if (b := ctx.producer(ctx.residual(ctx.producer(n.inputs[0]))[1])) is not None
                 and b.op == "attention" and len(b.inputs) == 1]
    layers = len(groups) or len(attention) or math.ceil(len(post) / 2)
    if layers <= POST_LN_MAX_LAYERS:
        return []
    return [Finding(
        post[0],
        f"post-LN stack of {layers} layers (more than {POST_LN_MAX_LAYERS}): the norm sits on the residual path",
        f"x = LN(x + F(x)) rescales the identity route from the loss back to the embeddings at each of its "
        f"{len(post)} norms, so at initialization the deeper layers dominate and a {layers}-layer post-LN stack "
        "diverges within a few hundred steps unless trained with learning-rate warmup and careful initialization",
        "move each norm into its branch, x + F(LN(x)) (pre-LN), and add one final norm before the head; "
        "if post-LN must stay, train with learning-rate warmup and a depth-scaled initialization",
        also=post[1:],
    )]


SEQUENCE_OPS = ops_with("embedding", "attention", "recurrent")


@rule("IRC-W105", "batchnorm-in-sequence", "BatchNorm in a sequence or autoregressive model")
def batchnorm_sequence(ctx: LintContext) -> list[Finding]:
    if not any(n.op in SEQUENCE_OPS for n in ctx.graph.nodes):
        return []
    decodes = any(n.op in RECURRENT or (n.op == "attention" and n.attrs["causal"]) for n in ctx.graph.nodes)
    out = []
    for node in ctx.nodes("batchnorm"):
        t = ctx.types[node.inputs[0]]
        axis = node.attrs["axis"] % t.rank
        others = [d for i, d in enumerate(t.shape) if i != axis]
        count = math.prod(others) if all(isinstance(d, int) for d in others) else None
        pooled = " × ".join(str(d) for d in others) + (f" = {count:,} values per channel here" if count else "")
        tail = (", and when decoding one token of one sequence (batch size 1) it must fall back to running "
                "averages collected under another length and content distribution" if decodes else
                ", and gradient accumulation or batch size 1 at inference change what it computes")
        out.append(Finding(
            node,
            "BatchNorm in a sequence model",
            f"BatchNorm pools each channel's statistics over the batch and time axes ({pooled}), so every "
            f"example's output depends on its batch-mates and on padding{tail}",
            "use layernorm (or rmsnorm): statistics per token, identical at training and inference, at any "
            "batch size",
        ))
    return out


# ops a dropout mask passes through unchanged in kind on its way to a BatchNorm
_TO_BATCHNORM = ops_with("linear", "conv", "pool", "activation", "residual", "view") - {"dropout"}


@rule("IRC-W106", "dropout-before-batchnorm", "dropout placed before a BatchNorm")
def dropout_before_batchnorm(ctx: LintContext) -> list[Finding]:
    out: dict[str, Finding] = {}
    for bn in ctx.nodes("batchnorm"):
        frontier, seen = [bn.inputs[0]], set()
        while frontier:
            node = ctx.producer(frontier.pop())
            if node is None or node.outputs[0] in seen:
                continue
            seen.add(node.outputs[0])
            if node.op == "dropout" and node.attrs["p"] > 0 and node.outputs[0] not in out:
                p = node.attrs["p"]
                out[node.outputs[0]] = Finding(
                    node,
                    f"dropout(p={p:g}) feeds a BatchNorm (line {bn.loc.line if bn.loc else '?'})",
                    f"in training inverted dropout scales the survivors by 1/(1−p) = {1 / (1 - p):.3g}, so a "
                    f"zero-mean unit reaches BatchNorm with {1 / (1 - p):.3g}× the variance it has at eval; the "
                    "running statistics collected under dropout then mis-normalize every eval activation (good "
                    "in training mode, worse after .eval())",
                    "put dropout after the last BatchNorm (e.g. just before the classifier), or use one of the two",
                )
            elif node.op in _TO_BATCHNORM:
                frontier.extend(node.inputs)
    return list(out.values())
