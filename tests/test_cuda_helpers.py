"""Shared set-up for the cuda backend tests (this module holds no tests).

Every CUDA test runs in numba's CUDA simulator, switched on here before anything imports
numba.cuda (pytest imports the test modules, and so this one, before running any test).
The simulator runs each CUDA thread as a Python thread: sizes stay tiny, and two patches
from the backend make it usable: ``simfast`` (barriers without busy polling) and
``simwarp`` (an emulation of ``shfl_xor_sync``, so the GPU's warp-shuffle path runs too).

Expected values come from the NumPy reference interpreter in float64 or from NumPy
formulas, never from the cuda backend itself. What the cpu backend tests share with these
is in :mod:`backend_cases`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from backend_cases import random_inputs, random_weights, reference, shared_temp

from irc.backends.cuda import simfast, simwarp
from irc.backends.cuda.device import use_simulator

__all__ = ["CUDA", "TOLERANCE", "assert_close", "check_graph", "cuda_cache", "poisoned", "random_inputs",
           "random_weights", "reference", "rel_error"]

CUDA = use_simulator()
simfast.install()
simwarp.install()

TOLERANCE = 1e-5  # ‖out − ref‖ / ‖ref‖ (normwise, 2-norm), float32 kernels against float64


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), "NaN in the output: an element was never written, or 0·inf"
    want = np.asarray(want, np.float64)
    scale = float(np.linalg.norm(want)) or 1.0
    return float(np.linalg.norm(got.astype(np.float64) - want)) / scale


def assert_close(got: np.ndarray, want: np.ndarray, tol: float = TOLERANCE) -> None:
    err = rel_error(got, want)
    assert err <= tol, f"relative error {err:.3e} > {tol:g}"


def poisoned(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """An output buffer full of NaN: any element a kernel fails to write shows."""
    return np.full(shape, np.nan, dtype)


def check_graph(compiled, graph, seed: int = 0, tol: float = TOLERANCE, id_bound: int = 8) -> dict[str, float]:
    """Run on fresh random weights and inputs; every output within ``tol`` of the reference."""
    w, x = random_weights(graph, seed), random_inputs(graph, seed + 1, id_bound)
    got = compiled.run(w, x)
    want = reference(graph, w, x)
    assert sorted(got) == sorted(want)
    errors = {label: rel_error(got[label], want[label]) for label in want}
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"outputs off the reference (relative error > {tol}): {bad}"
    return errors


@pytest.fixture(scope="session")
def cuda_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the session: a module generated twice is written once."""
    return shared_temp(tmp_path_factory) / "irc-cuda-cache"
