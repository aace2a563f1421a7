"""Convolutions on the cpu backend against the NumPy reference (float64): the im2col-per-tile kernel
with its epilogue, both of its ways of splitting the work, and BatchNorm folded into the convolution
(the ``fold-bn`` pass: conv2d_bn, with the residual add and the ReLU in the epilogue).

Shapes cross the kernel's boundaries: column tiles that cut an output row and run from one image into
the next (B = 3), windows that leave the input on every side, strides and dilations, rectangular
kernels, 'same' padding with an even kernel (the odd pad after), 1×1 convolutions and kernels wider
than the map. Each family is one graph, compiled once.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.pipeline import load_graph, run_passes
from irc.runtime.init import init_weights
from irc.runtime.inputs import random_inputs as model_inputs

_ = cpu_cache

CONVS = """
model conv_family(B) {
  input x: f32[B, 5, 23, 19]
  input big: f32[B, 6, 40, 37]
  input seq: f32[B, 4, 29]
  output y_3x3 = conv2d(x, 7, 3, padding=1)
  output y_stride2 = conv2d(x, 8, 3, stride=2, padding=1, bias=false)
  output y_1x1_stride2 = conv2d(x, 6, 1, stride=2, bias=false)
  output y_7x7 = conv2d(x, 4, 7, stride=2, padding=3)
  output y_dilated = conv2d(x, 3, 3, dilation=2, padding=2)
  output y_same_even = conv2d(x, 5, 4, padding=same)
  output y_rect = conv2d(x, 6, [3, 5], stride=[1, 3], padding=[2, 0])
  output y_wide = conv2d(x, 2, 9, padding=4, stride=3)
  output y_valid = conv2d(x, 3, 5)
  output y_big = conv2d(big, 9, 3, padding=1)
  output y_1d = conv1d(seq, 5, 3, stride=2, padding=1)
  output y_grouped = conv2d(x, 10, 3, padding=1, groups=5)
  output y_maxpool = maxpool2d(x, 3, stride=2, padding=1)
  output y_maxpool_dilated = maxpool2d(big, 3, stride=[1, 2], padding=[0, 1], dilation=2)
  output y_maxpool_2x2 = maxpool2d(x, 2)
}
"""


def test_convolutions_match_reference(cpu_cache):
    graph = build(CONVS, B=3)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert_matches(compiled.run(w, x), reference(graph, w, x))
    x["x"][1, 2, 4, 5] = np.nan  # a NaN wins every max-pool window it is in, and only those
    pooled = compiled.run(w, x)["y_maxpool"]
    nan = np.argwhere(np.isnan(pooled))
    # windows 2i-1..2i+1: row 4 is only in output row 2, column 5 in output columns 2 and 3
    assert sorted(map(tuple, nan.tolist())) == [(1, 2, 2, 2), (1, 2, 2, 3)]


SPLIT = """
model conv_split(B) {
  input x: f32[B, 8, 30, 27]
  output y = conv2d(x, 12, 5, padding=2)
  output y_winograd = conv2d(x, 14, 3, padding=1)
}
"""


@pytest.mark.parametrize("b", [1, 3])
def test_every_thread_split_gives_the_same_convolution(b, tmp_path, monkeypatch):
    """Both kernels called directly with 1 to 7 parts: by tiles of columns when the map has enough of them,
    else by output channels (after one im2col or input transform split by rows). Odd map sizes leave the
    Winograd kernel half tiles on the right and at the bottom; its products by BLAS, or by the register blocks
    on the filter packed in 6-row strips (14 channels: the last strip is a partial one). Every split must give
    the reference."""
    from irc.backends.cpu.render import conv_table

    # with its weight known at load the 5×5 on 8 channels would take conv_table.py's kernel (its own tests);
    # the tiles kernel tested here serves weights computed at run time, so the choice is forced to it
    monkeypatch.setattr(conv_table, "applies", lambda *args: False)
    graph = build(SPLIT, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=tmp_path)
    module = compiled.module
    want = reference(graph, w, x)
    derived = module.derive(w)
    ap = derived[next(k for k in derived if k.startswith("~winograd_f23_strips("))]
    u = module.winograd_filter(w["y_winograd.weight"], 14, 8)
    w2 = np.ascontiguousarray(w["y.weight"].reshape(12, -1))
    for parts in range(1, 8):
        out = np.full(want["y"].shape, np.nan, np.float32)
        module.k_conv2d_none(x["x"], w2, w["y.bias"], out.reshape(b, 12, -1), out, 1, 1, 2, 2, 1, 1, 5, 5, 0, parts)
        for packed in (0, 1):
            wino = np.full(want["y_winograd"].shape, np.nan, np.float32)
            module.k_winograd_none(x["x"], ap.reshape(16, 18, 8) if packed else u, ap, w["y_winograd.bias"],
                                   wino.reshape(b, 14, -1), wino, 1, 1, 0, packed, parts)
            assert_matches({"y": out, "y_winograd": wino}, want)


SMALL_MAP = """
model small_map(B) {
  input x: f32[B, 16, 7, 7]
  output y = conv2d(x, 24, 3, padding=1)
}
"""


@pytest.mark.parametrize(("b", "winograd"), [(1, False), (2, True), (8, True)])
def test_winograd_serves_maps_of_32_tiles_or_more(b, winograd, cpu_cache):
    """A 7×7 map is 16 tiles of 2×2 outputs per image: at B = 1 the products would be bound by reading the
    transformed filter (16/9 the filter's size), so the im2col GEMM serves it; from 32 tiles Winograd does.
    Either way the result is the reference's."""
    graph = build(SMALL_MAP, B=b)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert ("k_winograd_none(" in compiled.source) == winograd
    assert_matches(compiled.run(w, x), reference(graph, w, x))


def _bn_weights(graph, seed: int = 3) -> dict[str, np.ndarray]:
    """irc's initial weights with random BatchNorm statistics and affine terms, so the fold changes them."""
    rng = np.random.default_rng(seed)
    w = init_weights(graph, 0)
    for k in w:
        if k.endswith(("running_mean", ".bias")):
            w[k] = (rng.standard_normal(w[k].shape) * 0.2).astype(np.float32)
        elif k.endswith(("running_var", ".gain")):
            w[k] = rng.uniform(0.5, 1.5, w[k].shape).astype(np.float32)
    return w


def test_folded_resnet18_matches_the_unfolded_reference(cpu_cache):
    """ResNet-18 with every BatchNorm folded, each residual add and ReLU in a convolution's epilogue, on
    random weights and statistics: within 1e-5 of the unfolded graph in the float64 reference."""
    graph = load_graph("models/resnet18.arch", {"B": 2, "H": 40, "W": 40})
    folded = run_passes(graph, ["fuse", "fold-bn"])
    ops = [n.op for n in folded.nodes]
    assert not {"batchnorm", "relu", "add", "conv2d"} & set(ops)
    fused = [n for n in folded.nodes if n.op == "conv2d_bn"]
    assert len(fused) == 20  # the stem, 16 block convolutions, 3 projected shortcuts
    assert sum(len(n.inputs) == 7 for n in fused) == 8  # every block's second convolution adds the shortcut
    assert sum(n.attrs["act"] == "relu" for n in fused) == 17  # all but the 3 shortcut projections
    w, x = _bn_weights(graph), model_inputs(graph, 0, {})
    want = reference(graph, w, x)
    got = compile_graph(folded, cache_dir=cpu_cache).run(w, x)
    assert_matches(got, want, tol=1e-5)


FOLD_CASES = """
model fold_cases(B) {
  input x: f32[B, 4, 12, 12]
  input r: f32[B, 6, 12, 12]
  input r1: f32[B, 6, 1, 1]
  a = conv2d(x, 6, 3, padding=1, bias=false)
  output y_res_relu = relu(batchnorm(a) + r)
  c = conv2d(x, 6, 3, padding=1, bias=false)
  output y_conv_read_twice = batchnorm(c) + c
  output y_biased = relu(batchnorm(conv2d(x, 6, 3, padding=1)))
  output y_grouped = relu(batchnorm(conv2d(x, 6, 3, padding=1, groups=2, bias=false)) + r)
  output y_broadcast = batchnorm(conv2d(x, 6, 1, bias=false)) + r1
}
"""


def test_fold_fires_only_where_it_keeps_the_meaning(cpu_cache):
    """A conv whose output has a second reader, a conv with its own bias and a broadcasting add stay apart;
    the grouped conv folds (its epilogue runs in the driver). All outputs match the unfolded reference."""
    graph = build(FOLD_CASES, B=2)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    by_output = {v: n for n in folded.nodes for v in n.outputs}
    outputs = dict(folded.outputs)
    assert by_output[outputs["y_res_relu"]].op == "conv2d_bn"
    assert len(by_output[outputs["y_res_relu"]].inputs) == 7
    assert by_output[outputs["y_grouped"]].op == "conv2d_bn"
    assert by_output[outputs["y_conv_read_twice"]].op == "add"
    assert by_output[outputs["y_biased"]].op == "relu"
    assert by_output[outputs["y_broadcast"]].op == "add"
    assert sum(n.op == "conv2d_bn" for n in folded.nodes) == 3
    w, x = _bn_weights(graph), random_inputs(graph)
    got = compile_graph(folded, cache_dir=cpu_cache).run(w, x)
    assert_matches(got, reference(graph, w, x), tol=1e-5)


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0"])
def test_folded_zoo_models_match_the_unfolded_reference(name, cpu_cache):
    """Depthwise (grouped) convolutions with their BatchNorm folded (the grouped kernel, its epilogue in the
    driver), inverted residuals whose add joins the projection's epilogue, ReLU6 and SiLU left apart."""
    graph = load_graph(f"models/{name}.arch", {"B": 2, "H": 32, "W": 32})
    folded = run_passes(graph, ["fuse", "fold-bn"])
    assert not any(n.op == "batchnorm" for n in folded.nodes)
    assert any(n.op == "conv2d_bn" and n.attrs["groups"] > 1 for n in folded.nodes)
    w, x = _bn_weights(graph), model_inputs(graph, 0, {})
    got = compile_graph(folded, cache_dir=cpu_cache).run(w, x)
    assert_matches(got, reference(graph, w, x), tol=1e-5)


INLINE = """// irc IR v1
graph @m(B) {{
  %x = input : f32[B,4,9,9]
  %w = input : f32[6,4,{k},{k}]
  %g = input : f32[6]
  %b = input : f32[6]
  %m = input : f32[6]
  %v = input : f32[6]
  %r = input : f32[B,6,9,9]
  %y = conv2d_bn %x, %w, %g, %b, %m, %v, %r {{out=6, kernel={k}, padding={p}, act=relu}}
  output y = %y
}}
"""


@pytest.mark.parametrize("k", [3, 5])
def test_conv2d_bn_folds_computed_operands_on_every_run(k, cpu_cache):
    """Weights and statistics that are values, not params, fold in the driver on each run (Winograd for
    the 3×3): the result is NumPy's convolution, BatchNorm with the running statistics, add and ReLU."""
    from irc.backends.numpy_ref.conv import conv
    from irc.ir_parser import parse_ir
    from irc.passes import PASSES
    from irc.passes.bind import bind_symbols

    graph = PASSES["shape-infer"](bind_symbols(parse_ir(INLINE.format(k=k, p=k // 2)), {"B": 2}))
    rng = np.random.default_rng(5)
    x = {"x": rng.standard_normal((2, 4, 9, 9)), "w": rng.standard_normal((6, 4, k, k)) * 0.3,
         "g": rng.uniform(0.5, 1.5, 6), "b": rng.standard_normal(6), "m": rng.standard_normal(6),
         "v": rng.uniform(0.5, 1.5, 6), "r": rng.standard_normal((2, 6, 9, 9))}
    x = {name: a.astype(np.float32) for name, a in x.items()}
    got = compile_graph(graph, cache_dir=cpu_cache).run({}, x)["y"]
    y = conv(x["x"].astype(np.float64), x["w"].astype(np.float64), None, 1, k // 2, 1, 1)
    s = (x["g"] / np.sqrt(x["v"].astype(np.float64) + 1e-5))[None, :, None, None]
    want = np.maximum((y - x["m"][None, :, None, None]) * s + x["b"][None, :, None, None] + x["r"], 0)
    assert_matches({"y": got}, {"y": want}, tol=1e-5)
