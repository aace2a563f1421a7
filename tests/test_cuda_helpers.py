"""Shared set-up for the cuda backend tests (this module holds no tests).

Every CUDA test runs in numba's CUDA simulator, switched on here before anything imports
numba.cuda (pytest imports the test modules, and so this one, before running any test).
The simulator runs each CUDA thread as a Python thread: sizes stay tiny, and two patches
from the backend make it usable: ``simfast`` (barriers without busy polling) and
``simwarp`` (an emulation of ``shfl_xor_sync``, so the GPU's warp-shuffle path runs too).

Expected values come from the NumPy reference interpreter in float64 or from NumPy
formulas, never from the cuda backend itself.
"""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
import pytest

from irc.backends.cuda import simfast, simwarp
from irc.backends.cuda.device import use_simulator

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


def random_weights(graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay near unit size (1/sqrt(fan-in) for matrices)."""
    from irc.analysis.params import weight_table

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


def random_inputs(graph, seed: int = 1, id_bound: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for node in graph.inputs():
        shape = tuple(int(d) for d in node.type.shape)
        if node.type.is_float:
            out[node.outputs[0]] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[node.outputs[0]] = rng.integers(0, id_bound, shape).astype(np.int32)
    return out


def reference(graph, weights: dict, inputs: dict) -> dict[str, np.ndarray]:
    from irc.backends.numpy_ref import run_graph

    return run_graph(graph, weights, inputs, np.float64)


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
    return tmp_path_factory.getbasetemp() / "irc-cuda-cache"
