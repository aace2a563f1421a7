"""The cpu backend's LSTM against the NumPy reference (float64): every step's input product as one
matmul, then per step each thread's blocks of units (their rows of W_hh in one product, then gates,
cell and h). Hidden sizes that are not a multiple of the block (a short last block) and smaller than
one block; batches the streaming step serves (1 row: blocks of 32 units, 75 of them two full blocks and a short
one; 3 and 8 rows: register blocks on panels of W_hh, 8 rows in two passes over each) and dot_nt's (one past
SMALL_M); the kernel called directly with more threads than blocks."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render import recurrent
from irc.backends.cpu.render.gemm import SMALL_M

_ = cpu_cache

LSTM = """
model lstm_case(B, T) {{
  input x: f32[B, T, 6]
  seq, h, c = lstm(x, {hidden})
  output y_seq = seq
  output y_h = h
  output y_c = c
}}
"""


@pytest.mark.parametrize(("hidden", "batch"), [(37, 3), (5, 3), (37, 8), (21, 1), (75, 1), (29, SMALL_M + 1)])
def test_lstm_matches_reference_for_every_thread_split(hidden, batch, cpu_cache):
    graph = build(LSTM.format(hidden=hidden), B=batch, T=9)
    w, x = random_weights(graph), random_inputs(graph)
    want = reference(graph, w, x)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert_matches(compiled.run(w, x), want)
    module = compiled.module
    derived = {**w, **module.derive(w)}
    names = [k for k in module.DERIVED]  # weight_ih, weight_hh, bias in k_lstm's block order
    wih, whh, b = (derived[next(k for k in names if part in k)] for part in ("weight_ih", "weight_hh", "bias"))
    streams = recurrent.streams(batch)
    kernel = getattr(module, f"k_lstm{batch}" if streams else "k_lstm")
    whh = whh.reshape(-1, hidden)  # the streaming step's panels, as the driver passes them
    for parts in range(1, 6):
        seq = np.full((batch, 9, hidden), np.nan, np.float32)
        h, c = np.full((batch, hidden), np.nan, np.float32), np.full((batch, hidden), np.nan, np.float32)
        kernel(x["x"], wih, whh, b, seq, h, c, recurrent.units(batch), parts)
        assert_matches({"y_seq": seq, "y_h": h, "y_c": c}, want)
