"""``irc lint --measure`` (irc/lint/measure.py): the gradient lints cite the figure measured at initialisation.

Oracles: torch.autograd in float64 on the weights irc initialises and the batch irc draws (the measured
number itself, to the three digits the note prints), closed forms (the scale's own factor s·√d_k, the
chapter's 7B parameter count), and ``irc analyze --gradients`` for the same seed (the lint must cite that
measurement, not a second one of its own). Without --measure the output is the one tests/lint/*.out pins.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from irc.analysis.gradients import batch_inputs, build_step
from irc.pipeline import load_graph
from irc.runtime.init import init_weights

ROOT = Path(__file__).resolve().parents[1]
LINT = ROOT / "tests" / "lint"
DIGITS = 5e-3  # the note prints 3 significant digits: within half a unit of the third
MEASURED = re.compile(r"^note: (measured at init|not measured).*$", re.M)

STACK = """model stack(B) {{
  const d = 32
  input x: f32[B, d]
  block layer(h) {{
    return {body}
  }}
  output y = linear(repeat(50) layer(x), 4)
}}
"""
RECURRENT = """model rnn_final(B) {
  input x: f32[B, 100, 16]
  seq, h = rnn(x, 32)
  output y = h
}
model lstm_final(B) {
  const fb = 0.0
  input x: f32[B, 100, 16]
  seq, h, c = lstm(x, 32, forget_bias=fb)
  output y = h
}
"""


def _note(err: str) -> str:
    found = MEASURED.findall(err)
    assert len(found) == 1, err
    return next(m.group(0) for m in MEASURED.finditer(err))


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return float(m.group(1))


def _close(printed: float, want: float, rel: float = DIGITS) -> bool:
    return abs(printed - want) <= rel * abs(want)


def _batch(graph, seed: int = 0, index: int = 0) -> dict[str, np.ndarray]:
    """The batch the measurement draws (irc's input rule), so torch differentiates the same numbers."""
    return batch_inputs(build_step(graph, "mse", []), seed, index)


def _t(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def _stack_torch(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray], act, residual: bool):
    """torch's ‖∂L/∂h_l‖ per block output and the pre-activations of the 50-block stack (mse loss)."""
    w = {k: _t(v) for k, v in weights.items()}
    h, outs, pre = _t(batch["x"], grad=True), [], []
    for i in range(50):
        z = h @ w[f"layer.{i}.linear.weight"].T + w[f"layer.{i}.linear.bias"]
        pre.append(z.detach().numpy())
        h = h + act(z) if residual else act(z)
        h.retain_grad()
        outs.append(h)
    y = h @ w["y.weight"].T + w["y.bias"]
    ((y - _t(batch["targets"])) ** 2).mean().backward()
    return [float(o.grad.norm()) for o in outs], pre


def _stack(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "stack.arch"
    path.write_text(STACK.format(body=body), encoding="utf-8")
    return path


def _lint(irc_cli, path: Path, *flags: str):
    result = irc_cli(["lint", str(path), *flags])
    assert result.rc == 0 and (result.out == "" or "--format" in flags), result.err
    return result


def _without_notes(err: str) -> str:
    return "".join(line for line in err.splitlines(keepends=True) if not MEASURED.match(line))


# --- the chapter's claims, measured and checked against torch -------------------------------------------

def test_plain_sigmoid_stack_vanishes_and_the_residual_one_does_not(tmp_path: Path, irc_cli) -> None:
    """50 sigmoid layers (sigmoid' ≤ 1/4): IRC-W109 fires and its measured ‖∂L/∂h‖ first/last is below 1e-3,
    torch's number; the same stack with a residual around each layer (no W109) keeps a ratio above 0.1 in
    analyze's measurement, again torch's."""
    path = _stack(tmp_path, "sigmoid(linear(h, d))")
    err = _lint(irc_cli, path, "-D", "B=4", "--measure", "--batches", "1").err
    assert "[IRC-W109]" in err
    ratio = _number(r"‖∂L/∂h‖ (\S+) \(", _note(err))
    graph = load_graph(path, {"B": 4})
    want, _ = _stack_torch(init_weights(graph, 0), _batch(graph), torch.sigmoid, residual=False)
    assert ratio < 1e-3 and _close(ratio, want[0] / want[-1])
    res = _stack(tmp_path, "h + sigmoid(linear(h, d))")
    assert "[IRC-W109]" not in _lint(irc_cli, res, "-D", "B=4").err  # the residual bypasses every layer
    out = irc_cli(["analyze", str(res), "-D", "B=4", "--gradients", "--batches", "1", "--json"])
    measured = json.loads(out.out)["gradients"]["depth"][0]["first_to_last"]
    graph = load_graph(res, {"B": 4})
    want, _ = _stack_torch(init_weights(graph, 0), _batch(graph), torch.sigmoid, residual=True)
    assert measured > 0.1 and _close(measured, want[0] / want[-1], 1e-5)


def test_plain_tanh_stack_reports_what_xavier_init_gives(tmp_path: Path, irc_cli) -> None:
    """The lint's formula says 0.8^50 = 1.4e-5 for 50 plain layers; with Xavier weights a tanh stack's
    Jacobians are near 1 at init, and the measured figure says so: it is torch's ratio, not the formula's."""
    path = _stack(tmp_path, "tanh(linear(h, d))")
    err = _lint(irc_cli, path, "-D", "B=4", "--measure", "--batches", "1").err
    assert "0.8^50 = 1.4e-5" in err
    ratio = _number(r"‖∂L/∂h‖ (\S+) \(", _note(err))
    graph = load_graph(path, {"B": 4})
    want, _ = _stack_torch(init_weights(graph, 0), _batch(graph), torch.tanh, residual=False)
    assert _close(ratio, want[0] / want[-1])


def test_dead_relu_units_are_counted_over_every_sample(tmp_path: Path, irc_cli) -> None:
    """W109 on a ReLU stack also cites the dead units: pre-activation ≤ 0 on every sample of the 3 batches,
    counted here from torch's forward pass on the same weights and batches."""
    path = _stack(tmp_path, "relu(linear(h, d))")
    note = _note(_lint(irc_cli, path, "-D", "B=4", "--measure").err)
    graph = load_graph(path, {"B": 4})
    weights = init_weights(graph, 0)
    alive = np.zeros((50, 32), dtype=bool)
    for b in range(3):
        _, pre = _stack_torch(weights, _batch(graph, 0, b), torch.relu, residual=False)
        alive |= np.stack([(z > 0).any(axis=0) for z in pre])
    dead = int((~alive).sum())
    assert f"dead relu units (pre-activation ≤ 0 on all 12 samples): {dead:,} of {50 * 32:,}" in note
    assert f"({100 * dead / (50 * 32):.1f}%) in 50 layers" in note


def _recurrent_torch(op: str, weights: dict[str, np.ndarray], batch: dict[str, np.ndarray]) -> float:
    """torch's ‖∂L/∂x_1‖/‖∂L/∂x_T‖ of nn.RNN / nn.LSTM with irc's weights (its one bias as bias_ih)."""
    cls = torch.nn.RNN if op == "rnn" else torch.nn.LSTM
    layer = cls(16, 32, batch_first=True).double()
    with torch.no_grad():
        layer.weight_ih_l0.copy_(_t(weights[f"{op}.weight_ih"]))
        layer.weight_hh_l0.copy_(_t(weights[f"{op}.weight_hh"]))
        layer.bias_ih_l0.copy_(_t(weights[f"{op}.bias"]))
        layer.bias_hh_l0.zero_()
    x = _t(batch["x"], grad=True)
    _, state = layer(x)
    h = state if op == "rnn" else state[0]
    ((h[0] - _t(batch["targets"])) ** 2).mean().backward()
    norms = x.grad.norm(dim=(0, 2))
    return float(norms[0] / norms[-1])


def test_rnn_vanishes_lstm_forget_bias_keeps_more(tmp_path: Path, irc_cli) -> None:
    """Over 100 steps: W107's measured ‖∂L_T/∂x_1‖/‖∂L_T/∂x_T‖ for the vanilla RNN is below 1e-3, and W108's
    for an LSTM at b_f = 0 is torch's; at b_f = 1 (no warning) the LSTM keeps over 1e3× the RNN's and more
    than at b_f = 0 — though at init, with sigmoid(1) = 0.73 per step, it is still below 1e-3 over 100 steps
    (the chapter's 0.99^100 = 0.37 is a gate training has opened)."""
    path = tmp_path / "rec.arch"
    path.write_text(RECURRENT, encoding="utf-8")
    err = _lint(irc_cli, path, "--model", "rnn_final", "-D", "B=4", "--measure", "--batches", "1").err
    assert "[IRC-W107]" in err
    rnn = _number(r"‖∂L_T/∂x_T‖ = (\S+) over 100 steps", _note(err))
    graph = load_graph(path, {"B": 4}, "rnn_final")
    want_rnn = _recurrent_torch("rnn", init_weights(graph, 0), _batch(graph))
    assert rnn < 1e-3 and _close(rnn, want_rnn) and _note(err).endswith(": vanishing")
    err = _lint(irc_cli, path, "--model", "lstm_final", "-D", "B=4", "--measure", "--batches", "1").err
    assert "[IRC-W108]" in err
    lstm0 = _number(r"‖∂L_T/∂x_T‖ = (\S+) over 100 steps", _note(err))
    graph = load_graph(path, {"B": 4}, "lstm_final")
    assert _close(lstm0, _recurrent_torch("lstm", init_weights(graph, 0), _batch(graph)))
    assert _lint(irc_cli, path, "--model", "lstm_final", "-D", "B=4", "-D", "fb=1", "--measure").err == ""
    graph = load_graph(path, {"B": 4, "fb": 1}, "lstm_final")
    lstm1 = _recurrent_torch("lstm", init_weights(graph, 0), _batch(graph))
    assert lstm1 > 1e3 * want_rnn and lstm1 > lstm0 and lstm1 < 1e-3


def _attention_torch(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray], scale: float) -> float:
    """torch's ‖∂L/∂W_q‖ of one 2-head attention layer (d = 32, d_k = 16) with an mse loss."""
    w = {k: _t(v, grad=True) for k, v in weights.items()}
    x = _t(batch["x"])
    b, t, d = x.shape

    def heads(a: torch.Tensor) -> torch.Tensor:
        return a.reshape(b, t, 2, d // 2).transpose(1, 2)

    q, k, v = (heads(x @ w[f"y.{n}"].T) for n in ("wq", "wk", "wv"))
    o = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v
    y = o.transpose(1, 2).reshape(b, t, d) @ w["y.wo"].T
    ((y - _t(batch["targets"])) ** 2).mean().backward()
    return float(w["y.wq"].grad.norm())


def test_attention_scale_is_measured_at_both_scales(tmp_path: Path, irc_cli) -> None:
    """W102 at scale=1, d_k = 16: the note's ‖∂L/∂W_q‖ at scale=1 and at 1/√d_k are torch's, with the same
    weights, and the scale's own factor printed is s·√d_k = 4."""
    path = tmp_path / "att.arch"
    path.write_text("model att(B) {\n  input x: f32[B, 8, 32]\n  output y = attention(x, heads=2, scale=1)\n}\n",
                    encoding="utf-8")
    result = _lint(irc_cli, path, "-D", "B=4", "--measure", "--batches", "1", "--format", "json")
    (w,) = json.loads(result.out)["warnings"]
    assert w["code"] == "IRC-W102"
    note = w["measured"]["text"]
    at_one = _number(r"‖∂L/∂y\.wq‖ = (\S+) at scale=1,", note)
    at_default = _number(r"‖∂L/∂y\.wq‖ = \S+ at scale=1, (\S+) at 1/√d_k", note)
    graph = load_graph(path, {"B": 4})
    weights, batch = init_weights(graph, 0), _batch(graph)
    assert _close(at_one, _attention_torch(weights, batch, 1.0))
    assert _close(at_default, _attention_torch(weights, batch, 1 / math.sqrt(16)))
    assert f"×{1 * math.sqrt(16):.3g} of that is the scale's own factor" in note
    fields = w["measured"]["attention"]["wq"]
    assert _close(fields["grad_norm"], _attention_torch(weights, batch, 1.0), 1e-5)


# --- the same measurement as analyze --gradients ---------------------------------------------------------

@pytest.mark.parametrize("case, kind", [("w109_plain_deep", "depth"), ("w107_rnn_long", "time"),
                                        ("w103_no_final_norm", "depth")])
def test_lint_cites_analyze_gradients_measurement(case: str, kind: str, irc_cli) -> None:
    """For one seed and batch count, the lint's measured JSON object is the one analyze --gradients --json
    reports, and its note prints analyze's digits."""
    flags = ["--seed", "3", "--batches", "2"]
    arch = str(LINT / f"{case}.arch")
    lint = irc_cli(["lint", arch, "--measure", "--format", "json", *flags])
    (w,) = json.loads(lint.out)["warnings"]
    analyze = irc_cli(["analyze", arch, "--gradients", "--json", *flags])
    gradients = json.loads(analyze.out)["gradients"]
    m = w["measured"]
    assert m["status"] == "measured" and (m["seed"], m["batches"], m["loss"]) == (3, 2, gradients["loss"])
    assert m[kind] in gradients[kind]
    table = irc_cli(["analyze", arch, "--gradients", *flags]).out
    if case == "w109_plain_deep":
        line = next(x for x in table.splitlines() if x.startswith("  first/last: ‖∂L/∂h‖"))
        assert line.strip() in m["text"]
    elif case == "w107_rnn_long":
        printed = re.search(r"first/last: (\S+) \(×(\S+) per step\)", table)
        assert f"= {printed.group(1)} over 100 steps (×{printed.group(2)} per step" in m["text"]
    else:
        last = m[kind]["blocks"][-1]["activation_var"]
        assert m["last_block_var"] == last and f"var(h) = {last:.3g}" in m["text"]


# --- without --measure nothing changes; with it only the note is added -------------------------------------

MEASURED_CASES = ["w102_unscaled", "w103_no_final_norm", "w104_post_ln_deep", "w107_rnn_long",
                  "w108_forget_bias_zero", "w109_plain_deep"]


@pytest.mark.parametrize("case", MEASURED_CASES)
def test_measure_only_adds_a_note(case: str, irc_cli) -> None:
    def lint(*flags: str):
        return irc_cli(["lint", f"{case}.arch", *flags], cwd=LINT)  # as test_lint's goldens are made

    plain = lint()
    assert plain.err == (LINT / f"{case}.out").read_text(encoding="utf-8")  # the golden, untouched
    measured = lint("--measure", "--batches", "1")
    assert measured.rc == plain.rc == 0
    assert "\n" + _note(measured.err) + "\n" in measured.err  # exactly one measured note, a line of its own
    assert _without_notes(measured.err) == plain.err
    doc = json.loads(lint("--format", "json").out)
    with_measure = json.loads(lint("--format", "json", "--measure", "--batches", "1").out)
    assert all("measured" not in w for w in doc["warnings"])
    for w in with_measure["warnings"]:
        assert w.pop("measured")["status"] == "measured"
    assert with_measure == doc


def test_silenced_or_unmeasured_warnings_run_nothing(irc_cli, monkeypatch) -> None:
    """-W no-CODE drops the warning and its measurement; a rule with no measured figure runs no model."""
    import irc.lint.measure as measure

    def refuse(*args, **kwargs):
        raise AssertionError("measured a model no warning needed")

    monkeypatch.setattr(measure, "measure_gradients", refuse)
    arch = str(LINT / "w107_rnn_long.arch")
    assert irc_cli(["lint", arch, "--measure", "-W", "no-W107"]).err == ""
    other = str(LINT / "w110_dense_on_pixels.arch")
    assert irc_cli(["lint", other, "--measure"]).err == irc_cli(["lint", other]).err


def test_a_model_too_large_is_not_measured(irc_cli, monkeypatch) -> None:
    """The chapter's 7B model (its count: 12·d²·L + 2·2d·L + V·d = 6,967,263,232 parameters) gets a note
    naming the limit, at once: the measurement is never started."""
    import irc.lint.measure as measure

    monkeypatch.setattr(measure, "measure_gradients", lambda *a, **k: pytest.fail("measured a 7B model"))
    d, layers, vocab = 4096, 32, 128_000
    params = 12 * d * d * layers + 2 * 2 * d * layers + vocab * d
    assert params == 6_967_263_232
    result = irc_cli(["lint", str(ROOT / "models/seed/transformer_7b.arch"), "--measure"])
    assert result.rc == 0
    assert f"note: not measured: {params:.1e}".replace("e+0", "e") + " parameters exceed --measure's limit" \
        in result.err
    doc = json.loads(irc_cli(["lint", str(ROOT / "models/seed/transformer_7b.arch"), "--measure",
                              "--format", "json"]).out)
    assert [w["measured"]["status"] for w in doc["warnings"]] == ["not measured"]


def test_a_model_the_analysis_refuses_gets_its_reason(irc_cli, monkeypatch) -> None:
    """An IrcError from the measurement (here raised on purpose) becomes the note; the lint still exits 0."""
    import irc.lint.measure as measure
    from irc.diagnostics import IrcError

    def refuse(graph, **kwargs):
        raise IrcError(f"--gradients: '{graph.name}' is already a training step")

    monkeypatch.setattr(measure, "measure_gradients", refuse)
    result = irc_cli(["lint", str(LINT / "w107_rnn_long.arch"), "--measure"])
    assert result.rc == 0
    assert _note(result.err) == "note: not measured: --gradients: 'rnn_long' is already a training step"


def test_a_model_with_too_many_flops_is_not_measured(tmp_path: Path, irc_cli) -> None:
    path = _stack(tmp_path, "tanh(linear(h, d))")  # 5.4e4 parameters, but a batch of a million rows
    err = irc_cli(["lint", str(path), "-D", "B=1000000", "--measure"]).err
    assert "note: not measured: " in err and "training FLOPs per batch exceed --measure's limit" in err


@pytest.mark.parametrize("flags, words", [
    (["--seed", "1"], "--seed and --batches describe the gradient measurement: add --measure"),
    (["--batches", "2"], "add --measure"),
    (["--measure", "--batches", "0"], "--batches must be at least 1, got 0"),
    (["--measure", "--seed", "x"], "--seed: invalid int value"),
])
def test_bad_flags_are_usage_errors(flags: list[str], words: str, irc_cli) -> None:
    result = irc_cli(["lint", str(LINT / "w107_rnn_long.arch"), *flags])
    assert result.rc == 2 and words in result.err and "Traceback" not in result.err


def test_measure_takes_a_model(irc_cli) -> None:
    result = irc_cli(["lint", "--list", "--measure"])
    assert result.rc == 2 and "--measure measures a model's warnings" in result.err
