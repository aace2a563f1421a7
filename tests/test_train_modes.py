"""Training mode in irc's training loop: dropout draws a new mask every step from (seed, dropout, step), from
one step graph built once; the masks have the drop rate; the same seed gives the same run, another seed
another; and with irc's own masks handed to PyTorch, 20 steps give torch's losses and weights (dropout's
draws cannot match torch's RNG, so the oracle is torch's autograd through the very masks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from irc.backends.numpy_ref import run_graph
from irc.pipeline import load_graph
from irc.runtime.init import init_weights
from irc.runtime.optim import OptimConfig
from irc.runtime.train import TrainConfig, build_step, evaluate, fresh_state, train_steps
from irc.runtime.train_data import ArrayData

STEPS = 20
DROP_MLP = """model dmlp(B) {
  input x: f32[B, 24]
  h = dropout(relu(linear(x, 64)), p=0.5)
  h = dropout(tanh(linear(h, 32)), p=0.25)
  output logits = linear(h, 4)
}
"""


def _setup(tmp_path: Path, seed: int = 0):
    path = tmp_path / "dmlp.arch"
    path.write_text(DROP_MLP)
    graph = load_graph(path, {"B": 16})
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(112, 24)).astype(np.float32), rng.integers(0, 4, 112)
    data = ArrayData("random", {"x": x[:96], "targets": y[:96]}, {"x": x[96:], "targets": y[96:]})
    return graph, data, build_step(graph, "cross_entropy", seed=seed)


def _masks(graphs, weights: dict, data: ArrayData, cfg: TrainConfig, step: int) -> list[np.ndarray]:
    """The dropout masks of step ``step``: the step graph with its mask values as outputs, as train_step feeds it."""
    g = graphs.step.copy()
    masks = [n.outputs[0] for n in g.nodes if n.op == "dropout_mask"]
    g.outputs = [(f"mask{i}", m) for i, m in enumerate(masks)]
    feed = {**data.batch(step, cfg.seed, cfg.batch), graphs.step_input: np.array(step, dtype=np.int64)}
    out = run_graph(g, weights, feed, np.float64)
    return [out[f"mask{i}"] for i in range(len(masks))]


def test_one_step_graph_draws_new_masks_every_step(tmp_path: Path) -> None:
    graph, data, graphs = _setup(tmp_path)
    assert graphs.step_input is not None  # the masks read the step: the graph is built once
    assert sum(n.op == "dropout_mask" for n in graphs.step.nodes) == 2
    assert not any(n.op == "dropout" for n in graphs.step.nodes)
    cfg = TrainConfig(steps=STEPS, batch=16, seed=0)
    weights = init_weights(graph, seed=0)
    first, again, second = (_masks(graphs, weights, data, cfg, s) for s in (0, 0, 1))
    for m0, m0b, m1, p in zip(first, again, second, (0.5, 0.25)):
        assert np.array_equal(m0, m0b)  # the same step draws the same mask
        assert not np.array_equal(m0, m1)  # the next step another
        assert set(np.unique(m0)) == {0.0, 1 / (1 - p)}
        drawn = np.concatenate([m0.ravel(), m1.ravel()])
        n = drawn.size
        # the rate within 4 standard deviations of a binomial's
        assert abs((drawn == 0).mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    # every row of a mask is a draw of its own
    assert len({m.tobytes() for m in first[0]}) == len(first[0])
    # another run seed: other masks at the same step
    other = _setup(tmp_path, seed=1)[2]
    assert not np.array_equal(_masks(other, weights, data, cfg, 0)[0], first[0])


def test_dropout_training_is_deterministic_and_evaluates_without_dropout(tmp_path: Path) -> None:
    graph, data, graphs = _setup(tmp_path)
    cfg = TrainConfig(steps=6, batch=16, seed=0, lr=0.01, dtype=np.float64)
    runs = []
    for _ in range(2):
        state = fresh_state(init_weights(graph, seed=0), cfg)
        assert train_steps(graphs, state, data, cfg)
        runs.append(([row[2] for row in state.history], state.params))
    assert runs[0][0] == runs[1][0] and all(np.array_equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    other = _setup(tmp_path, seed=5)[2]
    state = fresh_state(init_weights(graph, seed=0), cfg)
    assert train_steps(other, state, data, cfg)
    assert [row[2] for row in state.history] != runs[0][0]  # other masks, other losses
    # evaluation is inference mode: the model without dropout
    plain = load_graph(_no_dropout(tmp_path), {"B": 16})
    held = evaluate(graphs, runs[0][1], data, np.float64)
    out = run_graph(build_step(plain).eval, runs[0][1], {"x": data.held["x"], "targets": data.held["targets"]},
                    np.float64)
    assert abs(held.loss - float(out["loss"])) <= 1e-12 * abs(held.loss)


def _no_dropout(tmp_path: Path) -> Path:
    path = tmp_path / "plain.arch"
    path.write_text(DROP_MLP.replace("dropout(", "(").replace(", p=0.5)", ")").replace(", p=0.25)", ")"))
    return path


def test_twenty_dropout_steps_equal_torch_through_the_same_masks(tmp_path: Path) -> None:
    graph, data, graphs = _setup(tmp_path, seed=3)
    cfg = TrainConfig(steps=STEPS, batch=16, seed=3, lr=0.01, optim=OptimConfig("adam"), dtype=np.float64)
    weights = init_weights(graph, seed=4)
    state = fresh_state(weights, cfg)
    assert train_steps(graphs, state, data, cfg)
    ours = [row[2] for row in state.history]
    w = {k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    opt = torch.optim.Adam(list(w.values()), lr=0.01)
    theirs = []
    for step in range(STEPS):
        m0, m1 = (torch.tensor(m) for m in _masks(graphs, weights, data, cfg, step))  # masks need no weights
        batch = data.batch(step, cfg.seed, cfg.batch)
        opt.zero_grad()
        h = F.relu(F.linear(torch.tensor(batch["x"], dtype=torch.float64), w["linear.weight"], w["linear.bias"])) * m0
        h = torch.tanh(F.linear(h, w["linear_1.weight"], w["linear_1.bias"])) * m1
        loss = F.cross_entropy(F.linear(h, w["logits.weight"], w["logits.bias"]), torch.tensor(batch["targets"]))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    rel = np.abs(np.array(ours) - np.array(theirs)) / np.abs(np.array(theirs))
    assert rel.max() <= 1e-10, (rel.max(), ours, theirs)
    for k, t in w.items():
        assert np.abs(state.params[k] - t.detach().numpy()).max() <= 1e-8, k
