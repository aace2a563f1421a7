"""Analysis numbers that follow from the op records' classes: learned position tables count with
the embeddings, and a lowered weight (``param``) is a weight, not an activation.

Oracles: Hugging Face's GPT-2 built on the meta device (its token and position tables), and the
weight bytes of the model (every param value holds exactly one weight)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = Path(__file__).resolve().parents[1]


def test_learned_positions_count_with_the_embeddings(irc_cli: Callable) -> None:
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config())  # GPT-2 small: 50,257 × 768 tokens, 1,024 × 768 positions
    tables = hf.transformer.wte.weight.numel() + hf.transformer.wpe.weight.numel()
    result = irc_cli(["analyze", str(ROOT / "models" / "gpt2_small.arch"), "--json"])
    assert result.rc == 0, result.err
    report = json.loads(result.out)["transformer"]
    assert report["params_embedding"] == tables == 39_383_808
    total = sum(p.numel() for p in hf.parameters())
    assert report["params_in_blocks"] + report["params_embedding"] + 2 * 768 == total  # + the final layernorm


MLP = "model mlp(B) {\n  input x: f32[B, 256]\n  h = relu(linear(x, 512))\n  output y = linear(h, 10)\n}\n"


def test_param_values_are_weights_not_activations(tmp_path: Path, irc_cli: Callable) -> None:
    arch = tmp_path / "mlp.arch"
    arch.write_text(MLP)
    lowered = tmp_path / "mlp.ir"
    subprocess.run([sys.executable, "-m", "irc.cli", "compile", str(arch), "-D", "B=4", "--passes", "decompose",
                    "-o", str(lowered)], check=True, capture_output=True)
    assert " = param " in lowered.read_text()
    result = irc_cli(["analyze", str(lowered), "--json"])
    assert result.rc == 0, result.err
    report = json.loads(result.out)
    params = [row for row in report["layers"] if row["op"] == "param"]
    assert len(params) == 4 and all(row["activation_bytes"] == 0 for row in params)
    # what is left is the activations alone: x, the two gemms, the relu (4 rows of 256, 512, 512, 10 floats)
    assert sum(row["activation_bytes"] for row in report["layers"]) == 4 * 4 * (256 + 512 + 512 + 10)
