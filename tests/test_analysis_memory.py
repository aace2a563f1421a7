"""Memory: weight bytes per dtype, activation liveness, saved activations, KV cache and recurrent state.

Expected values are worked out by hand from the model text (sizes × bytes, which buffers
are alive at each step), or quoted from the chapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SEED = Path(__file__).resolve().parents[1] / "models" / "seed"


@pytest.fixture
def analyze(irc_cli: Callable) -> Callable[..., dict[str, Any]]:
    def run(path: Path | str, *args: str) -> dict[str, Any]:
        result = irc_cli(["analyze", str(path), "--json", *args])
        assert result.rc == 0, result.err
        return json.loads(result.out)
    return run


def _write(tmp_path: Path, text: str, name: str = "m.arch") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("dtype, width", [("f32", 4), ("bf16", 2), ("f16", 2), ("int8", 1)])
def test_weight_bytes_follow_the_dtype(analyze: Callable, dtype: str, width: int) -> None:
    totals = analyze(SEED / "lstm_512.arch", "--dtype", dtype)["totals"]
    assert totals["weight_bytes"] == 2_099_200 * width


def test_a_chain_holds_two_buffers_at_its_peak(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, "model m(B) {\n  input x: f32[B, 1000]\n  output y = relu(tanh(relu(x)))\n}\n")
    totals = analyze(path)["totals"]
    one = 1000 * 4
    assert totals["activation_bytes"] == 4 * one  # x and three results
    assert totals["peak_activation_bytes"] == 2 * one  # each op's input and its result
    assert totals["saved_activation_bytes_backward"] == 4 * one


def test_a_residual_keeps_its_input_alive(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 256]
  a = relu(x)
  b = tanh(a)
  output y = x + b
}
""")
    totals = analyze(path, "--act-dtype", "f16")["totals"]
    one = 256 * 2
    assert totals["peak_activation_bytes"] == 3 * one  # x stays live across a and b


def test_views_do_not_allocate(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, "model m(B) {\n  input x: f32[B, 4, 8, 8]\n  output y = relu(flatten(x))\n}\n")
    report = analyze(path)
    one = 4 * 8 * 8 * 4
    assert report["totals"]["activation_bytes"] == 2 * one
    assert [layer["activation_bytes"] for layer in report["layers"]] == [one, 0, one]


def test_attention_peak_includes_its_score_matrix(analyze: Callable, tmp_path: Path) -> None:
    b, t, d, heads = 2, 16, 32, 4
    text = f"model m(B, T) {{\n  input x: f32[B, T, {d}]\n  output y = attention(x, heads={heads})\n}}\n"
    path = _write(tmp_path, text)
    totals = analyze(path, "-D", f"B={b}", "-D", f"T={t}")["totals"]
    x = b * t * d
    q_k_v_context = 4 * x
    scores = b * heads * t * t
    assert totals["peak_activation_bytes"] == 4 * (x + x + q_k_v_context + scores)  # input, result, intermediates
    assert totals["saved_activation_bytes_backward"] == 4 * (x + x + q_k_v_context + scores)


@pytest.mark.parametrize("kv_dtype, width", [("f32", 4), ("f16", 2), ("bf16", 2), ("int8", 1)])
def test_kv_cache_follows_kv_dtype(analyze: Callable, kv_dtype: str, width: int) -> None:
    totals = analyze(SEED / "transformer_7b.arch", "--kv-dtype", kv_dtype)["totals"]
    assert totals["kv_cache_bytes_per_token"] == 2 * 32 * 4096 * width  # 2·L·d_kv·bytes


def test_kv_cache_scales_with_batch_and_context(analyze: Callable) -> None:
    totals = analyze(SEED / "transformer_7b_gqa.arch", "-D", "B=4", "--context", "2048")["totals"]
    assert totals["kv_cache_bytes"] == 131_072 * 2048 * 4


MISTRAL = Path(__file__).resolve().parents[1] / "models" / "mistral_7b.arch"


def test_sliding_window_caps_the_kv_cache(analyze: Callable) -> None:
    """Mistral 7B's rolling buffer: 32 layers × 2 × 8 KV heads × 128 × 2 B = 128 KiB per token, held
    for at most 4,096 tokens. Its paper: at 32k tokens this "reduces the cache memory usage by 8x"."""
    short = analyze(MISTRAL, "-D", "T=16", "--context", "4096")["totals"]
    long = analyze(MISTRAL, "-D", "T=16", "--context", "32768")["totals"]
    assert long["kv_cache_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert long["kv_cache_window_tokens"] == 4096
    assert short["kv_cache_bytes"] == long["kv_cache_bytes"] == 131_072 * 4096  # 512 MiB
    assert long["kv_cache_bytes"] * 8 == 131_072 * 32768  # 8× less than a full cache


def test_sliding_window_attention_flops_count_the_visible_keys(analyze: Callable, tmp_path: Path) -> None:
    """Q·Kᵀ and ·V over the (query, key) pairs the mask keeps, counted by brute force here."""
    import numpy as np

    t, s_len, window, heads, hd = 300, 300, 37, 4, 8
    path = _write(tmp_path, f"model m() {{ input x: f32[1, {t}, {heads * hd}]\n"
                            f" output y = attention(x, heads={heads}, causal=true, window={window}) }}")
    rows = analyze(path)["layers"]
    attention = next(r for r in rows if r["op"] == "attention")
    j, i = np.arange(s_len)[None, :], np.arange(t)[:, None]
    pairs = int(((j <= i) & (j > i - window)).sum())
    assert attention["flops_forward_by_kind"]["attention"] == 2 * 2 * pairs * heads * hd


def test_an_encoder_caches_nothing(analyze: Callable) -> None:
    totals = analyze(SEED / "mha_4096.arch")["totals"]  # non-causal self-attention
    assert totals["kv_cache_bytes_per_token"] == 0 and totals["kv_cache_bytes"] == 0


def test_recurrent_state_is_fixed_whatever_the_length(analyze: Callable) -> None:
    short = analyze(SEED / "lstm_512.arch", "-D", "T=16")["totals"]
    long = analyze(SEED / "lstm_512.arch", "-D", "T=4096")["totals"]
    assert short["recurrent_state_bytes"] == long["recurrent_state_bytes"] == 2 * 512 * 4  # h and c
    assert short["kv_cache_bytes_per_token"] == 0


def test_per_token_figures_do_not_depend_on_batch(analyze: Callable) -> None:
    one = analyze(SEED / "transformer_7b.arch", "-D", "T=128")["totals"]
    four = analyze(SEED / "transformer_7b.arch", "-D", "T=128", "-D", "B=4")["totals"]
    assert four["flops_forward"] == 4 * one["flops_forward"]
    assert four["flops_forward_per_token"] == one["flops_forward_per_token"]
    assert four["tokens"] == 4 * 128
