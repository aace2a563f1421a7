"""Dense products on a weight packed once as 64-column panels of its transpose (gemm_panels.py), against NumPy
in float64: every split over 1 to 5 threads, by panels (x fits one block of rows) and by rows (several blocks),
with a partial last strip of rows and a partial last panel of columns (through the scratch block), K in one and
in several blocks of KC; every split giving the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, cpu_cache

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import gemm_panels
from irc.ir_parser import parse_ir
from irc.passes import PASSES

_ = cpu_cache

GEMM = """graph @g() {{
  %x = input : f32[{m},{k}]
  %w = param {{name=weight, shape=[{n}, {k}]}} : f32[{n},{k}] scope("fc")
  %b = param {{name=bias, shape=[{n}]}} : f32[{n}] scope("fc")
  %y = gemm %x, %w, %b {{act={act}}} : f32[{m},{n}]
  output y = %y
}}
"""


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


ACTS = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "gelu_tanh": _gelu_tanh}


def gemm_case(m: int, n: int, k: int, act: str, cache, seed: int = 5):
    """(compiled graph, x, w, b, the float64 NumPy result) of one dense layer with its weights as params."""
    graph = PASSES["shape-infer"](parse_ir(GEMM.format(m=m, n=n, k=k, act=act)))
    compiled = compile_graph(graph, cache_dir=cache)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    want = ACTS[act](x.astype(np.float64) @ w.T.astype(np.float64) + b)
    return compiled, x, w, b, want


def assert_every_split_matches(kernel, x: np.ndarray, wp: np.ndarray, b: np.ndarray, want: np.ndarray) -> None:
    """``kernel(x, wp, b, out, parts)`` matches ``want`` on 1 to 5 threads, with the same bits on each."""
    first = None
    for parts in range(1, 6):
        out = np.full(want.shape, np.nan, np.float32)
        kernel(x, wp, b, out, parts)
        assert_matches({"y": out}, {"y": want})
        if first is None:
            first = out
        else:  # every output is one chain of FMAs in K order, whoever computes it
            assert np.array_equal(out, first), f"{parts} threads changed the bits"


# (m, n, k): 17 rows (the first past gemm_stream's SMALL_M) with 7 panels, the last of 60 columns; 21 whole strips
# by 3 whole panels, K in 2 blocks of KC (256 + 74); 128 rows (a partial strip) by a whole and a partial panel,
# K = 3000 in 2 blocks of the L2 size (1792 + 1208); 40 rows by one panel (fewer panels than threads: by rows);
# 250 rows, K = 1100 in 2 blocks of the L2 size (1024 + 76)
@pytest.mark.parametrize("shape", [(17, 444, 40), (126, 192, 330), (128, 77, 3000), (40, 64, 129), (250, 70, 1100)])
@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh"])
def test_panel_gemm_every_split_matches_numpy(shape, act, cpu_cache):
    m, n, k = shape
    compiled, x, w, b, want = gemm_case(m, n, k, act, cpu_cache)
    module = compiled.module
    kernel = getattr(module, f"k_gemm_panels_{act}")
    wp = module.gemm_panels(w, 64)
    assert_every_split_matches(kernel, x, wp, b, want)


def test_panel_gemm_through_the_driver_and_its_limits(cpu_cache):
    """The driver derives the panels once per weights dict and calls the panel kernel from SMALL_M + 1 rows (1 to
    SMALL_M rows stream, test_cpu_gemm_stream.py) to ROWS_MAX; past ROWS_MAX rows BLAS, whatever the weight's
    size."""
    compiled, x, w, b, want = gemm_case(70, 130, 50, "relu", cpu_cache)
    assert "k_gemm_panels_relu(" in compiled.source and "gemm_panels(weights['fc.weight'], 64)" in compiled.source
    assert_matches(compiled.run({"fc.weight": w, "fc.bias": b}, {"x": x}), {"y": want})
    for rows, n, panels in ((gemm_panels.ROWS_MAX, 64, True), (gemm_panels.ROWS_MAX, 20000, True),
                            (gemm_panels.ROWS_MAX + 1, 64, False)):
        graph = PASSES["shape-infer"](parse_ir(GEMM.format(m=rows, n=n, k=64, act="none")))
        source = compile_graph(graph, cache_dir=cpu_cache).source
        assert ("k_gemm_panels_none(" in source) == panels, (rows, n)
        assert ("k_gemm_none(" in source) != panels, (rows, n)
    big, x, w, b, want = gemm_case(gemm_panels.ROWS_MAX + 1, 64, 8, "none", cpu_cache)
    assert_matches(big.run({"fc.weight": w, "fc.bias": b}, {"x": x}), {"y": want})
