"""Gemma (``model_type: gemma``, the first Gemma): GemmaForCausalLM as an .arch file and its weight map.

Gemma is the Llama layout with four differences, each written out here rather than hidden:
the token embedding is scaled by sqrt(hidden_size) (the tied head reads the unscaled table);
the head width ``head_dim`` (256) need not be hidden_size / heads; the FFN is GeGLU with
tanh-approximated GELU, ``down(gelu_tanh(gate(x)) · up(x))``, written with linear layers; and
RMSNorm's gain is ``1 + w`` with ``w`` stored — the weight map adds the 1 (``offset``).
"""

from __future__ import annotations

from irc.frontends.hf.arch_text import Imported, call_lines, const_lines, header, number
from irc.frontends.hf.config import HFConfig
from irc.frontends.hf.llama import P, _rope_theta
from irc.runtime.weight_map import Rule, WeightMap

BLOCK = [
    "# Gemma's decoder layer: llama_decoder (transformer.arch) with a head width of its own and a GeGLU FFN",
    "# (tanh GELU). Its RMSNorm gains are HF's 1 + w: the weight map adds the 1.",
    "block gemma_decoder(x, d, heads, kv_heads, head_dim, ff, eps=1e-6, rope_theta=10000) {",
    "  attn_norm = rmsnorm(x, eps=eps)",
    "  attn = attention(attn_norm, heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=true, rope=true,",
    "                   rope_theta=rope_theta)",
    "  h = x + attn",
    "  ffn_norm = rmsnorm(h, eps=eps)",
    "  gate = linear(ffn_norm, ff, bias=false)",
    "  up = linear(ffn_norm, ff, bias=false)",
    "  down = linear(gelu(gate, approx=tanh) * up, d, bias=false)",
    "  return h + down",
    "}",
    "",
]


def import_gemma(cfg: HFConfig, name: str, config_label: str) -> Imported:
    d = cfg.need("hidden_size", int, 3072, minimum=1)
    ff = cfg.need("intermediate_size", int, 24576, minimum=1)
    layers = cfg.need("num_hidden_layers", int, 28, minimum=1)
    heads = cfg.need("num_attention_heads", int, 16, minimum=1)
    kv = cfg.need("num_key_value_heads", int, 16, minimum=1)
    head_dim = cfg.need("head_dim", int, 256, minimum=1)
    vocab = cfg.need("vocab_size", int, 256000, minimum=1)
    ctx = cfg.need("max_position_embeddings", int, 8192, minimum=1)
    eps = cfg.need("rms_norm_eps", float, 1e-6)
    theta = _rope_theta(cfg)
    cfg.expect("hidden_act", ("gelu_pytorch_tanh", "gelu"), "gelu_pytorch_tanh",
               "Gemma's GeGLU uses the tanh GELU (HF maps \"gelu\" to it too)")
    cfg.expect("hidden_activation", ("gelu_pytorch_tanh", None), None, "Gemma's GeGLU uses the tanh GELU")
    cfg.expect("attention_bias", (False,), False, "Gemma's projections have no biases")
    cfg.expect("tie_word_embeddings", (True,), True, "Gemma's head is its embedding")
    cfg.expect("use_bidirectional_attention", (None, False), None, "irc builds the causal decoder")
    cfg.ignore("attention_dropout")
    if heads % kv:
        raise cfg.error("num_key_value_heads", f"num_attention_heads = {heads} is not a multiple of it")
    if head_dim % 2:
        raise cfg.error("head_dim", "RoPE needs an even head width")

    consts = [("hidden_size", str(d)), ("intermediate_size", str(ff)), ("num_hidden_layers", str(layers)),
              ("num_attention_heads", str(heads)), ("num_key_value_heads", str(kv)), ("head_dim", str(head_dim)),
              ("vocab_size", str(vocab)), ("rms_norm_eps", number(eps)), ("rope_theta", number(theta))]
    args = ["hidden_size", "heads=num_attention_heads", "kv_heads=num_key_value_heads", "head_dim=head_dim",
            "ff=intermediate_size", "eps=rms_norm_eps", "rope_theta=rope_theta"]
    lines = header(f"Gemma (HF model_type \"gemma\", GemmaForCausalLM): {layers} pre-RMSNorm decoder layers, d {d}, "
                   f"{heads} heads ({kv} key/value) of width {head_dim}, GeGLU FFN {ff}, tied head.", config_label,
                   [f"Context: max_position_embeddings = {ctx:,} (bind T up to it, -D T=N).",
                    "HF checkpoints load through the weight map next to this file (renames; norm gains 1 + w)."])
    lines += ["use \"transformer.arch\"", "", *BLOCK, f"model {name}(B, T) {{"]
    lines += const_lines(consts)
    lines += [f"  const max_position_embeddings = {ctx}  # the trained context", "  input tokens: i32[B, T]", "",
              "  embed_tokens = embedding(vocab_size, hidden_size)",
              "  x = embed_tokens(tokens) * sqrt(hidden_size)  # Gemma scales its embeddings",
              *call_lines("  x = repeat(num_hidden_layers) gemma_decoder", ["x", *args]),
              "  norm = rmsnorm(x, eps=rms_norm_eps)",
              "  output logits = unembed(norm, tied=embed_tokens)",
              "}"]
    return Imported(name, "\n".join(lines) + "\n", _weight_map(), "GemmaForCausalLM")


def _weight_map() -> WeightMap:
    h, b = P + "layers.{i}.", "gemma_decoder.{i}."
    rules = {"embed_tokens.weight": Rule((P + "embed_tokens.weight",)),
             f"{b}attn_norm.gain": Rule((f"{h}input_layernorm.weight",), offset=1.0),
             f"{b}ffn_norm.gain": Rule((f"{h}post_attention_layernorm.weight",), offset=1.0),
             "norm.gain": Rule((P + "norm.weight",), offset=1.0)}
    for letter in "qkvo":
        rules[f"{b}attn.w{letter}"] = Rule((f"{h}self_attn.{letter}_proj.weight",))
    for ours in ("gate", "up", "down"):
        rules[f"{b}{ours}.weight"] = Rule((f"{h}mlp.{ours}_proj.weight",))
    return WeightMap(rules, {"lm_head.weight": P + "embed_tokens.weight"}, (h + "self_attn.rotary_emb.inv_freq",),
                     P, "Hugging Face transformers, model_type gemma")
