"""conv_pointwise.py's strided 1×1 (the kept positions gathered into a panel, then one BLAS product per image and
block of output channels written into the NCHW output) against PyTorch in float64.

Shapes cross its boundaries: strides 2, 3 and rectangular, padding (rows and columns of zeros the gather
writes, a last kept column inside the input or not), odd map sizes, conv1d (H = 1), one output channel, batches
of 1 to 5 (the channel split that makes the tasks a multiple of the threads), BatchNorm folded with a residual
whose buffer dies there (the product writes the output before the epilogue reads the residual, so the two must
not share a buffer) and ReLU, weights computed on every run. The kernel called directly with 1 to 5 threads on
work buffers that start as NaN gives the same bits every time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import build, cpu_cache, random_inputs, random_weights

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import conv_pointwise
from irc.pipeline import run_passes

_ = cpu_cache

FAMILY = """
model pointwise(B) {
  input x: f32[B, 16, 21, 17]
  input wide: f32[B, 40, 14, 14]
  input seq: f32[B, 12, 31]
  output s2 = conv2d(x, 24, 1, stride=2)
  output s3 = conv2d(x, 7, 1, stride=3, bias=false)
  output rect = conv2d(x, 9, 1, stride=[1, 2])
  output padded = conv2d(x, 10, 1, stride=2, padding=1)
  output padded_rect = conv2d(wide, 33, 1, stride=[3, 2], padding=[2, 1])
  output one = conv2d(wide, 1, 1, stride=2)
  output s1d = conv1d(seq, 20, 1, stride=2)
}
"""

STRIDES = {"s2": (2, 0), "s3": (3, 0), "rect": ([1, 2], 0), "padded": (2, 1), "padded_rect": ([3, 2], [2, 1]),
           "one": (2, 0)}


def _torch(w: dict, x: dict) -> dict[str, np.ndarray]:
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    out = {}
    for name, (stride, padding) in STRIDES.items():
        src = torch.from_numpy(x["wide" if name in ("padded_rect", "one") else "x"]).double()
        out[name] = F.conv2d(src, t[f"{name}.weight"], t.get(f"{name}.bias"), stride=stride, padding=padding).numpy()
    out["s1d"] = F.conv1d(torch.from_numpy(x["seq"]).double(), t["s1d.weight"], t["s1d.bias"], stride=2).numpy()
    return out


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("b", [1, 2, 3])
def test_strided_one_by_ones_take_the_gathered_product_and_match_torch(b, cpu_cache):
    graph = build(FAMILY, B=b)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == ["k_conv_pointwise_none"]
    w, x = random_weights(graph), random_inputs(graph)
    got, want = compiled.run(w, x), _torch(w, x)
    for name in want:
        _close(got[name], want[name])


def test_applies_to_strided_one_by_ones_only():
    assert conv_pointwise.applies((1, 1), (2, 2)) and conv_pointwise.applies((1, 1), (1, 3))
    assert not (conv_pointwise.applies((1, 1), (1, 1)) or conv_pointwise.applies((3, 3), (2, 2))
                or conv_pointwise.applies((1, 3), (2, 2)))


@pytest.mark.parametrize("b", [1, 2, 5])
def test_every_thread_count_gives_the_same_bits(b, cpu_cache):
    """k_conv_pointwise_none called directly with 1 to 5 parts, with and without a residual, on a work buffer
    and an output that start as NaN: a panel element or output read before it is written shows."""
    graph = build(FAMILY, B=b)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    w, x = random_weights(graph), random_inputs(graph)
    want = _torch(w, x)
    src = x["wide"]
    weight = w["padded_rect.weight"].reshape(33, 40)
    bias = w["padded_rect.bias"]
    shape = want["padded_rect"].shape
    res = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    results = []
    for parts in range(1, 6):
        for has_res in (0, 1):
            out = np.full(shape, np.nan, np.float32)
            work = np.full(int(conv_pointwise.work_size(src.shape, shape)), np.nan, np.float32)
            module.k_conv_pointwise_none(src, weight, bias, res.reshape(b, 33, -1), out, work, 3, 2, 2, 1, has_res,
                                         parts)
            _close(out, want["padded_rect"] + (res if has_res else 0))
            results.append((has_res, out))
    for has_res in (0, 1):
        first = next(o for r, o in results if r == has_res)
        assert all(np.array_equal(o, first) for r, o in results if r == has_res)


def test_a_work_buffer_too_small_is_an_error(cpu_cache):
    graph = build(FAMILY, B=1)
    module = compile_graph(graph, cache_dir=cpu_cache).module
    x = np.zeros((1, 16, 21, 17), np.float32)
    out = np.zeros((1, 24, 11, 9), np.float32)
    with pytest.raises(ValueError, match="work buffer too small"):
        module.k_conv_pointwise_none(x, np.zeros((24, 16), np.float32), np.zeros(24, np.float32),
                                     out.reshape(1, 24, -1), out, np.zeros(10, np.float32), 2, 2, 0, 0, 0, 2)


DOWNSAMPLE = """
model downsample(B) {
  input x: f32[B, 32, 15, 15]
  input skip: f32[B, 48, 8, 8]
  a = relu(skip)
  conv = conv2d(x, 48, 1, stride=2, bias=false)
  bn = batchnorm(conv, eps=1e-5)
  output y = relu(bn + a)
}
"""


@pytest.mark.parametrize("b", [1, 2])
def test_folded_downsample_with_a_dying_residual_and_relu(b, cpu_cache):
    """conv2d_bn (fold-bn) of a strided 1×1, its residual relu(skip) dying at the add: the output gets a buffer
    of its own (sharing it, the product would overwrite the residual before the epilogue adds it), and the
    result is torch's conv, BatchNorm with running statistics, add and ReLU."""
    graph = build(DOWNSAMPLE, B=b)
    folded = run_passes(graph, ["fuse", "fold-bn"])
    assert [n.op for n in folded.nodes if n.op.startswith("conv")] == ["conv2d_bn"]
    compiled = compile_graph(folded, cache_dir=cpu_cache)
    assert "k_conv_pointwise_relu" in dir(compiled.module)
    rng = np.random.default_rng(5)
    w = random_weights(graph)
    w["bn.running_var"] = rng.uniform(0.5, 1.5, 48).astype(np.float32)
    w["bn.gain"] = rng.uniform(0.5, 1.5, 48).astype(np.float32)
    x = random_inputs(graph)
    got = compiled.run(w, x)["y"]
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    y = F.conv2d(torch.from_numpy(x["x"]).double(), t["conv.weight"], stride=2)
    y = F.batch_norm(y, t["bn.running_mean"], t["bn.running_var"], t["bn.gain"], t["bn.bias"], training=False,
                     eps=1e-5)
    _close(got, torch.relu(y + torch.relu(torch.from_numpy(x["skip"]).double())).numpy())
