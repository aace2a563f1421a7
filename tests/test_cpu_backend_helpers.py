"""Shared helpers for the cpu backend tests (this module holds no tests).

Expected values come from the NumPy reference interpreter run in float64, or from NumPy
formulas written out in the tests — never from the cpu backend itself.
"""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
import pytest

from irc.analysis.params import weight_table
from irc.graph import Graph
from irc.runtime.graphs import graph_from_source

TOLERANCE = 2e-5  # normwise: max |cpu - ref| / max |ref|, float32 kernels against a float64 reference


def build(source: str, **bindings: int) -> Graph:
    return graph_from_source(source, bindings or None)


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay near unit size (1/sqrt(fan-in) for matrices)."""
    rng = np.random.default_rng(seed)
    params, buffers = weight_table(graph)
    out: dict[str, np.ndarray] = {}
    for key, shape in sorted({**params, **buffers}.items()):
        shape = tuple(int(d) for d in shape)
        if key.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            a = rng.standard_normal(shape) / np.sqrt(prod(shape[1:]))
        else:
            a = rng.standard_normal(shape) * 0.5
        out[key] = a.astype(np.float32)
    return out


def random_inputs(graph: Graph, seed: int = 1, id_bound: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for node in graph.inputs():
        shape = tuple(int(d) for d in node.type.shape)
        if node.type.is_float:
            out[node.outputs[0]] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[node.outputs[0]] = rng.integers(0, id_bound, shape).astype(np.int32)
    return out


def reference(graph: Graph, weights: dict, inputs: dict) -> dict[str, np.ndarray]:
    from irc.backends.numpy_ref import run_graph

    return run_graph(graph, weights, inputs, np.float64)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), "non-finite values in the cpu backend's output"
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want))) / scale


def assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = TOLERANCE) -> None:
    assert sorted(got) == sorted(want)
    errors = {label: rel_error(got[label], want[label]) for label in want}
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"outputs off the reference (normwise relative error > {tol}): {bad}"


@pytest.fixture(scope="session")
def cpu_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session, so a graph compiled twice compiles once."""
    return tmp_path_factory.getbasetemp() / "irc-cpu-cache"
