"""`irc analyze` output people and programs use: --depth folding, --format table|csv|md|json, the
JSON Schema (docs/analysis-schema.json, validated with the jsonschema package), weight keys, lints
only with --lint, the header (binding sources, no KV cache dtype without a cache) and the
declared context as the default sequence."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
SCHEMA = json.loads((ROOT / "docs" / "analysis-schema.json").read_text(encoding="utf-8"))
LLAMA = str(MODELS / "llama2_7b.arch")
LLAMA_PARAMS = 6_738_415_616  # HF meta-llama/Llama-2-7b-hf
LLAMA_LAYER = 202_383_360  # 4·4096² attention + 3·4096·11,008 SwiGLU + 2·4096 norms (the HF checkpoint's shapes)


def _run(irc_cli: Callable, *args: str) -> str:
    result = irc_cli(["analyze", *args])
    assert result.rc == 0, result.err
    return result.out


def test_depth_one_fits_on_a_screen(irc_cli: Callable) -> None:
    out = _run(irc_cli, LLAMA, "--depth", "1")
    assert len(out.splitlines()) <= 40 and max(len(line) for line in out.splitlines()) <= 160
    row = next(line for line in out.splitlines() if line.startswith("llama_decoder.* ×32"))
    assert f"{32 * LLAMA_LAYER:,}" in row
    full = _run(irc_cli, LLAMA)
    assert len(full.splitlines()) > 250  # every op of 32 layers


def test_depth_two_keeps_one_row_per_layer_part(irc_cli: Callable) -> None:
    out = _run(irc_cli, LLAMA, "--depth", "2")
    attn = next(line for line in out.splitlines() if line.startswith("llama_decoder.*.attn ×32"))
    assert f"{32 * 4 * 4096 * 4096:,}" in attn


def test_csv_has_exact_numbers_that_sum_to_the_total(irc_cli: Callable) -> None:
    for depth in ([], ["--depth", "1"]):
        rows = list(csv.DictReader(io.StringIO(_run(irc_cli, LLAMA, "-D", "T=16", "--format", "csv", *depth))))
        assert sum(int(r["params"]) for r in rows) == LLAMA_PARAMS
    assert rows[2]["copies"] == "32"


def test_markdown_table(irc_cli: Callable) -> None:
    out = _run(irc_cli, str(MODELS / "resnet18.arch"), "--format", "md", "--depth", "1")
    lines = out.splitlines()
    head = lines.index("| layer | op | type | params | FLOPs | activations | r / j |")
    assert lines[head + 1].startswith("| --- |")
    assert any(line.startswith("| parameters | 11,689,512") for line in lines)  # torchvision's count


@pytest.mark.parametrize("args", [
    ["gpt2_small.arch", "-D", "T=8", "--train", "adam", "--pp", "2", "--tp", "2", "--hardware", "h100-sxm"],
    ["llama2_7b.arch", "-D", "T=8", "--hardware", "a100-sxm", "--precision", "bf16"],
    ["resnet18.arch"], ["mlp.arch", "--train", "momentum"], ["t5_small.arch", "-D", "T=8", "-D", "S=8"],
    ["lstm_lm.arch", "-D", "T=8"], ["mistral_7b.arch", "-D", "T=8", "--train", "adamw", "--zero", "3", "--dp", "8",
                                    "--recompute", "full"],
])
def test_json_validates_against_the_schema(irc_cli: Callable, args: list[str]) -> None:
    report = json.loads(_run(irc_cli, str(MODELS / args[0]), *args[1:], "--format", "json"))
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(report, SCHEMA)


def test_the_schema_rejects_what_it_should(irc_cli: Callable) -> None:
    report = json.loads(_run(irc_cli, str(MODELS / "mlp.arch"), "--json"))
    report["layers"][0]["type"] = "f32[1,784]"  # version 1's string types
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA)


def test_layers_carry_their_weight_keys(irc_cli: Callable) -> None:
    from irc.analysis.params import weight_table
    from irc.pipeline import load_graph

    path = str(MODELS / "gpt2_small.arch")
    report = json.loads(_run(irc_cli, path, "-D", "T=8", "--json"))
    keys = {k for layer in report["layers"] for k in layer["weight_keys"]}
    params, buffers = weight_table(load_graph(path, {"T": 8}))
    assert keys == set(params) | set(buffers)
    attn = next(x for x in report["layers"] if x["name"] == "pre_ln_decoder.0.attn")
    assert all(k.startswith("pre_ln_decoder.0.attn.") for k in attn["weight_keys"]) and attn["weight_keys"]


def test_lints_print_only_when_asked(irc_cli: Callable) -> None:
    path = str(MODELS / "seed" / "transformer_7b.arch")  # reaches the head with no final norm: IRC-W103
    for command in ("analyze", "compile"):
        quiet = irc_cli([command, path])
        assert quiet.rc == 0 and quiet.err == ""
        loud = irc_cli([command, path, "--lint"])
        assert loud.rc == 0 and "[IRC-W103]" in loud.err
        assert irc_cli([command, path, "-W", "error=W103"]).rc == 1  # -W asks for the lints too


def test_header_names_the_source_of_each_binding(irc_cli: Callable) -> None:
    head = _run(irc_cli, str(MODELS / "gpt2_small.arch"), "-D", "B=2").splitlines()[1]
    assert head == "bindings: B=2 (-D), T=1,024 (the model's ctx at " + str(MODELS / "gpt2_small.arch") + ":8:58)"
    head = _run(irc_cli, str(MODELS / "gpt2_small.arch"), "--context", "64").splitlines()[1]
    assert head == "bindings: B=1 (default batch), T=64 (--context)"


def test_no_kv_cache_dtype_without_a_cache(irc_cli: Callable) -> None:
    assert _run(irc_cli, str(MODELS / "resnet18.arch")).splitlines()[2] == "weights f32, activations f32"
    assert _run(irc_cli, str(MODELS / "gpt2_small.arch")).splitlines()[2].endswith(", KV cache f16")


def test_mlp_regions_never_claim_at_least_zero(irc_cli: Callable) -> None:
    out = _run(irc_cli, str(MODELS / "mlp.arch"))  # 784 → 300: ⌊300/784⌋ = 0 makes Montúfar's bound vacuous
    line = next(x for x in out.splitlines() if x.strip().startswith("ReLU MLP"))
    assert "≥ 0" not in line and "says nothing here" in line
    assert "saved for backward" in out and "saved for training" not in out


def test_declared_context_is_the_default_sequence(irc_cli: Callable, tmp_path: Path) -> None:
    path = tmp_path / "rope.arch"
    path.write_text("model rope(B, T) {\n  const d = 64, ctx = 2 * 2048\n  input tokens: i32[B, T]\n"
                    "  x = embedding(tokens, 100, d)\n  output y = attention(x, heads=4, causal=true, rope=true)\n}\n",
                    encoding="utf-8")
    report = json.loads(_run(irc_cli, str(path), "--json"))
    assert report["bindings"]["T"] == 4096 and report["binding_sources"]["T"] == "context"
    assert report["binding_notes"]["T"] == f"T=4,096 (the model's ctx at {path}:2:17)"
    assert json.loads(_run(irc_cli, str(path), "--json", "-D", "ctx=512"))["bindings"]["T"] == 512
    assert json.loads(_run(irc_cli, str(path), "--json", "--context", "100"))["bindings"]["T"] == 100


def test_usage_errors(irc_cli: Callable) -> None:
    path = str(MODELS / "mlp.arch")
    cases = [(["--depth", "0"], "--depth"), (["--json", "--format", "csv"], "disagree"),
             (["--precision", "bf16-mixed"], "--train"),
             (["--precision", "bf16", "--dtype", "f16"], "--precision sets"),
             (["--compute-efficiency", "0.5"], "--hardware"), (["--hardware-file", "x.toml"], "--hardware")]
    for flags, words in cases:
        r = irc_cli(["analyze", path, *flags])
        assert r.rc == 2 and words in r.err, (flags, r.err)
