"""F(4×4, 3×3) Winograd on the cpu backend: its matrices against the definition of a 1-D correlation, in exact
rational arithmetic; the kernel against NumPy's convolution in float64 on maps that cut tiles at the right and
at the bottom, every thread split, products by BLAS or by register blocks; and where it is chosen, a
ResNet basic block with BatchNorm folded, the shortcut added and ReLU in the epilogue.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import winograd, winograd_f43
from irc.backends.numpy_ref.conv import conv
from irc.pipeline import run_passes

_ = cpu_cache


def test_matrices_compute_a_correlation_exactly():
    """y = Aᵀ·((G·g) ⊙ (Bᵀ·d)) must be y_i = Σ_k g_k·d_{i+k} for every g and d: the trilinear identity
    Σ_j Aᵀ[i, j]·G[j, k]·Bᵀ[j, l] = [l = i + k], checked in exact fractions."""
    at, g, bt = winograd_f43.AT, winograd_f43.G, winograd_f43.BT
    for i in range(4):
        for k in range(3):
            for col in range(6):
                total = sum(Fraction(at[i][j]) * Fraction(g[j][k]) * Fraction(bt[j][col]) for j in range(6))
                assert total == (1 if col == i + k else 0), (i, k, col, total)


F43_MODEL = """
model f43(B) {
  input x: f32[B, 128, 24, 24]
  output y = conv2d(x, 130, 3, padding=1)
}
"""


def test_kernel_is_chosen_for_wide_channels_on_maps_of_multiples_of_4(cpu_cache):
    """128 channels in, 130 out, a 24×24 map: F(4×4, 3×3) (36 tiles at B = 1); the result is the reference's."""
    assert winograd.variant((3, 3), (1, 1), (1, 1), 1, 1, 128, 130, 24, 24) is winograd.F43
    assert winograd.variant((3, 3), (1, 1), (1, 1), 1, 1, 64, 64, 56, 56) is winograd.F23
    assert winograd.variant((3, 3), (1, 1), (1, 1), 1, 2, 64, 64, 56, 56) is winograd.F43
    assert winograd.variant((3, 3), (1, 1), (1, 1), 1, 8, 256, 256, 14, 14) is winograd.F23
    graph = build(F43_MODEL, B=1)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert "k_winograd_f43_none(" in compiled.source
    assert_matches(compiled.run(w, x), reference(graph, w, x))


@pytest.mark.parametrize(("b", "h", "w"), [(1, 13, 11), (3, 9, 16), (2, 4, 5)])
def test_every_split_with_cut_tiles(b, h, w, cpu_cache):
    """The kernel called directly on other shapes than it was compiled for: cut tiles at the right and at the
    bottom, runs of positions across images, 1 to 5 parts (by chunks of tiles, or by output channels), the
    products by BLAS on [36, out, in] or by register blocks on 6-row strips (14 channels: a partial strip),
    with and without a residual: each is NumPy's convolution plus bias (plus the residual)."""
    graph = build(F43_MODEL, B=1)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    rng = np.random.default_rng(b * 100 + h)
    ci, co = 8, 14
    x = rng.standard_normal((b, ci, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, ci, 3, 3)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(co).astype(np.float32)
    res = rng.standard_normal((b, co, h, w)).astype(np.float32)
    want = conv(x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), 1, 1, 1, 1)
    u = module.winograd_f43_filter(wt, co, ci)
    ap = module.gemm_pack6(u, co, ci)
    for parts in range(1, 6):
        for packed in (0, 1):
            for has_res in (0, 1):
                out = np.full((b, co, h, w), np.nan, np.float32)
                module.k_winograd_f43_none(x, ap.reshape(36, 18, ci) if packed else u, ap, bias, res.reshape(b, co, -1),
                                           out, 1, 1, has_res, packed, parts)
                assert_matches({"y": out}, {"y": want + res if has_res else want})


BLOCK = """
use "resnet.arch"
model wide_block(B, C, H, W) {
  input x: f32[B, C, H, W]
  output y = basic(x, C)
}
"""


def test_folded_basic_block_on_128_channels(cpu_cache):
    """A ResNet basic block of 128 channels on 16×16 maps at B = 2 (32 tiles of 4×4): both convolutions
    BatchNorm-folded into F(4×4, 3×3), the second adding the shortcut before its ReLU; within 1e-5 of the
    unfolded graph in the float64 reference."""
    from test_cpu_conv import _bn_weights

    graph = build(BLOCK, B=2, C=128, H=16, W=16)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    assert [n.op for n in folded.nodes].count("conv2d_bn") == 2
    w, x = _bn_weights(graph), random_inputs(graph)
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    calls = compiled.source.count("k_winograd_f43_relu(") - compiled.source.count("def k_winograd_f43_relu(")
    assert calls == 2
    assert_matches(compiled.run(w, x), reference(graph, w, x), tol=1e-5)
