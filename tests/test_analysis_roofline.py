"""`irc analyze --hardware`: bytes moved per op, arithmetic intensity, roofline times, prefill and decode.

Oracles: the roofline model (Williams et al. 2009: time = max(FLOPs / peak, bytes / bandwidth));
Llama-2-7B's 6,738,415,616 parameters (Hugging Face), whose fp16 decode at batch 1 must take at
least its weight bytes over the memory bandwidth (every weight is read once per token) and not
much more; the data-sheet numbers of the shipped table (H100 SXM: 3.35 TB/s, 989.4 TFLOP/s bf16).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from irc.analysis.hardware import TABLE, load_table

ROOT = Path(__file__).resolve().parents[1]
LLAMA = str(ROOT / "models" / "llama2_7b.arch")
LLAMA_PARAMS = 6_738_415_616


def _perf(irc_cli: Callable, *args: str) -> dict:
    result = irc_cli(["analyze", *args, "--json"])
    assert result.rc == 0, result.err
    return json.loads(result.out)


def test_shipped_table_has_the_data_sheet_numbers() -> None:
    table = load_table()
    assert {"h100-sxm", "h200", "a100-sxm", "mi300x", "epyc-9654"} <= set(table)
    assert table["h100-sxm"].memory_bandwidth == 3.35e12 and table["h100-sxm"].peak["bf16"] == 989.4e12
    assert table["h200"].memory_bandwidth == 4.8e12 and table["a100-sxm"].peak["bf16"] == 312e12
    assert TABLE.name == "hardware.toml"


def test_llama2_decode_is_bounded_by_its_weight_bytes(irc_cli: Callable) -> None:
    report = _perf(irc_cli, LLAMA, "--hardware", "h100-sxm", "--precision", "fp16", "-D", "T=512")
    decode = report["performance"]["decode"]
    weights = LLAMA_PARAMS * 2
    floor = weights / 3.35e12
    assert decode["weight_bytes"] == weights  # every weight read once per step (the head is untied)
    assert decode["bound"] == "memory" and decode["batch"] == 1
    assert floor <= decode["time_s"] <= 1.05 * (weights + decode["kv_cache_bytes"]) / 3.35e12
    assert decode["tokens_per_s"] == pytest.approx(1 / decode["time_s"])
    # KV cache read at context 512: 2 · 32 layers · 4,096 · 2 bytes per cached token
    assert decode["kv_cache_bytes"] == 2 * 32 * 4096 * 2 * 512


def test_prefill_is_compute_bound_and_at_least_2n_flops_per_token(irc_cli: Callable) -> None:
    p = _perf(irc_cli, LLAMA, "--hardware", "h100-sxm", "--precision", "bf16", "-D", "T=2048")["performance"]
    prefill = p["prefill"]
    assert prefill["bound"] == "compute" and prefill["tokens"] == 2048
    assert prefill["time_s"] >= 2 * LLAMA_PARAMS * 2048 / 989.4e12


def test_efficiency_factors_change_the_result(irc_cli: Callable) -> None:
    base = _perf(irc_cli, LLAMA, "--hardware", "h100-sxm", "--precision", "bf16", "-D", "T=2048")["performance"]
    slow_mem = _perf(irc_cli, LLAMA, "--hardware", "h100-sxm", "--precision", "bf16", "-D", "T=2048",
                     "--bandwidth-efficiency", "0.5")["performance"]
    slow_flops = _perf(irc_cli, LLAMA, "--hardware", "h100-sxm", "--precision", "bf16", "-D", "T=2048",
                       "--compute-efficiency", "0.5")["performance"]
    assert slow_mem["decode"]["time_s"] == pytest.approx(2 * base["decode"]["time_s"], rel=0.02)
    assert slow_flops["prefill"]["time_s"] == pytest.approx(2 * base["prefill"]["time_s"], rel=0.05)
    assert slow_flops["hardware"]["compute_efficiency"] == 0.5


def test_bytes_moved_per_op(irc_cli: Callable, tmp_path: Path) -> None:
    path = tmp_path / "m.arch"
    path.write_text("model m(B) {\n  input x: f32[B, 8]\n  h = linear(x, 16)\n  r = reshape(h, [B, 4, 4])\n"
                    "  output y = relu(r)\n}\n", encoding="utf-8")
    layers = {x["op"]: x for x in _perf(irc_cli, str(path), "-D", "B=2")["layers"]}
    lin = layers["linear"]
    assert lin["bytes_weights"] == (8 * 16 + 16) * 4  # W and b, f32
    assert lin["bytes_read"] == 2 * 8 * 4 + lin["bytes_weights"] and lin["bytes_written"] == 2 * 16 * 4
    assert lin["arithmetic_intensity"] == round(lin["flops_forward"] / (lin["bytes_read"] + lin["bytes_written"]), 4)
    assert layers["reshape"]["bytes_read"] == layers["reshape"]["bytes_written"] == 0  # a view moves nothing
    assert layers["relu"]["bytes_read"] == layers["relu"]["bytes_written"] == 2 * 16 * 4


def test_a_tied_head_reads_the_table_again(irc_cli: Callable) -> None:
    layers = _perf(irc_cli, str(ROOT / "models" / "gpt2_small.arch"), "-D", "T=8")["layers"]
    head = next(x for x in layers if x["op"] == "unembed")
    assert head["params"] == 0 and head["bytes_weights"] == 50257 * 768 * 4


def test_table_columns_and_roofline_lines(irc_cli: Callable) -> None:
    result = irc_cli(["analyze", LLAMA, "--hardware", "h100-sxm", "--precision", "bf16", "--depth", "1"])
    assert result.rc == 0, result.err
    out = result.out
    assert "FLOP/B" in out and "bound" in out
    assert "  prefill  " in out and "-bound" in out.split("  prefill  ")[1].splitlines()[0]
    decode = out.split("  decode   ")[1].splitlines()[0]
    assert "tokens/s" in decode and "memory-bound" in decode


def test_custom_hardware_file_and_errors(irc_cli: Callable, tmp_path: Path) -> None:
    table = tmp_path / "hw.toml"
    table.write_text('[toy]\nname = "toy"\nmemory = 1e9\nmemory_bandwidth = 1e9\ninterconnect = 1e9\n'
                     'compute_efficiency = 1\nbandwidth_efficiency = 1\npeak = { f32 = 1e12 }\n', encoding="utf-8")
    small = str(ROOT / "models" / "mlp.arch")
    report = _perf(irc_cli, small, "--hardware", "toy", "--hardware-file", str(table))
    weights = 266_610 * 4  # LeNet-300-100's parameters (Han et al. 2015), f32, read once
    assert report["performance"]["prefill"]["time_s"] >= weights / 1e9
    assert report["performance"]["decode"] is None
    r = irc_cli(["analyze", small, "--hardware", "h100"])
    assert r.rc == 2 and "h100-sxm" in r.err
    r = irc_cli(["analyze", small, "--hardware", "h100-sxm", "--compute-efficiency", "1.5"])
    assert r.rc == 2 and "(0, 1]" in r.err
