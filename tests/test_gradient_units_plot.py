"""Dead rectifier units and the gradient plot of ``irc analyze --gradients`` (irc/analysis/dead_units.py,
irc/analysis/gradient_plot.py). Oracles: NumPy's count of the same pre-activations; the PNG signature.
The chapter's other gradient claims are tests/test_gradient_claims.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from irc.analysis.gradients import measure_gradients
from irc.pipeline import load_graph
from irc.runtime.init import init_weights

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gradients"
DEPTH = FIXTURES / "depth.arch"
PNG = b"\x89PNG\r\n\x1a\n"


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _batch(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n.outputs[0]: rng.standard_normal(tuple(n.types[0].shape)) for n in graph.inputs()}
    out["targets"] = rng.standard_normal(tuple(graph.value_types()[graph.outputs[0][1]].shape))
    return out


def _analyze(irc_cli, *args: str):
    return irc_cli(["analyze", str(DEPTH), "-D", "B=8", "--gradients", "--batches", "1", *args])


def _relu_mlp(bias: float, batch: int = 64):
    """depth.arch's 4-layer ReLU MLP at its He weights with every hidden bias set to ``bias``; (graph,
    weights, inputs)."""
    graph = load_graph(DEPTH, {"B": batch}, "relu_mlp")
    weights = init_weights(graph, 0)
    for i in range(4):
        weights[f"layer.{i}.fc.bias"][:] = bias
    return graph, weights, _batch(graph)


def _numpy_dead(weights: dict[str, np.ndarray], x: np.ndarray) -> list[tuple[int, float]]:
    """(dead units, fraction of pre-activations <= 0) per layer, the MLP's pre-activations computed in NumPy."""
    h, out = x.astype(np.float64), []
    for i in range(4):
        z = h @ weights[f"layer.{i}.fc.weight"].astype(np.float64).T + weights[f"layer.{i}.fc.bias"]
        out.append((int(np.sum(np.all(z <= 0, axis=0))), float(np.mean(z <= 0))))
        h = np.maximum(z, 0)
    return out


@pytest.mark.parametrize("bias, low, high", [(-10.0, 1.0, 1.0), (0.0, 0.0, 0.1)])
def test_dead_relu_units(bias: float, low: float, high: float) -> None:
    """Chapter: the rectifier's "dead units" (the record's class: zero for negative inputs). A unit whose
    pre-activation is <= 0 for every sample never trains. A ReLU MLP whose biases are -10 (He weights give
    pre-activations of sd ~1.4) is 100% dead in every layer; with zero biases at most 10% of a layer's units
    are dead over 64 samples. irc's counts equal NumPy's on the same pre-activations, unit for unit."""
    graph, weights, batch = _relu_mlp(bias)
    r = measure_gradients(graph, "mse", batches=1, weights=weights, inputs=batch)
    assert [x.layer for x in r.rectifiers] == [f"layer.{i}.relu" for i in range(4)]
    for row, (dead, nonpositive) in zip(r.rectifiers, _numpy_dead(weights, batch["x"])):
        assert row.op == "relu" and row.units == 64 and row.samples == 64 and row.value == row.layer[:-4] + "fc"
        assert row.dead == dead and _close(row.nonpositive_fraction, nonpositive, 1e-12), row.layer
        assert low <= row.dead_fraction <= high, (row.layer, row.dead_fraction)
    if bias < 0:  # a dead network passes no gradient to its hidden weights
        assert all(w.grad_norm == 0 for w in r.weights if w.key.startswith("layer.") and w.key.endswith("weight"))


def test_dead_units_accumulate_over_batches_and_follow_the_records(tmp_path: Path) -> None:
    """A unit is dead only if no batch makes it positive: over 3 batches (irc's own draws, rebuilt here from
    irc run's rule) the count is NumPy's over the 3 batches together. The layers counted are the rectifier
    ops by their records (relu, leaky_relu, relu6), not gelu or tanh."""
    from irc.analysis.gradients import batch_inputs, build_step
    from irc.ops.registry import ops_with

    path = tmp_path / "mixed.arch"
    path.write_text("model mixed(B) {\n  input x: f32[B, 8]\n  a = leaky_relu(linear(x, 64))\n"
                    "  b = gelu(linear(a, 8))\n  c = relu6(linear(b, 8))\n  output y = relu(linear(tanh(c), 4))\n}\n",
                    encoding="utf-8")
    graph = load_graph(path, {"B": 2})
    r = measure_gradients(graph, "mse", batches=3)
    assert [x.op for x in r.rectifiers] == ["leaky_relu", "relu6", "relu"]
    assert {x.op for x in r.rectifiers} == ops_with("rectifier") & {n.op for n in graph.nodes}
    assert all(x.samples == 6 for x in r.rectifiers)
    step = build_step(graph, "mse", [])
    xs = np.concatenate([batch_inputs(step, 0, b)["x"] for b in range(3)]).astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in init_weights(graph, 0).items()}
    pre = xs @ w["linear.weight"].T + w["linear.bias"]
    assert r.rectifiers[0].dead == int(np.sum(np.all(pre <= 0, axis=0)))
    assert r.rectifiers[0].dead < int(np.sum(np.all(pre[:2] <= 0, axis=0)))  # batch 0 alone would count more
    assert _close(r.rectifiers[0].nonpositive_fraction, float(np.mean(pre <= 0)), 1e-12)


def test_cli_table_lists_dead_units(irc_cli) -> None:
    res = _analyze(irc_cli, "--model", "relu_mlp")
    assert res.rc == 0, res.err
    assert "rectifiers: dead units (pre-activation ≤ 0 for all 8 samples" in res.out
    assert "layer.3.relu" in res.out


def test_cli_gradients_plot_writes_a_png(irc_cli, tmp_path: Path) -> None:
    png = tmp_path / "grad.png"
    res = _analyze(irc_cli, "--model", "sigmoid_plain", "--gradients-plot", str(png))
    assert res.rc == 0, res.err
    data = png.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR" and len(data) > 1000
    assert not [p for p in tmp_path.iterdir() if p.name != "grad.png"]  # no temporary left behind
    again = tmp_path / "again.png"
    assert _analyze(irc_cli, "--model", "sigmoid_plain", "--gradients-plot", str(again)).rc == 0
    assert again.read_bytes() == data  # deterministic: no timestamp or version in the file
    lstm = irc_cli(["analyze", str(FIXTURES / "lstm.arch"), "-D", "B=2", "-D", "T=8", "--gradients", "--batches", "1",
                    "--gradients-plot", str(tmp_path / "time.png")])
    assert lstm.rc == 0, lstm.err
    assert (tmp_path / "time.png").read_bytes()[:8] == PNG


def test_cli_gradients_plot_without_matplotlib(irc_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    png = tmp_path / "grad.png"
    res = _analyze(irc_cli, "--model", "relu_he", "--gradients-plot", str(png))
    assert res.rc == 2 and "irc[train]" in res.err and "matplotlib" in res.err, res.err
    assert "Traceback" not in res.err and not png.exists()


def test_cli_gradients_plot_needs_a_profile(irc_cli, tmp_path: Path) -> None:
    path = tmp_path / "one.arch"
    path.write_text("model one(B) {\n  input x: f32[B, 4]\n  output y = linear(x, 3)\n}\n", encoding="utf-8")
    res = irc_cli(["analyze", str(path), "-D", "B=2", "--gradients", "--gradients-plot", str(tmp_path / "g.png")])
    assert res.rc == 1 and "nothing" not in res.err and "no gradient norm against depth" in res.err, res.err


@pytest.mark.parametrize("args, words", [
    (["--loss", "mse"], "add --gradients"),
    (["--seed", "1"], "add --gradients"),
    (["--gradients-plot", "g.png"], "add --gradients"),
    (["--gradients", "--gradients-plot", ""], "file name is empty"),
    (["--gradients", "--format", "csv"], "table or JSON"),
    (["--gradients", "--batches", "0"], "at least 1"),
])
def test_cli_usage_errors(irc_cli, args: list[str], words: str) -> None:
    res = irc_cli(["analyze", str(DEPTH), "--model", "relu_he", *args])
    assert res.rc == 2 and words in res.err, res.err
