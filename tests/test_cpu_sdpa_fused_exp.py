"""Attention's score blocks that take their 2**x themselves (sdpa_qk…e, every unmasked block after a row's
first): against softmax written out in float64, when later key tiles stay within REBASE of the first tile's
maxima (the fused path) and when they outgrow it (the block redone the plain way), causal or not."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend_helpers import build, cpu_cache

from irc.backends.cpu import compile_graph
from irc.backends.cpu.render.sdpa import LOG2E, REBASE, TILE_K

_ = cpu_cache

T, D, SCALE = 600, 16, 0.25  # three key tiles: 256, 256 and 88 keys
GRAPH = f"""
model fused_exp(B) {{
  input q: f32[B, 2, {T}, {D}]
  input k: f32[B, 2, {T}, {D}]
  input v: f32[B, 2, {T}, {D}]
  output y = sdpa(q, k, v, scale={SCALE})
  output y_causal = sdpa(q, k, v, scale={SCALE}, causal=true)
}}
"""


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) * SCALE
    if causal:
        s = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _inputs(growth: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, T, D)).astype(np.float32) for _ in range(3))
    k = (k * (1 + growth * np.arange(T) / T)[None, None, :, None]).astype(np.float32)  # later keys score higher
    return {"q": q, "k": k, "v": v}


def _outgrown_rows(x: dict[str, np.ndarray]) -> int:
    """Rows whose largest score in a later key tile passes the first tile's by more than REBASE (log2 units)."""
    s = np.einsum("bhid,bhjd->bhij", x["q"].astype(np.float64), x["k"].astype(np.float64)) * SCALE * LOG2E
    first = s[..., :TILE_K].max(-1)
    later = s[..., TILE_K:].max(-1)
    return int((later > first + REBASE).sum())


# growth 40: later scores pass the first tile's by over 127 log2 units, where a block not redone overflows
@pytest.mark.parametrize("growth,outgrown", [(0.0, False), (12.0, True), (40.0, True)],
                         ids=["fused", "redone", "redone-past-float-range"])
def test_sdpa_with_the_exponential_in_the_score_blocks(cpu_cache, growth: float, outgrown: bool) -> None:
    x = _inputs(growth)
    assert (_outgrown_rows(x) > 0) == outgrown  # the case is the one it says
    compiled = compile_graph(build(GRAPH, B=1), cache_dir=cpu_cache)
    got = compiled.run({}, x)
    for label, causal in (("y", False), ("y_causal", True)):
        want = _softmax_attention(x["q"], x["k"], x["v"], causal)
        err = float(np.abs(got[label] - want).max() / np.abs(want).max())
        assert err < 2e-5, (label, err)


def test_a_nan_score_in_a_fused_block_poisons_its_row(cpu_cache) -> None:
    x = _inputs(0.0)
    x["k"][0, 1, TILE_K + 5, 0] = np.nan  # a key of the second tile: a fused block
    got = compile_graph(build(GRAPH, B=1), cache_dir=cpu_cache).run({}, x)
    assert np.isnan(got["y"][0, 1]).all()  # every query of head 1 sees that key
    assert np.isfinite(got["y"][0, 0]).all()
    assert np.isfinite(got["y_causal"][0, 1, : TILE_K + 5]).all() and np.isnan(got["y_causal"][0, 1, TILE_K + 5:]).all()
