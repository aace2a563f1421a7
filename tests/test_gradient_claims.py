"""The chapter's claims about gradients, measured by irc (irc/analysis/gradients.py: the grad pass's backward
graph run on the NumPy reference in float64, at the weights the op records initialise).

Each test quotes the sentence it checks. Oracles: torch.autograd on the same weights and batch (the
measurement itself), bounds computed from the weights (a product of Jacobian norms), and closed forms
(tanh'(1), sigmoid, 0.84^span). The models are tests/fixtures/gradients/*.arch, and an RNN unrolled
here from shared `linear` instances (h_t = tanh(W·h_{t-1} + U·x_t + b), the `rnn` op's recurrence written
out) where a test needs each state h_t as a value of its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from irc.analysis.gradients import measure_gradients, probe_arrays
from irc.pipeline import load_graph
from irc.runtime.init import init_weights

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gradients"
DEPTH = FIXTURES / "depth.arch"
REL = 1e-9  # irc's float64 measurement against torch's float64 autograd


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _mlp_torch(weights: dict[str, np.ndarray], x: np.ndarray, t: np.ndarray, layers: int, act, residual: bool,
               bias: bool = True, head: bool = True) -> tuple[dict[str, float], list[float], float]:
    """torch's ‖∂L/∂W‖ per key, ‖∂L/∂h_l‖ per block output and ‖∂L/∂x‖ of depth.arch's stacks (mse loss)."""
    w = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    h, outs = xt, []
    for i in range(layers):
        z = h @ w[f"layer.{i}.fc.weight"].T + (w[f"layer.{i}.fc.bias"] if bias else 0)
        h = h + act(z) if residual else act(z)
        h.retain_grad()
        outs.append(h)
    y = h @ w["y.weight"].T + w["y.bias"] if head else h
    loss = ((y - torch.tensor(t, dtype=torch.float64)) ** 2).mean()
    loss.backward()
    return ({k: float(v.grad.norm()) for k, v in w.items()}, [float(o.grad.norm()) for o in outs],
            float(xt.grad.norm()))


def _batch(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n.outputs[0]: rng.standard_normal(tuple(n.types[0].shape)) for n in graph.inputs()}
    out["targets"] = rng.standard_normal(tuple(graph.value_types()[graph.outputs[0][1]].shape))
    return out


# --- depth: sigmoid, ReLU + He, residuals -----------------------------------------------------------------

def test_sigmoid_stack_vanishes_and_matches_torch() -> None:
    """Chapter: "the gradient reaching layer 1 of an L-layer stack is a product of L Jacobians, which vanishes
    (factors < 1)". A 20-layer sigmoid MLP (sigmoid' <= 1/4, Xavier weights) at init: irc's ‖∂L/∂h‖ of block 1
    is orders of magnitude below block 20's, under the bound prod_l ‖W_l‖/4, and torch agrees number for number."""
    graph = load_graph(DEPTH, {"B": 16}, "sigmoid_plain")
    weights = init_weights(graph, 0)
    batch = _batch(graph)
    r = measure_gradients(graph, "mse", batches=1, inputs=batch)
    d = r.depth[0]
    assert len(d.blocks) == 20 and d.measure == "activation"
    assert d.first_to_last() < 1e-6 and d.verdict() == "vanishing"
    assert d.weight_first_to_last() < 1e-6  # the first layer's weights get next to nothing as well
    # the product of Jacobians is bounded by prod ‖diag(sigmoid')·W‖ <= prod ‖W‖₂/4 (blocks 2..20)
    bound = math.prod(np.linalg.norm(weights[f"layer.{i}.fc.weight"].astype(np.float64), 2) / 4 for i in range(1, 20))
    assert d.first_to_last() <= bound
    grads, acts, dx = _mlp_torch(weights, batch["x"], batch["targets"], 20, torch.sigmoid, residual=False)
    for w in r.weights:
        assert _close(w.grad_norm, grads[w.key]), w.key
    for b, want in zip(d.blocks, acts):
        assert _close(b.activation_grad_norm, want), b.block
    assert _close(r.inputs["x"], dx)


def test_relu_with_he_init_does_not_vanish() -> None:
    """Chapter: "He initialization (Var(W) = 2/fan_in ...)" and "Fix: ... GELU/SiLU/LeakyReLU, He init,
    normalization". The same 20-layer stack with ReLU takes He from its record (‖W‖² ≈ 2·fan_out), and its
    first block's gradient stays at the order of the last's (irc and torch agree)."""
    graph = load_graph(DEPTH, {"B": 16}, "relu_he")
    weights = init_weights(graph, 0)
    he = weights["layer.3.fc.weight"].astype(np.float64)
    assert abs(np.var(he) - 2 / 64) < 0.1 * 2 / 64  # He: Var = 2/fan_in
    batch = _batch(graph)
    r = measure_gradients(graph, "mse", batches=1, inputs=batch)
    d = r.depth[0]
    assert 0.1 < d.first_to_last() < 10 and 0.1 < d.weight_first_to_last() < 10 and d.verdict() is None
    grads, acts, _ = _mlp_torch(weights, batch["x"], batch["targets"], 20, torch.relu, residual=False)
    assert all(_close(w.grad_norm, grads[w.key]) for w in r.weights)
    sigmoid = measure_gradients(load_graph(DEPTH, {"B": 16}, "sigmoid_plain"), "mse", batches=1)
    assert d.first_to_last() > 1e5 * sigmoid.depth[0].first_to_last()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_residual_keeps_the_first_layer_gradient(seed: int) -> None:
    """Chapter: "Residual y = x + F(x): Jacobian I + dF/dx, so ∏(I+J_l) always has a bare-I identity path →
    gradient floor ≥ 1, can't decay in L." The 20-layer sigmoid stack with a residual add around each
    layer: ‖∂L/∂h_1‖/‖∂L/∂h_20‖ is at least 1, where the plain stack's is below 1e-6 (irc's default loss,
    three batches)."""
    res = measure_gradients(load_graph(DEPTH, {"B": 16}, "sigmoid_residual"), seed=seed)
    plain = measure_gradients(load_graph(DEPTH, {"B": 16}, "sigmoid_plain"), seed=seed)
    assert res.depth[0].first_to_last() >= 1.0 and res.depth[0].verdict() is None
    assert plain.depth[0].first_to_last() < 1e-6


def test_plain_vs_residual_worked_numbers() -> None:
    """Chapter: "||J_l|| = 0.8, L = 50    plain: 0.8^50 = 1.4e-5     layer 1 gets nothing / residual: >= 1.0
    from the identity term alone" and "the residual net's worst case already beats the plain net's actual
    value by 1 / 1.4e-5 = 70,000×". 50 tanh layers whose weights are scaled to ‖W_l‖₂ = 0.8 (so
    ‖J_l‖ <= 0.8 · max|tanh'| <= 0.8): the plain stack's ‖∂L/∂x‖/‖∂L/∂h_50‖ is at most 0.8^50, the
    residual stack's at least 1, and the gap at least 70,000× (irc measures; torch agrees)."""
    assert f"{0.8 ** 50:.1e}" == "1.4e-05"
    out = {}
    for model in ("tanh_plain", "tanh_residual"):
        graph = load_graph(DEPTH, {"B": 16}, model)
        weights = {k: (v * 0.8 / np.linalg.norm(v.astype(np.float64), 2)).astype(np.float32)
                   for k, v in init_weights(graph, 0).items()}
        batch = _batch(graph)
        r = measure_gradients(graph, "mse", batches=1, weights=weights, inputs=batch)
        out[model] = r.inputs["x"] / r.depth[0].blocks[-1].activation_grad_norm
        _, acts, dx = _mlp_torch(weights, batch["x"], batch["targets"], 50, torch.tanh,
                                 residual=model == "tanh_residual", bias=False, head=False)
        assert _close(out[model], dx / acts[-1], 1e-7)
    assert out["tanh_plain"] <= 0.8 ** 50
    assert out["tanh_residual"] >= 1.0
    assert out["tanh_residual"] / out["tanh_plain"] >= 70_000


# --- the residual stream's variance under pre-LN -------------------------------------------------------

def test_pre_ln_residual_stream_variance_grows_as_1_plus_2l() -> None:
    """Chapter: "Residual stream variance grows as 1+2L → final norm before unembedding is required", and
    "If those additions are roughly independent and each has unit variance, variances add: variance entering
    block 1 = 1, each block adds 2 sublayers -> +2 variance per block, after L blocks = 1 + 2L; L = 32 ->
    1 + 64 = 65, sd = sqrt(65) = 8.06". The setup that makes it hold: a unit-variance input, and each of a
    block's two branches LN -> linear with W ~ N(0, 1/d) (given explicitly), so a branch adds a unit-variance
    output independent of the stream at init; no final norm. Over 3 seeds irc's var(h) after block l is
    1 + 2l within 10% at every block (5% for the seeds' mean), its slope 2 within 0.15, and after 32 blocks
    65 within 10% (sd 8.06 within 5%), far from the one-add-per-block count 1 + L = 33."""
    graph = load_graph(FIXTURES / "residual_stream.arch", {"B": 64})
    per_seed = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        weights = {k: rng.standard_normal(v.shape) / math.sqrt(v.shape[1]) if k.endswith(".weight") else v
                   for k, v in init_weights(graph, seed).items()}
        r = measure_gradients(graph, "mse", seed=seed, batches=1, weights=weights)
        (d,) = r.depth
        assert len(d.blocks) == 32
        var = np.array([b.activation_var for b in d.blocks])
        want = 1 + 2 * np.arange(1, 33)
        assert np.all(np.abs(var / want - 1) < 0.10), (seed, var / want)
        per_seed.append(var)
    mean = np.mean(per_seed, axis=0)
    assert np.all(np.abs(mean / (1 + 2 * np.arange(1, 33)) - 1) < 0.05)
    slope, intercept = np.polyfit(np.arange(1, 33), mean, 1)
    assert abs(slope - 2) < 0.15, slope
    assert abs(mean[-1] - 65) < 6.5 and abs(math.sqrt(mean[-1]) - 8.06) < 0.05 * 8.06
    assert abs(mean[-1] - 33) > 20  # not one add per block


# --- recurrence: the vanilla RNN's exponential, the LSTM's forget gate -----------------------------------

def _unrolled_rnn(steps: int, d: int, hidden: int) -> str:
    lines = ["model rnn(B) {", f"  const d = {d}, hidden = {hidden}"]
    lines += [f"  input x{t}: f32[B, d]" for t in range(1, steps + 1)]
    lines += ["  wh = linear(hidden, bias=false)", "  ux = linear(hidden)", "  h1 = tanh(ux(x1))"]
    lines += [f"  h{t} = tanh(wh(h{t - 1}) + ux(x{t}))" for t in range(2, steps + 1)]
    return "\n".join([*lines, f"  output y = h{steps}", "}"]) + "\n"


def _rnn_torch(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray], steps: int):
    """torch's ‖∂L/∂x_t‖, the states h_t and the loss of the unrolled RNN (mse on h_T)."""
    w = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    xs = [torch.tensor(batch[f"x{t}"], dtype=torch.float64, requires_grad=True) for t in range(1, steps + 1)]
    h, hs = None, []
    for x in xs:
        a = x @ w["ux.weight"].T + w["ux.bias"] + (h @ w["wh.weight"].T if h is not None else 0)
        h = torch.tanh(a)
        hs.append(h)
    loss = ((h - torch.tensor(batch["targets"], dtype=torch.float64)) ** 2).mean()
    loss.backward()
    return [float(x.grad.norm()) for x in xs], [h.detach().numpy() for h in hs]


def test_vanilla_rnn_gradient_is_an_exponential_in_the_span(tmp_path: Path) -> None:
    """Chapter: "Vanishing gradient is an exponential: per-step Jacobian D_t·W, so ‖dL_T/dh_k‖ ≤
    (max|tanh'|·‖W‖)^(T−k) = s^(T−k)". A tanh RNN over 100 steps (Xavier W, U): irc's ‖∂L/∂h_k‖/‖∂L/∂h_T‖
    stays under the product of ‖D_t·W‖₂ computed from the weights and states, ‖∂L_T/∂x_1‖ is beyond 1e-6 of
    ‖∂L_T/∂x_T‖, and each ‖∂L/∂x_t‖ equals torch's."""
    steps = 100
    path = tmp_path / "rnn.arch"
    path.write_text(_unrolled_rnn(steps, 16, 32), encoding="utf-8")
    graph = load_graph(path, {"B": 1})
    weights = init_weights(graph, 0)
    batch = _batch(graph)
    spans = [1, 10, 50, 99]
    probes = [f"h{steps - s}" for s in spans] + [f"h{steps}"]
    r = measure_gradients(graph, "mse", batches=1, inputs=batch, probes=probes)
    norms = [r.inputs[f"x{t}"] for t in range(1, steps + 1)]
    want, states = _rnn_torch(weights, batch, steps)
    assert all(_close(a, b, 1e-8) for a, b in zip(norms, want))
    assert norms[0] / norms[-1] < 1e-6
    w = weights["wh.weight"].astype(np.float64)
    last = r.probes[f"h{steps}"][0]
    for s in spans:
        k = steps - s
        product = math.prod(np.linalg.norm(np.diag(1 - states[t - 1][0] ** 2) @ w, 2) for t in range(k + 1, steps + 1))
        worst = max(np.max(1 - states[t - 1][0] ** 2) for t in range(k + 1, steps + 1)) * np.linalg.norm(w, 2)
        assert r.probes[f"h{k}"][0] / last <= product * (1 + 1e-9) <= worst ** s * (1 + 1e-9), s


def _scalar_rnn(jacobian: float, a: float, steps: int):
    """The `rnn` op at one unit whose every pre-activation is ``a`` (x_1 = a, then x_t = a − W·tanh(a)), with
    W = jacobian / tanh'(a): each step's Jacobian D_t·W is exactly ``jacobian``. (graph, weights, inputs), in
    float64: above 1 the fixed point is unstable, and a float32 W would drift off it within 100 steps."""
    graph = load_graph(FIXTURES / "rnn.arch", {"B": 1, "T": steps, "d": 1, "hidden": 1})
    w = jacobian / (1 - math.tanh(a) ** 2)
    weights = {"rnn.weight_ih": np.array([[1.0]]), "rnn.weight_hh": np.array([[w]]), "rnn.bias": np.zeros(1)}
    x = np.full((1, steps, 1), a - w * math.tanh(a))
    x[0, 0, 0] = a
    return graph, weights, {"x": x, "targets": np.zeros((1, 1))}


def test_vanilla_rnn_worked_numbers() -> None:
    """Chapter: "take max|tanh'| ≈ 0.42 and a generously large ||W|| = 2. Then s ≈ 0.42 · 2 = 0.84" and its
    table: span 10 → 1.7e-1, 25 → 1.3e-2, 50 → 1.6e-4, 100 → 2.7e-8 ("numerically zero"). A one-unit tanh RNN
    with W = 2 whose pre-activations all sit at 1 (tanh'(1) = 0.42) has D_t·W = 2·tanh'(1) at every step, and
    irc's ‖∂L_T/∂x_k‖/‖∂L_T/∂x_T‖ is exactly (2·tanh'(1))^(T−k): the chapter's column to its two digits, and
    the verdict says vanishing."""
    s = 2 * (1 - math.tanh(1) ** 2)
    assert f"{s:.2f}" == "0.84"
    graph, weights, batch = _scalar_rnn(s, 1.0, 101)
    assert abs(float(weights["rnn.weight_hh"][0, 0]) - 2.0) < 1e-12
    t = measure_gradients(graph, "mse", batches=1, weights=weights, inputs=batch).time[0]
    for span, printed in [(10, 1.7e-1), (25, 1.3e-2), (50, 1.6e-4), (100, 2.7e-8)]:
        measured = t.grad_norms[100 - span] / t.grad_norms[100]
        assert _close(measured, s ** span, 1e-9), span
        assert abs(measured - printed) <= 0.05 * printed, span  # the chapter prints two digits
    assert t.verdict() == "vanishing"


def test_exploding_rnn_worked_number() -> None:
    """Chapter: "Flip s above 1 and the same exponential runs the other way: s = 1.2 over 100 steps gives
    1.2^100 = 8.3e7." The one-unit RNN with D_t·W = 1.2 at every step: irc measures ‖∂L_T/∂x_1‖/‖∂L_T/∂x_T‖
    = 1.2^100 and the verdict says exploding."""
    graph, weights, batch = _scalar_rnn(1.2, 0.5, 101)
    t = measure_gradients(graph, "mse", batches=1, weights=weights, inputs=batch).time[0]
    assert _close(t.first_to_last(), 1.2 ** 100, 1e-6) and f"{t.first_to_last():.1e}" == "8.3e+07"
    assert t.verdict() == "exploding" and _close(t.factor(), 1.2, 1e-6)


def _lstm_torch(weights: dict[str, np.ndarray], x: np.ndarray, t: np.ndarray) -> list[float]:
    """torch's ‖∂L/∂x_t‖ per step of nn.LSTM with irc's weights (its one bias as bias_ih, bias_hh = 0)."""
    hidden = weights["lstm.weight_hh"].shape[1]
    lstm = torch.nn.LSTM(x.shape[2], hidden, batch_first=True).double()
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.tensor(weights["lstm.weight_ih"]))
        lstm.weight_hh_l0.copy_(torch.tensor(weights["lstm.weight_hh"]))
        lstm.bias_ih_l0.copy_(torch.tensor(weights["lstm.bias"]))
        lstm.bias_hh_l0.zero_()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    _, (h, _) = lstm(xt)
    ((h[0] - torch.tensor(t, dtype=torch.float64)) ** 2).mean().backward()
    return [float(v) for v in xt.grad.norm(dim=(0, 2))]


def _rnn_op_torch(weights: dict[str, np.ndarray], x: np.ndarray, t: np.ndarray) -> list[float]:
    """torch's ‖∂L/∂x_t‖ per step of nn.RNN (tanh) with irc's rnn weights (one bias as bias_ih)."""
    hidden = weights["rnn.weight_hh"].shape[1]
    rnn = torch.nn.RNN(x.shape[2], hidden, batch_first=True).double()
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(torch.tensor(weights["rnn.weight_ih"]))
        rnn.weight_hh_l0.copy_(torch.tensor(weights["rnn.weight_hh"]))
        rnn.bias_ih_l0.copy_(torch.tensor(weights["rnn.bias"]))
        rnn.bias_hh_l0.zero_()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    _, h = rnn(xt)
    ((h[0] - torch.tensor(t, dtype=torch.float64)) ** 2).mean().backward()
    return [float(v) for v in xt.grad.norm(dim=(0, 2))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lstm_forget_bias_keeps_the_gradient_through_time(seed: int) -> None:
    """Chapter: "LSTM replaces the matrix product with an additive cell state ... dc_t/dc_{t−1} = diag(f_t)" and
    "Init b_f to 1.0–2.0 so the untrained gate starts at sigmoid(1)=0.73, not 0.50". Over 100 steps at init,
    irc's per-step factor of ‖∂L_T/∂x_t‖ rises with b_f = 0, 1, 2 and is at least the gate's sigmoid(b_f);
    with b_f = 1 the gradient reaching x_1 is more than a million times the vanilla tanh RNN's (the `rnn`
    op, same widths), whose own is below 1e-12; torch's nn.LSTM and nn.RNN give the same per-step norms."""
    steps = 100
    factors = {}
    for fb in (0.0, 1.0, 2.0):
        graph = load_graph(FIXTURES / "lstm.arch", {"B": 4, "T": steps, "fb": fb})
        weights = init_weights(graph, seed)
        assert np.all(weights["lstm.bias"][32:64] == fb)  # the forget gate's rows, as the record initialises
        batch = _batch(graph, seed)
        r = measure_gradients(graph, "mse", seed=seed, batches=1, inputs=batch)
        t = r.time[0]
        assert t.value == "x" and t.loss_at == "as written" and len(t.grad_norms) == steps
        want = _lstm_torch(weights, batch["x"], batch["targets"])
        assert all(_close(a, b, 1e-8) for a, b in zip(t.grad_norms, want))
        factors[fb] = (t.factor(), t.first_to_last())
        assert t.factor() >= 1 / (1 + math.exp(-fb)), fb
    assert factors[0.0][0] < factors[1.0][0] < factors[2.0][0] < 1
    graph = load_graph(FIXTURES / "rnn.arch", {"B": 4, "T": steps})
    batch = _batch(graph, seed)
    vanilla = measure_gradients(graph, "mse", seed=seed, batches=1, inputs=batch).time[0]
    want = _rnn_op_torch(init_weights(graph, seed), batch["x"], batch["targets"])
    assert all(_close(a, b, 1e-8) for a, b in zip(vanilla.grad_norms, want))
    assert vanilla.first_to_last() < 1e-12 and vanilla.verdict() == "vanishing"
    assert factors[1.0][1] > 1e6 * vanilla.first_to_last()


@pytest.mark.parametrize("f, printed", [(0.99, 0.366), (0.95, 0.0059), (0.50, 7.9e-31)])
def test_lstm_forget_gate_worked_numbers(f: float, printed: float) -> None:
    """Chapter: "The gradient across T steps is prod_t f_t ...: f = 0.99 -> 0.99^100 = 0.366 signal survives
    100 steps; f = 0.95 -> 0.0059 marginal; f = 0.50 -> 7.9e-31 dead". An LSTM whose forget gate is f at every
    step (no recurrent weights, no input weights on the gate, b_f = logit f) fed one input at every step:
    irc's ‖∂L_T/∂x_1‖/‖∂L_T/∂x_101‖ over 100 steps of cell path is f^100."""
    steps, h = 102, 32  # x_1 … x_101 reach h_T only through the cell (x_T also moves o_T directly)
    graph = load_graph(FIXTURES / "lstm.arch", {"B": 2, "T": steps})
    weights = init_weights(graph, 0)
    weights["lstm.weight_hh"][:] = 0
    weights["lstm.weight_ih"][h:2 * h] = 0
    weights["lstm.bias"][h:2 * h] = math.log(f / (1 - f))
    rng = np.random.default_rng(0)
    x = np.repeat(rng.standard_normal((2, 1, 16)), steps, axis=1)
    r = measure_gradients(graph, "mse", batches=1, weights=weights,
                          inputs={"x": x, "targets": rng.standard_normal((2, h))})
    norms = r.time[0].grad_norms
    measured = norms[0] / norms[100]
    assert _close(measured, f ** 100, 1e-6)
    assert abs(measured - printed) <= 0.02 * printed


# --- attention: the 1/sqrt(d_k) scale -----------------------------------------------------------------

def test_two_way_softmax_worked_numbers() -> None:
    """Chapter: "unscaled, d_k = 128: separation 11.3, p_max 0.99999, dp/ds = p(1-p) 1.2e-5; scaled by
    sqrt(128): 1.0, 0.7311, 0.1966 ... gradient through the attention weights: ~16,000x smaller unscaled".
    irc's softmax backward at separations sqrt(128) and 1 gives dp_max/ds = p(1 − p) of both rows."""
    graph = load_graph(FIXTURES / "attention_head.arch", {"B": 2}, "two_way")
    s = np.array([[math.sqrt(128), 0.0], [1.0, 0.0]])
    p = 1 / (1 + np.exp(-s[:, 0]))
    # mse over 4 elements: dL/dp = (p − target)/2; this target makes dL/dp = (1, 0) on each row
    targets = np.stack([p - 2.0, 1 - p], axis=1)
    _, out = probe_arrays(graph, ["s", "p"], {}, {"s": s, "targets": targets}, "mse")
    fwd, ds = out["s"]
    assert np.allclose(out["p"][0][:, 0], p, rtol=1e-12)
    dpds = ds[:, 0]
    assert np.allclose(dpds, p * (1 - p), rtol=1e-9)
    assert f"{out['p'][0][0, 0]:.5f}" == "0.99999" and f"{out['p'][0][1, 0]:.4f}" == "0.7311"
    assert f"{dpds[0]:.1e}" == "1.2e-05" and f"{dpds[1]:.4f}" == "0.1966"
    assert abs(dpds[1] / dpds[0] - 16_000) <= 0.02 * 16_000


def _head(scale: float, batch: int = 256, steps: int = 2):
    return load_graph(FIXTURES / "attention_head.arch", {"B": batch, "T": steps, "scale": scale}, "head")


def test_unscaled_scores_have_variance_d_k_and_freeze_the_softmax() -> None:
    """Chapter: "With unit-variance components, Var(q·k)=d_k, so sd=√d_k (11.3 at d_k=128). Unscaled → near
    one-hot softmax → p(1−p)≈1e-5 gradient (frozen forward and backward). Dividing by √d_k restores unit
    variance; dividing by d_k over-corrects → uniform weights." One head at d_k = 128 over two keys (the
    chapter's two competitors), q and k unit-variance by their Xavier init: irc measures Var(scores) ≈ 128,
    1 and 1/128; the unscaled rows are one-hot, the 1/d_k rows uniform; and each row's measured
    p(1 − p) = ‖∂L/∂s‖/(√2·|∂L/∂p_0 − ∂L/∂p_1|) has a median below 1e-4 unscaled, over 1e3× below scaled's."""
    median = {}
    for name, scale, var in [("unscaled", 1.0, 128.0), ("scaled", 1 / math.sqrt(128), 1.0),
                             ("over", 1 / 128, 1 / 128)]:
        graph = _head(scale)
        r = measure_gradients(graph, "mse", batches=1, probes=["q", "scores", "p"])
        assert abs(r.probes["q"][1] - 1.0) < 0.1  # the chapter's premise: unit-variance components
        assert abs(r.probes["scores"][1] - var) < 0.15 * var, name
        weights = init_weights(graph, 0)
        rng = np.random.default_rng(1)
        batch = {"x": rng.standard_normal((256, 2, 128)), "targets": rng.standard_normal((256, 2, 128))}
        _, out = probe_arrays(graph, ["scores", "p"], weights, batch, "mse")
        p, dp = out["p"]
        ds = out["scores"][1]
        rows = np.linalg.norm(ds, axis=-1) / (math.sqrt(2) * np.abs(dp[..., 0] - dp[..., 1]))
        assert np.allclose(rows, (p[..., 0] * p[..., 1]), rtol=1e-6)  # the row's p(1 − p), measured
        median[name] = float(np.median(rows))
        if name == "unscaled":
            assert np.mean(p.max(axis=-1)) > 0.95
        if name == "over":
            assert np.mean(np.abs(p - 0.5)) < 0.05
    assert median["unscaled"] < 1e-4 and median["scaled"] > 0.1  # the chapter's ≈1e-5 against 0.1966
    assert median["scaled"] / median["unscaled"] > 1e3


# --- layer norm placement ----------------------------------------------------------------------------

def test_pre_ln_keeps_an_identity_path_post_ln_renormalises_it() -> None:
    """Chapter: "Pre-LN x + Sublayer(LN(x)) keeps the residual stream a true identity" / "Post-LN puts a
    normalization on the residual path. So the identity route ... gets rescaled once per block" / "Under
    pre-LN nothing rescales it, so its variance grows with depth." 24-block encoders at GPT-2 init: pre-LN's
    ‖∂L/∂h‖ at block 1 is at least block 24's (the identity floor) and its stream's variance grows at every
    block; post-LN's stream is renormalised to variance 1 at every block. Neither vanishes at init: the
    chapter puts post-LN's trouble in training (warmup), not in a gradient that is gone at step 0."""
    pre = measure_gradients(load_graph(FIXTURES / "layernorm_placement.arch", {"B": 4, "T": 16}, "pre_ln"),
                            batches=1)
    post = measure_gradients(load_graph(FIXTURES / "layernorm_placement.arch", {"B": 4, "T": 16}, "post_ln"),
                             batches=1)
    assert pre.loss == "cross_entropy" and pre.loss_source.startswith("default")
    p, q = pre.depth[0], post.depth[0]
    assert len(p.blocks) == len(q.blocks) == 24
    assert p.first_to_last() >= 1.0 and p.verdict() is None and q.verdict() is None
    var = [b.activation_var for b in p.blocks]
    assert all(b > a for a, b in zip(var, var[1:]))
    assert all(abs(b.activation_var - 1.0) < 1e-3 for b in q.blocks)


# --- the masked loss of a language model's time profile --------------------------------------------------

def test_language_model_time_profile_puts_the_loss_at_the_last_step() -> None:
    """The time profile of a recurrent layer in a language model reads ‖∂L_T/∂x_t‖: the loss at step T only
    (cross_entropy's ignored targets before T). torch (embedding, nn.LSTM, linear; cross-entropy of the last
    position) gives the same norm at every step."""
    sizes = {"B": 2, "T": 12, "vocab": 50, "hidden": 16, "layers": 1}
    graph = load_graph(Path(__file__).resolve().parents[1] / "models" / "lstm_lm.arch", sizes)
    weights = init_weights(graph, 0)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 50, (2, 12)), rng.integers(0, 50, (2, 12))
    r = measure_gradients(graph, batches=1, inputs={"tokens": tokens, "targets": targets})
    (t,) = r.time
    assert r.loss == "cross_entropy" and t.loss_at == "last step" and len(t.grad_norms) == 12
    w = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    x = w["emb.weight"][torch.tensor(tokens)].clone().requires_grad_(True)
    lstm = torch.nn.LSTM(16, 16, batch_first=True).double()
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(w["layer.0.lstm.weight_ih"])
        lstm.weight_hh_l0.copy_(w["layer.0.lstm.weight_hh"])
        lstm.bias_ih_l0.copy_(w["layer.0.lstm.bias"])
        lstm.bias_hh_l0.zero_()
    seq, _ = lstm(x)
    logits = seq[:, -1] @ w["decoder.weight"].T + w["decoder.bias"]
    torch.nn.functional.cross_entropy(logits, torch.tensor(targets[:, -1])).backward()
    want = x.grad.norm(dim=(0, 2))
    assert all(_close(a, float(b), 1e-8) for a, b in zip(t.grad_norms, want))
    assert t.grad_norms[0] < t.grad_norms[-1]


# --- the command line ------------------------------------------------------------------------------------

def _analyze(irc_cli, *args: str):
    return irc_cli(["analyze", str(DEPTH), "-D", "B=8", "--gradients", "--batches", "1", *args])


def test_cli_table_names_the_vanishing_stack(irc_cli) -> None:
    res = _analyze(irc_cli, "--model", "sigmoid_plain")
    assert res.rc == 0, res.err
    out = res.out
    assert out.index("summary") < out.index("gradients at initialisation")  # after the usual report
    assert "depth: layer (20 blocks" in out and "layer.0.fc.weight" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: vanishing through layer: ‖∂L/∂h‖ of layer.0 is ")
    assert _analyze(irc_cli, "--model", "sigmoid_plain").out == out  # deterministic for a seed
    relu = _analyze(irc_cli, "--model", "relu_he").out
    assert relu.rstrip().splitlines()[-1].startswith("verdict: no vanishing or exploding gradient")


def test_cli_json_follows_the_schema(irc_cli) -> None:
    import json

    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "analysis-schema.json").read_text("utf-8"))
    res = _analyze(irc_cli, "--model", "sigmoid_plain", "--json", "--seed", "3", "--loss", "cross_entropy")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    jsonschema.validate(doc, schema)
    g = doc["gradients"]
    assert g["loss"] == "cross_entropy" and g["loss_source"] == "--loss" and g["seed"] == 3 and g["batches"] == 1
    assert g["verdict"] == "vanishing" and g["depth"][0]["verdict"] == "vanishing"
    assert g["depth"][0]["first_to_last"] < 1e-6 and len(g["depth"][0]["blocks"]) == 20
    assert [w["key"] for w in g["weights"]][:2] == ["layer.0.fc.weight", "layer.0.fc.bias"]
    lstm = irc_cli(["analyze", str(FIXTURES / "lstm.arch"), "-D", "B=2", "-D", "T=20", "--gradients", "--json"])
    assert lstm.rc == 0, lstm.err
    jsonschema.validate(json.loads(lstm.out), schema)
    (t,) = json.loads(lstm.out)["gradients"]["time"]
    assert t["steps"] == 20 and len(t["grad_norms"]) == 20 and t["loss_at"] == "as written"
    assert "gradients" not in json.loads(irc_cli(["analyze", str(DEPTH), "--model", "relu_he", "--json"]).out)
    relu = _analyze(irc_cli, "--model", "relu_mlp", "--json")
    assert relu.rc == 0, relu.err
    doc = json.loads(relu.out)
    jsonschema.validate(doc, schema)
    rows = doc["gradients"]["rectifiers"]
    assert [x["layer"] for x in rows] == [f"layer.{i}.relu" for i in range(4)]
    assert all(x["samples"] == 8 and x["units"] == 64 and 0 <= x["dead_fraction"] <= 1 for x in rows)
    assert g["rectifiers"] == []  # the sigmoid stack has none


def test_cli_refuses_a_second_loss(irc_cli, tmp_path: Path) -> None:
    path = tmp_path / "own.arch"
    path.write_text("model own(B) {\n  input x: f32[B, 4]\n  input y: i64[B]\n"
                    "  output loss = cross_entropy(linear(x, 3), y)\n}\n", encoding="utf-8")
    assert irc_cli(["analyze", str(path), "-D", "B=4", "--gradients", "--batches", "1"]).rc == 0
    res = irc_cli(["analyze", str(path), "-D", "B=4", "--gradients", "--loss", "mse"])
    assert res.rc == 2 and "computes its own loss" in res.err


def test_cli_refuses_a_training_step(irc_cli, tmp_path: Path) -> None:
    """A grad dump is already forward + backward: measuring its gradients would differentiate twice."""
    own = tmp_path / "own.arch"
    own.write_text("model own(B) {\n  input x: f32[B, 4]\n  input y: i64[B]\n"
                   "  output loss = cross_entropy(linear(x, 3), y)\n}\n", encoding="utf-8")
    dump = tmp_path / "step.ir"
    assert irc_cli(["compile", str(own), "--passes", "grad", "-D", "B=2", "-o", str(dump)]).rc == 0
    res = irc_cli(["analyze", str(dump), "--gradients"])
    assert res.rc == 1 and "already a training step" in res.err, res.err
