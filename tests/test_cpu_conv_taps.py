"""The GEMM convolutions of the cpu backend against the NumPy reference in float64: the tap sum (conv_taps.py:
a GEMM per tap read in place from phase planes) and the exact im2col panel (conv_cols.py: the few-channel
stem and small maps, where the tap sum's grid would waste columns). Every input of the family has at least
conv_taps.MIN_CHANNELS channels or a stride, so every convolution here that is not a 3×3 of stride 1 takes
one of the two, or, for a weight known at load of more than one tap, conv_direct.py's product
(test_cpu_conv_direct.py): the tap sum then still serves weights computed on every run, and is called
directly on those shapes here.

Shapes cross their boundaries: strides 2 and 3 (phase planes, some unread: a 1×1 of stride 2 reads one of
four), padding on every side, dilation, rectangular and even kernels, windows wider than the map, 1×1 of
stride 1 without padding (the input read as its own plane), 1×1 grids written in place, an odd batch (work
split inside images), maps too small to split by positions (split by output channels), the panel of the
whole batch and tiles of it, conv1d, and the fold-bn pass's conv2d_bn with residual and ReLU, including
weights computed on every run.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import conv_taps
from irc.backends.cpu.render.conv import _pads, _pair, _spatial
from irc.pipeline import run_passes

_ = cpu_cache

FAMILY = """
model taps_family(B) {
  input x: f32[B, 20, 23, 19]
  input small: f32[B, 32, 9, 9]
  input seq: f32[B, 16, 29]
  output y_3x3_s2 = conv2d(x, 24, 3, stride=2, padding=1, bias=false)
  output y_1x1_s2 = conv2d(x, 17, 1, stride=2)
  output y_1x1 = conv2d(x, 9, 1)
  output y_1x1_padded = conv2d(x, 9, 1, padding=1, stride=[2, 3])
  output y_7x7_s2 = conv2d(x, 8, 7, stride=2, padding=3)
  output y_5x5 = conv2d(x, 8, 5, padding=2)
  output y_dilated = conv2d(x, 8, 3, dilation=2, padding=2)
  output y_dilated_s2 = conv2d(x, 8, 3, dilation=2, stride=2, padding=1)
  output y_rect = conv2d(x, 6, [3, 5], stride=[1, 3], padding=[2, 0])
  output y_same_even = conv2d(x, 5, 4, padding=same)
  output y_wide = conv2d(x, 7, 9, padding=4, stride=3)
  output y_valid_s3 = conv2d(x, 7, 3, stride=3)
  output y_small_s2 = conv2d(small, 40, 3, stride=2, padding=1)
  output y_small_1x1 = conv2d(small, 40, 1, stride=2)
  output y_1d = conv1d(seq, 12, 3, stride=2, padding=1)
  input rgb: f32[B, 3, 30, 26]
  output y_stem = conv2d(rgb, 16, 7, stride=2, padding=3)
}
"""


def _window(node) -> tuple[int, ...]:
    """(kh, kw, sh, sw, ph, pw, dh, dw) of a conv2d or conv1d node (1-D as 2-D with H = 1)."""
    nd = 2 if node.op == "conv2d" else 1
    k, s, d = (_pair(node.attrs[key], nd) for key in ("kernel", "stride", "dilation"))
    pads = _pads(node.attrs["padding"], k, d, nd)
    return (*_spatial(nd, k, 1), *_spatial(nd, s, 1), *_spatial(nd, pads, 0), *_spatial(nd, d, 1))


def _tap_sum(module, node, w, x, want_shape, parts: int) -> np.ndarray:
    """``node``'s convolution by k_conv_taps_none called directly: its weight in (ki, kj, c) order, on a work
    buffer of the driver's size for ``parts`` threads that starts as NaN."""
    kh, kw, sh, sw, ph, pw, dh, dw = geometry = _window(node)
    src = x[node.inputs[0]]
    x4 = src if src.ndim == 4 else src[:, :, None, :]
    weight = w[f"{node.weights}.weight"]
    co, ci = weight.shape[:2]
    wt = np.ascontiguousarray(weight.reshape(co, ci, kh, kw).transpose(0, 2, 3, 1).reshape(co, kh * kw * ci))
    has_bias = int(f"{node.weights}.bias" in w)
    bias = w[f"{node.weights}.bias"] if has_bias else np.zeros(co, np.float32)
    out = np.full(want_shape, np.nan, np.float32)
    out4 = out if out.ndim == 4 else out.reshape(out.shape[0], co, 1, -1)
    size = eval(conv_taps.work_size(geometry, x4.shape, out4.shape), {"get_num_threads": lambda: parts})
    work = np.full(size, np.nan, np.float32)
    module.k_conv_taps_none(x4, wt, bias, out4.reshape(out.shape[0], co, -1), out4, work, sh, sw, ph, pw, dh, dw,
                            kh, kw, has_bias, 0, conv_taps.block(co), parts)
    return out


@pytest.mark.parametrize("b", [1, 3])
def test_tap_sum_convolutions_match_reference(b, cpu_cache):
    """Compiled, the family's convolutions of more than one tap take conv_direct.py's product and its 1×1 of
    stride 1 the tap sum; the tap sum is then called directly on every one of those larger kernels too."""
    graph = build(FAMILY, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    # the stem: conv_table.py's kernel, but in a batch of maps this small one panel of the batch (conv_cols.py);
    # the strided 1×1s: conv_pointwise.py's gathered product
    kernels = (["k_conv_cols_none"] * (b > 1) + ["k_conv_direct_none", "k_conv_pointwise_none"]
               + ["k_conv_table_none"] * (b == 1) + ["k_conv_taps_none"])
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == kernels
    want = reference(graph, w, x)
    assert_matches(compiled.run(w, x), want)
    taps = [n for n in graph.nodes if n.op in ("conv1d", "conv2d") and n.inputs[0] != "rgb"
            and _window(n)[0] * _window(n)[1] > 1]
    assert len(taps) == 11
    got = {n.outputs[0]: _tap_sum(compiled.module, n, w, x, want[n.outputs[0]].shape, b + 1) for n in taps}
    assert_matches(got, {k: want[k] for k in got})


SPLIT = """
model conv_split(B) {
  input x: f32[B, 24, 21, 17]
  input tiny: f32[B, 32, 7, 7]
  input rgb: f32[B, 3, 30, 26]
  output y_s2 = conv2d(x, 20, 3, stride=2, padding=1)
  output y_1x1 = conv2d(x, 20, 1, stride=2)
  output y_tiny_1x1 = conv2d(tiny, 36, 1, stride=2)
  output y_tiny = conv2d(tiny, 36, 3, stride=2, padding=1)
  output y_stem = conv2d(rgb, 16, 7, stride=2, padding=3)
  output y_taps = conv2d(x, 8, 1)
  input rgb20: f32[B, 3, 20, 20]
  output y_cols = conv2d(rgb20, 8, 9, padding=4, stride=3)
}
"""


@pytest.mark.parametrize("b", [1, 2, 3])
def test_every_thread_split_gives_the_same_convolution(b, cpu_cache):
    """Both kernels called directly with 1 to 7 parts. The tap sum: whole images per thread, chunks of each
    image's positions, or output-channel blocks (the 4×4 map). The panel (also of a 1×1, gathered from the
    input without planes): tiles of columns that cut output rows and run from one image into the next, or
    one panel of the batch with the output channels split (by BLAS, or by 6-row strips of a packed weight).
    Work buffers start as NaN, so a temporary read before it is written shows."""
    graph = build(SPLIT, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    # compiled, the 3×3s take conv_direct.py's product, the strided 1×1s conv_pointwise.py's, the stem at B = 1
    # the table and the 9×9 of stride 3 (its grid too wide for the table) the panel; called directly below
    kernels = (["k_conv_cols_none", "k_conv_direct_none", "k_conv_pointwise_none"] + ["k_conv_table_none"] * (b == 1)
               + ["k_conv_taps_none"])
    assert [k for k in dir(module) if k.startswith("k_")] == kernels
    want = reference(graph, w, x)

    def hwc(name, co, ci, k):  # the tap sum's weight order: [out, (ki, kj, c)]
        return np.ascontiguousarray(w[f"{name}.weight"].transpose(0, 2, 3, 1).reshape(co, k * k * ci))

    def flat(name, co):
        return np.ascontiguousarray(w[f"{name}.weight"].reshape(co, -1))

    taps = {"y_s2": ("x", hwc("y_s2", 20, 24, 3), 2, 1, 3), "y_1x1": ("x", flat("y_1x1", 20), 2, 0, 1),
            "y_tiny_1x1": ("tiny", flat("y_tiny_1x1", 36), 2, 0, 1)}
    cols = {"y_tiny": ("tiny", flat("y_tiny", 36), 2, 1, 3, [7, 1000]),
            "y_stem": ("rgb", flat("y_stem", 16), 2, 3, 7, [64, 100, 1000]),
            "y_1x1": ("x", flat("y_1x1", 20), 2, 0, 1, [13, 1000])}  # a 1×1's panel gathered from x
    for parts in range(1, 8):
        got = {}
        for name, (src, wt, s, p, k) in taps.items():
            co = want[name].shape[1]
            # a 1×1's GEMMs write the output in place; a 3×3's go through a product block per thread
            out = np.full(want[name].shape, np.nan, np.float32)
            pb = conv_taps.block(co)
            work = np.full(60_000 + parts * co * pb, np.nan, np.float32)
            module.k_conv_taps_none(x[src], wt, w[f"{name}.bias"], out.reshape(b, co, -1), out, work, s, s, p, p, 1, 1,
                                    k, k, 1, 0, pb, parts)
            got[name] = out
        assert_matches(got, {k: want[k] for k in got})
        for name, (src, wt, s, p, k, tiles) in cols.items():
            co = want[name].shape[1]
            ap = module.gemm_pack6(wt, co, wt.shape[1])  # 6-row strips: 36, 16 and 20 channels end part-way or not
            for tile, packed in [(t, u) for t in tiles for u in (0, 1)]:  # 1000: the whole batch in one panel
                out = np.full(want[name].shape, np.nan, np.float32)
                work = np.full(500_000, np.nan, np.float32)
                module.k_conv_cols_none(x[src], wt, w[f"{name}.bias"], out.reshape(b, co, -1), out, work,
                                        ap if packed else wt.reshape(-1), packed, s, s, p, p, 1, 1, k, k, 0, tile,
                                        parts)
                assert_matches({name: out}, {name: want[name]})


FOLD = """
model taps_fold(B) {
  input x: f32[B, 16, 14, 14]
  input y: f32[B, 32, 7, 7]
  a = conv2d(x, 32, 3, stride=2, padding=1, bias=false)
  output y_3x3_res_relu = relu(batchnorm(a) + relu(y))
  p = conv2d(x, 32, 1, stride=2, bias=false)
  output y_1x1_res_relu = relu(batchnorm(p) + relu(y))
  q = conv2d(x, 24, 1, bias=false)
  output y_1x1_bn = batchnorm(q)
}
"""


def _bn_weights(graph, seed: int = 3) -> dict[str, np.ndarray]:
    """Random weights with BatchNorm statistics and affine terms far from the identity."""
    rng = np.random.default_rng(seed)
    w = random_weights(graph)
    for k in w:
        if k.endswith(("running_mean", ".bias")):
            w[k] = (rng.standard_normal(w[k].shape) * 0.2).astype(np.float32)
        elif k.endswith(("running_var", ".gain")):
            w[k] = rng.uniform(0.5, 1.5, w[k].shape).astype(np.float32)
    return w


@pytest.mark.parametrize("b", [1, 2])
def test_folded_convolutions_with_residual_and_relu(b, cpu_cache):
    """conv2d_bn: the 3×3/2 on its packed weight through conv_direct.py's product at any batch, the 1×1/2
    through conv_pointwise.py's gathered product, the 1×1/1 through the tap sum (by BLAS in place) at B = 1 and the
    panel at B = 2 (small maps). The tap sum's epilogue after a grid (the residual read there, a 3×3's) is
    test_conv2d_bn_folds_computed_operands_on_every_run's."""
    graph = build(FOLD, B=b)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    fused = [n for n in folded.nodes if n.op == "conv2d_bn"]
    assert len(fused) == 3 and sum(len(n.inputs) == 7 for n in fused) == 2
    w, x = _bn_weights(graph), random_inputs(graph)
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    kinds = {"k_conv_direct_relu", "k_conv_pointwise_relu", "k_conv_taps_none" if b == 1 else "k_conv_cols_none"}
    assert {k for k in dir(compiled.module) if k.startswith("k_conv")} == kinds
    got = compiled.run(w, x)
    assert_matches(got, reference(graph, w, x), tol=1e-5)


INLINE = """// irc IR v1
graph @m(B) {
  %x = input : f32[B,16,13,13]
  %w = input : f32[24,16,3,3]
  %g = input : f32[24]
  %b = input : f32[24]
  %m = input : f32[24]
  %v = input : f32[24]
  %r = input : f32[B,24,7,7]
  %y = conv2d_bn %x, %w, %g, %b, %m, %v, %r {out=24, kernel=3, stride=2, padding=1, act=relu}
  output y = %y
  %w1 = input : f32[24,16,1,1]
  %r1 = relu %r
  %y1 = conv2d_bn %x, %w1, %g, %b, %m, %v, %r1 {out=24, kernel=1, stride=2, padding=0, act=relu}
  output y1 = %y1
}
"""


@pytest.mark.parametrize("b", [1, 2])
def test_conv2d_bn_folds_computed_operands_on_every_run(b, cpu_cache):
    """Weights and statistics that are values: folded (and put in tap order for the tap sum, B = 1) in the
    driver on each run; the result is NumPy's convolution, BatchNorm with the running statistics, the
    residual add and ReLU. The strided 1×1's product (conv_pointwise.py) writes the output before the epilogue
    reads the residual, so the residual's dying buffer (relu(r) dies at the add) must not be the output."""
    from irc.backends.numpy_ref.conv import conv
    from irc.ir_parser import parse_ir
    from irc.passes import PASSES
    from irc.passes.bind import bind_symbols

    graph = PASSES["shape-infer"](bind_symbols(parse_ir(INLINE), {"B": b}))
    rng = np.random.default_rng(7)
    x = {"x": rng.standard_normal((b, 16, 13, 13)), "w": rng.standard_normal((24, 16, 3, 3)) * 0.2,
         "g": rng.uniform(0.5, 1.5, 24), "b": rng.standard_normal(24), "m": rng.standard_normal(24),
         "v": rng.uniform(0.5, 1.5, 24), "r": rng.standard_normal((b, 24, 7, 7)),
         "w1": rng.standard_normal((24, 16, 1, 1)) * 0.2}
    x = {name: a.astype(np.float32) for name, a in x.items()}
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    kernel = "k_conv_taps_relu" if b == 1 else "k_conv_cols_relu"
    kernels = sorted([kernel, "k_conv_pointwise_relu", "k_relu"])
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == kernels

    def want() -> dict[str, np.ndarray]:
        out = {}
        for name, w, pad, r in (("y", "w", 1, x["r"]), ("y1", "w1", 0, np.maximum(x["r"], 0))):
            y = conv(x["x"].astype(np.float64), x[w].astype(np.float64), None, 2, pad, 1, 1)
            s = (x["g"] / np.sqrt(x["v"].astype(np.float64) + 1e-5))[None, :, None, None]
            out[name] = np.maximum((y - x["m"][None, :, None, None]) * s + x["b"][None, :, None, None] + r, 0)
        return out

    assert_matches(compiled.run({}, x), want(), tol=1e-5)
    x["w"] = x["w"] * np.float32(-0.5)  # a new weight: refolded, and the work buffer used again
    assert_matches(compiled.run({}, x), want(), tol=1e-5)


SMALL_MAPS = """
model small_maps(B) {
  input x: f32[B, 16, 24, 24]
  input s: f32[B, 16, 14, 14]
  output y_12 = relu(batchnorm(conv2d(x, 20, 3, stride=2, padding=1, bias=false)))
  output y_7 = batchnorm(conv2d(s, 20, 3, stride=2, padding=1, bias=false))
}
"""


def test_batches_of_small_maps_take_the_direct_product(cpu_cache):
    """In a batch, a packed 3×3/2 takes conv_direct.py's product whatever its map: to a 12×12 map (144
    outputs, where the tap sum ran per image before it) and to 7×7 (49, where the batch's panel ran)."""
    graph = build(SMALL_MAPS, B=3)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    assert {k for k in dir(compiled.module) if k.startswith("k_conv")} == {"k_conv_direct_relu", "k_conv_direct_none"}
    w, x = _bn_weights(graph), random_inputs(graph)
    assert_matches(compiled.run(w, x), reference(graph, w, x), tol=1e-5)
