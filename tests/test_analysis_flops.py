"""FLOP and MAC counts: the per-op table is complete, and its numbers match the formulas
(written out here independently) and PyTorch's own FLOP counter."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from irc.analysis.flops import MATMUL_KINDS
from irc.diagnostics import IrcError
from irc.ops import OPS


def _write(tmp_path: Path, text: str, name: str = "m.arch") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def analyze(irc_cli: Callable) -> Callable[..., dict[str, Any]]:
    def run(path: Path, *args: str) -> dict[str, Any]:
        result = irc_cli(["analyze", str(path), "--json", *args])
        assert result.rc == 0, result.err
        return json.loads(result.out)
    return run


def _kind(report: dict[str, Any], op: str, kind: str) -> int:
    return sum(layer["flops_forward_by_kind"].get(kind, 0) for layer in report["layers"] if layer["op"] == op)


def test_an_op_without_a_formula_is_an_error_not_zero(tmp_path: Path, irc_cli: Callable,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from irc.analysis.analyze import Options, analyze_graph, load_for_analysis

    path = _write(tmp_path, "model m(B) {\n  input x: f32[B, 4]\n  output y = relu(x)\n}\n")
    import dataclasses

    monkeypatch.setitem(OPS, "relu", dataclasses.replace(OPS["relu"], cost=None))
    graph, bindings = load_for_analysis(path, {}, None, None)
    with pytest.raises(IrcError, match="no FLOP formula for op 'relu'") as info:
        analyze_graph(graph, bindings, Options())
    assert info.value.loc is not None and info.value.loc.line == 3
    result = irc_cli(["analyze", str(path)])
    assert result.rc == 1 and "no FLOP formula" in result.err and "Traceback" not in result.err


def test_linear_and_matmul_kinds_are_twice_the_macs(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B, T) {
  input x: f32[B, T, 64]
  h = linear(x, 96)
  a = attention(h, heads=4, causal=true)
  output y = ffn(a, hidden=128)
}
""")
    report = analyze(path, "-D", "B=2", "-D", "T=10")
    products = sum(report["flops_forward_by_kind"][k] for k in MATMUL_KINDS)
    assert products == 2 * report["totals"]["macs_forward"]
    b, t = 2, 10
    assert _kind(report, "linear", "linear") == 2 * b * t * 64 * 96
    assert _kind(report, "linear", "elementwise") == b * t * 96  # the bias add
    assert _kind(report, "ffn", "linear") == 2 * b * t * (96 * 128 + 128 * 96)


def test_attention_counts_both_matmuls_and_the_exact_causal_triangle(analyze: Callable, tmp_path: Path) -> None:
    text = "model m(B, T) {{\n  input x: f32[B, T, 256]\n  output y = attention(x, heads=8, causal={})\n}}\n"
    b, t, d = 3, 12, 256
    full = analyze(_write(tmp_path, text.format("false"), "full.arch"), "-D", f"B={b}", "-D", f"T={t}")
    causal = analyze(_write(tmp_path, text.format("true"), "causal.arch"), "-D", f"B={b}", "-D", f"T={t}")
    # Q·Kᵀ and ·V: 2 matmuls × 2 FLOPs × d per (query, key) pair = 4·n·d per token
    assert full["flops_forward_by_kind"]["attention"] == 4 * d * b * t * t
    triangle = sum(i + 1 for i in range(t))  # query i sees keys 0..i
    assert causal["flops_forward_by_kind"]["attention"] == 4 * d * b * triangle
    # projections: 4 matrices d×d
    assert full["flops_forward_by_kind"]["linear"] == 2 * 4 * d * d * b * t


def test_cross_attention_and_gqa_projections(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B, T, S) {
  input x: f32[B, T, 64]
  input mem: f32[B, S, 32]
  output y = attention(x, mem, heads=8, kv_heads=2)
}
""")
    report = analyze(path, "-D", "T=5", "-D", "S=7")
    hd = 64 // 8
    q_and_o = 2 * 5 * 64 * 64
    k_and_v = 2 * 7 * 32 * (2 * hd)
    assert report["flops_forward_by_kind"]["linear"] == 2 * (q_and_o + k_and_v)
    assert report["flops_forward_by_kind"]["attention"] == 4 * 8 * hd * 5 * 7
    assert report["totals"]["kv_cache_cross_bytes"] == 2 * 7 * 2 * hd * 2  # K and V of 7 keys, fp16


def test_recurrent_layers_cost_per_step_times_steps(analyze: Callable, tmp_path: Path) -> None:
    d, h, t = 24, 16, 9
    for op, gates in (("lstm", 4), ("gru", 3), ("rnn", 1)):
        text = f"model m(B, T) {{\n  input x: f32[B, T, {d}]\n  y = {op}(x, {h})\n  output o = y\n}}\n"
        path = _write(tmp_path, text, f"{op}.arch")
        report = analyze(path, "-D", f"T={t}")
        per_step = gates * (d * h + h * h)  # the chapter's weight count without biases
        assert report["flops_forward_by_kind"]["linear"] == 2 * per_step * t, op
        assert report["totals"]["macs_forward"] == per_step * t, op


def test_training_is_three_times_forward_for_pure_products(analyze: Callable) -> None:
    report = analyze(Path(__file__).resolve().parents[1] / "models" / "seed" / "flatten_head.arch")
    totals = report["totals"]
    assert totals["flops_forward"] == 2 * 25_088 * 1_000
    assert totals["flops_training"] == 3 * totals["flops_forward"]


def test_conv_pool_linear_and_attention_matmuls_match_torch_flop_counter(analyze: Callable, tmp_path: Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    path = _write(tmp_path, """
model m(B) {
  input image: f32[B, 3, 32, 32]
  c1 = conv2d(image, 16, 3, stride=2, padding=1)
  c2 = conv2d(relu(c1), 32, 3, padding=1, groups=4, dilation=1)
  p = flatten(maxpool2d(c2, 2))
  output y = linear(p, 10)
}
""")
    report = analyze(path, "-D", "B=2")
    x = torch.randn(2, 3, 32, 32)
    with FlopCounterMode(display=False) as counter:
        h = F.conv2d(x, torch.randn(16, 3, 3, 3), torch.randn(16), stride=2, padding=1)
        h = F.conv2d(F.relu(h), torch.randn(32, 4, 3, 3), torch.randn(32), padding=1, groups=4)
        h = F.max_pool2d(h, 2).flatten(1)
        F.linear(h, torch.randn(10, h.shape[1]), torch.randn(10))
    assert report["flops_forward_by_kind"]["linear"] == counter.get_total_flops()

    # attention's two matmuls, as torch counts the explicit products (B, heads, T, d_head)
    b, t, heads, d = 2, 6, 4, 32
    text = f"model a(B, T) {{\n  input x: f32[B, T, {d}]\n  output y = attention(x, heads={heads})\n}}\n"
    attn = _write(tmp_path, text, "a.arch")
    report = analyze(attn, "-D", f"B={b}", "-D", f"T={t}")
    xs = torch.randn(b, t, d)
    with FlopCounterMode(display=False) as counter:
        q, k, v = (F.linear(xs, torch.randn(d, d)).view(b, t, heads, d // heads).transpose(1, 2) for _ in range(3))
        probs = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, t, d)
        F.linear(ctx, torch.randn(d, d))
    kinds = report["flops_forward_by_kind"]
    assert kinds["linear"] + kinds["attention"] == counter.get_total_flops()
