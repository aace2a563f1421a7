"""Transposes on the cpu backend against NumPy: the two axes before the last swapped (attention's heads split
off and merged back) run the k_swap_middle kernel over both threads, at any rank from 3; every other
permutation copies the transposed view."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import build, cpu_cache

from irc.backends.cpu import compile_graph

_ = cpu_cache

PERMS = """
model perms(B) {
  input x3: f32[B, 7, 5]
  input x4: f32[B, 9, 12, 8]
  input x5: f32[2, B, 3, 5, 4]
  output swap3 = transpose(x3, [1, 0, 2])
  output swap4 = transpose(x4, [0, 2, 1, 3])
  output swap5 = transpose(x5, [0, 1, 3, 2, 4])
  output other4 = transpose(x4, [0, 3, 1, 2])
  output last3 = transpose(x3, [0, 2, 1])
}
"""
WANT = {"swap3": ("x3", (1, 0, 2)), "swap4": ("x4", (0, 2, 1, 3)), "swap5": ("x5", (0, 1, 3, 2, 4)),
        "other4": ("x4", (0, 3, 1, 2)), "last3": ("x3", (0, 2, 1))}


@pytest.mark.parametrize("b", [1, 3])
def test_transposes_match_numpy(b, cpu_cache):
    compiled = compile_graph(build(PERMS, B=b), cache_dir=cpu_cache)
    assert compiled.source.count("k_swap_middle(") == 4  # the definition and the three swaps
    rng = np.random.default_rng(0)
    x = {"x3": rng.standard_normal((b, 7, 5)), "x4": rng.standard_normal((b, 9, 12, 8)),
         "x5": rng.standard_normal((2, b, 3, 5, 4))}
    x = {k: v.astype(np.float32) for k, v in x.items()}
    got = compiled.run({}, x)
    for name, (src, perm) in WANT.items():
        np.testing.assert_array_equal(got[name], x[src].transpose(perm), err_msg=name)
