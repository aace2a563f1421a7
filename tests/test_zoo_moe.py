"""Mixtral-8x7B and DeepSeek-V2(-Lite): total and active parameters, MLA's KV cache, MoE decode bytes.

Oracles: Hugging Face's own MixtralForCausalLM and DeepseekV2ForCausalLM built on the meta device (shapes,
no memory) from the published configurations, and the papers' figures — Mixtral (Jiang et al. 2024): 46.7B
parameters, 12.9B used per token; DeepSeek-V2 (DeepSeek-AI 2024): 236B total, 21B activated, and
DeepSeek-V2-Lite 15.7B total, 2.4B activated; MLA caches (d_c + d_R)·l numbers per token, "equal to GQA
with only 2.25 groups" (its Table 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
FIXTURES = ROOT / "tests" / "fixtures"

MIXTRAL = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
               tie_word_embeddings=False)
V2_LITE = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
               num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
               n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
               qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, head_dim=64, tie_word_embeddings=False)
V2 = {**V2_LITE, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
      "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 160,
      "q_lora_rank": 1536}


def hf_counts(kind: str, config: dict) -> tuple[int, int, int]:
    """(all parameters, those a token uses, the token embedding) of Hugging Face's model: a token uses every
    parameter but the routed experts it is not sent to, (E − k)/E of each layer's stacked experts."""
    import transformers

    cfg_cls, model_cls = {"mixtral": ("MixtralConfig", "MixtralForCausalLM"),
                          "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM")}[kind]
    cfg = getattr(transformers, cfg_cls)(**config)
    with torch.device("meta"):
        model = getattr(transformers, model_cls)(cfg)
    total = sum(p.numel() for p in model.parameters())
    e = config.get("num_local_experts") or config["n_routed_experts"]
    k = config["num_experts_per_tok"]
    unused = sum(p.numel() * (e - k) // e for name, p in model.named_parameters() if ".experts." in name)
    return total, total - unused, model.get_input_embeddings().weight.numel()


def totals(irc_cli: Callable, path: Path, *extra: str) -> dict:
    result = irc_cli(["analyze", str(path), "--json", "-D", "T=1", *extra])
    assert result.rc == 0, result.err
    return json.loads(result.out)["totals"]


def test_mixtral_8x7b_counts(irc_cli):
    t = totals(irc_cli, MODELS / "mixtral_8x7b.arch")
    total, active, _ = hf_counts("mixtral", MIXTRAL)
    assert (t["params"], t["params_active"]) == (total, active)
    assert round(t["params"] / 1e9, 1) == 46.7 and round(t["params_active"] / 1e9, 1) == 12.9  # the paper's
    assert t["kv_cache_bytes_per_token"] == 32 * 2 * 8 * 128 * 2  # GQA: 8 KV heads of 128, f16


@pytest.mark.parametrize("path, config, published", [
    (MODELS / "deepseek_v2_lite.arch", V2_LITE, (15.7, 2.4)),
    (FIXTURES / "deepseek_v2.arch", V2, (236, 21)),
])
def test_deepseek_v2_counts(irc_cli, path, config, published):
    t = totals(irc_cli, path)
    total, active, embedding = hf_counts("deepseek_v2", config)
    assert (t["params"], t["params_active"]) == (total, active)
    # DeepSeek counts activated parameters without the token embedding (a lookup, no arithmetic); its figures
    # are within one unit of the last digit they print (V2-Lite's 2.45B prints as 2.4B, V2's 20.85B as 21B)
    unit = 0.1 if published[0] < 100 else 1
    assert abs(t["params"] / 1e9 - published[0]) < unit
    assert abs((t["params_active"] - embedding) / 1e9 - published[1]) < unit


def test_mla_caches_the_latent_and_one_rope_key(irc_cli):
    t = totals(irc_cli, MODELS / "deepseek_v2_lite.arch", "--kv-dtype", "bf16")
    layers, d_c, d_r, d_h = 27, 512, 64, 128
    assert t["kv_cache_bytes_per_token"] == layers * (d_c + d_r) * 2
    assert (d_c + d_r) / (2 * d_h) == 2.25  # the paper's "GQA with 2.25 groups", from irc's per-layer figure
    per_layer = t["kv_cache_bytes_per_token"] / layers / 2
    assert per_layer / (2 * d_h) == 2.25


def test_moe_decode_reads_only_the_chosen_experts(irc_cli):
    """At batch 1 a decode step reads the weights its one token uses (active parameters), not all experts; at a
    batch of 64 tokens nearly every expert is hit."""
    def weights_read(batch: int) -> int:
        result = irc_cli(["analyze", str(MODELS / "mixtral_8x7b.arch"), "--json", "--hardware", "h100-sxm",
                          "--precision", "bf16", "-D", f"B={batch}", "-D", "T=16"])
        assert result.rc == 0, result.err
        return json.loads(result.out)["performance"]["decode"]["weight_bytes"]

    t = totals(irc_cli, MODELS / "mixtral_8x7b.arch")
    assert weights_read(1) == 2 * t["params_active"]
    expected_experts = 8 * (1 - (1 - 2 / 8) ** 64)  # uniform routing: E·(1 − (1 − k/E)^N) experts touched
    per_expert = 3 * 14336 * 4096
    assert weights_read(64) == pytest.approx(2 * (t["params_active"] + 32 * (expected_experts - 2) * per_expert),
                                             rel=1e-6)
