"""`irc analyze` as a command: the table, the JSON schema, bindings, determinism and errors."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "models" / "seed"
DOC = ROOT / "docs" / "analysis-json.md"


def test_table_reads_with_separators_units_subtotals_and_bindings(irc_cli: Callable) -> None:
    result = irc_cli(["analyze", str(SEED / "transformer_7b.arch"), "--context", "8192"])
    assert result.rc == 0, result.err
    out = result.out
    assert "bindings: B=1 (default batch), T=8,192 (-D" not in out
    assert "B=1 (default batch), T=8,192 (--context)" in out
    assert re.search(r"^decoder\.0\.attn\s+attention\s+f32\[1,8192,4096\]\s+67,108,864\s", out, re.M)
    assert re.search(r"^  decoder\.0 subtotal\s+6 ops\s+201,342,976\s", out, re.M)
    assert "6,967,263,232" in out
    assert "524,288 B/token (512 KiB)" in out and "4 GiB at 8,192 tokens" in out
    assert "24,576 tokens" in out
    assert "GFLOP" in out and "GiB" in out


def test_table_shows_receptive_fields_for_spatial_layers(irc_cli: Callable) -> None:
    out = irc_cli(["analyze", str(SEED / "vgg_stack.arch")]).out
    assert re.search(r"^c2\s+conv2d\s+f32\[1,512,28,28\]\s+2,359,808\s.*r=68 j=8$", out, re.M)
    assert "H=224 (default spatial), W=224 (default spatial)" in out


def test_json_has_the_documented_fields(irc_cli: Callable) -> None:
    report = json.loads(irc_cli(["analyze", str(SEED / "transformer_7b.arch"), "--json"]).out)
    assert report["irc_analysis_version"] == 2
    for key in ("params", "flops_forward", "flops_forward_per_token", "flops_training_per_token", "weight_bytes",
                "kv_cache_bytes_per_token"):
        assert isinstance(report["totals"][key], int), key
    for layer in report["layers"]:
        assert {"name", "op", "type", "params", "flops_forward", "receptive_field", "jump"} <= set(layer)
    assert report["transformer"]["attention_crossover_tokens"] == 24_576
    doc = DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_0-9]+)`", doc))
    undocumented = [k for section in ("totals", "transformer") for k in report[section] if k not in documented]
    undocumented += [k for k in report if k not in documented]
    undocumented += [k for k in report["layers"][0] if k not in documented]
    assert not undocumented, f"fields missing from docs/analysis-json.md: {undocumented}"


def test_output_is_deterministic(irc_cli: Callable) -> None:
    args = ["analyze", str(SEED / "swiglu_7b.arch")]
    assert irc_cli(args).out == irc_cli(args).out
    assert irc_cli([*args, "--json"]).out == irc_cli([*args, "--json"]).out


def test_bindings_from_flags_and_defaults(irc_cli: Callable) -> None:
    report = json.loads(irc_cli(["analyze", str(SEED / "lstm_512.arch"), "--json", "-D", "T=64"]).out)
    assert report["bindings"] == {"B": 1, "T": 64}
    assert report["binding_sources"] == {"B": "batch", "T": "-D"}
    assert report["layers"][0]["type"] == {"dtype": "f32", "shape": [1, 64, 512]}
    report = json.loads(irc_cli(["analyze", str(SEED / "lstm_512.arch"), "--json", "--context", "300"]).out)
    assert report["bindings"]["T"] == 300
    # the declared context sets the default sequence length: BERT-base declares ctx = 512
    report = json.loads(irc_cli(["analyze", str(ROOT / "models" / "bert_base.arch"), "--json"]).out)
    assert report["bindings"]["T"] == 512
    assert report["binding_sources"]["T"] == "context"
    assert report["binding_notes"]["T"].startswith("T=512 (the model's ctx at ")


def test_an_unplaceable_symbol_asks_for_a_binding(irc_cli: Callable, tmp_path: Path) -> None:
    path = tmp_path / "m.arch"
    path.write_text("model m(B, D) {\n  input x: f32[B, 10, D]\n  output y = relu(x)\n}\n", encoding="utf-8")
    result = irc_cli(["analyze", str(path)])  # a sequence's width has no sensible default
    assert result.rc == 1 and "-D D=VALUE" in result.err
    assert irc_cli(["analyze", str(path), "-D", "D=3"]).rc == 0


def test_usage_and_input_errors(irc_cli: Callable, tmp_path: Path) -> None:
    assert irc_cli(["analyze", str(SEED / "mha_4096.arch"), "--context", "0"]).rc == 2
    assert irc_cli(["analyze", str(SEED / "mha_4096.arch"), "--dtype", "f8"]).rc == 2
    missing = irc_cli(["analyze", str(tmp_path / "nope.arch")])
    assert missing.rc == 1 and "no such file" in missing.err
    unknown = irc_cli(["analyze", str(SEED / "mha_4096.arch"), "-D", "nope=3"])
    assert unknown.rc == 1 and "nope" in unknown.err


def test_writes_to_a_file_and_reads_ir_dumps(irc_cli: Callable, tmp_path: Path) -> None:
    ir = tmp_path / "stem.ir"
    assert irc_cli(["compile", str(SEED / "resnet_stem.arch"), "-o", str(ir)]).rc == 0
    out = tmp_path / "report.json"
    assert irc_cli(["analyze", str(ir), "--json", "-o", str(out)]).rc == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["bindings"] == {"B": 1, "H": 224, "W": 224}
    assert [x["receptive_field"] for x in report["layers"] if x["op"] == "conv2d"] == [7, 11, 15]


def test_dtype_aliases_and_token_suffixes_are_accepted(irc_cli) -> None:
    """--dtype takes PyTorch's names (fp16, bfloat16), --context the k suffix -D takes."""
    a = irc_cli(["analyze", "models/gpt2_small.arch", "--dtype", "fp16", "--context", "1k", "--json"])
    b = irc_cli(["analyze", "models/gpt2_small.arch", "--dtype", "f16", "--context", "1024", "--json"])
    assert a.rc == 0 and a.out == b.out
    bad = irc_cli(["analyze", "models/gpt2_small.arch", "--context", "2q"])
    assert bad.rc == 2 and "4k" in bad.err
