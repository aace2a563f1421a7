"""irc → ONNX → irc: a model exported by irc and read back by irc's ONNX frontend keeps its parameters,
its multiply-adds and its outputs (issue 14, item 4).

The oracles are the original graph's own numbers (parameter count from the op records, which the zoo
test holds to the published counts) and ONNX Runtime on the exported file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from irc.analysis.analyze import Options, analyze_graph
from irc.analysis.bindings import default_bindings
from irc.backends.numpy_ref.interpreter import interpret
from irc.backends.onnx import write_file
from irc.frontends.onnx.importer import onnx_weights
from irc.pipeline import load_graph
from irc.runtime.init import init_weights
from irc.runtime.inputs import random_inputs

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "mlp": {"B": 3},
    "resnet18": {"B": 2, "H": 32, "W": 32},
    "mobilenet_v2": {"B": 1, "H": 32, "W": 32},
    "efficientnet_b0": {"B": 1, "H": 32, "W": 32},
    "densenet121": {"B": 1, "H": 32, "W": 32},
}


def _counts(graph):
    analysis = analyze_graph(graph, default_bindings(graph, dict(graph.bindings), None), Options())
    return analysis.totals["params"], analysis.totals["macs_forward"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_then_import_keeps_params_macs_and_outputs(name: str, tmp_path: Path) -> None:
    graph = load_graph(ROOT / "models" / f"{name}.arch", CASES[name])
    weights = init_weights(graph, 0)
    rng = np.random.default_rng(1)
    for key, value in weights.items():  # batch-norm statistics off their defaults, so they are exercised
        if key.endswith(("running_mean", "running_var", "gain", "bias")):
            weights[key] = (value + rng.uniform(0.1, 0.5, value.shape)).astype(np.float32)
    path = tmp_path / f"{name}.onnx"
    npz = tmp_path / "w.npz"
    np.savez(npz, **weights)
    write_file(graph, str(path), str(npz))
    back = load_graph(path)
    assert _counts(back) == _counts(graph)
    inputs = random_inputs(graph, 0, {})
    want = interpret(graph, weights, inputs, np.float64)
    got = interpret(back, onnx_weights(path, back), inputs, np.float64)
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = runtime.run(None, {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in inputs.items()})
    for (label, ref), theirs in zip(want.items(), ort_out):
        mine = got[next(iter(got))] if len(got) == 1 else got[label]
        scale = np.abs(ref).max()
        assert np.abs(mine - ref).max() / scale < 1e-9, label  # the same float64 arithmetic, both graphs
        assert np.abs(theirs - ref).max() / scale < 1e-5, label
