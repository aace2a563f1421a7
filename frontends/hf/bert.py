"""BERT (``model_type: bert``): BertModel, with its pooler and a padding mask, and its weight map.

The checkpoint stores torch.nn.Linear ``[out, in]`` everywhere: the map only renames. The
attention mask (HF's ``attention_mask``: 1 attends, 0 is padding) becomes an additive score
bias, ``(mask − 1)·10⁹``, that hides padded keys from every layer, as HF's mask does.
"""

from __future__ import annotations

from irc.frontends.hf.arch_text import Imported, const_lines, header, number
from irc.frontends.hf.config import HFConfig
from irc.runtime.weight_map import Rule, WeightMap

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu", "tanh": "tanh"}
MASK_FILL = "1e9"  # a hidden key's score bias: exp(−1e9) is exactly 0 at float32 and float64


def import_bert(cfg: HFConfig, name: str, config_label: str) -> Imported:
    vocab = cfg.need("vocab_size", int, 30522, minimum=1)
    d = cfg.need("hidden_size", int, 768, minimum=1)
    layers = cfg.need("num_hidden_layers", int, 12, minimum=1)
    heads = cfg.need("num_attention_heads", int, 12, minimum=1)
    ff = cfg.need("intermediate_size", int, 3072, minimum=1)
    ctx = cfg.need("max_position_embeddings", int, 512, minimum=1)
    types = cfg.need("type_vocab_size", int, 2, minimum=1)
    eps = cfg.need("layer_norm_eps", float, 1e-12)
    act_name = cfg.need("hidden_act", str, "gelu")
    if act_name not in ACTIVATIONS:
        raise cfg.error("hidden_act", f"irc has no such activation (supported: {', '.join(ACTIVATIONS)})")
    act = ACTIVATIONS[act_name]
    cfg.expect("position_embedding_type", ("absolute",), "absolute", "relative position embeddings are not built")
    cfg.expect("is_decoder", (False,), False, "BERT as a decoder is not built")
    cfg.expect("add_cross_attention", (False,), False, "BERT with cross-attention is not built")
    cfg.ignore("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "tie_word_embeddings")
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden_size = {d} is not divisible by num_attention_heads = {heads}")

    consts = [("vocab_size", str(vocab)), ("hidden_size", str(d)), ("num_hidden_layers", str(layers)),
              ("num_attention_heads", str(heads)), ("intermediate_size", str(ff)),
              ("max_position_embeddings", str(ctx)), ("type_vocab_size", str(types)), ("layer_norm_eps", number(eps))]
    lines = header(f"BERT (HF model_type \"bert\", BertModel with pooler): {layers} post-LN encoder layers, d {d}, "
                   f"{heads} heads, FFN {ff}.", config_label,
                   ["attention_mask is HF's (1 attends, 0 is padding), given as floats: --input attention_mask=M.npy.",
                    "HF checkpoints (BertModel, or BertFor* with a 'bert.' prefix and heads) load through the",
                    "weight map next to this file (renames only)."])
    lines += ["use \"transformer.arch\"", "",
              "# post_ln_encoder (transformer.arch) with an additive score bias: the padding mask",
              "block bert_layer(x, mask_bias, heads, ff, act=gelu, eps=1e-12) {",
              "  attn = attention(x, attn_bias=mask_bias, heads=heads, bias=true)",
              "  ln1 = layernorm(x + attn, eps=eps)",
              "  mlp = ffn(ln1, hidden=ff, act=act, bias=true)",
              "  ln2 = layernorm(ln1 + mlp, eps=eps)",
              "  return ln2",
              "}", "", f"model {name}(B, T) {{"]
    lines += const_lines(consts)
    lines += ["  input tokens: i32[B, T]", "  input token_types: i32[B, T]",
              "  input attention_mask: f32[B, T]  # 1 attends, 0 is padding", "",
              "  word_embeddings = embedding(vocab_size, hidden_size)",
              "  token_type_embeddings = embedding(type_vocab_size, hidden_size)",
              "  position_embeddings = positional(word_embeddings(tokens) + token_type_embeddings(token_types), "
              "learned,",
              "                                   max_len=max_position_embeddings)",
              "  embeddings_ln = layernorm(position_embeddings, eps=layer_norm_eps)",
              f"  mask_bias = reshape((attention_mask - 1) * {MASK_FILL}, [B, 1, 1, T])",
              "  x = repeat(num_hidden_layers) bert_layer(embeddings_ln, mask_bias, heads=num_attention_heads,",
              f"    ff=intermediate_size, act={act}, eps=layer_norm_eps)",
              "  output hidden = x",
              "  pooler = linear(select(x, axis=1, index=0), hidden_size)",
              "  output pooled = tanh(pooler)",
              "}"]
    return Imported(name, "\n".join(lines) + "\n", _weight_map(), "BertModel")


def _weight_map() -> WeightMap:
    e, h, b = "embeddings.", "encoder.layer.{i}.", "bert_layer.{i}."
    rules = {"word_embeddings.weight": Rule((e + "word_embeddings.weight",)),
             "token_type_embeddings.weight": Rule((e + "token_type_embeddings.weight",)),
             "position_embeddings.weight": Rule((e + "position_embeddings.weight",)),
             "embeddings_ln.gain": Rule((e + "LayerNorm.weight",)),
             "embeddings_ln.bias": Rule((e + "LayerNorm.bias",))}
    for letter, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
        rules[f"{b}attn.w{letter}"] = Rule((f"{h}attention.self.{theirs}.weight",))
        rules[f"{b}attn.b{letter}"] = Rule((f"{h}attention.self.{theirs}.bias",))
    # every other layer module of HF's holds a weight and a bias: (our weight, our bias, their module)
    for weight, bias, theirs in (("attn.wo", "attn.bo", "attention.output.dense"),
                                 ("ln1.gain", "ln1.bias", "attention.output.LayerNorm"),
                                 ("mlp.w1", "mlp.b1", "intermediate.dense"),
                                 ("mlp.w2", "mlp.b2", "output.dense"),
                                 ("ln2.gain", "ln2.bias", "output.LayerNorm")):
        rules[b + weight] = Rule((f"{h}{theirs}.weight",))
        rules[b + bias] = Rule((f"{h}{theirs}.bias",))
    rules["pooler.weight"] = Rule(("pooler.dense.weight",))
    rules["pooler.bias"] = Rule(("pooler.dense.bias",))
    # BertFor* checkpoints add task heads (cls.*) that BertModel does not have; older ones a position_ids buffer
    return WeightMap(rules, {}, ("cls.*", "embeddings.position_ids"), "bert.",
                     "Hugging Face transformers, model_type bert (BertModel; BertFor* checkpoints with prefix 'bert.')")
