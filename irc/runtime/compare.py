"""How two runs of one model are compared: a normwise relative error, and non-finite values.

``rel_error(a, ref) = max|a − ref| / max|ref|`` — the largest deviation measured against the
output's own scale (the ∞-norm), so values near zero do not inflate it the way an
elementwise relative error would. This is the definition ``--check`` and the oracle tests use.
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 20  # elements compared at a time: the float64 scratch stays a few MiB for any output size


def rel_error(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = np.asarray(a), np.asarray(ref)
    if a.shape != ref.shape:
        raise ValueError(f"shapes differ: {a.shape} and {ref.shape}")
    if a.size == 0:
        return 0.0
    fa, fr = a.reshape(-1), ref.reshape(-1)
    scale = diff = 0.0
    for start in range(0, fa.size, CHUNK):  # in chunks: whole-array float64 temporaries cost 6x the output
        r64 = fr[start:start + CHUNK].astype(np.float64)
        a64 = fa[start:start + CHUNK].astype(np.float64)
        s, d = float(np.max(np.abs(r64))), float(np.max(np.abs(a64 - r64)))
        if np.isnan(s) or np.isnan(d):  # a NaN anywhere is no match (Python's max() would drop it)
            return float("nan")
        scale, diff = max(scale, s), max(diff, d)
    return diff / scale if scale > 0 else diff


def nonfinite(a: np.ndarray) -> str | None:
    """'3 NaN, 1 Inf' when ``a`` holds any, else None."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc":
        return None
    flat = a.reshape(-1)
    nan = sum(int(np.count_nonzero(np.isnan(flat[i:i + CHUNK]))) for i in range(0, flat.size, CHUNK))
    inf = sum(int(np.count_nonzero(np.isinf(flat[i:i + CHUNK]))) for i in range(0, flat.size, CHUNK))
    if not nan and not inf:
        return None
    return ", ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)


def reference_errors(graph, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                     expected: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Run the numpy reference in float32 and float64; each output's rel_error against ``expected``.

    ``expected`` comes from an independent implementation computed in float64 (PyTorch, or
    NumPy written from the chapter's equations): the float32 error measures the reference
    as users run it, the float64 one its semantics with rounding taken out.
    """
    from irc.backends.numpy_ref import run_graph

    f32 = run_graph(graph, weights, inputs, np.float32)
    f64 = run_graph(graph, weights, inputs, np.float64)
    return {label: (rel_error(f32[label], want), rel_error(f64[label], want)) for label, want in expected.items()}
