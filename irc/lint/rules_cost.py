"""Serving-cost lints at the bound context: attention's share of FLOPs (W117), the KV cache (W118)."""

from __future__ import annotations

from irc.lint.context import LintContext
from irc.lint.numbers import binary_bytes
from irc.lint.registry import Finding, rule
from irc.ops.attention import head_dim, is_cross, kv_heads
from irc.ops.registry import ops_with

KV_MAX_BYTES = 2**30  # per sequence at fp16: the chapter's GQA 7B holds 1 GiB at 8k tokens
GQA_GROUP = 4  # the chapter's 32 query heads over 8 KV heads


@rule("IRC-W117", "attention-dominates", "attention costs more than the weight matmuls at the bound context")
def attention_dominates(ctx: LintContext) -> list[Finding]:
    layers = [n for n in ctx.nodes("attention") if not is_cross(n)]
    if not layers or not ctx.nodes(*ops_with("ffn")):
        return []  # the chapter's comparison is within transformer blocks: self-attention against the FFN
    a = ctx.analysis
    if a is None or not a.transformer or not a.context:
        return []
    t = a.transformer
    n, crossover = a.context, t["attention_crossover_tokens"]
    if n <= crossover:
        return []
    windows = [layer.attrs.get("window") for layer in layers]
    if all(w is not None for w in windows) and min(n, max(windows)) <= crossover:
        return []  # a sliding window bounds the keys each token reads (Mistral: 4,096 of any context)
    d = t["d_model"]
    matmuls = round(t["matmul_flops_per_token_per_layer"])
    per_key = round(t["attention_flops_per_token_per_layer_per_key"])
    share = t.get("attention_share_at_context")
    share_text = f" and takes {100 * share:.1f}% of each token's matmul FLOPs at n = {n:,}" if share is not None else ""
    return [Finding(
        layers[0],
        f"attention dominates the cost at the bound context n = {n:,} (crossover n* = {crossover:,} tokens)",
        f"per token and layer the weight matmuls cost {matmuls:,} FLOPs (24·d² for "
        f"the chapter's block) while Q·Kᵀ and ·V cost {per_key:,}·n "
        f"(4·n·d), so past n* = {crossover:,} (6d = {6 * d:,} at d = {d:,}) the n² term wins{share_text}",
        "bound what each token reads — a sliding window (local attention) makes the cost grow with the window, "
        f"not n — or keep the context below {crossover:,}; FlashAttention-style kernels avoid the n×n memory "
        "but not these FLOPs",
        [x for x in [ctx.defaulted(layers[0].inputs[0])] if x],
        layers[1:],
    )]


@rule("IRC-W118", "kv-cache", "a full multi-head KV cache above 1 GiB per sequence at the bound context")
def kv_cache(ctx: LintContext) -> list[Finding]:
    from irc.analysis.kv_cache import analyse_kv

    cached = [n for n in ctx.nodes("attention") if not is_cross(n) and n.attrs["causal"]]
    if not cached or not ctx.concrete:
        return []
    if any(kv_heads(n.attrs) != n.attrs["heads"] for n in cached):
        return []  # already shares KV heads
    n_tokens = ctx.types[cached[0].inputs[0]].shape[1]
    kv = analyse_kv(ctx.graph, "f16", "f32")
    per_token, total = kv.per_token_bytes, kv.bytes_at(n_tokens)
    if total <= KV_MAX_BYTES:
        return []
    first = cached[0]
    heads = first.attrs["heads"]
    d_kv = heads * head_dim(first.attrs, ctx.types[first.inputs[0]].shape[-1])
    uniform = all(n.attrs["heads"] == heads for n in cached)
    options = []
    if uniform and heads % GQA_GROUP == 0 and heads > GQA_GROUP:
        groups = heads // GQA_GROUP
        options.append(f"attention(..., kv_heads={groups}) (GQA: {heads} query heads share {groups} KV heads) "
                       f"keeps {binary_bytes(per_token // GQA_GROUP)} per token, "
                       f"{binary_bytes(total // GQA_GROUP)} at n = {n_tokens:,} ({GQA_GROUP}× less)")
    if uniform and heads > 1:
        options.append(f"kv_heads=1 (MQA) keeps {binary_bytes(per_token // heads)} per token ({heads}× less) "
                       "at a larger quality cost")
    fix = "share key/value heads: " + "; ".join(options) if options else "share key/value heads (GQA or MQA)"
    return [Finding(
        first,
        f"KV cache of {binary_bytes(total)} per sequence at n = {n_tokens:,}: {len(cached)} causal layers × 2 (K, V) "
        f"× {d_kv:,} × 2 B = {binary_bytes(per_token)} per token at fp16",
        "decoding keeps every past token's keys and values so no step recomputes them, so the cache grows as "
        f"O(n) per sequence and a batch multiplies it — with one KV head per query head it is "
        f"{binary_bytes(total)} for one sequence of {n_tokens:,} tokens",
        fix,
        [x for x in [ctx.defaulted(first.inputs[0])] if x],
        cached[1:],
    )]
