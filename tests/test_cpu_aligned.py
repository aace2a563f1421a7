"""Buffers the register blocks stream through start on a 64-byte boundary (backends/cpu/aligned.py): the
helpers at every starting offset an allocator may give, and a compiled graph's driver temporaries, its
convolution work buffer and its derived weights, with its outputs checked against the float64 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.aligned import EMPTY64, EMPTY64_DEVICE, aligned64

_ = cpu_cache


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("offset", range(16))
def test_aligned64_moves_a_misaligned_float32_array_onto_a_cache_line(offset: int) -> None:
    base = np.empty(7 * 9 + 32, np.float32)
    start = (-_address(base) % 64) // 4 + offset  # `offset` floats past a boundary
    a = base[start:start + 63].reshape(7, 9)
    a[...] = np.arange(63, dtype=np.float32).reshape(7, 9) - 20.5
    out = aligned64(a)
    assert _address(out) % 64 == 0
    assert out.shape == (7, 9) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.arange(63, dtype=np.float32).reshape(7, 9) - 20.5)
    assert (out is a) == (offset == 0)  # an aligned array is kept, not copied


def test_aligned64_leaves_other_dtypes_alone() -> None:
    ids = np.arange(10, dtype=np.int64)[1:]
    assert aligned64(ids) is ids


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 17), (2, 64, 7, 7), (1000, 33)])
def test_driver_empty64_is_aligned_and_of_the_shape(shape: tuple[int, ...]) -> None:
    scope: dict = {"np": np, "math": math}
    exec(EMPTY64, scope)
    for _ in range(8):  # several allocations: whatever the allocator hands out
        a = scope["empty64"](shape)
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        assert _address(a) % 64 == 0


def test_device_empty64_is_aligned_at_every_size() -> None:
    scope: dict = {"np": np, "njit": njit}
    exec(EMPTY64_DEVICE.replace("cache=True", "cache=False"), scope)
    device = scope["empty64_device"]

    @njit
    def addresses(sizes):  # the first element's address modulo 64, and the length, of each allocation
        out = np.empty((sizes.size, 2), np.int64)
        for i in range(sizes.size):
            a = device(sizes[i])
            a[:] = np.float32(1.0)  # the whole view is usable
            out[i, 0] = a.ctypes.data % 64
            out[i, 1] = a.size
        return out

    sizes = np.array([1, 2, 15, 16, 17, 100, 384, 4096, 32768, 100_003], np.int64)
    got = addresses(sizes)
    assert (got[:, 0] == 0).all()
    np.testing.assert_array_equal(got[:, 1], sizes)


GRAPH = """
model aligned_case(B) {
  input img: f32[B, 16, 13, 11]
  input seq: f32[B, 40, 64]
  output c = relu(conv2d(img, 24, 3, stride=2, padding=1))
  output h = linear(relu(linear(seq, 96)), 64)
}
"""


def test_a_compiled_graph_keeps_its_streamed_buffers_on_cache_lines(cpu_cache) -> None:
    graph = build(GRAPH, B=2)
    w, x = random_weights(graph), random_inputs(graph)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert_matches(compiled.run(w, x), reference(graph, w, x))
    module = compiled.module
    assert "empty64(" in compiled.source  # the hidden layer between the two products is a driver temporary
    assert _address(module.conv_work.buf) % 64 == 0
    derived = [k for k in module.DERIVED]
    assert derived, "expected packed weights for the products of 80 rows"
    prepared = compiled._prepare(w)
    assert all(_address(prepared[k]) % 64 == 0 for k in derived)
