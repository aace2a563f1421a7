"""The CPU backend's flash-style attention backward (backends/cpu/render/grad_sdpa.py) against the NumPy
reference in float64: sdpa_grad on its own over the shapes that exercise its tiles (several query and key
tiles, a causal diagonal inside a tile, a sliding window, GQA, one key/value batch for every query batch,
T ≠ S), and a transformer's whole training step after flash-grad, compiled as one module."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import cpu_cache, rel_error
from test_cpu_grad_helpers import check, step_graph
from test_ops_sdpa_grad import sdpa_grad_graph

from irc.backends.cpu import compile_graph
from irc.backends.numpy_ref import run_graph

_ = cpu_cache  # a fixture, used by name below

# (B, H, G, T, S, hd, hv, causal, window, key/value batch); the kernel's tiles are 64 queries × 128 keys
CASES = [
    (2, 4, 4, 10, 10, 8, 8, False, None, 2),
    (2, 4, 2, 70, 70, 16, 8, True, None, 2),
    (1, 4, 1, 200, 150, 8, 8, True, 33, 1),
    (3, 2, 2, 9, 300, 8, 4, False, None, 1),
    (2, 4, 2, 130, 130, 8, 8, True, None, 1),
    (1, 2, 2, 150, 40, 8, 8, True, None, 1),  # more queries than keys
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(str(v) for v in c))
def test_sdpa_grad_kernel(cpu_cache, case: tuple) -> None:
    graph = sdpa_grad_graph(*case)
    rng = np.random.default_rng(sum(case[:7]))
    x = {n.outputs[0]: rng.normal(size=tuple(n.types[0].shape)).astype(np.float32) for n in graph.inputs()}
    want = run_graph(graph, {}, x, np.float64)
    got = compile_graph(graph, cache_dir=cpu_cache).run({}, x)
    for label in ("dq", "dk", "dv"):
        assert rel_error(got[label], want[label]) <= 1e-5, label


DECODER = """model lm(B, T) {
  input tokens: i32[B, T]
  input targets: i64[B, T]
  emb = embedding(32, 16)
  x = positional(emb(tokens), learned, max_len=96)
  h = x + attention(layernorm(x), heads=2, causal=true)
  h = h + ffn(layernorm(h), hidden=32, act=gelu)
  output loss = cross_entropy(unembed(layernorm(h), tied=emb), targets)
}
"""


def test_a_transformer_step_with_flash_attention(cpu_cache) -> None:
    graph = step_graph(DECODER, flash=True, B=2, T=90)
    assert not any(n.op in ("softmax", "softmax_grad") for n in graph.nodes)
    check(cpu_cache, graph, {"sdpa", "sdpa_grad", "layernorm_grad", "act_grad", "embedding_grad",
                             "position_grad", "cross_entropy_grad"}, id_bound=32)
