"""The numpy reference's RNN, LSTM and GRU against PyTorch (and the chapter's GRU against NumPy).

Same float32 weights and inputs; the oracle computes in float64. Tolerance definition
(irc.runtime.compare.rel_error): max|ours − oracle| / max|oracle| per output; the reference
in float32 within 1e-5, in float64 within 1e-10.

Conventions: PyTorch's RNN and LSTM carry two bias vectors whose sum is irc's one.
nn.GRU is ``gru(variant=torch)`` (bias_ih and bias_hh kept apart: the reset gate multiplies
``W_hn h + b_hn``). ``gru(variant=chapter)`` is checked against the chapter's equations,
written here independently in the concatenated form the chapter uses:
``z, r = σ(W·[h, x] + b)``, ``g = tanh(W_g·[r ⊙ h, x] + b_g)``, ``h = (1 − z)·h + z·g``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import check_weights, expected_weights

# ops whose numpy reference this file checks against PyTorch (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({"rnn", "lstm", "gru"})
TOL32, TOL64 = 1e-5, 1e-10
B, T, D, H = 3, 7, 5, 4


def fp32_state(module: nn.Module) -> dict[str, np.ndarray]:
    module.double()
    out = {}
    with torch.no_grad():
        for name, t in module.named_parameters():
            t.copy_(t.float().double())
            out[name] = t.float().numpy().copy()
    return out


def run_case(call: str, params: dict[str, np.ndarray], x: np.ndarray, expected: dict[str, np.ndarray],
             results: str) -> None:
    src = f"model m() {{\n  input x: f32[{B}, {T}, {D}]\n  {results} = {call}\n" + "".join(
        f"  output {r}\n" for r in results.split(", ")) + "}\n"
    graph = graph_from_source(src)
    weights = {key: params[key.rsplit(".", 1)[1]] for key in expected_weights(graph)}
    check_weights(graph, weights)
    for label, (err32, err64) in reference_errors(graph, weights, {"x": x}, expected).items():
        assert err32 <= TOL32, f"{call} {label}: float32 reference off by {err32:.2e}"
        assert err64 <= TOL64, f"{call} {label}: float64 reference off by {err64:.2e}"


@pytest.fixture
def x() -> np.ndarray:
    torch.manual_seed(0)
    return np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.float64))


def two_biases(module: nn.Module) -> np.ndarray:
    """Snap torch's two biases to multiples of 2^-12, so their float32 sum (irc's one bias) is exact."""
    with torch.no_grad():
        for t in (module.bias_ih_l0, module.bias_hh_l0):
            t.copy_(torch.round(t * 4096) / 4096)
    total = module.bias_ih_l0.detach().numpy() + module.bias_hh_l0.detach().numpy()
    return total.astype(np.float32)


@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_rnn(x, act):
    m = nn.RNN(D, H, nonlinearity=act, batch_first=True)
    p = fp32_state(m)
    params = {"weight_ih": p["weight_ih_l0"], "weight_hh": p["weight_hh_l0"], "bias": two_biases(m)}
    seq, h = m(_t(x))
    run_case(f"rnn(x, {H}, act={act})", params, x, {"y": seq.detach().numpy(), "h": h[0].detach().numpy()}, "y, h")


def test_lstm(x):
    m = nn.LSTM(D, H, batch_first=True)
    p = fp32_state(m)
    params = {"weight_ih": p["weight_ih_l0"], "weight_hh": p["weight_hh_l0"], "bias": two_biases(m)}
    seq, (h, c) = m(_t(x))
    run_case(f"lstm(x, {H})", params, x,
             {"y": seq.detach().numpy(), "h": h[0].detach().numpy(), "c": c[0].detach().numpy()}, "y, h, c")


def test_lstm_without_bias(x):
    m = nn.LSTM(D, H, batch_first=True, bias=False)
    p = fp32_state(m)
    seq, (h, c) = m(_t(x))
    run_case(f"lstm(x, {H}, bias=false)", {"weight_ih": p["weight_ih_l0"], "weight_hh": p["weight_hh_l0"]}, x,
             {"y": seq.detach().numpy(), "c": c[0].detach().numpy()}, "y, h, c")


def test_gru_torch_variant(x):
    m = nn.GRU(D, H, batch_first=True)
    p = fp32_state(m)
    params = {"weight_ih": p["weight_ih_l0"], "weight_hh": p["weight_hh_l0"],
              "bias_ih": p["bias_ih_l0"], "bias_hh": p["bias_hh_l0"]}
    seq, h = m(_t(x))
    run_case(f"gru(x, {H}, variant=torch)", params, x, {"y": seq.detach().numpy(), "h": h[0].detach().numpy()},
             "y, h")


def chapter_gru(x: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chapter's GRU, one sample and one step at a time, on concatenated [h, x] (float64)."""
    x, w_ih, w_hh, b = (a.astype(np.float64) for a in (x, w_ih, w_hh, b))
    hid = w_hh.shape[1]
    rows = {g: slice(i * hid, (i + 1) * hid) for i, g in enumerate("rzn")}
    # the chapter's W·[h, x]: one matrix per gate over the concatenation
    w = {g: np.concatenate([w_hh[rows[g]], w_ih[rows[g]]], axis=1) for g in "rzn"}
    sig = lambda v: 1 / (1 + np.exp(-v))
    seq = np.zeros(x.shape[:2] + (hid,))
    for n in range(x.shape[0]):
        h = np.zeros(hid)
        for t in range(x.shape[1]):
            hx = np.concatenate([h, x[n, t]])
            r = sig(w["r"] @ hx + b[rows["r"]])
            z = sig(w["z"] @ hx + b[rows["z"]])
            g = np.tanh(w["n"] @ np.concatenate([r * h, x[n, t]]) + b[rows["n"]])
            h = (1 - z) * h + z * g
            seq[n, t] = h
    return seq, seq[:, -1]


def test_gru_chapter_variant(x):
    rng = np.random.default_rng(1)
    params = {"weight_ih": rng.normal(0, 0.6, (3 * H, D)).astype(np.float32),
              "weight_hh": rng.normal(0, 0.6, (3 * H, H)).astype(np.float32),
              "bias": rng.normal(0, 0.5, (3 * H,)).astype(np.float32)}
    seq, h = chapter_gru(x, params["weight_ih"], params["weight_hh"], params["bias"])
    run_case(f"gru(x, {H})", params, x, {"y": seq, "h": h}, "y, h")


def test_gru_variants_differ(x):
    """The attribute matters: the same weights give different sequences under the two variants."""
    m = nn.GRU(D, H, batch_first=True)
    p = fp32_state(m)
    torch_seq = m(_t(x))[0].detach().numpy()
    chapter_seq, _ = chapter_gru(x, p["weight_ih_l0"], p["weight_hh_l0"], p["bias_ih_l0"] + p["bias_hh_l0"])
    assert rel_error(chapter_seq, torch_seq) > 0.05
