"""The Llama family: Llama 1/2/3 (``llama``), Mistral (``mistral``) and Qwen2 (``qwen2``).

All three are pre-RMSNorm decoders with rotate-half RoPE, grouped-query attention and a
SwiGLU FFN, and their checkpoints store every projection as torch.nn.Linear ``[out, in]``:
the weight map only renames. They differ in what the config may switch on: Mistral's
sliding window, Qwen2's query/key/value biases (the output projection has none), a tied head.
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.frontends.hf.arch_text import Imported, call_lines, const_lines, head_lines, header, number
from irc.frontends.hf.config import HFConfig
from irc.runtime.weight_map import Rule, WeightMap

P = "model."  # base_model_prefix of every *ForCausalLM here


@dataclass(frozen=True)
class Family:
    title: str
    hf_class: str
    hidden: int  # HF's defaults, used when the config leaves a key out
    ff: int
    kv_heads: int | None  # None: one per query head
    vocab: int
    context: int
    window: int | None = None  # Mistral: sliding_window's default


FAMILIES = {
    "llama": Family("Llama", "LlamaForCausalLM", 4096, 11008, None, 32000, 2048),
    "mistral": Family("Mistral", "MistralForCausalLM", 4096, 14336, 8, 32000, 131072, window=4096),
    "qwen2": Family("Qwen2", "Qwen2ForCausalLM", 4096, 22016, None, 151936, 32768),
}


def _rope_theta(cfg: HFConfig) -> float:
    """``rope_theta`` (transformers 4) or ``rope_parameters.rope_theta`` (5); plain RoPE only."""
    params = cfg.get("rope_parameters", None)
    scaling = cfg.get("rope_scaling", None)
    if params is not None:
        if not isinstance(params, dict):
            raise cfg.error("rope_parameters", "must be an object")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise cfg.error("rope_parameters", f"rope_type {kind!r}: irc implements plain RoPE only "
                            "(rope_type \"default\"); scaled RoPE would silently change every position")
        if "rope_theta" in params:
            return float(params["rope_theta"])
    if scaling is not None:
        raise cfg.error("rope_scaling", "irc implements plain RoPE only (rope_scaling null); scaled RoPE "
                        "(linear, dynamic, yarn, llama3) would silently change every position")
    return cfg.need("rope_theta", float, 10000.0)


def import_llama(cfg: HFConfig, name: str, config_label: str) -> Imported:
    fam = FAMILIES[cfg.model_type]
    d = cfg.need("hidden_size", int, fam.hidden, minimum=1)
    ff = cfg.need("intermediate_size", int, fam.ff, minimum=1)
    layers = cfg.need("num_hidden_layers", int, 32, minimum=1)
    heads = cfg.need("num_attention_heads", int, 32, minimum=1)
    kv = cfg.need("num_key_value_heads", int, fam.kv_heads or heads, minimum=1)
    vocab = cfg.need("vocab_size", int, fam.vocab, minimum=1)
    ctx = cfg.need("max_position_embeddings", int, fam.context, minimum=1)
    eps = cfg.need("rms_norm_eps", float, 1e-6)
    theta = _rope_theta(cfg)
    tied = cfg.need("tie_word_embeddings", bool, False)
    cfg.expect("hidden_act", ("silu",), "silu", "the SwiGLU FFN's gate is silu")
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden_size = {d} is not divisible by num_attention_heads = {heads}")
    if heads % kv:
        raise cfg.error("num_key_value_heads", f"num_attention_heads = {heads} is not a multiple of it")
    cfg.expect("head_dim", (d // heads,), d // heads, "a head width other than hidden_size / num_attention_heads")
    cfg.ignore("attention_dropout", "pretraining_tp")  # dropout; tensor-parallel slicing computes the same
    bias = "false"
    window = None
    if cfg.model_type == "qwen2":
        bias = "qkv"  # Qwen2's q, k and v projections have biases, o_proj none
        if cfg.need("use_sliding_window", bool, False):
            raise cfg.error("use_sliding_window", "irc supports only false: Qwen2 slides the window in the "
                            "layers from max_window_layers on, and irc's blocks are all alike")
        kinds = cfg.get("layer_types", None)
        if kinds is not None and any(k != "full_attention" for k in kinds):
            raise cfg.error("layer_types", "irc supports only \"full_attention\" in every layer")
        cfg.ignore("sliding_window", "max_window_layers")  # read only when use_sliding_window is true
    else:
        if cfg.model_type == "llama":
            bias = "true" if cfg.need("attention_bias", bool, False) else "false"
            cfg.expect("mlp_bias", (False,), False, "irc's SwiGLU FFN takes no biases in the llama_decoder block")
        if cfg.model_type == "mistral":
            window = cfg.get("sliding_window", fam.window)
            if not isinstance(window, int) or isinstance(window, bool) or window < 1:
                raise cfg.error("sliding_window", "must be a positive integer or null")

    consts = [("hidden_size", str(d)), ("intermediate_size", str(ff)), ("num_hidden_layers", str(layers)),
              ("num_attention_heads", str(heads)), ("num_key_value_heads", str(kv)), ("vocab_size", str(vocab)),
              ("rms_norm_eps", number(eps)), ("rope_theta", number(theta))]
    if window is not None:
        consts.append(("sliding_window", str(window)))
    block = {"false": "llama_decoder", "qkv": "qwen2_decoder"}.get(bias, "llama_biased_decoder")
    args = ["heads=num_attention_heads", "kv_heads=num_key_value_heads", "ff=intermediate_size", "eps=rms_norm_eps",
            "rope_theta=rope_theta"] + (["window=sliding_window"] if window is not None else [])
    extras = []
    if window is not None:
        extras.append(f"sliding window {window:,}")
    if bias != "false":
        extras.append("q, k, v biases" if bias == "qkv" else "attention biases")
    if tied:
        extras.append("tied head")
    lines = header(f"{fam.title} (HF model_type \"{cfg.model_type}\", {fam.hf_class}): {layers} pre-RMSNorm decoder "
                   f"layers, d {d}, {heads} heads ({kv} key/value){', ' + ', '.join(extras) if extras else ''}.",
                   config_label, [f"Context: max_position_embeddings = {ctx:,} (bind T up to it, -D T=N).",
                                  "HF checkpoints load through the weight map next to this file (renames only)."])
    lines += ["use \"transformer.arch\"", ""]
    if bias != "false":
        lines += _biased_block(block, bias)
    lines += [f"model {name}(B, T) {{"]
    lines += const_lines(consts)
    lines += [f"  const max_position_embeddings = {ctx}  # the trained context", "  input tokens: i32[B, T]", "",
              "  embed_tokens = embedding(vocab_size, hidden_size)",
              *call_lines(f"  x = repeat(num_hidden_layers) {block}", ["embed_tokens(tokens)", *args]),
              "  norm = rmsnorm(x, eps=rms_norm_eps)"]
    lines += [*head_lines("norm", "embed_tokens", tied), "}"]
    return Imported(name, "\n".join(lines) + "\n", _weight_map(block, bias, tied, cfg.model_type), fam.hf_class)


def _biased_block(block: str, bias: str) -> list[str]:
    """llama_decoder of frontends/arch/lib/transformer.arch with biases on the attention projections."""
    what = "q, k and v (o_proj has none)" if bias == "qkv" else "q, k, v and o"
    return [f"# llama_decoder (transformer.arch) with biases on {what}",
            f"block {block}(x, heads, ff, kv_heads=none, eps=1e-6, rope_theta=10000) {{",
            "  attn_norm = rmsnorm(x, eps=eps)",
            "  attn = attention(attn_norm, heads=heads, kv_heads=kv_heads, causal=true, rope=true, "
            "rope_theta=rope_theta,",
            f"                   bias={bias})",
            "  h = x + attn",
            "  ffn_norm = rmsnorm(h, eps=eps)",
            "  mlp = swiglu(ffn_norm, hidden=ff)",
            "  return h + mlp",
            "}", ""]


def _weight_map(block: str, bias: str, tied: bool, model_type: str) -> WeightMap:
    h, b = P + "layers.{i}.", block + ".{i}."
    rules = {"embed_tokens.weight": Rule((P + "embed_tokens.weight",)),
             f"{b}attn_norm.gain": Rule((f"{h}input_layernorm.weight",))}
    biased = {"true": "qkvo", "qkv": "qkv"}.get(bias, "")
    for letter in "qkvo":
        rules[f"{b}attn.w{letter}"] = Rule((f"{h}self_attn.{letter}_proj.weight",))
        if letter in biased:
            rules[f"{b}attn.b{letter}"] = Rule((f"{h}self_attn.{letter}_proj.bias",))
    rules[f"{b}ffn_norm.gain"] = Rule((f"{h}post_attention_layernorm.weight",))
    for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
        rules[f"{b}mlp.{ours}"] = Rule((f"{h}mlp.{theirs}.weight",))
    rules["norm.gain"] = Rule((P + "norm.weight",))
    if not tied:
        rules["lm_head.weight"] = Rule(("lm_head.weight",))
    return WeightMap(rules, {"lm_head.weight": P + "embed_tokens.weight"} if tied else {},
                     (h + "self_attn.rotary_emb.inv_freq",),  # a RoPE buffer older transformers saved
                     P, f"Hugging Face transformers, model_type {model_type}")
