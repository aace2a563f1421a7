"""The CUDA kernels launched directly in the simulator, against NumPy formulas in float64.

Attention and GEMM run with their production tiles and with tiny tiles (so that a few rows
already cross several tile boundaries); every block-reducing kernel runs in both reduction
paths: ``shared`` (what the simulator runs natively) and ``shuffle`` (the GPU's warp-shuffle
path, its shuffles emulated by ``simwarp``). Outputs start as NaN, inputs are fresh random.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_helpers import assert_close, cuda_cache, poisoned

from irc.backends.cuda.render.gemm_src import GLU_TILES, TILES, GemmSpec, gemm_kernel
from irc.backends.cuda.render.sdpa_src import TILES as ATTN_TILES
from irc.backends.cuda.render.sdpa_src import AttnSpec, AttnTile, sdpa_kernel
from irc.backends.cuda.standalone import load_kernels

_ = cuda_cache
PATHS = ["shared", "shuffle"]
TINY = AttnTile(2, 2, 2, 2)  # 4 threads, 4×4 tiles: boundaries everywhere at small sizes


def sdpa_reference(q, k, v, causal, scale, bias=None, window=None):
    """softmax(q·kᵀ·scale + bias, causal: key j > query i hidden, and with a window also
    j <= i − window)·v in float64; all-hidden rows give 0."""
    heads, groups = q.shape[1], k.shape[1]
    k = np.repeat(k.astype(np.float64), heads // groups, axis=1)
    v = np.repeat(v.astype(np.float64), heads // groups, axis=1)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + bias
    if causal:
        t, n = s.shape[-2:]
        i, j = np.arange(t)[:, None], np.arange(n)[None, :]
        s = np.where(j > i, -np.inf, s)
        if window is not None:
            s = np.where(j <= i - window, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p @ v


def run_sdpa(cache, tile, b, h, g, t, s, hd, hdv, causal, path, bias=None, dtype=np.float32, seed=0,
             qkv=None, window=None):
    spec = AttnSpec(tile, hd, hdv, causal, bias is not None, path, window=window is not None)
    kernel = getattr(load_kernels([sdpa_kernel(spec)], cache), spec.name)
    rng = np.random.default_rng(seed)
    q, k, v = qkv if qkv is not None else (rng.standard_normal((b, h, t, hd)).astype(dtype),
                                           rng.standard_normal((b, g, s, hd)).astype(dtype),
                                           rng.standard_normal((b, g, s, hdv)).astype(dtype))
    out = poisoned((b, h, t, hdv), dtype)
    scale = 1.0 / np.sqrt(hd)
    grid = (-(-t // tile.bm), b * h)
    extra = () if window is None else (window,)
    kernel[grid, (tile.threads,)](q, k, v, bias if bias is not None else q, out, np.float32(scale), h, g, *extra)
    return out, sdpa_reference(q, k, v, causal, scale, bias, window)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t,s", [(9, 7), (5, 11), (8, 8)], ids=["T>S", "T<S", "T=S"])
def test_sdpa_causal_tile_boundaries(cuda_cache, path, t, s):
    out, want = run_sdpa(cuda_cache, TINY, 1, 2, 1, t, s, 4, 4, True, path)
    assert_close(out, want)


@pytest.mark.parametrize("path", PATHS)
def test_sdpa_gqa_with_bias_and_fully_masked_rows(cuda_cache, path):
    """GQA (4 query heads on 2 kv heads), a value width unlike the key width, a bias whose
    row 1 is all −∞ (that row's output is zeros, never NaN) and a row with one key left."""
    rng = np.random.default_rng(3)
    bias = rng.standard_normal((1, 4, 6, 7)).astype(np.float32)
    bias[0, :, 1, :] = -np.inf
    bias[0, 2, 4, :-1] = -np.inf
    out, want = run_sdpa(cuda_cache, TINY, 2, 4, 2, 6, 7, 4, 3, False, path, bias=bias)
    assert np.all(out[:, :, 1] == 0.0)
    assert_close(out, want)


def test_sdpa_mqa_broadcast_bias(cuda_cache):
    """MQA (one kv head for 3 query heads), causal, a bias broadcast over batch and heads."""
    bias = np.random.default_rng(4).standard_normal((1, 1, 8, 8)).astype(np.float32)
    out, want = run_sdpa(cuda_cache, TINY, 2, 3, 1, 8, 8, 4, 4, True, "shared", bias=bias)
    assert_close(out, want)


def test_sdpa_one_key_value_batch_serves_every_query_batch(cuda_cache):
    """Cross-attention to one memory: k and v of batch 1 against 3 query sequences."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((3, 2, 9, 4)).astype(np.float32)
    k = rng.standard_normal((1, 1, 7, 4)).astype(np.float32)
    v = rng.standard_normal((1, 1, 7, 4)).astype(np.float32)
    out, _ = run_sdpa(cuda_cache, TINY, 3, 2, 1, 9, 7, 4, 4, True, "shared", qkv=(q, k, v))
    want = sdpa_reference(q, np.repeat(k, 3, axis=0), np.repeat(v, 3, axis=0), True, 0.5)
    assert_close(out, want)


def test_sdpa_causal_never_reads_keys_past_the_diagonal(cuda_cache):
    """Keys and values no query may see are NaN: a kernel that visited their tiles (even to
    multiply by p = 0) would turn the output into NaN."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    k[:, :, 8:] = np.nan
    v[:, :, 8:] = np.nan
    out, _ = run_sdpa(cuda_cache, TINY, 1, 2, 2, 8, 16, 4, 4, True, "shared", qkv=(q, k, v))
    want = sdpa_reference(q, k[:, :, :8], v[:, :, :8], True, 0.5)
    assert_close(out, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t,s,window", [(13, 13, 1), (13, 13, 3), (13, 13, 6), (11, 13, 13), (14, 9, 5)],
                         ids=["W=1", "W=3", "W=6", "W=T", "T>S"])
def test_sdpa_sliding_window_tile_boundaries(cuda_cache, path, t, s, window):
    """Mistral's window with 4×4 tiles: windows shorter than a tile, across two, and as long as
    the sequence (no effect); with fewer keys than queries the last rows see no key (zeros)."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 2, t, 4), (1, 1, s, 4), (1, 1, s, 4)))
    out, want = run_sdpa(cuda_cache, TINY, 1, 2, 1, t, s, 4, 4, True, path, qkv=(q, k, v), window=window)
    assert_close(out, want)
    if window == 1:  # each query sees only its own key: its output is that key's value
        np.testing.assert_allclose(out[0, :, :s], np.broadcast_to(v[0, 0], (2, s, 4)), rtol=1e-6)
    if t > s + window - 1:
        assert not out[:, :, s + window - 1:].any(), "rows whose window holds no key give zeros"


def test_sdpa_sliding_window_gqa_bias(cuda_cache):
    """The window on top of a bias and GQA (4 query heads on 2 key/value heads), two batches."""
    bias = np.random.default_rng(7).standard_normal((2, 1, 10, 10)).astype(np.float32)
    out, want = run_sdpa(cuda_cache, TINY, 2, 4, 2, 10, 10, 4, 3, True, "shared", bias=bias, window=4)
    assert_close(out, want)


def test_sdpa_sliding_window_never_reads_tiles_left_of_it(cuda_cache):
    """Keys and values 0..3 (the first 4-key tile) are NaN: with W = 3, query tiles from row 8
    on start their key loop at key 4 or later, so their rows stay finite and exact."""
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    want = sdpa_reference(q, k, v, True, 0.5, window=3)
    k[:, :, :4] = np.nan
    v[:, :, :4] = np.nan
    out, _ = run_sdpa(cuda_cache, TINY, 1, 2, 2, 16, 16, 4, 4, True, "shared", qkv=(q, k, v), window=3)
    assert_close(out[:, :, 8:], want[:, :, 8:])


@pytest.mark.parametrize("path", PATHS)
def test_sdpa_production_tile_narrow_window(cuda_cache, path):
    """The GPU's 64×64 tiles, a window of 20 crossing the tile edge at 64, T and S ragged."""
    out, want = run_sdpa(cuda_cache, ATTN_TILES["narrow"], 1, 2, 1, 70, 67, 8, 8, True, path, window=20)
    assert_close(out, want)


@pytest.mark.parametrize("path", PATHS)
def test_sdpa_production_tile_narrow(cuda_cache, path):
    """The 64-thread tile the GPU runs for head widths up to 64: 64×64 tiles, T and S ragged."""
    out, want = run_sdpa(cuda_cache, ATTN_TILES["narrow"], 1, 2, 1, 70, 67, 8, 8, True, path)
    assert_close(out, want)


def test_sdpa_production_tile_wide(cuda_cache):
    """The 128-thread tile for wide values (72 columns: a partial last column group)."""
    out, want = run_sdpa(cuda_cache, ATTN_TILES["wide"], 1, 2, 2, 20, 70, 8, 72, False, "shared")
    assert_close(out, want)


def test_sdpa_float16_inputs_accumulate_in_float32(cuda_cache):
    out, want = run_sdpa(cuda_cache, TINY, 1, 2, 1, 9, 7, 4, 4, True, "shared", dtype=np.float16)
    assert out.dtype == np.float16
    assert_close(out.astype(np.float32), want, tol=2e-3)  # the fp16 output's rounding


def test_sdpa_spec_keeps_shared_memory_under_the_static_limit():
    for hd in (32, 64, 80, 128, 256):
        for causal in (False, True):
            spec = AttnSpec(ATTN_TILES["narrow" if hd <= 64 else "wide"], hd, hd, causal, False, "shared")
            assert spec.shared_bytes <= 48 * 1024
    assert AttnSpec(ATTN_TILES["narrow"], 64, 64, True, False, "shuffle").q_resident
    assert not AttnSpec(ATTN_TILES["wide"], 128, 128, True, False, "shuffle").q_resident


# -- GEMM ---------------------------------------------------------------------------------


def run_gemm(cache, spec: GemmSpec, m: int, n: int, k: int, z: int = 1, a_batch: int | None = None, seed: int = 0):
    """Launch one GEMM; returns (output, float64 reference). ``a_batch=1`` broadcasts A over z."""
    kernel = getattr(load_kernels([gemm_kernel(spec)], cache), spec.name)
    rng = np.random.default_rng(seed)
    za = z if a_batch is None else a_batch
    a = rng.standard_normal((za, m, k)).astype(np.float32)
    bshape = (z, n, k) if spec.layout == "nt" else (z, k, n)
    b = rng.standard_normal(bshape).astype(np.float32)
    b2 = rng.standard_normal(bshape).astype(np.float32)
    bias = rng.standard_normal(n if spec.bias == "col" else m).astype(np.float32)
    a64 = np.broadcast_to(a.astype(np.float64), (z, m, k))
    bt = np.swapaxes(b, 1, 2) if spec.layout == "nt" else b
    want = a64 @ bt
    if spec.bias == "col":
        want = want + bias
    elif spec.bias == "row":
        want = want + bias[:, None]
    if spec.act == "relu":
        want = np.maximum(want, 0)
    elif spec.act == "gelu_tanh":
        want = 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want**3)))
    if spec.glu:
        want = want / (1 + np.exp(-want)) * (a64 @ np.swapaxes(b2, 1, 2))
    ends = [n // 3, 2 * n // 3]
    widths = [ends[0], ends[1] - ends[0], n - ends[1]] if spec.outputs == 3 else [n]
    outs = [poisoned((z, m, w)) for w in widths]
    args = [a, b] + ([b2] if spec.glu else []) + [bias] + outs
    args += [m, n, k, 1, za, 1, z, 1] + (ends if spec.outputs == 3 else [])
    t = spec.tile
    kernel[(-(-n // t.bn), -(-m // t.bm), z), (t.threads,)](*args)
    return np.concatenate(outs, axis=2), want


@pytest.mark.parametrize("tile", ["small", "medium", "large"])
def test_gemm_tiles_at_ragged_sizes(cuda_cache, tile):
    """Every production tile, with M, N, K one past a multiple of it (partial tiles everywhere)."""
    t = TILES[tile]
    out, want = run_gemm(cuda_cache, GemmSpec(t, "nt", "col", "gelu_tanh"), t.bm + 1, t.bn + 3, 2 * t.bk + 1)
    assert_close(out, want)


@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_gemm_prefetching_variant(cuda_cache, layout):
    """The variant that loads the next K tile while multiplying: K not a multiple of the tile."""
    spec = GemmSpec(TILES["small"], layout, "col", prefetch=True, min_blocks=2)
    out, want = run_gemm(cuda_cache, spec, 40, 35, 21)
    assert_close(out, want)


def test_gemm_nn_batched_row_bias_broadcast_a(cuda_cache):
    """B stored [K, N] (matmul, im2col), a bias per row, A shared by every batch entry."""
    out, want = run_gemm(cuda_cache, GemmSpec(TILES["small"], "nn", "row", "relu"), 33, 34, 9, z=3, a_batch=1)
    assert_close(out, want)


def test_gemm_gated_large_tile(cuda_cache):
    out, want = run_gemm(cuda_cache, GemmSpec(GLU_TILES["large"], "nt", act="silu", glu=True), 129, 65, 9)
    assert_close(out, want)


def test_gemm_split_outputs(cuda_cache):
    """One GEMM over merged Q, K, V weights writing three results."""
    out, want = run_gemm(cuda_cache, GemmSpec(TILES["small"], "nt", outputs=3), 33, 36, 12)
    assert_close(out, want)
