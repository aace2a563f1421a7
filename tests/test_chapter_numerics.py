"""The chapter's worked numbers (shared/seeds/000_*), computed by the numpy reference.

Each expected value is copied from the chapter's text, to the digits it prints.
"""

from __future__ import annotations

import numpy as np
import pytest

from irc.analysis.params import count_params
from irc.backends.numpy_ref import run_graph
from irc.backends.numpy_ref.elementwise import dropout_train
from irc.backends.numpy_ref.norm import batchnorm_train
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import expected_weights

# "A lookup, worked": the cat sat on, d_k = 4
Q_SAT = [1, 2, 0, 1]
KEYS = [[0, 0, 1, 0], [1, 2, 0, 1], [0, 1, 0, 1], [1, 0, 0, 0]]  # the, cat, sat, on
VALUES = [[0.1, 0.0, 0.2, 0.0], [0.9, 0.2, 0.1, 0.4], [0.2, 0.8, 0.0, 0.3], [0.0, 0.1, 0.7, 0.1]]
SAT = 2  # sat's position in "the cat sat on"


def lookup(values: list[list[float]], causal: bool = False, scale: float | None = None) -> np.ndarray:
    """sat's output row from the attention op: one head, q from x, k and v from kv = [keys | values].

    Identity projections pick the chapter's vectors out: wq = I, wk = [I 0], wv = [0 I], wo = I.
    Every query row is q_sat, so row SAT is sat's row at its own position (what the mask sees).
    """
    dv = len(values[0])
    extra = "" if scale is None else f", scale={scale}"
    graph = graph_from_source(
        f"model m() {{ input x: f32[1, 4, 4]; input kv: f32[1, 4, {4 + dv}]\n"
        f" output y = attention(x, kv, heads=1, head_dim=4, causal={str(causal).lower()}{extra}) }}")
    eye = np.eye(4, dtype=np.float32)
    weights = {"y.wq": eye, "y.wk": np.eye(4, 4 + dv, dtype=np.float32),
               "y.wv": np.eye(dv, 4 + dv, 4, dtype=np.float32), "y.wo": np.eye(4, dv, dtype=np.float32)}
    assert set(weights) == set(expected_weights(graph))
    x = np.array([[Q_SAT] * 4], np.float32)
    kv = np.concatenate([np.array([KEYS], np.float32), np.array([values], np.float32)], axis=-1)
    return run_graph(graph, weights, {"x": x, "kv": kv}, np.float64)["y"][0, SAT]


def test_sat_attention_weights_and_output():
    weights = lookup(np.eye(4).tolist())  # values = one-hot rows: the output is the weight row
    np.testing.assert_allclose(weights, [0.037, 0.738, 0.165, 0.061], atol=5e-4)
    np.testing.assert_allclose(lookup(VALUES), [0.701, 0.285, 0.124, 0.351], atol=5e-4)


def test_sat_causal_row():
    np.testing.assert_allclose(lookup(np.eye(4).tolist(), causal=True), [0.039, 0.786, 0.175, 0.0], atol=5e-4)
    assert lookup(np.eye(4).tolist(), causal=True)[3] == 0.0  # masked before the softmax: exactly zero


def test_sat_unscaled_row():
    np.testing.assert_allclose(lookup(np.eye(4).tolist(), scale=1.0), [0.002, 0.944, 0.047, 0.006], atol=5e-4)


# "The same 24 numbers, read two ways": B = 2, T = 3, D = 4
TABLE = [[[4, 1, -1, 4], [1, 0, 3, 0], [3, 0, 6, 3]],
         [[2, 2, 4, 0], [0, 3, 0, 1], [2, 0, 6, 4]]]


def _layernorm(x: np.ndarray) -> np.ndarray:
    graph = graph_from_source("model m() { input x: f32[2, 3, 4]\n output y = layernorm(x, affine=false) }")
    return run_graph(graph, {}, {"x": x})["y"]


@pytest.mark.parametrize("changed", [6, 12])
def test_layernorm_batchnorm_table(changed):
    x = np.array(TABLE, np.float32)
    x[0, 2, 2] = changed
    ln = _layernorm(x)[1, 0]
    bn = batchnorm_train(x, axis=-1)[1, 0]
    np.testing.assert_allclose(ln, [0.0, 0.0, 1.41, -1.41], atol=5e-3)
    expected_bn = [0.0, 0.87, 0.37, -1.15] if changed == 6 else [0.0, 0.87, 0.0, -1.15]
    np.testing.assert_allclose(bn, expected_bn, atol=5e-3)


def test_layernorm_of_untouched_example_is_bit_identical():
    before = np.array(TABLE, np.float32)
    after = before.copy()
    after[0, 2, 2] = 12
    assert np.array_equal(_layernorm(before)[1], _layernorm(after)[1])
    assert not np.array_equal(batchnorm_train(before, -1)[1], batchnorm_train(after, -1)[1])


def test_inverted_dropout_keeps_the_mean():
    """p = 0.1, x = 2.0: survivors are 2.222, the train-time average is the clean 2.0."""
    x = np.full(1_000_000, 2.0, np.float32)
    y = dropout_train(x, 0.1, np.random.default_rng(0))
    survivors = y[y != 0]
    np.testing.assert_allclose(survivors, 2.0 / 0.9, rtol=1e-6)
    assert abs((y == 0).mean() - 0.1) < 0.002
    # sd of one draw is 2.222·sqrt(0.9·0.1) = 0.667; over 10^6 draws the mean's sd is 0.00067
    assert abs(float(y.mean(dtype=np.float64)) - 2.0) < 0.003
    graph = graph_from_source("model m() { input x: f32[4]\n output y = dropout(x, p=0.1) }")
    assert np.array_equal(run_graph(graph, {}, {"x": x[:4]})["y"], x[:4])  # inference: the identity


# "The fold: why composing beats adding": |2x - 1| from two ReLUs, stacked 10 deep
FOLD = """model fold(N) {
  input x: f32[N, 1]
  block fold_layer(h) {
    return relu(linear(h, 2))
  }
  h = repeat(10) fold_layer(x)
  output y = linear(h, 1)
}
"""


def fold_weights(graph) -> dict[str, np.ndarray]:
    """relu(2x − 1), relu(1 − 2x) from x, then from the sum of the pair; the output adds the pair."""
    out = {}
    for key, shape in expected_weights(graph).items():
        if shape == (2, 1):
            out[key] = np.array([[2.0], [-2.0]], np.float32)
        elif shape == (2, 2):
            out[key] = np.array([[2.0, 2.0], [-2.0, -2.0]], np.float32)
        elif shape == (1, 2):
            out[key] = np.array([[1.0, 1.0]], np.float32)
        elif key.endswith(".bias") and shape == (2,):
            out[key] = np.array([-1.0, 1.0], np.float32)
        else:
            out[key] = np.zeros(shape, np.float32)
    return out


def count_pieces(x: np.ndarray, y: np.ndarray) -> int:
    slopes = np.diff(y) / np.diff(x)
    return 1 + int(np.count_nonzero(np.abs(np.diff(slopes)) > 1e-6 * np.abs(slopes).max()))


def test_fold_ten_deep_has_1024_pieces():
    n = 2**16 + 1
    graph = graph_from_source(FOLD, {"N": n})
    assert count_params(graph) == (61, 0)  # the chapter's "10 hidden layers, w=2: 61" parameters
    x = np.linspace(0.0, 1.0, n)
    y = run_graph(graph, fold_weights(graph), {"x": x[:, None].astype(np.float32)})["y"][:, 0]
    assert count_pieces(x, y) == 1024
    assert y.min() == 0.0 and y.max() == 1.0


def test_fold_tables():
    """One fold at x = 0, .25, .5, .75, 1 and two folds on the eighths, as the chapter tabulates."""
    def folds(depth: int, x: list[float]) -> np.ndarray:
        graph = graph_from_source(FOLD.replace("repeat(10)", f"repeat({depth})"), {"N": len(x)})
        return run_graph(graph, fold_weights(graph), {"x": np.array(x, np.float32)[:, None]})["y"][:, 0]

    np.testing.assert_array_equal(folds(1, [0, 0.25, 0.5, 0.75, 1]), [1.0, 0.5, 0.0, 0.5, 1.0])
    np.testing.assert_array_equal(folds(2, [i / 8 for i in range(9)]), [1, 0.5, 0, 0.5, 1, 0.5, 0, 0.5, 1])
