"""LayerNorm, RMSNorm and residual add + LayerNorm over [N, D] fp32, in GB/s.

GB/s counts the bytes a kernel must move at least once: LayerNorm and RMSNorm read x and
write y (2·N·D·4 bytes); add + norm reads x and r and writes the sum and the norm
(4·N·D·4), fused or not, so the unfused pair's figure shows what fusion saves. The copy
peer is the yardstick: a 2-thread Numba ``prange`` copy (read + write) with plain stores, which read
each line of the output before writing it. irc's norms write outputs this large (256 MiB) by
streaming stores, which do not, so they can pass it. Fused and unfused
add + norm are timed twice: into fresh buffers, and in place as the schedule runs them in a
pre-LN block (the stream and the branch both die at the add), where the fused kernel moves
4 streams of memory and the pair 6 (the pair must write the sum, then read it back).

irc is timed at its kernels (the ones its generated module calls, on buffers allocated
once, as the schedule reuses them inside a model) and, for LayerNorm, through
``CompiledGraph.run`` as well (whose output goes into the last call's buffer once the caller has
dropped it, as the timing loop does).
PyTorch and NumPy allocate their results on every call, as they do in use.
"""

from __future__ import annotations

import numpy as np

from benchmarks.timing import best_of

EPS = 1e-5
GRAPH_PLAIN = """
model norms(N, D) {
  input x: f32[N, D]
  input r: f32[N, D]
  output ln = layernorm(x)
  output rms = rmsnorm(x)
  output s = x + r
}
"""
GRAPH_FUSED = """
model add_norm(N, D) {
  input x: f32[N, D]
  input r: f32[N, D]
  s = x + r
  output s_out = s
  output ln = layernorm(s)
}
"""
GRAPH_LN = """
model layernorm_only(N, D) {
  input x: f32[N, D]
  output ln = layernorm(x)
}
"""


def _data(n: int, d: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d), dtype=np.float32)
    r = rng.standard_normal((n, d), dtype=np.float32)
    g = rng.standard_normal(d, dtype=np.float32)
    b = rng.standard_normal(d, dtype=np.float32)
    return x, r, g, b


def _row(item: str, peer: str, seconds: float, nbytes: int, note: str = "") -> dict:
    return {"case": "norms", "item": item, "peer": peer, "seconds": seconds, "value": nbytes / seconds / 1e9,
            "unit": "GB/s", "note": note}


def peer_copy(n: int, d: int, repeats: int) -> list[dict]:
    from numba import njit, prange

    @njit(parallel=True, cache=False)
    def copy(x, y):
        for i in prange(x.size):
            y[i] = x[i]

    x = np.random.default_rng(0).standard_normal(n * d, dtype=np.float32)
    y = np.empty_like(x)
    t = best_of(lambda: copy(x, y), repeats)
    return [_row("copy", "copy", t, 2 * x.nbytes, "numba prange, 2 threads")]


def _kernel(module, name: str):
    """The module's kernel ``name``, or the streaming-store variant it has instead for outputs this large
    (backends/cpu/render/stream_stores.py), which takes the thread count last."""
    streamed = getattr(module, f"{name}_stream", None)
    if streamed is None:
        return getattr(module, name)
    from numba import get_num_threads

    return lambda *args: streamed(*args, get_num_threads())


def peer_irc(n: int, d: int, repeats: int) -> list[dict]:
    from irc.backends.cpu import compile_graph
    from irc.backends.cpu.threads import single_pool
    from irc.pipeline import run_passes
    from irc.runtime.graphs import graph_from_source

    x, r, g, b = _data(n, d)
    binds = {"N": n, "D": d}
    plain = compile_graph(graph_from_source(GRAPH_PLAIN, binds)).module
    fused = compile_graph(run_passes(graph_from_source(GRAPH_FUSED, binds), ["fuse"])).module
    layernorm, rmsnorm = _kernel(plain, "k_layernorm"), _kernel(plain, "k_rmsnorm")
    add_layernorm = _kernel(fused, "k_add_layernorm")
    only = compile_graph(graph_from_source(GRAPH_LN, binds))
    eps = np.float32(EPS)
    y, s, y2 = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    flat = (x.reshape(-1), r.reshape(-1), s.reshape(-1))
    rows = []
    with single_pool():
        t = best_of(lambda: layernorm(x, g, b, y, eps), repeats)
        rows.append(_row("LayerNorm", "irc", t, 2 * x.nbytes, "kernel k_layernorm"))
        t = best_of(lambda: rmsnorm(x, g, y, eps), repeats)
        rows.append(_row("RMSNorm", "irc", t, 2 * x.nbytes, "kernel k_rmsnorm"))
        t = best_of(lambda: add_layernorm(x, r, g, b, s, y, eps), repeats)
        rows.append(_row("add+LayerNorm", "irc", t, 4 * x.nbytes, "fused kernel k_add_layernorm"))

        def pair() -> None:
            plain.k_add_flat(*flat)
            layernorm(s, g, b, y2, eps)
        t = best_of(pair, repeats)
        rows.append(_row("add+LayerNorm", "irc unfused", t, 4 * x.nbytes, "k_add_flat then k_layernorm"))
        # as the schedule places them in a pre-LN block, where the stream x and the branch r both
        # die at the add: the sum over x, the norm over r (fused); the add over x, then the
        # norm of x into r (unfused)
        xi, ri = x.copy(), r.copy()
        t = best_of(lambda: add_layernorm(xi, ri, g, b, xi, ri, eps), repeats)
        rows.append(_row("add+LayerNorm in place", "irc", t, 4 * x.nbytes, "fused, sum over x, norm over r"))
        xf, rf = xi.reshape(-1), ri.reshape(-1)

        def pair_in_place() -> None:
            plain.k_add_flat(xf, rf, xf)
            layernorm(xi, g, b, ri, eps)
        t = best_of(pair_in_place, repeats)
        rows.append(_row("add+LayerNorm in place", "irc unfused", t, 4 * x.nbytes, "add over x, norm of x over r"))
    weights = {"ln.gain": g, "ln.bias": b}
    t = best_of(lambda: only.run(weights, {"x": x}), repeats)
    rows.append(_row("LayerNorm", "irc graph run", t, 2 * x.nbytes, "CompiledGraph.run: new output each call"))
    return rows


def peer_torch(n: int, d: int, repeats: int) -> list[dict]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    x, r, g, b = (torch.from_numpy(a) for a in _data(n, d))
    rows = []
    with torch.inference_mode():
        t = best_of(lambda: F.layer_norm(x, (d,), g, b, EPS), repeats)
        rows.append(_row("LayerNorm", "torch", t, 2 * x.numel() * 4, "F.layer_norm"))
        t = best_of(lambda: F.rms_norm(x, (d,), g, EPS), repeats)
        rows.append(_row("RMSNorm", "torch", t, 2 * x.numel() * 4, "F.rms_norm"))
        t = best_of(lambda: F.layer_norm(x + r, (d,), g, b, EPS), repeats)
        rows.append(_row("add+LayerNorm", "torch", t, 4 * x.numel() * 4, "x + r, then F.layer_norm"))
    return rows


def peer_numpy(n: int, d: int, repeats: int) -> list[dict]:
    from irc.backends.numpy_ref.norm import layernorm, rmsnorm

    x, r, g, b = _data(n, d)
    repeats = max(1, repeats // 2)  # NumPy takes seconds here
    rows = []
    t = best_of(lambda: layernorm(x, g, b, EPS), repeats)
    rows.append(_row("LayerNorm", "numpy", t, 2 * x.nbytes, "irc's NumPy reference"))
    t = best_of(lambda: rmsnorm(x, g, EPS), repeats)
    rows.append(_row("RMSNorm", "numpy", t, 2 * x.nbytes, "irc's NumPy reference"))
    t = best_of(lambda: layernorm(x + r, g, b, EPS), repeats)
    rows.append(_row("add+LayerNorm", "numpy", t, 4 * x.nbytes, "x + r, then the reference LayerNorm"))
    return rows


PEERS = {"copy": peer_copy, "irc": peer_irc, "torch": peer_torch, "numpy": peer_numpy}
