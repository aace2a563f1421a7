"""Numerical edge cases on every CPU-side backend: fully masked attention rows, constant rows
in LayerNorm, softmax at ±1e4, long recurrences, and NaN/Inf that --check must report."""

from __future__ import annotations

import numpy as np
import pytest

from irc.backends import get_backend
from irc.passes import PASSES
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights

BACKENDS = ["numpy", "cpu"]


def _run(backend: str, source: str, inputs: dict[str, np.ndarray], fuse: bool = False, weights=None):
    graph = graph_from_source(source)
    if fuse:
        graph = PASSES["fuse"](graph)
    weights = weights if weights is not None else init_weights(graph, seed=0)
    return get_backend(backend).compile(graph).run(weights, inputs), weights


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fuse", [False, True])
def test_fully_masked_attention_row_is_zero_not_nan(backend: str, fuse: bool) -> None:
    # causal cross-attention with T > S: top-left alignment leaves query rows with keys, but
    # a bias of -inf on every key of row 0 masks that row entirely (through sdpa's bias input)
    src = """
    model m() {
      input q: f32[1, 2, 3, 4]
      input k: f32[1, 2, 5, 4]
      input v: f32[1, 2, 5, 4]
      input bias: f32[1, 1, 3, 5]
      output y = sdpa(q, k, v, bias, scale=0.5, causal=true)
    }
    """
    rng = np.random.default_rng(0)
    bias = np.zeros((1, 1, 3, 5), np.float32)
    bias[..., 0, :] = -np.inf
    inputs = {"q": rng.standard_normal((1, 2, 3, 4)).astype(np.float32),
              "k": rng.standard_normal((1, 2, 5, 4)).astype(np.float32),
              "v": rng.standard_normal((1, 2, 5, 4)).astype(np.float32), "bias": bias}
    out, _ = _run(backend, src, inputs, fuse)
    y = out["y"]
    assert np.all(np.isfinite(y))
    assert np.all(y[0, :, 0] == 0)
    assert np.any(y[0, :, 1] != 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layernorm_of_constant_rows_is_the_bias(backend: str) -> None:
    src = "model m() { input x: f32[4, 16]\n output y = layernorm(x) }"
    x = np.full((4, 16), 3.25, np.float32)
    x[1] = -1e6
    rng = np.random.default_rng(3)
    weights = {"y.gain": rng.standard_normal(16).astype(np.float32),
               "y.bias": rng.standard_normal(16).astype(np.float32)}
    out, w = _run(backend, src, {"x": x}, weights=weights)
    assert np.all(np.isfinite(out["y"]))
    np.testing.assert_array_equal(out["y"], np.broadcast_to(weights["y.bias"], (4, 16)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_at_large_logits(backend: str) -> None:
    src = "model m() { input x: f32[3, 4]\n output y = softmax(x) }"
    x = np.array([[1e4, -1e4, 0, 1e4], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4 - 1, 0, 0]], np.float32)
    out, _ = _run(backend, src, {"x": x})
    y = out["y"]
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(y[0], [0.5, 0, 0, 0.5], atol=1e-7)
    np.testing.assert_allclose(y[1], [0.25] * 4, rtol=1e-6)
    e = np.exp(np.float64(-1))
    np.testing.assert_allclose(y[2, :2], [1 / (1 + e), e / (1 + e)], rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["rnn", "lstm", "gru"])
def test_long_recurrence_stays_finite_and_matches(backend: str, op: str) -> None:
    src = f"model m() {{ input x: f32[2, 2000, 8]\n output y = {op}(x, 16) }}"
    x = np.random.default_rng(1).standard_normal((2, 2000, 8)).astype(np.float32) * 3
    graph = graph_from_source(src)
    weights = init_weights(graph, seed=0)
    out = get_backend(backend).compile(graph).run(weights, {"x": x})
    ref = get_backend("numpy").compile(graph).run(weights, {"x": x})
    assert np.all(np.isfinite(out["y"]))
    np.testing.assert_allclose(out["y"], ref["y"], atol=2e-5)


def test_check_reports_nan_instead_of_a_match(tmp_path, irc_cli) -> None:
    model = tmp_path / "m.arch"
    model.write_text("model m() { input x: f32[2, 4]\n output y = relu(x) }\n")
    x = np.array([[1, np.nan, 2, 3], [0, 1, np.inf, 2]], np.float32)
    np.save(tmp_path / "x.npy", x)
    result = irc_cli(["run", str(model), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}", "--check"])
    assert result.rc == 1
    text = (result.out + result.err).lower()
    assert "nan" in text
