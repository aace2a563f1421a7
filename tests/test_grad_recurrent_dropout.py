"""Dropout between stacked recurrent layers in training (rnn/lstm/gru with layout=torch, layers > 1, dropout > 0):
``training_graph`` gives the layer ``train=true`` and a mask [layers − 1, B, T, dirs·H] drawn by dropout_mask, and
the forward and the backward primitive apply it as PyTorch's nn.RNN/LSTM/GRU in ``train()`` mode do.

Oracles (torch's random draws cannot be irc's, so the masks are shared):
- PyTorch's own modules in train mode: torch's CPU kernel draws each mask between layers as
  ``empty(T, B, dirs·H).bernoulli_(1 − p) / (1 − p)`` after the layer; re-drawn from the same torch seed it is
  handed to irc's layer (the mask as an input), and the loss and every gradient must be torch's within 1e-10;
- a float64 transcription of PyTorch's computation (one single-layer nn module per layer, with irc's mask
  multiplied in between), fed the mask irc's training graph drew: the NumPy reference (float64) within 1e-10 and
  the CPU backend (float32) within 1e-5 of each gradient's largest entry;
- the mask's statistics (the drop rate within 4 standard deviations of a binomial's, kept values 1/(1 − p)), a new
  mask every step and the same one for the same seed and step; p = 0 or one layer: exactly the graph as before;
- ``irc train`` on a small stacked-LSTM language model with dropout, on both engines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import cpu_cache
from torch import nn

from irc.analysis.flops import node_cost
from irc.backends.numpy_ref import run_graph
from irc.diagnostics import IrcError
from irc.graph import Graph
from irc.ops.grad_train import step_input_name, training_graph
from irc.pipeline import run_passes
from irc.printer import print_graph
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights

_ = cpu_cache  # a fixture, used by name below
B, T, D, H, P = 3, 5, 4, 6, 0.3
TOL64, TOL32 = 1e-10, 1e-5
MODULES = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}
# name -> (op, layers, bidirectional, irc attributes, torch keyword arguments)
CASES = {
    "lstm_2_bi": ("lstm", 2, True, "", {}),
    "lstm_3": ("lstm", 3, False, "", {}),
    "gru_2_bi": ("gru", 2, True, ", variant=torch", {}),
    "gru_3": ("gru", 3, False, ", variant=torch", {}),
    "rnn_3_bi_relu": ("rnn", 3, True, ", act=relu", {"nonlinearity": "relu"}),
    "rnn_2": ("rnn", 2, False, "", {}),
}


def _dirs(bi: bool) -> int:
    return 2 if bi else 1


def _source(case: str, p: float = P, mask_input: bool = False) -> str:
    """The layer under an MSE loss that reads its sequence and two final-state rows (one of the first layer's),
    so the gradients of h (and c) reach the backward too. ``mask_input``: the layer in training mode by hand,
    its dropout mask an input of the graph."""
    op, layers, bi, extra, _ = CASES[case]
    width = _dirs(bi) * H
    results = "s, h, c" if op == "lstm" else "s, h"
    state = "c" if op == "lstm" else "h"
    rows = (f"concat(select(h, 0, 0), select({state}, 0, 1))" if bi
            else f"select(h, 0, 0) * select({state}, 0, {layers - 1})")
    mask_decl = f"  input m: f32[{layers - 1}, {B}, {T}, {width}]\n" if mask_input else ""
    train = ", train=true" if mask_input else ""
    return (f"model m() {{\n  input x: f32[{B}, {T}, {D}]\n{mask_decl}  input target: f32[{B}, {T}, {width}]\n"
            f"  {results} = {op}(x{', m' if mask_input else ''}, {H}, layers={layers}, "
            f"bidirectional={str(bi).lower()}, dropout={p}, layout=torch{extra}{train})\n"
            f"  out = s + reshape({rows}, [{B}, 1, {width}])\n  output loss = mse(out, target)\n}}\n")


def _module(case: str, layers: int | None = None, dropout: float = P) -> nn.Module:
    """PyTorch's module of the case (float64; weights float32-representable, so both sides hold the same numbers)."""
    op, n, bi, _, kw = CASES[case]
    torch.manual_seed(len(case))
    m = MODULES[op](D, H, num_layers=layers or n, bidirectional=bi, batch_first=True, dropout=dropout, **kw)
    m = m.double()
    with torch.no_grad():
        for w in m.parameters():
            w.copy_((w * 1.5).float().double())
    return m


def _data(case: str, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = _dirs(CASES[case][2]) * H
    return {"x": rng.standard_normal((B, T, D)), "target": rng.standard_normal((B, T, width))}


def _torch_loss(case: str, seq: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None, target: np.ndarray):
    """The .arch body's loss in torch: mse(s + the two final-state rows, target)."""
    op, layers, bi, _, _ = CASES[case]
    state = c if op == "lstm" else h
    rows = torch.cat([h[0], state[1]], -1) if bi else h[0] * state[layers - 1]
    return F.mse_loss(seq + rows[:, None], torch.tensor(target))


def _stacked(case: str, params: dict[str, torch.Tensor], x: torch.Tensor, masks: torch.Tensor):
    """PyTorch's stacked computation written out: one single-layer module per layer on that layer's weights
    (weight_ih_l1 read as the module's weight_ih_l0), the output sequence of every layer but the last times its
    mask. Returns (sequence, h_n, c_n or None)."""
    op, layers, bi, _, kw = CASES[case]
    seq, hs, cs = x, [], []
    for layer in range(layers):
        m = MODULES[op](seq.shape[-1], H, bidirectional=bi, batch_first=True, **kw).double()
        mine = {re.sub(rf"_l{layer}(?=$|_reverse)", "_l0", k.rsplit(".", 1)[1]): v for k, v in params.items()
                if re.search(rf"_l{layer}($|_reverse)", k)}
        assert set(mine) == set(dict(m.named_parameters()))
        out, state = torch.func.functional_call(m, mine, (seq,))
        hs.append(state[0] if op == "lstm" else state)
        if op == "lstm":
            cs.append(state[1])
        seq = out * masks[layer] if layer < layers - 1 else out
    return seq, torch.cat(hs), torch.cat(cs) if cs else None


def _torch_grads(case: str, weights: dict[str, np.ndarray], data: dict[str, np.ndarray], masks: np.ndarray):
    """The transcription's loss and the gradients of every weight and of x, in float64."""
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    x = torch.tensor(data["x"], requires_grad=True)
    loss = _torch_loss(case, *_stacked(case, params, x, torch.tensor(masks, dtype=torch.float64)), data["target"])
    loss.backward()
    return loss.item(), {**{k: v.grad.numpy() for k, v in params.items()}, "x": x.grad.numpy()}


def _close(got: np.ndarray, want: np.ndarray, tol: float) -> bool:
    return float(np.abs(np.asarray(got, np.float64) - want).max()) <= tol * max(float(np.abs(want).max()), 1e-300)


def _weights(case: str) -> dict[str, np.ndarray]:
    op = CASES[case][0]
    return {f"{op}.{k}": v.detach().numpy().copy() for k, v in _module(case).state_dict().items()}


def _layer(graph: Graph):
    return next(n for n in graph.nodes if n.op in MODULES)


def _step(case: str, seed: int = 7, **kw) -> tuple[Graph, str]:
    """The training step graph (training_graph, then the grad pass) with the layer's mask as output ``mask``."""
    train = training_graph(graph_from_source(_source(case)), seed=seed, **kw)
    mask = _layer(train).inputs[1]
    step = run_passes(train, ["grad"])
    step.outputs.append(("mask", mask))
    return step, mask


def _check_grads(case: str, out: dict[str, np.ndarray], weights: dict, data: dict, masks: np.ndarray, tol: float):
    loss, grads = _torch_grads(case, weights, data, masks)
    op = CASES[case][0]
    assert abs(float(out["loss"]) - loss) <= tol * abs(loss), (float(out["loss"]), loss)
    assert _close(out["grad_x"], grads.pop("x"), tol)
    for key, want in grads.items():
        assert _close(out[f"grad_{key.replace('.', '_')}"], want, tol), key
    assert len([k for k in out if k.startswith(f"grad_{op}_")]) == len(grads)


# -- (a) the same mask: torch's modules in train mode, and the transcription ----------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_irc_fed_torchs_own_mask_equals_the_module_in_train_mode(case: str) -> None:
    """nn.LSTM/GRU/RNN(num_layers, dropout=0.3).train() against irc's layer with train=true, fed the masks
    torch drew (re-drawn from the same torch seed), loss and every gradient within 1e-10."""
    op, layers, bi, _, _ = CASES[case]
    module, data = _module(case).train(), _data(case)
    x = torch.tensor(data["x"], requires_grad=True)
    torch.manual_seed(11)
    seq, state = module(x)
    h, c = state if op == "lstm" else (state, None)
    loss = _torch_loss(case, seq, h, c, data["target"])
    loss.backward()
    torch.manual_seed(11)  # torch's CPU kernel: after each layer but the last, a [T, B, dirs·H] draw
    masks = torch.stack([torch.empty(T, B, _dirs(bi) * H, dtype=torch.float64).bernoulli_(1 - P).div_(1 - P)
                         .transpose(0, 1) for _ in range(layers - 1)]).numpy()
    assert 0 < (masks == 0).mean() < 1  # the masks drop something: train mode is not eval mode here
    with torch.no_grad():
        module.eval()
        assert abs(_torch_loss(case, *_eval_outputs(module, x, op), data["target"]).item() - loss.item()) > 1e-6
    step = run_passes(graph_from_source(_source(case, mask_input=True)), ["grad"])
    weights = {f"{op}.{k}": v.detach().numpy() for k, v in module.state_dict().items()}
    out = run_graph(step, weights, {**data, "m": masks}, np.float64)
    assert abs(float(out["loss"]) - loss.item()) <= TOL64 * loss.item()
    assert _close(out["grad_x"], x.grad.numpy(), TOL64)
    for name, w in module.named_parameters():
        assert _close(out[f"grad_{op}_{name}"], w.grad.numpy(), TOL64), name


def _eval_outputs(module: nn.Module, x: torch.Tensor, op: str):
    seq, state = module(x)
    return (seq, *state) if op == "lstm" else (seq, state, None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_graph_mask_gives_torchs_gradients_float64(case: str) -> None:
    step, _ = _step(case)
    weights, data = _weights(case), _data(case)
    out = run_graph(step, weights, data, np.float64)
    masks = out["mask"]
    assert masks.shape == (CASES[case][1] - 1, B, T, _dirs(CASES[case][2]) * H)
    _check_grads(case, out, weights, data, masks, TOL64)
    # the comparison can fail: the same weights and data without the mask are off
    with pytest.raises(AssertionError):
        _check_grads(case, out, weights, data, np.ones_like(masks), TOL64)


@pytest.mark.parametrize("case", ["lstm_2_bi", "lstm_3", "gru_2_bi", "rnn_3_bi_relu"])
def test_cpu_backend_training_step_gives_torchs_gradients_float32(case: str, cpu_cache) -> None:
    from irc.backends.cpu import compile_graph

    step, _ = _step(case)
    weights, data = _weights(case), _data(case)
    out = compile_graph(step, cache_dir=cpu_cache).run({k: v.astype(np.float32) for k, v in weights.items()},
                                                       {k: v.astype(np.float32) for k, v in data.items()})
    ref_mask = run_graph(step, weights, data, np.float64)["mask"]
    assert np.array_equal(out["mask"], ref_mask.astype(np.float32))  # both engines draw the very same mask
    _check_grads(case, out, weights, data, ref_mask, TOL32)


# -- (b) the mask's statistics, (c) new masks every step ------------------------------------------------------


BIG = ("model m() {\n  input x: f32[8, 16, 5]\n  input target: f32[8, 16, 64]\n"
       "  s, h, c = lstm(x, 32, layers=3, bidirectional=true, dropout=%s, layout=torch)\n"
       "  output loss = mse(s, target)\n}\n")


def _mask_at(graph: Graph, step: int | None = None, step_name: str | None = None) -> np.ndarray:
    """The layer's mask in the training forward ``graph`` (the mask reads no weight; x is zeros)."""
    g = graph.copy()
    g.outputs = [("mask", _layer(g).inputs[1])]
    feed = {"x": np.zeros((8, 16, 5)), "target": np.zeros((8, 16, 64))}
    if step_name is not None:
        feed[step_name] = np.array(step, dtype=np.int64)
    return run_graph(g, init_weights(g, seed=0), feed, np.float64)["mask"]


@pytest.mark.parametrize("p", [0.3, 0.6])
def test_mask_drop_rate_and_scale(p: float) -> None:
    mask = _mask_at(training_graph(graph_from_source(BIG % p), seed=3))
    assert mask.shape == (2, 8, 16, 64)
    assert set(np.unique(mask)) == {0.0, 1 / (1 - p)}
    assert abs((mask == 0).mean() - p) < 4 * np.sqrt(p * (1 - p) / mask.size)
    assert not np.array_equal(mask[0], mask[1])  # each layer boundary draws its own


def test_a_new_mask_every_step_the_same_for_the_same_seed_and_step() -> None:
    graph = graph_from_source(BIG % 0.3)
    name = step_input_name(graph)
    train = training_graph(graph, seed=3, step_input=name)
    assert any(n.op == "input" and n.outputs[0] == name for n in train.nodes)  # the mask reads the step
    first, again, second = (_mask_at(train, s, name) for s in (0, 0, 1))
    assert np.array_equal(first, again) and not np.array_equal(first, second)
    other = _mask_at(training_graph(graph, seed=4, step_input=name), 0, name)
    assert not np.array_equal(first, other)
    rebuilt = _mask_at(training_graph(graph, seed=3, step_input=name), 1, name)
    assert np.array_equal(rebuilt, second)
    # without a step input, the seed alone: the same seed the same mask, another seed another
    a, b, c = (_mask_at(training_graph(graph, seed=s)) for s in (5, 5, 6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_the_layer_masks_leave_the_dropout_ops_seeds_alone() -> None:
    """The layers' masks are numbered apart from the dropout ops': adding one changes no other mask."""
    src = ("model m() {\n  input x: f32[2, 3, 4]\n  input target: f32[2, 3, 6]\n"
           "  s, h, c = lstm(dropout(x, 0.2), 6, layers=2, dropout=%s, layout=torch)\n"
           "  output loss = mse(dropout(s, 0.4), target)\n}\n")

    def seeds(p: float) -> list[int]:
        train = training_graph(graph_from_source(src % p), seed=9)
        layer_mask = _layer(train).inputs[1:]
        return [n.attrs["seed"] for n in train.nodes if n.op == "dropout_mask" and n.outputs[0] not in layer_mask]

    assert seeds(0.3) == seeds(0.0) and len(seeds(0.3)) == 2


# -- (d) no dropout, one layer: the graph as before ---------------------------------------------------------------


@pytest.mark.parametrize("layer", [
    "lstm(x, 6, layers=2, layout=torch)",
    "lstm(x, 6, layers=2, dropout=0.0, layout=torch)",
    "lstm(x, 6, layers=1, dropout=0.3, bidirectional=true, layout=torch)",
    "lstm(x, 6, dropout=0.3, layout=torch)",
    "lstm(x, 6)",
])
def test_no_dropout_between_layers_leaves_the_graph_as_it_was(layer: str) -> None:
    graph = graph_from_source(f"model m() {{\n  input x: f32[2, 3, 4]\n  s, h, c = {layer}\n"
                              "  output loss = mse(s * s, s)\n}\n")
    train = training_graph(graph, seed=1, step_input="step")
    assert print_graph(train) == print_graph(graph)
    assert len(_layer(train).inputs) == 1 and _layer(train).attrs.get("train") is None


# -- the record: type rule, cost; the exporters and CUDA refuse a training graph -----------------------------------

ERRORS = {
    "mask_without_train": ("lstm(x, m, 6, layers=3, dropout=0.3, layout=torch)",
                           "a dropout mask operand needs train=true"),
    "train_without_mask": ("lstm(x, 6, layers=3, dropout=0.3, layout=torch, train=true)",
                           "train=true needs the dropout mask [2, 2, 3, 6] as the second operand"),
    "train_one_layer": ("lstm(x, 6, dropout=0.3, layout=torch, train=true)",
                        "train=true applies dropout between stacked layers: it needs layers > 1 and dropout > 0"),
    "train_no_dropout": ("lstm(x, m, 6, layers=3, layout=torch, train=true)", "it needs layers > 1 and dropout > 0"),
    "mask_shape": ("lstm(x, m, 6, layers=2, dropout=0.3, layout=torch, train=true)",
                   "the dropout mask f32[2,2,3,6] must be [layers − 1, B, T, dirs·H] = [1, 2, 3, 6]"),
    "train_chapter_layout": ("lstm(x, 6, train=true)", "train= needs layout=torch"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_type_rule_errors(case: str) -> None:
    layer, message = ERRORS[case]
    src = f"model m() {{\n  input x: f32[2, 3, 4]\n  input m: f32[2, 2, 3, 6]\n  s, h, c = {layer}\n  output s\n}}\n"
    with pytest.raises(IrcError) as e:
        graph_from_source(src)
    assert message in str(e.value), str(e.value)


def test_cost_counts_the_mask_multiply_forward_and_backward() -> None:
    """Training adds one multiply per element of the sequences between layers, in the forward and the backward;
    and keeps the masked sequences too (the next layer's input) besides the unmasked ones."""
    case = "lstm_2_bi"
    plain = graph_from_source(_source(case))
    train = training_graph(plain, seed=0)
    step = run_passes(train, ["grad"])
    between = (CASES[case][1] - 1) * B * T * 2 * H
    types = step.value_types()

    def cost(graph: Graph, op: str):
        node = next(n for n in graph.nodes if n.op == op)
        return node_cost(node, [graph.value_types()[v] for v in node.inputs]), node

    (fwd_plain, _), (fwd_train, node) = cost(plain, "lstm"), cost(train, "lstm")
    assert fwd_train.total - fwd_plain.total == between and fwd_train.macs == fwd_plain.macs
    from irc.ops import get_op

    ins = [types[v] for v in node.inputs]
    plain_node = _layer(plain)
    assert (get_op("lstm").internal_elements(node.attrs, ins)
            - get_op("lstm").internal_elements(plain_node.attrs, ins[:1])) == between
    grad_train, _ = cost(step, "lstm_grad")
    grad_plain, _ = cost(run_passes(plain, ["grad"]), "lstm_grad")
    assert grad_train.total - grad_plain.total == between


def test_exporters_and_cuda_refuse_a_training_graph() -> None:
    from irc.backends import emit_source
    from irc.backends import onnx as onnx_export
    from irc.backends import torch as torch_export

    train = training_graph(graph_from_source(_source("lstm_2_bi")), seed=0)
    by_hand = graph_from_source(_source("lstm_2_bi", mask_input=True))
    for graph, word in ((train, "'dropout_mask'"), (by_hand, "'lstm' with train=true")):
        for export in (lambda g: onnx_export.to_model(g, {}), torch_export.emit_source,
                       lambda g: emit_source(g, "cuda")):
            with pytest.raises(IrcError) as e:
                export(graph)
            assert word in str(e.value), str(e.value)


def test_the_backward_primitive_takes_the_mask_last_only_in_training() -> None:
    from irc.ops import get_op
    from irc.ops.registry import ShapeError
    from irc.types import TensorType

    graph = training_graph(graph_from_source(_source("lstm_3")), seed=0)
    node = _layer(graph)
    x, mask = (graph.value_types()[v] for v in node.inputs)
    seq, h, c = node.types
    grad = get_op("lstm_grad")
    assert len(grad.infer(node.attrs, [x, seq, h, c, mask])) == 1 + 12  # dx, then 4 weights per layer
    assert len(grad.infer(node.attrs, [x, seq, mask])) == 13
    with pytest.raises(ShapeError, match="a dropout mask operand needs train=true"):
        grad.infer({**node.attrs, "train": None}, [x, seq, h, c, mask])
    with pytest.raises(ShapeError, match="must be"):
        grad.infer(node.attrs, [x, seq, h, c, TensorType("f32", (2, B, T, 2 * H))])


def test_the_training_step_prints_and_parses_back_with_symbolic_sizes() -> None:
    from irc.ir_parser import parse_ir

    src = ("model m(B, T) {\n  input x: f32[B, T, 4]\n"
           "  s, h = gru(x, 6, layers=3, bidirectional=true, dropout=0.3, layout=torch, variant=torch)\n"
           "  output loss = mse(s * s, s)\n}\n")
    step = run_passes(training_graph(graph_from_source(src), seed=2, step_input="step"), ["grad"])
    text = print_graph(step)
    assert "gru_grad %x, %d.s.1, %s.mask {" in text and "f32[2,B,T,12]" in text
    assert print_graph(parse_ir(text, "step.ir")) == text


# -- irc train: a small stacked-LSTM language model with dropout, on both engines ----------------------------------

LM = """model lm(B, T) {
  const vocab = 256, hidden = 16
  input tokens: i32[B, T]
  emb = embedding(vocab, hidden)
  seq, h, c = lstm(emb(tokens), hidden, layers=2, dropout=%s, layout=torch)
  output logits = linear(seq, vocab)
}
"""


def _train_losses(engine, p: float, folder: Path) -> list[float]:
    """12 Adam steps of the LM (dropout p) on random tokens: the loss of each step."""
    from irc.pipeline import load_graph
    from irc.runtime.optim import OptimConfig
    from irc.runtime.train import TrainConfig, build_step, fresh_state, train_steps
    from irc.runtime.train_data import ArrayData

    path = folder / f"lm_{p}.arch"
    path.write_text(LM % p)
    graph = load_graph(path, {"B": 4, "T": 6})
    graphs = build_step(graph, seed=2, engine=engine)
    assert sum(n.op == "dropout_mask" for n in graphs.step.nodes) == (1 if p else 0)
    text = np.random.default_rng(4).integers(0, 256, (32, 7))
    data = ArrayData("random", {"tokens": text[:, :-1], "targets": text[:, 1:]})
    dtype = np.float64 if engine.name == "numpy" else np.float32
    cfg = TrainConfig(steps=12, batch=4, seed=2, lr=3e-3, optim=OptimConfig("adam"), dtype=dtype)
    state = fresh_state(init_weights(graph, seed=1), cfg)
    assert train_steps(graphs, state, data, cfg)
    return [row[2] for row in state.history]


def test_training_a_dropout_lstm_lm_cpu_equals_the_reference(cpu_cache, tmp_path: Path) -> None:
    from irc.runtime.train_engine import Engine

    ref = _train_losses(Engine("numpy"), 0.3, tmp_path)
    cpu = _train_losses(Engine("cpu", cache_dir=cpu_cache), 0.3, tmp_path)
    rel = np.abs(np.array(cpu) - np.array(ref)) / np.abs(np.array(ref))
    assert rel.max() <= TOL32, (rel.max(), cpu, ref)
    assert ref != _train_losses(Engine("numpy"), 0.0, tmp_path)  # the dropout acts in training


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_irc_train_runs_a_dropout_lstm_lm(irc_cli: Callable, tmp_path: Path, cpu_cache, backend: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRC_CACHE_DIR", str(cpu_cache.parent / "cli-cache"))
    model, text = tmp_path / "lm.arch", tmp_path / "text.txt"
    model.write_text(LM % 0.3)
    text.write_text("the cat sat on the mat. " * 60)
    r = irc_cli(["train", str(model), "--data", str(text), "-D", "T=12", "--batch", "8", "--steps", "30", "--lr",
                 "1e-2", "--backend", backend, "--save", str(tmp_path / "w.safetensors")])
    assert r.rc == 0, r.err
    losses = [float(row.split(",")[2]) for row in (tmp_path / "w.loss.csv").read_text().splitlines()[1:]]
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0] * 0.8
