"""conv2d_bn (the fold-bn pass's fused convolution) against PyTorch: F.conv2d, then F.batch_norm in eval
mode with the running statistics, the residual add and the ReLU, in float64 on the same weights; irc's
cpu backend (which folds the statistics into the weights at load) within 1e-5, max|irc − torch| / max|torch|.
Grouped, strided, dilated and 1×1 convolutions, with and without a residual."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import cpu_cache

from irc.backends.cpu import compile_graph
from irc.pipeline import run_passes
from irc.runtime.graphs import graph_from_source

ORACLE_OPS = frozenset({"conv2d_bn"})
_ = cpu_cache

# name -> (conv arguments, torch keyword arguments, with a residual)
CASES = {
    "3x3": ("6, 3, padding=1", {"padding": 1}, True),
    "3x3_stride2": ("6, 3, stride=2, padding=1", {"stride": 2, "padding": 1}, False),
    "1x1_stride2": ("6, 1, stride=2", {"stride": 2}, True),
    "dilated": ("6, 3, padding=2, dilation=2", {"padding": 2, "dilation": 2}, True),
    "grouped": ("6, 3, padding=1, groups=2", {"padding": 1, "groups": 2}, True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv2d_bn_matches_torch(name, cpu_cache):
    conv, kwargs, residual = CASES[name]
    src = f"""
model m(B) {{
  input x: f32[B, 4, 11, 11]
  input r: f32[B, 6, {11 if kwargs.get('stride', 1) == 1 else 6}, {11 if kwargs.get('stride', 1) == 1 else 6}]
  conv = conv2d(x, {conv}, bias=false)
  bn = batchnorm(conv, eps=1e-3)
  output out = relu({'bn + r' if residual else 'bn'})
}}
"""
    graph = run_passes(graph_from_source(src, {"B": 2}), ["fuse", "fold-bn"])
    assert [n.op for n in graph.nodes if n.op not in ("input", "param")] == ["conv2d_bn"]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 11, 11)).astype(np.float32)
    size = 11 if kwargs.get("stride", 1) == 1 else 6
    r = rng.standard_normal((2, 6, size, size)).astype(np.float32)
    groups = kwargs.get("groups", 1)
    k = 1 if name.startswith("1x1") else 3
    w = {"conv.weight": (rng.standard_normal((6, 4 // groups, k, k)) * 0.3).astype(np.float32),
         "bn.gain": rng.uniform(0.5, 1.5, 6).astype(np.float32),
         "bn.bias": rng.standard_normal(6).astype(np.float32),
         "bn.running_mean": rng.standard_normal(6).astype(np.float32),
         "bn.running_var": rng.uniform(0.5, 1.5, 6).astype(np.float32)}
    got = compile_graph(graph, cache_dir=cpu_cache).run(w, {"x": x, "r": r})["out"]
    t = {k_: torch.from_numpy(v).double() for k_, v in w.items()}
    y = F.conv2d(torch.from_numpy(x).double(), t["conv.weight"], **kwargs)
    y = F.batch_norm(y, t["bn.running_mean"], t["bn.running_var"], t["bn.gain"],
                     t["bn.bias"], training=False, eps=1e-3)
    want = torch.relu(y + torch.from_numpy(r).double() if residual else y).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
