"""Receptive field and jump through strides, dilation, non-square kernels and branches.

Expected values come from the chapter's recurrence worked by hand in each test
(r += (k − 1)·j with the incoming j, then j *= s; branches take the larger r).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def analyze(irc_cli: Callable) -> Callable[..., dict[str, Any]]:
    def run(path: Path, *args: str) -> dict[str, Any]:
        result = irc_cli(["analyze", str(path), "--json", *args])
        assert result.rc == 0, result.err
        return json.loads(result.out)
    return run


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.arch"
    path.write_text(text, encoding="utf-8")
    return path


def _by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {layer["name"]: layer for layer in report["layers"]}


def test_a_projected_residual_takes_the_larger_field(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 8, 32, 32]
  a = conv2d(x, 8, 3, stride=2, padding=1)
  b = conv2d(relu(a), 8, 3, padding=1)
  short = conv2d(x, 8, 1, stride=2)
  output y = relu(b + short)
}
""")
    layers = _by_name(analyze(path))
    assert (layers["a"]["receptive_field"], layers["a"]["jump"]) == (3, 2)  # 1 + 2·1, 1·2
    assert (layers["b"]["receptive_field"], layers["b"]["jump"]) == (7, 2)  # 3 + 2·2
    assert (layers["short"]["receptive_field"], layers["short"]["jump"]) == (1, 2)
    assert (layers["y"]["receptive_field"], layers["y"]["jump"]) == (7, 2)  # max(7, 1), jumps agree


def test_the_larger_field_wins_whichever_branch_holds_it(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 4, 16, 16]
  a = conv2d(x, 4, 3, padding=1)
  wide = conv2d(x, 4, 9, padding=4)
  output y = concat(a, wide, axis=1)
}
""")
    assert _by_name(analyze(path))["y"]["receptive_field"] == 9


def test_non_square_kernels_report_one_value_per_axis(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 1, 40, 40]
  a = conv2d(x, 2, [3, 5], stride=[1, 2])
  output y = maxpool2d(a, 2)
}
""")
    layers = _by_name(analyze(path))
    assert layers["a"]["receptive_field"] == [3, 5] and layers["a"]["jump"] == [1, 2]
    assert layers["y"]["receptive_field"] == [4, 7] and layers["y"]["jump"] == [2, 4]  # + (2−1)·j


def test_pools_use_their_kernel_as_stride_and_flatten_ends_tracking(analyze: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 3, 32, 32]
  p = avgpool2d(x, 4)
  c = conv2d(p, 8, 3, dilation=2)
  output y = linear(flatten(c), 10)
}
""")
    layers = _by_name(analyze(path))
    assert (layers["p"]["receptive_field"], layers["p"]["jump"]) == (4, 4)
    assert (layers["c"]["receptive_field"], layers["c"]["jump"]) == (4 + 4 * 4, 4)  # k_eff = 2·2 + 1 = 5
    assert layers["y"]["receptive_field"] is None


def test_branches_with_different_jumps_are_an_error(irc_cli: Callable, tmp_path: Path) -> None:
    path = _write(tmp_path, """
model m(B) {
  input x: f32[B, 4, 224, 224]
  pooled = maxpool2d(x, 2)
  wide = conv2d(x, 4, 113)
  output y = pooled + wide
}
""")
    result = irc_cli(["analyze", str(path)])
    assert result.rc == 1
    assert "different jumps" in result.err and "m.arch:6:" in result.err
    assert "Traceback" not in result.err


def test_sequence_models_have_no_receptive_field(irc_cli: Callable) -> None:
    root = Path(__file__).resolve().parents[1]
    report = json.loads(irc_cli(["analyze", str(root / "models/seed/lstm_512.arch"), "--json"]).out)
    assert report["receptive_field"] is None
    assert all(layer["receptive_field"] is None for layer in report["layers"])
