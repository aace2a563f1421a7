"""T5 (``model_type: t5``): T5ForConditionalGeneration as an .arch file and its weight map.

HF computes one relative-position bias per stack, in block 0, and adds it to every layer's
self-attention; irc makes it once per stack (rel_position_bias) and passes it to each layer.
With a tied head (the original T5), the decoder output is scaled by d_model^-1/2 before it.
The checkpoint stores torch.nn.Linear ``[out, in]``: the map only renames.
"""

from __future__ import annotations

from irc.frontends.hf.arch_text import Imported, call_lines, const_lines, head_lines, header, number
from irc.frontends.hf.config import HFConfig
from irc.runtime.weight_map import Rule, WeightMap


def import_t5(cfg: HFConfig, name: str, config_label: str) -> Imported:
    vocab = cfg.need("vocab_size", int, 32128, minimum=1)
    d = cfg.need("d_model", int, 512, minimum=1)
    d_kv = cfg.need("d_kv", int, 64, minimum=1)
    ff = cfg.need("d_ff", int, 2048, minimum=1)
    layers = cfg.need("num_layers", int, 6, minimum=1)
    dec_layers = cfg.need("num_decoder_layers", int, layers, minimum=1)
    heads = cfg.need("num_heads", int, 8, minimum=1)
    buckets = cfg.need("relative_attention_num_buckets", int, 32, minimum=1)
    distance = cfg.need("relative_attention_max_distance", int, 128, minimum=1)
    eps = cfg.need("layer_norm_epsilon", float, 1e-6)
    tied = cfg.need("tie_word_embeddings", bool, True)
    cfg.expect("feed_forward_proj", ("relu",), "relu",
               "T5 v1.1's gated-gelu FFN (GeGLU) is not built by irc's t5 blocks")
    cfg.expect("is_encoder_decoder", (True,), True)
    cfg.ignore("dropout_rate", "classifier_dropout", "n_positions", "dense_act_fn", "is_gated_act", "output_past")
    if d_kv * heads != d:
        raise cfg.error("d_kv", f"d_kv · num_heads = {d_kv * heads} differs from d_model = {d}; irc's T5 blocks "
                        "take the head width from d_model / num_heads")

    consts = [("vocab_size", str(vocab)), ("d_model", str(d)), ("num_heads", str(heads)), ("d_ff", str(ff)),
              ("num_layers", str(layers)), ("num_decoder_layers", str(dec_layers)),
              ("relative_attention_num_buckets", str(buckets)), ("relative_attention_max_distance", str(distance)),
              ("layer_norm_epsilon", number(eps))]
    pos = ["buckets=relative_attention_num_buckets", "max_distance=relative_attention_max_distance"]
    lines = header(f"T5 (HF model_type \"t5\", T5ForConditionalGeneration): {layers} + {dec_layers} layers, d {d}, "
                   f"{heads} heads, FFN {ff} (ReLU){', tied head' if tied else ''}.", config_label,
                   ["HF checkpoints load through the weight map next to this file (renames only)."])
    lines += ["use \"transformer.arch\"", "", f"model {name}(B, S, T) {{"]
    lines += const_lines(consts)
    lines += ["  input tokens: i32[B, S]          # source",
              "  input decoder_tokens: i32[B, T]  # target, shifted right", "",
              "  shared = embedding(vocab_size, d_model)", "",
              "  src = shared(tokens)",
              *call_lines("  encoder_pos = rel_position_bias", ["src", "heads=num_heads", *pos]),
              "  x = repeat(num_layers) t5_encoder(src, encoder_pos, heads=num_heads, ff=d_ff, eps=layer_norm_epsilon)",
              "  encoder_norm = rmsnorm(x, eps=layer_norm_epsilon)", "",
              "  tgt = shared(decoder_tokens)",
              *call_lines("  decoder_pos = rel_position_bias", ["tgt", "heads=num_heads", *pos, "bidirectional=false"]),
              *call_lines("  y = repeat(num_decoder_layers) t5_decoder",
                          ["tgt", "encoder_norm", "decoder_pos", "heads=num_heads", "ff=d_ff",
                           "eps=layer_norm_epsilon"]),
              "  decoder_norm = rmsnorm(y, eps=layer_norm_epsilon)"]
    lines += [*head_lines("decoder_norm * (1 / sqrt(d_model))" if tied else "decoder_norm", "shared", tied), "}"]
    return Imported(name, "\n".join(lines) + "\n", _weight_map(tied), "T5ForConditionalGeneration")


def _weight_map(tied: bool) -> WeightMap:
    rules = {"shared.weight": Rule(("shared.weight",)),
             "encoder_norm.gain": Rule(("encoder.final_layer_norm.weight",)),
             "decoder_norm.gain": Rule(("decoder.final_layer_norm.weight",)),
             "encoder_pos.weight": Rule(("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",)),
             "decoder_pos.weight": Rule(("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",))}

    def attn(ours: str, theirs: str) -> None:
        for letter in "qkvo":
            rules[f"{ours}.w{letter}"] = Rule((f"{theirs}.{letter}.weight",))

    e, dec = "encoder.block.{i}.layer.", "decoder.block.{i}.layer."
    attn("t5_encoder.{i}.attn", e + "0.SelfAttention")
    rules["t5_encoder.{i}.ln1.gain"] = Rule((e + "0.layer_norm.weight",))
    rules["t5_encoder.{i}.mlp.w1"] = Rule((e + "1.DenseReluDense.wi.weight",))
    rules["t5_encoder.{i}.mlp.w2"] = Rule((e + "1.DenseReluDense.wo.weight",))
    rules["t5_encoder.{i}.ln2.gain"] = Rule((e + "1.layer_norm.weight",))
    attn("t5_decoder.{i}.attn", dec + "0.SelfAttention")
    rules["t5_decoder.{i}.ln1.gain"] = Rule((dec + "0.layer_norm.weight",))
    attn("t5_decoder.{i}.cross", dec + "1.EncDecAttention")
    rules["t5_decoder.{i}.ln2.gain"] = Rule((dec + "1.layer_norm.weight",))
    rules["t5_decoder.{i}.mlp.w1"] = Rule((dec + "2.DenseReluDense.wi.weight",))
    rules["t5_decoder.{i}.mlp.w2"] = Rule((dec + "2.DenseReluDense.wo.weight",))
    rules["t5_decoder.{i}.ln3.gain"] = Rule((dec + "2.layer_norm.weight",))
    if not tied:
        rules["lm_head.weight"] = Rule(("lm_head.weight",))
    # every stack's embedding is the shared table (saved again by some checkpoints), and so is a tied head
    same = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
    if tied:
        same["lm_head.weight"] = "shared.weight"
    return WeightMap(rules, same, (), "", "Hugging Face transformers, model_type t5 (T5ForConditionalGeneration)")
