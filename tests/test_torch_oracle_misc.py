"""The numpy reference against PyTorch for the ops the layer files leave out: positions, the
unembedding, dropout and identity at inference, and the primitives and fused ops that `decompose`
and fusion produce (each called directly from an .arch file on given weights).

Same float32 values on both sides; PyTorch in float64 is the exact answer (see
test_torch_oracle_layers.py for the tolerance definition).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.runtime.compare import reference_errors
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import expected_weights

# ops whose numpy reference this file checks against PyTorch (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"positional", "unembed", "dropout", "identity", "gemm", "gemm_glu", "gemm_multi", "rope",
                        "causal_mask", "add_norm"})
TOL32, TOL64 = 1e-5, 1e-10


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float64))


def _check(body: str, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
           want: dict[str, torch.Tensor]) -> None:
    decls = "\n".join(f"  input {k}: f32[{', '.join(str(d) for d in v.shape)}]" for k, v in inputs.items())
    graph = graph_from_source(f"model m() {{\n{decls}\n{body}\n}}\n")
    keyed = {key: weights[key.rsplit(".", 1)[1]] for key in expected_weights(graph)}  # by short name
    expected = {k: v.detach().numpy() for k, v in want.items()}
    for label, (err32, err64) in reference_errors(graph, keyed, inputs, expected).items():
        assert err32 <= TOL32, f"{label}: float32 reference off by {err32:.2e}"
        assert err64 <= TOL64, f"{label}: float64 reference off by {err64:.2e}"


def test_learned_positional_adds_the_first_rows_of_its_table(rng) -> None:
    x, table = rand(rng, 2, 5, 8), rand(rng, 9, 8)
    _check("  output y = positional(x, learned, max_len=9)", {"x": x}, {"weight": table},
           {"y": t64(x) + F.embedding(torch.arange(5), t64(table))})


def test_sinusoidal_positional_is_vaswanis_table(rng) -> None:
    x = rand(rng, 2, 6, 8)
    pos = torch.arange(6, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    table = torch.zeros(6, 8, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos / div), torch.cos(pos / div)
    _check("  output y = positional(x)", {"x": x}, {}, {"y": t64(x) + table})


@pytest.mark.parametrize("bias", [False, True])
def test_unembed_own_table(rng, bias: bool) -> None:
    x, w, b = rand(rng, 2, 3, 8), rand(rng, 11, 8), rand(rng, 11)
    weights = {"weight": w} | ({"bias": b} if bias else {})
    _check(f"  output y = unembed(x, 11, bias={str(bias).lower()})", {"x": x}, weights,
           {"y": F.linear(t64(x), t64(w), t64(b) if bias else None)})


def test_unembed_tied_reads_the_embedding_table(rng) -> None:
    ids = np.array([[1, 4, 2]], dtype=np.int64)
    table = rand(rng, 6, 8)
    graph = graph_from_source("model m() {\n  input ids: i32[1, 3]\n  emb = embedding(6, 8)\n"
                              "  output y = unembed(emb(ids), tied=emb)\n}\n")
    want = F.linear(F.embedding(torch.from_numpy(ids), t64(table)), t64(table)).numpy()
    (err32, err64), = reference_errors(graph, {"emb.weight": table}, {"ids": ids}, {"y": want}).values()
    assert err32 <= TOL32 and err64 <= TOL64


def test_dropout_and_identity_are_the_identity_at_inference(rng) -> None:
    x = rand(rng, 3, 7)
    _check("  output y = dropout(x, 0.3)\n  output z = identity(x)", {"x": x}, {},
           {"y": F.dropout(t64(x), 0.3, training=False), "z": t64(x)})


ACTS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu, "tanh": torch.tanh}


@pytest.mark.parametrize("act", sorted(ACTS))  # act=none, the default, is z below
def test_gemm_with_bias_and_activation(rng, act: str) -> None:
    x, w, b = rand(rng, 2, 3, 6), rand(rng, 5, 6), rand(rng, 5)
    _check(f"  output y = gemm(x, w, b, act={act})\n  output z = gemm(x, w)", {"x": x, "w": w, "b": b}, {},
           {"y": ACTS[act](F.linear(t64(x), t64(w), t64(b))), "z": F.linear(t64(x), t64(w))})


def test_gemm_glu_and_gemm_multi(rng) -> None:
    x, wg, wu, wv = rand(rng, 2, 3, 6), rand(rng, 4, 6), rand(rng, 4, 6), rand(rng, 2, 6)
    tx = t64(x)
    _check("  output y = gemm_glu(x, wg, wu)\n  q, k, v = gemm_multi(x, wg, wu, wv)\n  output q\n  output k\n"
           "  output v", {"x": x, "wg": wg, "wu": wu, "wv": wv}, {},
           {"y": F.silu(F.linear(tx, t64(wg))) * F.linear(tx, t64(wu)), "q": F.linear(tx, t64(wg)),
            "k": F.linear(tx, t64(wu)), "v": F.linear(tx, t64(wv))})


def test_rope_is_llamas_rotate_half(rng) -> None:
    x = rand(rng, 2, 3, 5, 8)
    t = t64(x)
    inv = 1.0 / 500.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.outer(torch.arange(5, dtype=torch.float64), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-t[..., 4:], t[..., :4]], -1)
    _check("  output y = rope(x, theta=500)", {"x": x}, {}, {"y": t * cos + rotated * sin})


@pytest.mark.parametrize("window", [None, 2])
def test_causal_mask_hides_future_and_out_of_window_keys(rng, window: int | None) -> None:
    x = rand(rng, 2, 5, 6)
    i, j = torch.arange(5)[:, None], torch.arange(6)[None, :]
    hidden = (j > i) | ((j <= i - window) if window else torch.zeros(5, 6, dtype=torch.bool))
    want = t64(x).masked_fill(hidden, -math.inf)
    graph = graph_from_source("model m() {\n  input x: f32[2, 5, 6]\n  output y = causal_mask(x"
                              + (f", window={window}" if window else "") + ")\n}\n")
    from irc.backends.numpy_ref.interpreter import interpret

    got = interpret(graph, {}, {"x": x}, np.float64)["y"]
    mask = hidden.expand(2, 5, 6).numpy()
    assert (got[mask] == -np.inf).all() and np.isfinite(got[~mask]).all()  # minus infinity, and only there
    assert np.array_equal(got[~mask], want.numpy()[~mask])


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_add_norm_yields_the_sum_and_its_norm(rng, kind: str) -> None:
    x, r, gain, bias = rand(rng, 2, 3, 8), rand(rng, 2, 3, 8), rand(rng, 8), rand(rng, 8)
    s = t64(x) + t64(r)
    if kind == "layernorm":
        normed = F.layer_norm(s, (8,), t64(gain), t64(bias), eps=1e-5)
        weights = {"gain": gain, "bias": bias}
    else:
        normed = s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-5) * t64(gain)
        weights = {"gain": gain}
    _check(f"  s, n = add_norm(x, r, kind={kind})\n  output s\n  output n", {"x": x, "r": r}, weights,
           {"s": s, "n": normed})
