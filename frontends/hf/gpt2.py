"""GPT-2 (``model_type: gpt2``): GPT2LMHeadModel as an .arch file and its weight map.

HF's GPT-2 stores its projections as ``Conv1D``, weight ``[in, out]``: every matrix is
transposed on load (irc's linear is ``[out, in]``, as torch.nn.Linear), and the fused
``c_attn`` ``[d, 3d]`` is split into the query, key and value projections, in that order.
``attn.c_proj`` is square, so only the explicit transpose in the map gets it right.
"""

from __future__ import annotations

from irc.frontends.hf.arch_text import Imported, const_lines, head_lines, header, number
from irc.frontends.hf.config import HFConfig
from irc.runtime.weight_map import Rule, WeightMap

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": None, "gelu": "gelu",
               "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh"}
P = "transformer."  # GPT2LMHeadModel's base_model_prefix


def import_gpt2(cfg: HFConfig, name: str, config_label: str) -> Imported:
    d = cfg.need("n_embd", int, 768, minimum=1)
    heads = cfg.need("n_head", int, 12, minimum=1)
    layers = cfg.need("n_layer", int, 12, minimum=1)
    vocab = cfg.need("vocab_size", int, 50257, minimum=1)
    ctx = cfg.need("n_positions", int, 1024, minimum=1)
    inner = cfg.get("n_inner", None)
    eps = cfg.need("layer_norm_epsilon", float, 1e-5)
    act_name = cfg.need("activation_function", str, "gelu_new")
    act = ACTIVATIONS.get(act_name)
    if act is None:
        supported = ", ".join(k for k, v in ACTIVATIONS.items() if v)
        raise cfg.error("activation_function", f"irc has no such activation (supported: {supported})")
    tied = cfg.need("tie_word_embeddings", bool, True)
    scaled = cfg.need("scale_attn_weights", bool, True)
    cfg.expect("scale_attn_by_inverse_layer_idx", (False,), False,
               "irc's attention has no per-layer score scale 1/(layer + 1)")
    cfg.expect("add_cross_attention", (False,), False, "GPT-2 with cross-attention is an encoder-decoder part")
    # fp32 upcasting changes nothing at float32; the rest are training-time or other-head settings
    cfg.ignore("reorder_and_upcast_attn", "attn_pdrop", "embd_pdrop", "resid_pdrop", "n_ctx", "summary_type",
               "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
               "n_special", "predict_special_tokens")
    if d % heads:
        raise cfg.error("n_head", f"n_embd = {d} is not divisible by n_head = {heads}")
    if inner is not None and (not isinstance(inner, int) or isinstance(inner, bool) or inner < 1):
        raise cfg.error("n_inner", "must be a positive integer or null (4 * n_embd)")

    consts = [("n_embd", str(d)), ("n_head", str(heads)), ("n_layer", str(layers)), ("vocab_size", str(vocab)),
              ("n_positions", str(ctx)), ("n_inner", "4 * n_embd" if inner is None else str(inner)),
              ("layer_norm_epsilon", number(eps))]
    if not scaled:
        raise cfg.error("scale_attn_weights", "irc's pre_ln_decoder block always scales scores by 1/sqrt(head)")
    lines = header(f"GPT-2 (HF model_type \"gpt2\", GPT2LMHeadModel): {layers} pre-LN decoder layers, "
                   f"d {d}, {heads} heads.", config_label,
                   ["HF checkpoints load through the weight map next to this file: every Conv1D matrix is",
                    "transposed, c_attn is split into q, k, v."])
    lines += ["use \"transformer.arch\"", "", f"model {name}(B, T) {{"]
    lines += const_lines(consts)
    lines += ["  input tokens: i32[B, T]", "",
              "  wte = embedding(vocab_size, n_embd)",
              "  wpe = positional(wte(tokens), learned, max_len=n_positions)",
              f"  x = repeat(n_layer) pre_ln_decoder(wpe, heads=n_head, ff=n_inner, act={act}, "
              "eps=layer_norm_epsilon)",
              "  ln_f = layernorm(x, eps=layer_norm_epsilon)"]
    lines += [*head_lines("ln_f", "wte", tied), "}"]
    return Imported(name, "\n".join(lines) + "\n", _weight_map(tied), "GPT2LMHeadModel")


def _weight_map(tied: bool) -> WeightMap:
    h, b = P + "h.{i}.", "pre_ln_decoder.{i}."
    rules = {"wte.weight": Rule((P + "wte.weight",)), "wpe.weight": Rule((P + "wpe.weight",))}
    for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
        rules[f"{b}{ours}.gain"] = Rule((f"{h}{theirs}.weight",))
        rules[f"{b}{ours}.bias"] = Rule((f"{h}{theirs}.bias",))
    for part, letter in enumerate("qkv"):  # c_attn: [d, 3d] = [q | k | v] along the output axis
        rules[f"{b}attn.w{letter}"] = Rule((f"{h}attn.c_attn.weight",), (1, 3, part), transpose=True)
        rules[f"{b}attn.b{letter}"] = Rule((f"{h}attn.c_attn.bias",), (0, 3, part))
    rules[f"{b}attn.wo"] = Rule((f"{h}attn.c_proj.weight",), transpose=True)
    rules[f"{b}attn.bo"] = Rule((f"{h}attn.c_proj.bias",))
    rules[f"{b}mlp.w1"] = Rule((f"{h}mlp.c_fc.weight",), transpose=True)
    rules[f"{b}mlp.b1"] = Rule((f"{h}mlp.c_fc.bias",))
    rules[f"{b}mlp.w2"] = Rule((f"{h}mlp.c_proj.weight",), transpose=True)
    rules[f"{b}mlp.b2"] = Rule((f"{h}mlp.c_proj.bias",))
    rules["ln_f.gain"] = Rule((P + "ln_f.weight",))
    rules["ln_f.bias"] = Rule((P + "ln_f.bias",))
    if not tied:
        rules["lm_head.weight"] = Rule(("lm_head.weight",))
    return WeightMap(rules, {"lm_head.weight": P + "wte.weight"} if tied else {},
                     # the causal-mask buffers older transformers saved with every checkpoint
                     (h + "attn.bias", h + "attn.masked_bias"), P,
                     "Hugging Face transformers, model_type gpt2 (GPT2LMHeadModel or GPT2Model)")
