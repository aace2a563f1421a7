"""Attention cores, B 1, 8 heads, head width 64, T = S = 1,024 and 4,096, causal and not.

GFLOP/s counts the two products, 4·B·H·T·S·d flops; causal attention counts the half
that is computed (2·B·H·T·S·d), as FlashAttention's papers do. sgemm's rate is NumPy's
2,048³ sgemm in its own process: the arithmetic ceiling. Peak memory is the most resident
memory a call adds to its process (VmHWM reset before the call): a T×S fp32 matrix per
head is 64 MiB at T = 4,096, and all 8 heads' 512 MiB.
"""

from __future__ import annotations

import numpy as np

from benchmarks.timing import best_of, peak_extra_bytes

HEADS, WIDTH = 8, 64
SHAPES = [(1024, False), (1024, True), (4096, False), (4096, True)]
GRAPH = """
model attention_core(T) {{
  input q: f32[1, {h}, T, {d}]
  input k: f32[1, {h}, T, {d}]
  input v: f32[1, {h}, T, {d}]
  output y = sdpa(q, k, v, scale={scale}, causal={causal})
}}
"""


def flops(t: int, causal: bool) -> float:
    full = 4.0 * HEADS * t * t * WIDTH
    return full / 2 if causal else full


def _qkv(t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, HEADS, t, WIDTH), dtype=np.float32) for _ in range(3))


def _item(t: int, causal: bool) -> str:
    return f"T={t}" + (" causal" if causal else "")


def _rows(peer: str, t: int, causal: bool, seconds: float, peak: int | None, note: str) -> list[dict]:
    rows = [{"case": "attention", "item": _item(t, causal), "peer": peer, "seconds": seconds,
             "value": flops(t, causal) / seconds / 1e9, "unit": "GFLOP/s", "note": note}]
    if peak is not None:
        rows.append({"case": "attention-memory", "item": _item(t, causal), "peer": peer, "seconds": 0.0,
                     "value": peak / 2**20, "unit": "MiB", "note": note})
    return rows


def _sizes(quick: bool) -> list[tuple[int, bool]]:
    return [(t // 4 if quick else t, c) for t, c in SHAPES]


def peer_irc(quick: bool, repeats: int) -> list[dict]:
    from irc.backends.cpu import compile_graph
    from irc.runtime.graphs import graph_from_source

    rows = []
    for t, causal in _sizes(quick):
        src = GRAPH.format(h=HEADS, d=WIDTH, scale=WIDTH**-0.5, causal="true" if causal else "false")
        compiled = compile_graph(graph_from_source(src, {"T": t}))
        q, k, v = _qkv(t)
        inputs = {"q": q, "k": k, "v": v}
        seconds = best_of(lambda: compiled.run({}, inputs), repeats)
        peak = peak_extra_bytes(lambda: compiled.run({}, inputs)) if t == max(s for s, _ in _sizes(quick)) else None
        rows += _rows("irc", t, causal, seconds, peak, "flash-style sdpa kernel")
    return rows


def peer_torch(quick: bool, repeats: int) -> list[dict]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    rows = []
    with torch.inference_mode():
        for t, causal in _sizes(quick):
            q, k, v = (torch.from_numpy(a) for a in _qkv(t))

            def call() -> object:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            seconds = best_of(call, repeats)
            peak = peak_extra_bytes(call) if t == max(s for s, _ in _sizes(quick)) else None
            rows += _rows("torch", t, causal, seconds, peak, "F.scaled_dot_product_attention")
    return rows


def peer_numpy(quick: bool, repeats: int) -> list[dict]:
    from irc.backends.numpy_ref.attention import sdpa

    rows = []
    for t, causal in _sizes(quick):
        q, k, v = _qkv(t)

        def call() -> object:
            with np.errstate(all="ignore"):
                return sdpa(q, k, v, causal, WIDTH**-0.5)
        seconds = best_of(call, max(1, repeats // 2))
        peak = peak_extra_bytes(call) if t == max(s for s, _ in _sizes(quick)) else None
        rows += _rows("numpy", t, causal, seconds, peak, "materialised T×S scores (irc's reference)")
    return rows


def peer_sgemm(quick: bool, repeats: int) -> list[dict]:
    n = 1024 if quick else 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    seconds = best_of(lambda: a @ a, repeats)
    return [{"case": "sgemm", "item": f"{n}³", "peer": "numpy", "seconds": seconds, "value": 2.0 * n**3 / seconds / 1e9,
             "unit": "GFLOP/s", "note": "NumPy's OpenBLAS, its default threads"}]


PEERS = {"irc": peer_irc, "torch": peer_torch, "numpy": peer_numpy, "sgemm": peer_sgemm}
