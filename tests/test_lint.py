"""Architecture lints (irc lint): golden output per rule, the chapter's numbers, -W flags, the zoo.

tests/lint/wNNN_*.arch triggers exactly IRC-WNNN and wNNN_ok.arch triggers nothing; each has
its expected output in a .out file (rewrite with ``pytest --update-golden``, then check every
number in the diff against the formula in the .arch comment). The numbers the warnings quote
are re-derived here from the chapter's formulas and published sizes, not from irc.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from irc.lint import RULES, lint_graph
from irc.lint.cli import print_lints
from irc.pipeline import load_graph

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(__file__).resolve().parent / "lint"
CASES = sorted(LINT.glob("*.arch"))
_CODE = re.compile(r"\[(IRC-W\d{3})\]")


def _code(arch: Path) -> str:
    return "IRC-" + arch.stem.split("_")[0].upper()


def _lint(irc_cli, arch: Path, *flags: str):
    return irc_cli(["lint", arch.name, *flags], cwd=arch.parent)


def _sci(x: float) -> str:
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


@pytest.mark.parametrize("arch", CASES, ids=lambda p: p.stem)
def test_golden_output(arch: Path, irc_cli, golden) -> None:
    result = _lint(irc_cli, arch)
    assert result.rc == 0 and result.out == ""  # diagnostics go to stderr, as every command's do
    golden.check(arch.with_suffix(".out"), result.err)


@pytest.mark.parametrize("arch", [p for p in CASES if not p.stem.endswith("_ok")], ids=lambda p: p.stem)
def test_trigger_model_gives_exactly_its_warning(arch: Path, irc_cli) -> None:
    assert set(_CODE.findall(_lint(irc_cli, arch).err)) == {_code(arch)}


@pytest.mark.parametrize("arch", [p for p in CASES if p.stem.endswith("_ok")], ids=lambda p: p.stem)
def test_clean_model_gives_no_warning(arch: Path, irc_cli) -> None:
    assert _lint(irc_cli, arch).err == ""


def test_every_rule_has_a_trigger_and_a_clean_model() -> None:
    stems = {p.stem for p in CASES}
    for code in RULES:
        prefix = code.removeprefix("IRC-").lower()
        assert f"{prefix}_ok" in stems, f"{code} has no clean model"
        assert any(s.startswith(prefix + "_") and s != f"{prefix}_ok" for s in stems), f"{code} never fires"


def test_lstm_forget_bias_zero(irc_cli) -> None:
    """IRC-W108 quotes the chapter's 0.50^100 for a forget gate that starts at b_f = 0."""
    out = _lint(irc_cli, LINT / "w108_forget_bias_zero.arch").err
    assert f"0.50^100 = {_sci(0.5 ** 100)}" in out  # the chapter's 7.9e-31


# -- the chapter's numbers, derived here --------------------------------------------------


def _out(irc_cli, path: str, *flags: str) -> str:
    result = irc_cli(["lint", path, *flags], cwd=ROOT)
    assert result.rc == 0 and result.out == "", result.err
    return result.err


def test_unscaled_attention_numbers(irc_cli) -> None:
    out = _out(irc_cli, "tests/lint/w102_unscaled.arch")
    sd = math.sqrt(128)
    p = 1 / (1 + math.exp(-sd))
    unit = 1 / (1 + math.exp(-1)) * (1 - 1 / (1 + math.exp(-1)))
    assert f"sd √128 = {sd:.1f}" in out and f"p(1−p) = {_sci(p * (1 - p))}" in out  # 11.3, 1.2e-5
    assert f"{round(unit / (p * (1 - p)), -3):,.0f}× smaller" in out  # the chapter's ~16,000×


def test_over_scaled_attention_is_near_uniform(tmp_path: Path) -> None:
    arch = tmp_path / "over.arch"
    arch.write_text("model over(B) {\n  input tokens: i32[B, 16]\n  emb = embedding(100, 256)\n"
                    "  output y = attention(positional(emb(tokens), sinusoidal), heads=2, scale=1 / 128)\n}\n")
    (w,) = lint_graph(load_graph(arch, {}))
    assert w.code == "IRC-W102" and "flattens" in w.message
    assert f"sd {1 / math.sqrt(128):.2g}" in w.mechanism  # the chapter's 0.088


def test_causal_attention_without_position(tmp_path: Path) -> None:
    arch = tmp_path / "nope.arch"
    arch.write_text("model nope(B) {\n  input tokens: i32[B, 16]\n  emb = embedding(100, 32)\n"
                    "  output y = attention(emb(tokens), heads=4, causal=true)\n}\n")
    (w,) = lint_graph(load_graph(arch, {}))
    assert w.code == "IRC-W101" and "causal mask" in w.mechanism


def test_float_sequence_input_may_carry_positions() -> None:
    assert lint_graph(load_graph(ROOT / "models/seed/mha_4096.arch", {})) == []


def test_residual_variance_numbers(irc_cli) -> None:
    out = _out(irc_cli, "models/seed/transformer_7b.arch")
    assert f"1 + 2·32 = {1 + 2 * 32} (sd √65 = {math.sqrt(65):.2f})" in out  # the chapter's 8.06


def test_rnn_numbers(irc_cli) -> None:
    out = _out(irc_cli, "tests/lint/w107_rnn_long.arch")
    assert f"0.84^100 = {_sci(0.84 ** 100)}" in out  # 2.7e-8
    assert f"0.99^100 = {0.99 ** 100:.2g}" in out  # 0.37


def test_rnn_length_follows_the_binding(tmp_path: Path) -> None:
    arch = tmp_path / "rnn.arch"
    arch.write_text("model r(B, T) {\n  input x: f32[B, T, 8]\n  seq, h = rnn(x, 8)\n  output y = seq\n}\n")
    assert lint_graph(load_graph(arch, {"T": 49})) == []
    (w,) = lint_graph(load_graph(arch, {"T": 50}))
    assert f"0.84^50 = {_sci(0.84 ** 50)}" in w.mechanism  # 1.6e-4
    (w,) = lint_graph(load_graph(arch, {}))  # T unbound: the default 1,024, and the note says so
    assert "T = 1,024" in w.message and any("T=1,024 (default sequence)" in n for n in w.notes)


def test_plain_depth_numbers(irc_cli) -> None:
    assert f"0.8^50 = {_sci(0.8 ** 50)}" in _out(irc_cli, "tests/lint/w109_plain_deep.arch")  # 1.4e-5


def test_dense_and_conv_parameter_numbers(irc_cli) -> None:
    out = _out(irc_cli, "models/seed/dense_on_image.arch")
    dense, conv = 224 * 224 * 3 * 1000 + 1000, 3 * 3 * 3 * 64 + 64
    assert f"{dense:,} parameters" in out and f"= {conv:,} parameters" in out  # 150,529,000 and 1,792
    assert f"({round(dense / conv, -3):,.0f}× fewer)" in out  # ~84,000×
    out = _out(irc_cli, "models/seed/flatten_head.arch")
    assert f"{7 * 7 * 512 * 1000:,} parameters" in out and f"{512 * 1000:,} parameters" in out


def test_vgg16_head_share(irc_cli) -> None:
    out = _out(irc_cli, "models/vgg16.arch")
    head, total = 25088 * 4096 + 4096, 138_357_544  # torchvision's published count
    assert f"{head:,} parameters ({100 * head / total:.1f}% of the model)" in out
    assert f"{512 * 4096 + 4096:,} parameters" in out


def test_receptive_field_numbers(irc_cli) -> None:
    out = _out(irc_cli, "tests/lint/w112_small_receptive_field.arch")
    assert f"sees {1 + 8 * 2}×{1 + 8 * 2} pixels" in out
    assert f"would need {math.ceil((224 - 1) / 2)})" in out  # the chapter's 112 layers
    assert "reach 224 in 7 layers" in out  # 2^(7+1) − 1 = 255 ≥ 224 > 2^7 − 1


def test_swiglu_rounding_numbers(irc_cli) -> None:
    out = _out(irc_cli, "tests/lint/w114_ffn_tile.arch")
    hidden = math.floor(8 * 4096 / 3)
    tiles = math.ceil(hidden / 256)
    assert f"= {tiles} tiles" in out and f"last is {hidden - (tiles - 1) * 256}/256 full" in out
    assert f"= {tiles * 256:,}" in out and tiles * 256 == 11_008  # the chapter's 11,008


def _lint_text(tmp_path: Path, text: str, **bindings: int) -> list:
    arch = tmp_path / "m.arch"
    arch.write_text(text)
    return lint_graph(load_graph(arch, bindings))


def test_ffn_tile_is_64_below_1024_and_toys_are_quiet(tmp_path: Path) -> None:
    body = "model m(B, T) {{\n  input x: f32[B, T, 256]\n  output y = ffn(x, hidden={h})\n}}\n"
    (w,) = _lint_text(tmp_path, body.format(h=1000))
    assert w.code == "IRC-W114" and f"= {math.ceil(1000 / 64) * 64:,}" in w.fix  # 1,024
    assert _lint_text(tmp_path, body.format(h=320)) == []  # a multiple of 64 under 1,024
    assert _lint_text(tmp_path, body.format(h=32)) == []  # narrower than one tile


def test_kernel_on_a_one_by_one_map(tmp_path: Path) -> None:
    text = "model m(B) {\n  input x: f32[B, 8, 1, 1]\n  output y = conv2d(x, 4, 3, padding=1)\n}\n"
    (w,) = _lint_text(tmp_path, text)
    assert w.code == "IRC-W113" and "8 of the 9 taps" in w.mechanism


def test_fragments_without_a_body_stay_quiet(tmp_path: Path) -> None:
    # one attention layer and no FFN: the chapter's crossover compares the two inside a block
    text = "model m(B) {\n  input x: f32[B, 4096, 64]\n  output y = attention(x, heads=4)\n}\n"
    assert _lint_text(tmp_path, text) == []
    # a lone 1×1 convolution is a per-pixel layer, not a dense-prediction network
    assert _lint_text(tmp_path, "model m(B) {\n  input x: f32[B, 8, 32, 32]\n  output y = conv2d(x, 4, 1)\n}\n") == []


def test_embedding_and_untied_numbers(irc_cli) -> None:
    out = _out(irc_cli, "tests/lint/w115_embedding_dominates.arch")
    assert f"({50257 * 64:,} of" in out
    out = _out(irc_cli, "models/lstm_lm.arch")
    head, total = 650 * 10_000 + 10_000, 19_775_200  # the header's count (Zaremba et al. medium)
    assert f"{head:,} parameters, {100 * head / total:.1f}% of the model" in out


def test_attention_crossover_and_kv_numbers(irc_cli) -> None:
    assert f"6d = {6 * 64}" in _out(irc_cli, "tests/lint/w117_attention_dominates.arch")
    out = _out(irc_cli, "tests/lint/w118_kv_cache.arch")
    per_token = 2 * 32 * 4096 * 2
    assert per_token == 512 * 1024 and "512 KiB per token" in out and "4 GiB per sequence" in out
    assert "128 KiB per token, 1 GiB at n = 8,192 (4× less)" in out  # the chapter's GQA cut
    assert f"{per_token // 32 // 1024} KiB per token (32× less)" in out  # MQA


def test_t5_unscaled_attention_is_flagged_with_its_init_note(irc_cli) -> None:
    out = _out(irc_cli, "models/t5_small.arch")
    p = 1 / (1 + math.exp(-8.0))
    assert f"p(1−p) = {_sci(p * (1 - p))}" in out and "folds 1/√d_k into W_q's initialization" in out


# -- the zoo: only warnings a reviewer agrees with ----------------------------------------

ZOO = {
    "models/bert_base.arch": set(),  # post-LN at 12 layers: at the threshold, not past it
    "models/gpt2_small.arch": set(),
    # untied, but its head is 1.9% of 6.74B; at its own 4,096-token context the MHA cache is 2 GiB a sequence
    "models/llama2_7b.arch": {"IRC-W118"},
    "models/lstm_lm.arch": {"IRC-W116"},  # untied 650 × 10,000 decoder is a third of the model
    "models/mistral_7b.arch": set(),  # 32k context, but the 4,096-token window bounds attention (no W117)
    "models/mlp.arch": set(),  # the input is already a flat vector: no image shape to judge
    "models/resnet18.arch": set(),
    "models/t5_small.arch": {"IRC-W102"},  # scale=1 (T5 compensates in its init; irc's does not)
    "models/vgg16.arch": {"IRC-W111"},  # 25,088 → 4,096 flatten head: 74% of the parameters
    # the vision zoo: every deep path has identity shortcuts (MobileNetV2, EfficientNet, ConvNeXt, ViT) or
    # concatenated ones (DenseNet, U-Net), so no W109; the classifiers pool (or read the class token) instead
    # of flattening a map (no W110/W111) and their fields cover 224² (no W112); ViT adds a learned position
    # table (a param, so no W101) and is pre-LN with a final norm (no W103); its 3,072 and ConvNeXt's 4·C
    # hidden widths are multiples of the tile (no W114); dropout follows the pooling, never a BatchNorm (no W106)
    "models/convnext_tiny.arch": set(),
    "models/densenet121.arch": set(),
    "models/efficientnet_b0.arch": set(),
    "models/mobilenet_v2.arch": set(),
    # U-Net's field is r = 200 (bottleneck 140 at jump 16, + 4·(8 + 4 + 2 + 1) from the decoder's double
    # convs) against its 512² input: true of the published network, which Ronneberger et al. run as
    # overlapping tiles for that reason
    "models/unet.arch": {"IRC-W112"},
    "models/vit_b_16.arch": set(),
    "models/whisper_tiny_encoder.arch": set(),  # sinusoidal positions, scaled attention, pre-LN with a final norm
    "models/mixtral_8x7b.arch": set(),  # GQA keeps its 32k-token cache at 4 GiB; 14,336 is a multiple of the tile
    # DeepSeek's widths (dense 10,944, experts 1,408) are not multiples of the 256 tile; MLA's latent cache is small
    "models/deepseek_v2_lite.arch": {"IRC-W114"},
    # the 2×2×64 flatten head is 62% of the parameters (a global-pool head trains to 97-98% instead of 98-99%)
    "models/digits_cnn.arch": {"IRC-W111"},
    "models/byte_lm.arch": set(),
    "models/seed/conv3x3.arch": set(),
    "models/seed/dense_on_image.arch": {"IRC-W110"},
    "models/seed/dilated_stack.arch": set(),
    "models/seed/flatten_head.arch": {"IRC-W111"},
    "models/seed/fold_deep.arch": set(),
    "models/seed/fold_deep20.arch": {"IRC-W109"},  # 21 plain layers
    "models/seed/fold_shallow.arch": set(),
    "models/seed/gap_head.arch": set(),
    "models/seed/gru_512.arch": set(),
    "models/seed/llm_40x5120.arch": set(),
    "models/seed/lstm_512.arch": set(),
    "models/seed/mha_4096.arch": set(),
    "models/seed/resnet_stem.arch": set(),
    "models/seed/swiglu_7b.arch": set(),
    "models/seed/transformer_7b.arch": {"IRC-W103"},  # the chapter's count has no final norm
    "models/seed/transformer_7b_gqa.arch": {"IRC-W103"},
    "models/seed/transformer_7b_mqa.arch": {"IRC-W103"},
    "models/seed/vgg_stack.arch": set(),
}


def test_zoo_list_is_complete() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("models/*.arch"), *ROOT.glob("models/seed/*.arch")]}
    assert found == set(ZOO)


@pytest.mark.parametrize("path", sorted(ZOO))
def test_zoo_warnings(path: str, irc_cli) -> None:
    assert set(_CODE.findall(_out(irc_cli, path))) == ZOO[path]


# -- -W flags and the command line ----------------------------------------------------------


def test_no_code_silences(irc_cli) -> None:
    arch = LINT / "w103_no_final_norm.arch"
    for flag in ("no-IRC-W103", "no-w103", "no-prenorm-no-final-norm"):
        result = _lint(irc_cli, arch, "-W", flag)
        assert (result.rc, result.out, result.err) == (0, "", "")


def test_error_code_promotes_and_exits_1(irc_cli) -> None:
    arch = LINT / "w103_no_final_norm.arch"
    result = _lint(irc_cli, arch, "-W", "error=IRC-W103")
    assert result.rc == 1
    assert ": error: pre-LN stack" in result.err and result.err.endswith("1 error generated.\n")
    assert _lint(irc_cli, arch, "-W", "error=IRC-W101").rc == 0  # another code stays a warning


def test_error_promotes_all_and_later_flags_win(irc_cli) -> None:
    arch = LINT / "w103_no_final_norm.arch"
    assert _lint(irc_cli, arch, "-W", "error").rc == 1
    assert _lint(irc_cli, arch, "-W", "error", "-W", "no-error=W103").rc == 0
    assert _lint(irc_cli, arch, "-W", "error", "-W", "no-W103").rc == 0
    assert _lint(irc_cli, arch, "-W", "no-W103", "-W", "W103").err != ""


def test_no_all_silences_everything_and_all_restores(irc_cli) -> None:
    arch = LINT / "w103_no_final_norm.arch"
    assert _lint(irc_cli, arch, "-W", "no-all").err == ""
    assert "[IRC-W103]" in _lint(irc_cli, arch, "-W", "no-all", "-W", "all").err


def test_print_lints_writes_to_any_stream() -> None:
    """What ``compile`` and ``analyze`` would call to print the same warnings to stderr."""
    graph = load_graph(LINT / "w103_no_final_norm.arch", {})
    stream = io.StringIO()
    assert print_lints(graph, ["error=W103"], stream) == 1
    assert "error: pre-LN stack" in stream.getvalue()


def test_unknown_code_is_a_usage_error(irc_cli) -> None:
    result = _lint(irc_cli, LINT / "w101_ok.arch", "-W", "error=IRC-W999")
    assert result.rc == 2 and "unknown warning 'IRC-W999'" in result.err


def test_bad_model_is_an_error_not_a_traceback(irc_cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.arch"
    bad.write_text("model m(B) {\n  input x: f32[B, 4]\n  output y = linear(x, 0)\n}\n")
    result = irc_cli(["lint", bad.name], cwd=tmp_path)
    assert result.rc == 1 and "bad.arch:3:" in result.err and "Traceback" not in result.err


def test_warnings_carry_code_location_and_fix() -> None:
    (w,) = lint_graph(load_graph(LINT / "w110_dense_on_pixels.arch", {}))
    assert (w.code, w.name, w.loc.line, w.loc.col) == ("IRC-W110", "dense-on-pixels", 5, 14)
    assert w.fix.startswith("convolve first")


def test_every_code_is_documented() -> None:
    doc = (ROOT / "docs" / "lints.md").read_text(encoding="utf-8")
    for code, rule in RULES.items():
        assert f"## {code} {rule.name}" in doc


# -- --list, --explain, --format json|sarif, library warnings at the user's call -----------------


def test_list_names_every_rule(irc_cli) -> None:
    result = irc_cli(["lint", "--list"])
    assert result.rc == 0 and result.err == ""
    lines = result.out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(RULES)
    assert all(RULES[line.split()[0]].name == line.split()[1] for line in lines)


def test_explain_prints_the_rule_section(irc_cli) -> None:
    result = irc_cli(["lint", "--explain", "w103"])
    assert result.rc == 0
    assert result.out.startswith("IRC-W103 prenorm-no-final-norm: ")
    assert "**Mechanism**" in result.out and "**Fix**" in result.out and "## IRC-W104" not in result.out
    assert irc_cli(["lint", "--explain", "W999"]).rc == 2
    assert irc_cli(["lint", str(LINT / "w101_ok.arch"), "--list"]).rc == 2  # rules or a model, not both


def test_json_report(irc_cli) -> None:
    arch = LINT / "w103_no_final_norm.arch"
    result = _lint(irc_cli, arch, "--format", "json", "-W", "error=W103")
    assert result.rc == 1 and result.err == ""
    report = json.loads(result.out)
    (w,) = report["warnings"]
    assert (w["code"], w["severity"], w["file"]) == ("IRC-W103", "error", arch.name)
    assert report["counts"] == {"warnings": 0, "errors": 1} and w["fix"].startswith("normalize")


def test_sarif_report(irc_cli) -> None:
    arch = LINT / "w110_dense_on_pixels.arch"
    sarif = json.loads(_lint(irc_cli, arch, "--format", "sarif").out)
    assert sarif["version"] == "2.1.0"
    run = sarif["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == sorted(RULES)
    (result,) = run["results"]
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (result["ruleId"], result["level"], region["startLine"], region["startColumn"]) == \
        ("IRC-W110", "warning", 5, 14)
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "IRC-W110"


def test_library_warnings_point_at_the_users_call(irc_cli) -> None:
    err = _out(irc_cli, "models/t5_small.arch")
    first = err.splitlines()[0]
    assert first.startswith("models/t5_small.arch:") and "[IRC-W102]" in first
    assert "t5_encoder(" in err.splitlines()[1]  # the quoted line is the user's call
    assert "note: inside the library block 't5_encoder' at <lib>/transformer.arch:" in err


def test_w112_reads_resampling_ops_without_a_kernel(tmp_path, irc_cli) -> None:
    """pixel_shuffle and upsample are window ops with no kernel attribute: W112 must not crash on them."""
    path = tmp_path / "ps.arch"
    path.write_text("model m(B) {\n  input x: f32[B, 3, 64, 64]\n  a = conv2d(x, 16, 3, padding=1)\n"
                    "  s = upsample(pixel_shuffle(a, 2), 2)\n  output y = conv2d(s, 2, 1)\n}\n")
    result = irc_cli(["lint", str(path)])
    assert result.rc == 0 and "IRC-W112" in result.err and "jump 0.25" in result.err
