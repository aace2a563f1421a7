"""GEMV-like dense products (1 to SMALL_M rows) streaming a weight packed once as panels of its transpose
(gemm_stream.py), against NumPy in float64: each panel width (128 columns for one row, then 64, 48, 32, 16 for
2-6, 7-8, 9-12 and 13-16 rows), a partial last panel (through the scratch block), every split over 1 to 5
threads giving the same bits, and the driver's choice of kernel at 1, 2, SMALL_M and SMALL_M + 1 rows."""

from __future__ import annotations

import pytest
from test_cpu_backend_helpers import assert_matches, cpu_cache
from test_cpu_gemm_panels import assert_every_split_matches, gemm_case

from irc.backends.cpu.render import gemm_stream
from irc.backends.cpu.render.gemm import SMALL_M

_ = cpu_cache


def test_panel_width_keeps_the_block_in_registers():
    assert [gemm_stream.width(m) for m in (1, 2, 6, 7, 8, 9, 12, 13, 16)] == [128, 64, 64, 48, 48, 32, 32, 16, 16]


# (m, n, k): 1 row by 2 panels of 128 and a partial one of 44 columns, K odd; 2 rows by 3 panels of 64 and a
# partial one of 7 columns; 8 rows by 48-column panels, 5 whole ones
# (fewer than some thread counts); 12 rows by one partial panel only (n < 32); 16 rows, K long (3000)
@pytest.mark.parametrize("shape", [(1, 300, 77), (2, 199, 70), (8, 240, 129), (12, 20, 33), (16, 100, 3000),
                                   (5, 64, 1)])
@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh"])
def test_stream_gemm_every_split_matches_numpy(shape, act, cpu_cache):
    m, n, k = shape
    compiled, x, w, b, want = gemm_case(m, n, k, act, cpu_cache, seed=11)
    module = compiled.module
    kernel = getattr(module, f"k_gemm_stream{m}_{act}")
    wp = module.gemm_panels(w, gemm_stream.width(m))
    assert_every_split_matches(kernel, x, wp, b, want)


@pytest.mark.parametrize(("rows", "kernel"), [(1, "k_gemm_stream1_relu("), (2, "k_gemm_stream2_relu("),
                                              (SMALL_M, f"k_gemm_stream{SMALL_M}_relu("),
                                              (SMALL_M + 1, "k_gemm_panels_relu(")])
def test_driver_picks_the_stream_kernel_from_one_row_to_small_m(rows, kernel, cpu_cache):
    """The driver derives the panels once per weights dict at the width the rows need; more than SMALL_M rows
    take the 64-column panel kernel."""
    compiled, x, w, b, want = gemm_case(rows, 130, 50, "relu", cpu_cache, seed=11)
    assert kernel in compiled.source
    if gemm_stream.applies(rows, SMALL_M):
        assert f"gemm_panels(weights['fc.weight'], {gemm_stream.width(rows)})" in compiled.source
    assert_matches(compiled.run({"fc.weight": w, "fc.bias": b}, {"x": x}), {"y": want})
