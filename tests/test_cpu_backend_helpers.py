"""Shared helpers for the cpu backend tests (this module holds no tests); what the cuda
backend tests share with them is in :mod:`backend_cases`.

Expected values come from the NumPy reference interpreter run in float64, or from NumPy
formulas written out in the tests — never from the cpu backend itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from backend_cases import build, random_inputs, random_weights, reference, shared_temp

__all__ = ["TINY", "TOLERANCE", "assert_matches", "build", "cpu_cache", "random_inputs", "random_weights",
           "reference", "rel_error", "tiny_case"]

TOLERANCE = 2e-5  # normwise: max |cpu - ref| / max |ref|, float32 kernels against a float64 reference


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
    return shared_temp(tmp_path_factory) / "irc-cpu-cache"


# the cache tests' model: two cheap kernels, a linear layer and a ReLU
TINY = """
model tiny(B) {
  input x: f32[B, 6]
  output y = relu(linear(x, 5))
}
"""


def tiny_case() -> tuple:
    """(graph, weights, inputs) of TINY at B = 3."""
    graph = build(TINY, B=3)
    return graph, random_weights(graph), random_inputs(graph)
