"""models/t5_small.arch against Hugging Face's T5 (transformers), weight for weight.

HF T5 computes one relative-position bias per stack in block 0 and adds it to the scores of
every layer's self-attention; cross-attention gets none. irc's model makes the same tensor
once per stack (rel_position_bias) and passes it to each layer (attention(..., attn_bias=)).
A small configuration (d 64, 4 heads, 2 + 2 layers) runs on sequences long enough to reach
the log-spaced buckets and the max_distance clip (150 source tokens, distance up to 149).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from test_cpu_backend_helpers import cpu_cache  # noqa: F401  (a fixture)

from irc.backends.cpu import compile_graph
from irc.backends.numpy_ref import run_graph
from irc.pipeline import load_graph, run_passes
from irc.runtime.compare import rel_error

# ops whose numpy reference this file checks against Hugging Face's T5 (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"rel_position_bias"})
MODEL = Path(__file__).resolve().parents[1] / "models" / "t5_small.arch"
SIZES = {"d": 64, "heads": 4, "ff": 128, "vocab": 100, "layers": 2}
B, S, T = 2, 150, 40


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=SIZES["vocab"], d_model=SIZES["d"], d_kv=SIZES["d"] // SIZES["heads"], d_ff=SIZES["ff"],
        num_layers=SIZES["layers"], num_decoder_layers=SIZES["layers"], num_heads=SIZES["heads"],
        relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
        layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # HF's init leaves the bias tables small; make positions matter
        for stack in (model.encoder, model.decoder):
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0.0, 2.0)
    return model


def irc_weights(model) -> dict[str, np.ndarray]:
    """HF's state dict under irc's keys (both store Linear weights as [out, in])."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    w = {"shared.weight": sd["shared.weight"], "encoder_norm.gain": sd["encoder.final_layer_norm.weight"],
         "decoder_norm.gain": sd["decoder.final_layer_norm.weight"],
         "encoder_pos.weight": sd["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
         "decoder_pos.weight": sd["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]}

    def attn(prefix: str, hf: str) -> None:
        for ours, theirs in (("wq", "q"), ("wk", "k"), ("wv", "v"), ("wo", "o")):
            w[f"{prefix}.{ours}"] = sd[f"{hf}.{theirs}.weight"]

    for i in range(SIZES["layers"]):
        e, d = f"encoder.block.{i}.layer", f"decoder.block.{i}.layer"
        attn(f"t5_encoder.{i}.attn", f"{e}.0.SelfAttention")
        w[f"t5_encoder.{i}.ln1.gain"] = sd[f"{e}.0.layer_norm.weight"]
        w[f"t5_encoder.{i}.mlp.w1"] = sd[f"{e}.1.DenseReluDense.wi.weight"]
        w[f"t5_encoder.{i}.mlp.w2"] = sd[f"{e}.1.DenseReluDense.wo.weight"]
        w[f"t5_encoder.{i}.ln2.gain"] = sd[f"{e}.1.layer_norm.weight"]
        attn(f"t5_decoder.{i}.attn", f"{d}.0.SelfAttention")
        w[f"t5_decoder.{i}.ln1.gain"] = sd[f"{d}.0.layer_norm.weight"]
        attn(f"t5_decoder.{i}.cross", f"{d}.1.EncDecAttention")
        w[f"t5_decoder.{i}.ln2.gain"] = sd[f"{d}.1.layer_norm.weight"]
        w[f"t5_decoder.{i}.mlp.w1"] = sd[f"{d}.2.DenseReluDense.wi.weight"]
        w[f"t5_decoder.{i}.mlp.w2"] = sd[f"{d}.2.DenseReluDense.wo.weight"]
        w[f"t5_decoder.{i}.ln3.gain"] = sd[f"{d}.2.layer_norm.weight"]
    return w


@pytest.fixture(scope="module")
def case(hf_model):
    rng = np.random.default_rng(0)
    inputs = {"tokens": rng.integers(0, SIZES["vocab"], (B, S)).astype(np.int32),
              "decoder_tokens": rng.integers(0, SIZES["vocab"], (B, T)).astype(np.int32)}
    with torch.no_grad():
        want = hf_model(input_ids=torch.from_numpy(inputs["tokens"]).long(),
                        decoder_input_ids=torch.from_numpy(inputs["decoder_tokens"]).long()).logits.numpy()
    graph = load_graph(MODEL, {"B": B, "S": S, "T": T, **SIZES})
    return graph, irc_weights(hf_model), inputs, want


def test_weights_map_one_to_one(hf_model, case) -> None:
    graph, weights, _, _ = case
    from irc.analysis.params import weight_table

    table, _ = weight_table(graph)
    assert sorted(table) == sorted(weights)
    assert all(tuple(weights[k].shape) == tuple(s) for k, s in table.items())
    assert sum(p.numel() for p in hf_model.parameters()) == sum(int(np.prod(s)) for s in table.values())


def test_numpy_reference_matches_hf(case) -> None:
    graph, weights, inputs, want = case
    got = run_graph(graph, weights, inputs, np.float32)["logits"]
    assert got.shape == want.shape == (B, T, SIZES["vocab"])
    assert rel_error(got, want) < 1e-5


def test_fused_graph_matches_hf(case) -> None:
    """decompose + fuse turn every self-attention into sdpa(q, k, v, bias)."""
    graph, weights, inputs, want = case
    fused = run_passes(graph, ["fuse"])
    assert sum(n.op == "sdpa" and len(n.inputs) == 4 for n in fused.nodes) == 2 * SIZES["layers"]
    assert rel_error(run_graph(fused, weights, inputs, np.float32)["logits"], want) < 1e-5


def test_cpu_backend_matches_hf(case, cpu_cache) -> None:  # noqa: F811
    """The fused graph in generated Numba kernels (flash-style sdpa with the bias) against HF."""
    graph, weights, inputs, want = case
    compiled = compile_graph(run_passes(graph, ["fuse"]), cache_dir=cpu_cache)
    assert rel_error(compiled.run(weights, inputs)["logits"], want) < 1e-5


def test_the_comparison_sees_the_position_bias(case) -> None:
    """The test can fail: without the decoder's position bias the logits are far off HF's."""
    graph, weights, inputs, want = case
    zeroed = {**weights, "decoder_pos.weight": np.zeros_like(weights["decoder_pos.weight"])}
    assert rel_error(run_graph(graph, zeroed, inputs, np.float32)["logits"], want) > 1e-3
