"""The cpu backend's gemm kernel split both ways over 1 to 5 parts, against NumPy (float64): by rows when x has
at least as many rows as the weight (or the product is too narrow to split its columns), else by columns
(each thread packing its share of the weight once). The weight is an input of the graph, a value known only at
run time, so it goes through BLAS rather than the panels packed once per weights dict (test_cpu_gemm_panels.py)."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, cpu_cache

from irc.backends.cpu import compile_graph
from irc.ir_parser import parse_ir
from irc.passes import PASSES

_ = cpu_cache

GEMM = """graph @g() {{
  %x = input : f32[{m},{k}]
  %w = input : f32[{n},{k}]
  %b = param {{name=bias, shape=[{n}]}} : f32[{n}] scope("fc")
  %y = gemm %x, %w, %b {{act={act}}} : f32[{m},{n}]
  output y = %y
}}
"""


# (m, n, k): rows (m >= n), columns (m < n), rows because too narrow to split (n < 64 per part); and columns
# of a few rows (m <= SMALL_M: dot_nt reads the weight directly, 4 weight rows at a time by passes of 4 rows of x
# and one pass of the 3, 2 or 1 left), with m and n such that every pass and remainder loop runs, and one row past
# SMALL_M (back to BLAS)
@pytest.mark.parametrize("shape", [(300, 200, 17), (70, 430, 19), (9, 100, 23), (1, 1001, 768), (3, 643, 7),
                                   (8, 1030, 768), (16, 517, 33), (17, 700, 40), (6, 515, 31), (2, 130, 700)])
@pytest.mark.parametrize("act", ["relu", "none"])
def test_gemm_every_split_matches_numpy(shape, act, cpu_cache):
    """Every block starts as the bias and BLAS adds its product in place (beta = 1); the activation, when there
    is one, is a pass of its own over the block."""
    m, n, k = shape
    graph = PASSES["shape-infer"](parse_ir(GEMM.format(m=m, n=n, k=k, act=act)))
    module = compile_graph(graph, cache_dir=cpu_cache).module
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    want = np.maximum(want, 0) if act == "relu" else want
    kernel = getattr(module, f"k_gemm_{act}")
    for parts in range(1, 6):
        out = np.full((m, n), np.nan, np.float32)
        kernel(x, w, b, out, parts)
        assert_matches({"y": out}, {"y": want})
