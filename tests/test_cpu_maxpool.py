"""Max pooling on the cpu backend (k_maxpool2d: rows, then columns of a row buffer padded with -inf) against
PyTorch's max_pool2d / max_pool1d.

Shapes cross the kernel's cases: ResNet's 3×3 of stride 2 with padding 1 (its one-pass column maximum) on
odd and even maps, windows that leave the input on every side, strides 1, 2 and 3, dilation, rectangular
and even kernels, inputs with columns no window reads, maxpool1d (H = 1), and NaNs, which win every window
they are in. B = 1 and B = 3 (planes of several images over the threads).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import build, cpu_cache, random_inputs

from irc.backends.cpu import compile_graph

torch = pytest.importorskip("torch")
_ = cpu_cache

POOLS = """
model pools(B) {
  input x: f32[B, 5, 23, 19]
  input even: f32[B, 3, 16, 12]
  input seq: f32[B, 4, 29]
  output resnet = maxpool2d(x, 3, stride=2, padding=1)
  output resnet_even = maxpool2d(even, 3, stride=2, padding=1)
  output k2 = maxpool2d(x, 2)
  output dilated = maxpool2d(x, 3, stride=[1, 2], padding=[0, 1], dilation=2)
  output rect = maxpool2d(x, [2, 3], stride=[2, 1])
  output wide = maxpool2d(x, [4, 5], stride=3, padding=2)
  output s1 = maxpool2d(even, 3, stride=1, padding=1)
  output dilated_s2 = maxpool2d(x, 3, stride=2, padding=1, dilation=[1, 2])
  output pool1d = maxpool1d(seq, 3, stride=2, padding=1)
}
"""

# (input, kernel, stride, padding, dilation) of each output, as PyTorch's max_pool2d takes them
CASES = {"resnet": ("x", 3, 2, 1, 1), "resnet_even": ("even", 3, 2, 1, 1), "k2": ("x", 2, 2, 0, 1),
         "dilated": ("x", 3, (1, 2), (0, 1), 2), "rect": ("x", (2, 3), (2, 1), 0, 1),
         "wide": ("x", (4, 5), 3, 2, 1), "s1": ("even", 3, 1, 1, 1), "dilated_s2": ("x", 3, 2, 1, (1, 2))}


def _want(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pool = torch.nn.functional.max_pool2d
    want = {name: pool(torch.from_numpy(x[src]), k, s, p, d).numpy() for name, (src, k, s, p, d) in CASES.items()}
    want["pool1d"] = torch.nn.functional.max_pool1d(torch.from_numpy(x["seq"]), 3, 2, 1).numpy()
    return want


@pytest.mark.parametrize("b", [1, 3])
def test_maxpool_matches_pytorch(b, cpu_cache):
    graph = build(POOLS, B=b)
    x = random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert [k for k in dir(compiled.module) if k.startswith("k_")] == ["k_maxpool2d"]
    got, want = compiled.run({}, x), _want(x)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_maxpool_nan_wins_its_windows(cpu_cache):
    """A NaN in a row (the row pass), at a map's first and last columns (the padded buffer's edges) and in
    the 1-D input: every window that holds one gives NaN, every other window its maximum."""
    graph = build(POOLS, B=2)
    x = random_inputs(graph)
    for src, idx in (("x", (1, 2, 4, 5)), ("x", (0, 0, 0, 0)), ("x", (1, 4, 22, 18)), ("even", (0, 1, 7, 11)),
                     ("seq", (1, 3, 28))):
        x[src][idx] = np.nan
    got = compile_graph(graph, cache_dir=cpu_cache).run({}, x)
    want = _want(x)
    for name in want:
        assert np.isnan(want[name]).any(), name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)  # NaNs compare equal here


def test_maxpool_every_thread_count(cpu_cache):
    """k_maxpool2d called directly on 1 to all of Numba's threads (planes split over them): odd B·C planes
    (3·5) so the threads get unequal shares."""
    import numba

    graph = build(POOLS, B=3)
    x = random_inputs(graph)
    kernel = compile_graph(graph, cache_dir=cpu_cache).module.k_maxpool2d
    want = _want(x)["resnet"]
    before = numba.get_num_threads()
    try:
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            out = np.full(want.shape, np.nan, np.float32)
            kernel(x["x"], out, 3, 3, 2, 2, 1, 1, 1, 1)
            np.testing.assert_array_equal(out, want, err_msg=f"{threads} threads")
    finally:
        numba.set_num_threads(before)
