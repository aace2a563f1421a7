"""conv_direct.py's convolution (output positions broadcast, output channels in vector lanes, the weight in
panels of 48 output channels, the last one 16, 32 or 48 wide) against the NumPy reference in float64.

Shapes cross its boundaries: strides 2 and 3, dilation, padding explicit, 'same' and asymmetric (an even
kernel's odd one after), padding a whole output row reads, rectangular and even kernels, conv1d (H = 1);
output channels 16 to 100 (last panels of 16, 32 and 48, filled or ragged), input channels that end part-way
through a chunk of 16, output rows of 7 and of other widths (a row's last block part-way), batches of 1 to 3,
BatchNorm folded with a residual and ReLU. The kernel called directly with 1 to 7 threads, with and without a
residual, on work buffers that start as NaN: the same bits from every thread count. A NaN in the input reaches
exactly the outputs whose windows hold it (not those that only a row's last block reads past its end). The
selection: a weight known at load, no groups, more than one tap and at least 16 input channels.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference
from test_cpu_conv_taps import _bn_weights, _window

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import conv_direct
from irc.backends.cpu.render.conv import _conv_kernel
from irc.pipeline import run_passes

_ = cpu_cache

FAMILY = """
model direct_family(B) {
  input x: f32[B, 20, 15, 23]
  input c16: f32[B, 16, 12, 17]
  input deep: f32[B, 40, 9, 11]
  input seq: f32[B, 24, 37]
  output y_s2 = conv2d(x, 16, 3, stride=2, padding=1)
  output y_s3 = conv2d(x, 24, 3, stride=3)
  output y_dilated = conv2d(x, 32, 3, dilation=2, padding=2)
  output y_same_even = conv2d(x, 40, 4, padding=same)
  output y_rect = conv2d(x, 64, [3, 5], stride=[1, 2], padding=[2, 0])
  output y_even_s2 = conv2d(c16, 80, 2, stride=2, bias=false)
  output y_dilated_s2 = conv2d(c16, 17, 3, stride=2, dilation=2, padding=[1, 3])
  output y_pad = conv2d(c16, 24, 2, padding=2)
  output y_deep = conv2d(deep, 100, 5, padding=2)
  output y_1d = conv1d(seq, 48, 5, stride=2, padding=2)
}
"""


def _kernel_of(source: str) -> dict[str, str]:
    """Each driver step's value (``# %v = op ...`` up to the next step) -> the first kernel the step calls."""
    steps = re.findall(r"# %(\w+) = \w+[^\n]*\n(.*?)(?=\n    # %|\n    return )", source, re.S)
    return {v: m.group(1) for v, body in steps if (m := re.search(r"\b(k_\w+)\(", body))}


def _convs(graph) -> list:
    return [n for n in graph.nodes if n.op in ("conv1d", "conv2d")]


def _direct(module, node, w, x, want_shape, parts: int, res: np.ndarray | None = None) -> np.ndarray:
    """``node``'s convolution by k_conv_direct_none called directly, its weight packed by the module's helper,
    on a work buffer of the driver's size for ``parts`` threads that starts as NaN (plus ``res``, if given)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry = _window(node)
    src = x[node.inputs[0]]
    x4 = src if src.ndim == 4 else src[:, :, None, :]
    weight = w[f"{node.weights}.weight"]
    co, kk = weight.shape[0], weight[0].size
    bias = w.get(f"{node.weights}.bias", np.zeros(co, np.float32))
    out = np.full(want_shape, np.nan, np.float32)
    out4 = out.reshape(out.shape[0], co, -1, out.shape[-1])
    size = eval(conv_direct.work_size(geometry, x4.shape, out4.shape), {"get_num_threads": lambda: parts})
    work = np.full(size, np.nan, np.float32)
    rows = (out.shape[0], co, -1)
    module.k_conv_direct_none(x4, module.conv_direct_pack(weight, co, kk), bias,
                              (out if res is None else res).reshape(rows), out4, work, sh, sw, ph, pw, dh, dw, kh, kw,
                              int(res is not None), parts)
    return out


@pytest.mark.parametrize("b", [1, 2, 3])
def test_direct_convolutions_match_reference(b, cpu_cache):
    graph = build(FAMILY, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == ["k_conv_direct_none"]
    convs = _convs(graph)
    assert len(convs) == 10
    assert _kernel_of(compiled.source) == {n.outputs[0]: "k_conv_direct_none" for n in convs}
    assert_matches(compiled.run(w, x), reference(graph, w, x))


@pytest.mark.parametrize("b", [1, 3])
def test_every_thread_count_gives_the_same_bits(b, cpu_cache):
    """1 to 7 threads (bands of output rows that divide among them or not, more threads than units), with
    and without a residual in the epilogue: the reference's values, and each thread count the same bits."""
    graph = build(FAMILY, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    want = reference(graph, w, x)
    rng = np.random.default_rng(4)
    for node in _convs(graph):
        name = node.outputs[0]
        res = rng.standard_normal(want[name].shape).astype(np.float32)
        first = {}
        for parts in range(1, 8):
            got = {"plain": _direct(module, node, w, x, want[name].shape, parts),
                   "res": _direct(module, node, w, x, want[name].shape, parts, res)}
            assert_matches(got, {"plain": want[name], "res": want[name] + res})
            for k, v in got.items():
                assert np.array_equal(v, first.setdefault(k, v)), (name, parts, k)


FOLD = """
model direct_fold(B) {
  input x: f32[B, 24, 13, 11]
  input r: f32[B, 40, 7, 6]
  a = conv2d(x, 40, 3, stride=2, padding=1, bias=false)
  output y_res_relu = relu(batchnorm(a) + relu(r))
  output y_bn = batchnorm(conv2d(x, 52, [3, 2], stride=[2, 1], padding=[1, 0], bias=false))
}
"""


@pytest.mark.parametrize("b", [1, 2])
def test_folded_batchnorm_residual_and_relu(b, cpu_cache):
    """conv2d_bn through the direct product: the folded weight packed in panels and the folded bias, the
    residual added and ReLU in the epilogue (relu(r) dies at the add: the output may take its buffer)."""
    graph = build(FOLD, B=b)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    fused = [n for n in folded.nodes if n.op == "conv2d_bn"]
    assert len(fused) == 2 and sum(len(n.inputs) == 7 for n in fused) == 1
    w, x = _bn_weights(graph), random_inputs(graph)
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    assert {k for k in dir(compiled.module) if k.startswith("k_conv")} == {"k_conv_direct_relu", "k_conv_direct_none"}
    assert sorted(_kernel_of(compiled.source).values()) == ["k_conv_direct_none", "k_conv_direct_relu", "k_relu"]
    assert_matches(compiled.run(w, x), reference(graph, w, x), tol=1e-5)


def test_a_nan_reaches_the_outputs_whose_windows_hold_it(cpu_cache):
    """3×3/2 to 4×9 outputs: a row takes two blocks of 7 positions, the second's last 5 computed past the
    row's end (on input column 19 and the plane's padding) and not copied. A NaN there, one in an input row
    no window reads, and one at a corner: only the outputs whose windows hold a NaN are NaN, in every channel."""
    graph = build("""
model direct_nan(B) {
  input x: f32[B, 16, 10, 20]
  output y = conv2d(x, 40, 3, stride=2)
}
""", B=2)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert _kernel_of(compiled.source) == {"y": "k_conv_direct_none"}
    for at in ((0, 5, 4, 7), (1, 3, 2, 19), (1, 0, 9, 4), (1, 15, 0, 0)):
        x["x"][at] = np.nan
    got, want = compiled.run(w, x)["y"], reference(graph, w, x)["y"]
    mask = np.zeros(want.shape, bool)
    mask[0, :, 1:3, 3] = True  # input (4, 7): output rows 1 and 2 (input rows 2..6), column 3 (input 6..8)
    mask[1, :, 0, 0] = True
    assert np.array_equal(np.isnan(want), mask) and np.array_equal(np.isnan(got), mask)
    ok = ~mask
    assert np.abs(got[ok] - want[ok]).max() / np.abs(want[ok]).max() < 2e-5


SELECT = """
model direct_select(B) {
  input x: f32[B, 16, 14, 13]
  input few: f32[B, 15, 14, 13]
  input wide: f32[B, 32, 14, 13]
  input seq: f32[B, 16, 40]
  output d_3x3_s2 = conv2d(x, 24, 3, stride=2, padding=1)
  output d_1x3 = conv2d(x, 24, [1, 3], padding=[0, 1])
  output d_2x1 = conv2d(wide, 8, [2, 1])
  output d_5x5 = conv2d(wide, 16, 5, padding=2)
  output d_1d = conv1d(seq, 16, 3)
  output winograd = conv2d(wide, 16, 3, padding=1)
  output taps_1x1 = conv2d(x, 24, 1)
  output cols_1x1_s2 = conv2d(x, 24, 1, stride=2)
  output grouped = conv2d(wide, 32, 3, padding=1, groups=2)
  output depthwise = conv2d(wide, 32, 3, stride=2, padding=1, groups=32)
  output table_15 = conv2d(few, 24, 3, stride=2, padding=1)
}
"""


def test_the_direct_product_serves_ungrouped_convolutions_of_taps_on_16_channels(cpu_cache):
    """Compiled: every convolution of a weight known at load without groups, of more than one tap (a 1×3, a
    2×1, conv1d) on at least 16 channels takes it; 3×3s of stride 1 stay Winograd's, 1×1s the tap sum's or
    (strided) the gathered product's, grouped and depthwise ones the grouped kernel's, 15 channels the table's.
    A weight computed on every run (not packed) takes the tap sum."""
    graph = build(SELECT, B=1)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    kinds = _kernel_of(compiled.source)
    assert kinds == {"d_3x3_s2": "k_conv_direct_none", "d_1x3": "k_conv_direct_none",
                     "d_2x1": "k_conv_direct_none", "d_5x5": "k_conv_direct_none", "d_1d": "k_conv_direct_none",
                     "winograd": "k_winograd_none", "taps_1x1": "k_conv_taps_none",
                     "cols_1x1_s2": "k_conv_pointwise_none", "grouped": "k_conv2d", "depthwise": "k_conv2d",
                     "table_15": "k_conv_table_none"}
    w, x = random_weights(graph), random_inputs(graph)
    assert_matches(compiled.run(w, x), reference(graph, w, x))
    assert conv_direct.applies(16, 1, 2) and conv_direct.applies(512, 1, 49)
    assert not (conv_direct.applies(15, 1, 9) or conv_direct.applies(32, 2, 9) or conv_direct.applies(64, 1, 1))
    s2 = (3, 3, 2, 2, 1, 1, 1, 1)
    assert [_conv_kernel(ci, s2, nb, 7, 7, packed) for ci, nb, packed in
            ((16, 1, True), (16, 8, True), (16, 1, False), (15, 1, True))] == ["direct", "direct", "taps", "table"]
