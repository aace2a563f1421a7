"""`irc analyze --train`: model states against the ZeRO paper, activations against Megatron-LM's
formulas, parallel plans (per-device parameters, bubble, communication) and their errors.

Oracles: Rajbhandari et al. 2019 (ZeRO, §3.1 and Figure 1's worked example: 7.5B parameters,
N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device); Korthikanti et al. 2022
(Reducing Activation Recomputation in Large Transformer Models, §4, Table 2: per-layer
activations sbh(34 + 5as/h) bytes, 34sbh with selective recomputation, sbh(10 + 24/t + 5as/(ht))
with tensor parallelism, /t with sequence parallelism too, 2sbh with full recomputation);
Narayanan et al. 2021 (pipeline bubble (p − 1)/m; Megatron's 2 all-reduces of b·s·h per layer
forward); Hugging Face's parameter count of Llama-2-7B.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from irc.analysis.training_memory import model_states

ROOT = Path(__file__).resolve().parents[1]
LLAMA = str(ROOT / "models" / "llama2_7b.arch")
GPT2 = str(ROOT / "models" / "gpt2_small.arch")
LLAMA_PARAMS = 6_738_415_616  # HF meta-llama/Llama-2-7b-hf

# ZeRO, Figure 1: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam), GB = 10^9 bytes
ZERO_FIGURES = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}


@pytest.mark.parametrize("stage", sorted(ZERO_FIGURES))
def test_zero_worked_example_from_the_formulas(stage: int) -> None:
    rows = model_states(7_500_000_000, "adam", "fp16-mixed", stage, 64)
    assert round(sum(r.bytes for r in rows) / 1e9, 1) == ZERO_FIGURES[stage]
    k = sum(r.bytes_per_param for r in rows if r.name in ("optimizer states", "fp32 master weights"))
    assert k == 12  # ZeRO's K for mixed-precision Adam


def _gpt_layers(tmp_path: Path, h: int, a: int, layers: int = 3) -> Path:
    """Megatron's GPT layer: pre-LN, attention and a 4h GeLU MLP, dropout after each branch."""
    path = tmp_path / "gpt.arch"
    path.write_text(f"""model gpt_layers(B, T) {{
  const h = {h}, a = {a}, layers = {layers}
  input x: f32[B, T, h]
  block layer(x) {{
    y = x + dropout(attention(layernorm(x), heads=a, causal=true, bias=true), p=0.1)
    return y + dropout(ffn(layernorm(y), hidden=4 * h, act=gelu), p=0.1)
  }}
  output out = repeat(layers) layer(x)
}}
""", encoding="utf-8")
    return path


def _train(irc_cli: Callable, path: Path | str, *flags: str) -> dict:
    result = irc_cli(["analyze", str(path), "--json", "--train", "adam", *flags])
    assert result.rc == 0, result.err
    return json.loads(result.out)["training"]


def test_zero_stages_on_a_7_5b_model(irc_cli: Callable, tmp_path: Path) -> None:
    path = tmp_path / "big.arch"  # one 75,000 × 100,000 matrix: exactly 7.5e9 parameters
    path.write_text("model big(B) {\n  input x: f32[B, 75000]\n  output y = linear(x, 100000, bias=false)\n}\n",
                    encoding="utf-8")
    for stage, gb in ZERO_FIGURES.items():
        t = _train(irc_cli, path, "--precision", "fp16-mixed", "--dp", "64", "--zero", str(stage))
        states = sum(r["bytes"] for r in t["rows"][:4])
        assert t["params_per_device"] == 7_500_000_000
        assert round(states / 1e9, 1) == gb, stage


# (h, a): GPT-3 175B and Megatron's 22B model (Korthikanti et al. Table 3); s = 2048, b = 1
@pytest.mark.parametrize("h,a", [(12288, 96), (6144, 64)])
def test_megatron_activations_per_layer(irc_cli: Callable, tmp_path: Path, h: int, a: int) -> None:
    path = _gpt_layers(tmp_path, h, a)
    s, b, t = 2048, 1, 8
    common = ["-D", f"T={s}", "--precision", "bf16-mixed", "--attention-dropout"]

    def layer(*flags: str) -> int:
        return _train(irc_cli, path, *common, *flags)["activations"]["first_layer_bytes"]

    # sbh(34 + 5as/h) = 34sbh + 5as²b, exact in integers
    assert layer() == 34 * s * b * h + 5 * a * s * s * b
    assert layer("--recompute", "selective") == 34 * s * b * h
    assert layer("--recompute", "full") == 2 * s * b * h
    assert layer("--tp", str(t)) == s * b * h * 10 + s * b * h * 24 // t + 5 * a * s * s * b // t
    assert layer("--tp", str(t), "--sp") == (34 * s * b * h + 5 * a * s * s * b) // t
    assert layer("--tp", str(t), "--sp", "--recompute", "selective") == 34 * s * b * h // t


def test_without_attention_dropout_the_scores_are_kept_once(irc_cli: Callable, tmp_path: Path) -> None:
    h, a, s = 4096, 32, 1024
    t = _train(irc_cli, _gpt_layers(tmp_path, h, a), "-D", f"T={s}", "--precision", "bf16-mixed")
    # no mask and no dropped-out copy of the probabilities: 2as²b instead of 5as²b
    assert t["activations"]["first_layer_bytes"] == s * h * 34 + 2 * a * s * s


def test_pipeline_holds_one_micro_batch_per_stage_ahead(irc_cli: Callable, tmp_path: Path) -> None:
    h, a, s = 1024, 16, 512
    path = _gpt_layers(tmp_path, h, a, layers=8)
    one = _train(irc_cli, path, "-D", f"T={s}", "--precision", "bf16-mixed", "--global-batch", "16")
    four = _train(irc_cli, path, "-D", f"T={s}", "--precision", "bf16-mixed", "--pp", "4", "--global-batch", "16")
    assert four["plan"]["micro_batches"] == 16
    assert four["pipeline_bubble"] == {"of_ideal": 3 / 16, "of_step": round(3 / 19, 6)}
    # 1F1B: stage 0 holds 4 micro-batches of 2 layers, as much as the unsplit model's 8 layers of one
    assert four["activations"]["in_flight"] == [4, 3, 2, 1]
    layer = one["activations"]["first_layer_bytes"]
    assert four["activations"]["per_stage_bytes"][0] == 2 * layer  # stage 0: layers 0 and 1
    assert four["rows"][4]["bytes"] == 4 * 2 * layer


def test_tensor_parallel_replicates_only_vectors(irc_cli: Callable) -> None:
    t = _train(irc_cli, LLAMA, "-D", "T=16", "--tp", "8", "--precision", "bf16-mixed")
    norms = (2 * 32 + 1) * 4096  # RMSNorm gains: two per layer and the final one, replicated
    assert t["params_per_device"] * 8 - 7 * norms == LLAMA_PARAMS
    rows = {r["name"]: r for r in t["rows"]}
    assert rows["weights"]["bytes"] == 2 * t["params_per_device"]
    assert rows["fp32 master weights"]["bytes"] == 4 * t["params_per_device"]
    assert rows["optimizer states"]["bytes"] == 8 * t["params_per_device"]


def test_communication_from_the_layer_shapes(irc_cli: Callable, tmp_path: Path) -> None:
    h, a, s, layers = 2048, 16, 1024, 4
    path = _gpt_layers(tmp_path, h, a, layers)
    t = _train(irc_cli, path, "-D", f"T={s}", "--precision", "bf16-mixed", "--tp", "4", "--dp", "2")
    comm = {(c["group"], c["kind"], c["what"].split(" ")[0]): c for c in t["communication"]}
    # Megatron: per layer, one all-reduce of b·s·h after attention and one after the MLP, each way
    assert comm[("tp", "all-reduce", "layer")]["bytes"] == layers * 2 * s * h * 2
    assert comm[("tp", "all-reduce", "input")]["bytes"] == layers * 2 * s * h * 2
    dp = comm[("dp", "all-reduce", "gradients")]
    assert dp["bytes"] == 2 * t["params_per_device"] and dp["calls"] == 1
    assert dp["sent_bytes"] == dp["bytes"]  # a ring all-reduce sends 2(n−1)/n of the buffer: 1× at n = 2
    t3 = _train(irc_cli, path, "-D", f"T={s}", "--precision", "bf16-mixed", "--dp", "4", "--zero", "3",
                "--global-batch", "8")
    kinds = {(c["kind"], c["what"].split(" ")[0]): c["calls"] for c in t3["communication"]}
    assert kinds == {("reduce-scatter", "gradients"): 2, ("all-gather", "weights"): 4}


def test_sequence_parallel_turns_all_reduces_into_gather_and_scatter(irc_cli: Callable, tmp_path: Path) -> None:
    path = _gpt_layers(tmp_path, 1024, 16, 2)
    t = _train(irc_cli, path, "-D", "T=256", "--tp", "2", "--sp")
    kinds = {c["kind"] for c in t["communication"]}
    assert kinds == {"all-gather", "reduce-scatter"}


def test_recompute_full_holds_one_block_again_in_backward(irc_cli: Callable, tmp_path: Path) -> None:
    path = _gpt_layers(tmp_path, 1024, 16, 4)
    none = _train(irc_cli, path, "-D", "T=256", "--precision", "bf16-mixed")
    full = _train(irc_cli, path, "-D", "T=256", "--precision", "bf16-mixed", "--recompute", "full")
    # the largest block is the last: its layer plus the model output the loss keeps (s·h at 2 bytes)
    assert full["temporary"]["recomputed block"] == none["activations"]["first_layer_bytes"] + 256 * 1024 * 2
    assert full["rows"][4]["bytes"] < none["rows"][4]["bytes"]


def test_optimizers_and_precisions(irc_cli: Callable) -> None:
    n = 124_439_808  # GPT-2 small, OpenAI's count
    for opt, state in (("sgd", 0), ("momentum", 4), ("adam", 8), ("adamw", 8)):
        rows = {r.name: r.bytes for r in model_states(n, opt, "fp32", 0, 1)}
        assert rows == {"weights": 4 * n, "gradients": 4 * n, "optimizer states": state * n,
                        "fp32 master weights": 0}
    t = _train(irc_cli, GPT2, "-D", "T=64", "--precision", "bf16-mixed")
    assert sum(r["bytes"] for r in t["rows"][:4]) == 16 * n


def test_plan_errors_point_at_the_layer(irc_cli: Callable) -> None:
    r = irc_cli(["analyze", GPT2, "--train", "adam", "--tp", "5"])
    assert r.rc == 1 and "heads=12" in r.err and "<lib>/transformer.arch:" in r.err
    r = irc_cli(["analyze", GPT2, "--train", "adam", "--pp", "5"])
    assert r.rc == 1 and "12 repeated layers" in r.err and "1, 2, 3, 4, 6, 12" in r.err
    r = irc_cli(["analyze", GPT2, "--zero", "1"])
    assert r.rc == 2 and "--train" in r.err
    r = irc_cli(["analyze", GPT2, "--train", "sgd", "--dp", "3", "--global-batch", "10"])
    assert r.rc == 2 and "not a multiple" in r.err


def test_micro_batch_binds_the_batch(irc_cli: Callable) -> None:
    t = _train(irc_cli, GPT2, "-D", "T=64", "--micro-batch", "4", "--dp", "2", "--global-batch", "32")
    assert t["plan"]["micro_batch"] == 4 and t["plan"]["micro_batches"] == 4
    r = irc_cli(["analyze", GPT2, "-D", "B=2", "--micro-batch", "4"])
    assert r.rc == 2 and "already 2" in r.err


def test_text_report_has_a_row_per_state(irc_cli: Callable) -> None:
    out = irc_cli(["analyze", GPT2, "-D", "T=128", "--train", "adamw", "--precision", "bf16-mixed", "--depth", "1"]).out
    section = out[out.index("training memory per device"):]
    for row in ("weights", "gradients", "optimizer states", "fp32 master weights", "activations", "temporary peak",
                "total"):
        assert f"\n  {row} " in section, row


def test_a_tied_head_keeps_a_copy_of_the_table_on_the_last_stage(irc_cli: Callable) -> None:
    t = _train(irc_cli, GPT2, "-D", "T=16", "--pp", "2")
    # Megatron keeps the word embeddings on the first and the last stage (and all-reduces their gradients)
    assert sum(t["params_per_stage"]) == 124_439_808 + 50_257 * 768


@pytest.mark.parametrize("layers,bidirectional", [(2, False), (3, True)])
def test_stacked_recurrent_dropout_keeps_its_mask_and_the_masked_sequences(tmp_path: Path, layers: int,
                                                                            bidirectional: bool) -> None:
    """nn.LSTM(num_layers, dropout) in training keeps, per boundary between layers, a 1-byte mask and the
    masked copy of the sequence the next layer reads: (L − 1)·B·T·dirs·H·(1 + bytes per value) more than
    the same layer without dropout."""
    from irc.analysis.training_memory import saved_for_backward
    from irc.pipeline import load_graph

    b, t, h, dirs = 4, 50, 32, 2 if bidirectional else 1

    def saved(dropout: float) -> int:
        path = tmp_path / f"l{dropout}.arch"
        path.write_text(f"model m(B, T) {{\n  input x: f32[B, T, 16]\n  y, hn, cn = lstm(x, hidden={h}, "
                        f"layout=torch, layers={layers}, bidirectional={'true' if bidirectional else 'false'}, "
                        f"dropout={dropout})\n  output y = y\n}}\n")
        return sum(s.bytes for s in saved_for_backward(load_graph(path, {"B": b, "T": t}), "f32"))

    assert saved(0.3) - saved(0.0) == (layers - 1) * b * t * dirs * h * (1 + 4)
