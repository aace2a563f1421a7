"""The chapter's worked numbers, each from its models/seed/*.arch file through `irc analyze --json`.

Every expected value is quoted from the chapter (shared/seeds/000_*, section named in the
test), never from irc's output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "models" / "seed"


@pytest.fixture
def analyze(irc_cli: Callable) -> Callable[..., dict[str, Any]]:
    def run(name: str, *args: str) -> dict[str, Any]:
        result = irc_cli(["analyze", str(SEED / f"{name}.arch"), "--json", *args])
        assert result.rc == 0, result.err
        return json.loads(result.out)
    return run


def _layers(report: dict[str, Any], *ops: str) -> list[dict[str, Any]]:
    return [layer for layer in report["layers"] if layer["op"] in ops]


# -- §2 dense, §3 convolution ------------------------------------------------------------


def test_dense_layer_on_a_flattened_image(analyze: Callable) -> None:
    report = analyze("dense_on_image")
    assert report["totals"]["params"] == 150_529_000  # 150,528·1,000 + 1,000
    assert _layers(report, "linear")[0]["attrs"]["out"] == 1000


def test_conv3x3_and_its_saving_over_the_dense_layer(analyze: Callable) -> None:
    conv = analyze("conv3x3")["totals"]["params"]
    assert conv == 1_792  # 3·3·3·64 + 64
    dense = analyze("dense_on_image")["totals"]["params"]
    assert round(dense / conv, -3) == 84_000  # "~84,000x fewer"


def test_vgg_stack_receptive_fields(analyze: Callable) -> None:
    report = analyze("vgg_stack")
    spatial = _layers(report, "conv2d", "maxpool2d")
    assert [layer["receptive_field"] for layer in spatial] == [3, 5, 6, 10, 14, 16, 24, 32, 36, 52, 68]
    assert [layer["jump"] for layer in spatial] == [1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    assert report["receptive_field"] == {"receptive_field": 68, "jump": 8}  # not 75: r before j


def test_resnet_stem_receptive_fields(analyze: Callable) -> None:
    convs = _layers(analyze("resnet_stem"), "conv2d")
    assert [c["receptive_field"] for c in convs] == [7, 11, 15]
    assert [c["jump"] for c in convs] == [2, 2, 4]


def test_dilated_stack_receptive_fields(analyze: Callable) -> None:
    convs = _layers(analyze("dilated_stack"), "conv2d")
    assert [c["attrs"]["dilation"] for c in convs] == [1, 2, 4, 8]
    assert [c["receptive_field"] for c in convs] == [3, 7, 15, 31]
    assert {c["jump"] for c in convs} == {1}


# -- §4 pooling heads ---------------------------------------------------------------------


def test_flatten_head_versus_global_average_pool_head(analyze: Callable) -> None:
    flat = analyze("flatten_head")
    gap = analyze("gap_head")
    assert _layers(flat, "linear")[0]["params"] == 25_088_000  # 7·7·512·1,000
    assert _layers(gap, "linear")[0]["params"] == 512_000  # 512·1,000
    assert flat["totals"]["params"] == 25_088_000 and gap["totals"]["params"] == 512_000


# -- §5 recurrence ----------------------------------------------------------------------------


def test_lstm_and_gru_parameters(analyze: Callable) -> None:
    lstm = analyze("lstm_512")["totals"]["params"]
    gru = analyze("gru_512")["totals"]["params"]
    assert lstm == 2_099_200  # 4·524,800
    assert gru == 1_574_400  # 3·524,800
    assert gru * 4 == lstm * 3  # "25% fewer"


# -- §6 attention ---------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 32, 4096])
def test_attention_parameters_do_not_depend_on_heads(analyze: Callable, heads: int) -> None:
    report = analyze("mha_4096", "-D", f"heads={heads}")
    assert report["bindings"]["heads"] == heads
    assert _layers(report, "attention")[0]["attrs"]["heads"] == heads
    assert report["totals"]["params"] == 67_108_864  # 4·4,096²


# -- §15 parameter arithmetic: the 7B model -------------------------------------------------------


def test_transformer_7b_parameter_arithmetic(analyze: Callable) -> None:
    report = analyze("transformer_7b")
    blocks = [g for g in report["groups"] if g["name"].startswith("decoder.")]
    assert len(blocks) == 32
    assert {g["params"] for g in blocks} == {201_342_976}  # 12·d² + the two norms
    assert report["transformer"]["params_in_blocks"] == 6_442_975_232
    embedding = _layers(report, "embedding")[0]["params"]
    assert embedding == 524_288_000  # 128,000·4,096
    assert report["totals"]["params"] == 6_967_263_232  # tied embeddings
    assert round(100 * embedding / report["totals"]["params"], 1) == 7.5
    assert _layers(report, "unembed")[0]["shared_weights"] is True


def test_transformer_7b_compute_rules(analyze: Callable) -> None:
    t = analyze("transformer_7b")["transformer"]
    d = 4096
    # Rule 1: forward ≈ 2N (~14 GFLOPs/token), training ≈ 6N (~42 GFLOPs/token)
    assert abs(t["forward_vs_2n"] - 1) < 0.05 and abs(t["training_vs_6n"] - 1) < 0.05
    assert abs(t["flops_forward_per_token"] / 14e9 - 1) < 0.05
    assert abs(t["flops_training_per_token"] / 42e9 - 1) < 0.05
    # Rule 2: parameter matmuls 24·d² vs attention 4·n·d per token per layer, n = 6d
    assert t["matmul_flops_per_token_per_layer"] == 24 * d * d
    assert t["attention_flops_per_token_per_layer_per_key"] == 4 * d
    assert t["attention_crossover_tokens"] == 24_576


def test_transformer_7b_kv_cache(analyze: Callable) -> None:
    report = analyze("transformer_7b", "--context", "8192")
    totals = report["totals"]
    assert totals["kv_cache_bytes_per_token"] == 524_288  # 2·32·4,096·2 = 512 KiB
    assert totals["kv_cache_context_tokens"] == 8192
    assert totals["kv_cache_bytes"] == 4 * 2**30  # 4 GiB at 8k
    assert report["bindings"]["T"] == 8192


def test_gqa_and_mqa_kv_cache(analyze: Callable) -> None:
    gqa = analyze("transformer_7b_gqa", "--context", "8192")["totals"]
    mqa = analyze("transformer_7b_mqa")["totals"]
    assert gqa["kv_cache_bytes_per_token"] == 131_072  # 128 KiB
    assert gqa["kv_cache_bytes"] == 2**30  # 1 GiB at 8k
    assert mqa["kv_cache_bytes_per_token"] == 16_384
    assert 524_288 // gqa["kv_cache_bytes_per_token"] == 4 and 524_288 // mqa["kv_cache_bytes_per_token"] == 32


def test_llm_40x5120_blocks(analyze: Callable) -> None:
    t = analyze("llm_40x5120")["transformer"]
    assert t["layers"] == 40
    assert round(t["params_in_blocks"] / 1e9, 2) == 12.58  # 12·40·5,120² = 12,582,912,000


def test_swiglu_width_and_ffn_parameters(analyze: Callable) -> None:
    report = analyze("swiglu_7b")
    ffns = _layers(report, "swiglu")
    assert len(ffns) == 32
    assert {f["attrs"]["hidden"] for f in ffns} == {11_008}  # round_up(8·4,096/3, 256)
    assert {f["params"] for f in ffns} == {135_266_304}
    # LLaMA-7B as published (Touvron et al. 2023; Hugging Face LlamaForCausalLM): 6,738,415,616
    assert report["totals"]["params"] == 6_738_415_616


# -- §1 depth beats width ------------------------------------------------------------------------------


def test_fold_networks(analyze: Callable) -> None:
    shallow, deep, deep20 = analyze("fold_shallow"), analyze("fold_deep"), analyze("fold_deep20")
    assert shallow["totals"]["params"] == 3_070
    assert deep["totals"]["params"] == 61
    assert deep20["totals"]["params"] == 121
    assert round(3_070 / 61) == 50
    assert deep["relu_mlp"]["linear_regions_lower_bound"] == 1_024  # (2/1)^(1·9)·2^1
    assert deep["relu_mlp"]["fold_regions"] == 2**10
    assert deep20["relu_mlp"]["linear_regions_lower_bound"] == 2**20 == 1_048_576
    assert shallow["relu_mlp"]["linear_regions_lower_bound"] == 1_023  # (1023/1)^0·1023^1
    assert shallow["relu_mlp"]["one_layer_max_regions"] == 1_024  # w + 1
    assert deep20["relu_mlp"]["linear_regions_lower_bound_log10"] == round(20 * math.log10(2), 4)


def test_region_bound_past_a_thousand_digits_is_given_by_its_logarithm() -> None:
    """(3·10^6 / 3000)^3000 · (10^6)^3000 = 10^27,000: too long to print, so null and its log10."""
    from irc.analysis.regions import montufar_bound, montufar_log10

    assert montufar_log10(3000, [3_000_000, 1_000_000]) == pytest.approx(27_000)
    assert montufar_bound(3000, [3_000_000, 1_000_000]) is None
    assert montufar_bound(3, [300_000, 100_000]) == 10**30  # (10^5)^3 · (10^5)^3, exact
    assert montufar_bound(10**10, [300, 100]) == 0  # ⌊300/d_in⌋ = 0, without forming 100^(10^10)
