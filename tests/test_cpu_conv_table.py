"""conv_table.py's convolution (few input channels, K over every tap read through a table of phase-plane
offsets, no im2col) against the NumPy reference in float64.

Shapes cross its boundaries: strides 1, 2 and 3 and a rectangular one, dilation, rectangular and even kernels,
1 and 15 input channels (16 take conv_direct.py's product), output channels that end part-way through a 6-row
strip, conv1d (H = 1), a batch, BatchNorm folded with a residual and ReLU; and, calling the kernel directly,
every thread count from 1 to 7 with blocks of 64 to 512 positions on work buffers that start as NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference
from test_cpu_conv_taps import _bn_weights  # BatchNorm statistics and affine terms far from the identity

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import conv_direct, conv_table, conv_taps
from irc.pipeline import run_passes

_ = cpu_cache

FAMILY = """
model table_family(B) {
  input rgb: f32[B, 3, 45, 41]
  input gray: f32[B, 1, 40, 36]
  input many: f32[B, 15, 30, 28]
  input seq: f32[B, 4, 300]
  output y_stem = conv2d(rgb, 16, 7, stride=2, padding=3)
  output y_5x5 = conv2d(rgb, 10, 5, padding=2)
  output y_dilated = conv2d(gray, 7, 5, dilation=2, padding=4)
  output y_rect = conv2d(rgb, 13, [3, 5], stride=[1, 2], padding=[1, 2])
  output y_even_s3 = conv2d(rgb, 6, 4, stride=3, bias=false)
  output y_15 = conv2d(many, 20, 3, stride=2, padding=1)
  output y_1d = conv1d(seq, 8, 5, stride=2, padding=2)
}
"""


@pytest.mark.parametrize("b", [1, 2])
def test_table_convolutions_match_reference(b, cpu_cache):
    graph = build(FAMILY, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    # in a batch, maps under 256 outputs (the stride 3, the 15 channels, conv1d) take one panel of the batch
    kernels = ["k_conv_table_none"] if b == 1 else ["k_conv_cols_none", "k_conv_table_none"]
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == kernels
    assert_matches(compiled.run(w, x), reference(graph, w, x))


def test_sixteen_channels_take_the_direct_product(cpu_cache):
    """The boundary: from conv_taps.MIN_CHANNELS channels (conv_direct.MIN_CHANNELS too) a convolution of a
    weight known at load leaves the table for conv_direct.py's product, and a grid wider than 5/4 of the output
    row (a 9×9 window on a 13-wide map) goes to the exact panel."""
    assert conv_direct.MIN_CHANNELS == conv_taps.MIN_CHANNELS == 16
    graph = build("""
model table_edges(B) {
  input x: f32[B, 16, 30, 28]
  input rgb: f32[B, 3, 20, 20]
  output y = conv2d(x, 8, 3, stride=2, padding=1)
  output y_wide = conv2d(rgb, 8, 9, padding=4, stride=3)
}
""", B=1)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == ["k_conv_cols_none", "k_conv_direct_none"]
    w, x = random_weights(graph), random_inputs(graph)
    assert_matches(compiled.run(w, x), reference(graph, w, x))


FOLD = """
model table_fold(B) {
  input rgb: f32[B, 3, 33, 31]
  input r: f32[B, 12, 17, 16]
  a = conv2d(rgb, 12, 3, stride=2, padding=1, bias=false)
  output y_res_relu = relu(batchnorm(a) + relu(r))
  output y_bn = batchnorm(conv2d(rgb, 9, 5, padding=2, bias=false))
}
"""


@pytest.mark.parametrize("b", [1, 2])
def test_folded_batchnorm_residual_and_relu(b, cpu_cache):
    """conv2d_bn through the table kernel: the folded weight and bias, the residual added and ReLU in the
    epilogue (the residual's buffer may be the output's: each element is read before it is written)."""
    graph = build(FOLD, B=b)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    assert sum(n.op == "conv2d_bn" for n in folded.nodes) == 2
    w, x = _bn_weights(graph), random_inputs(graph)
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    assert {k for k in dir(compiled.module) if k.startswith("k_conv")} == {"k_conv_table_relu", "k_conv_table_none"}
    assert_matches(compiled.run(w, x), reference(graph, w, x), tol=1e-5)


@pytest.mark.parametrize("b", [1, 3])
def test_every_thread_count_and_block_gives_the_same_convolution(b, cpu_cache):
    """The kernel called directly: 1 to 7 threads (more threads than blocks, too), blocks of 64 to 512 grid
    positions (a block's last rows cut part-way, one block past a whole image), output channels filling their
    last strip or not. Work buffers start as NaN, so a temporary read before it is written shows."""
    graph = build(FAMILY, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    want = reference(graph, w, x)
    cases = {"y_stem": ("rgb", 2, 3, 7, 1), "y_5x5": ("rgb", 1, 2, 5, 1), "y_dilated": ("gray", 1, 4, 5, 2)}
    for name, (src, s, p, k, d) in cases.items():
        co, ci = want[name].shape[1], x[src].shape[1]
        kk = ci * k * k
        ap = module.gemm_pack6(np.ascontiguousarray(w[f"{name}.weight"].reshape(co, kk)), co, kk)
        strips = (co + 5) // 6
        for parts in range(1, 8):
            for pb in (64, 128, 256, 512):
                out = np.full(want[name].shape, np.nan, np.float32)
                work = np.full(b * s * s * ci * 60 * 60 + conv_table.SLACK + parts * strips * 6 * pb, np.nan,
                               np.float32)
                module.k_conv_table_none(x[src], ap.reshape(strips * 6, kk), w[f"{name}.bias"],
                                         out.reshape(b, co, -1), out, work, ap, s, s, p, p, d, d, k, k, 0, pb, parts)
                assert_matches({name: out}, {name: want[name]})
