"""rnn/lstm/gru with ``layout=torch``: PyTorch's stacked, bidirectional, two-bias nn.RNN/LSTM/GRU
(batch_first), checked against torch on the same weights: the numpy reference (float32 within
1e-5, float64 within 1e-10), the cpu backend and the cuda backend in the simulator (float32
within 1e-5); the parameter names and shapes against the module's state_dict (loading is a pure
renaming), the parameter count of Zaremba et al.'s large LSTM LM against torch's, the FLOPs
against the per-step formula, the forget-gate init, the recurrent state the KV analysis counts,
and the layout's errors. Tolerance: max|ours − torch| / max|torch| per output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_cpu_backend_helpers import cpu_cache
from test_cuda_helpers import cuda_cache
from torch import nn

from irc.analysis.flops import node_cost
from irc.analysis.kv_cache import analyse_kv
from irc.analysis.params import count_params
from irc.diagnostics import IrcError
from irc.ops import get_op
from irc.printer import print_graph
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights
from irc.runtime.weights import check_weights, expected_weights

ORACLE_OPS = frozenset({"rnn", "lstm", "gru"})
_ = cpu_cache, cuda_cache
TOL32, TOL64 = 1e-5, 1e-10
B, T, D, H = 2, 5, 6, 4
MODULES = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}

# (op, layers, bidirectional, bias, extra attributes, torch keyword arguments)
CASES = {
    "lstm_2_bi": ("lstm", 2, True, True, "", {}),
    "lstm_3": ("lstm", 3, False, True, ", dropout=0.5", {"dropout": 0.5}),
    "lstm_1_bi_nobias": ("lstm", 1, True, False, "", {}),
    "gru_2_bi": ("gru", 2, True, True, ", variant=torch", {}),
    "rnn_2_bi_tanh": ("rnn", 2, True, True, "", {}),
    "rnn_2_relu": ("rnn", 2, False, True, ", act=relu", {"nonlinearity": "relu"}),
}


def _source(op: str, layers: int, bi: bool, bias: bool, extra: str, t: int = T) -> str:
    results = "y, h, c" if op == "lstm" else "y, h"
    return (f"model m() {{\n  input x: f32[{B}, {t}, {D}]\n  {results} = {op}(x, {H}, layers={layers}, "
            f"bidirectional={str(bi).lower()}, bias={str(bias).lower()}, layout=torch{extra})\n"
            + "".join(f"  output {r}\n" for r in results.split(", ")) + "}\n")


def _case(name: str):
    op, layers, bi, bias, extra, kwargs = CASES[name]
    torch.manual_seed(len(name))
    module = MODULES[op](D, H, num_layers=layers, bidirectional=bi, bias=bias, batch_first=True, **kwargs)
    module = module.double().eval()  # eval: dropout between layers is the identity, as in irc
    with torch.no_grad():
        for p in module.parameters():  # float32-representable, so both sides hold the same numbers
            p.copy_((p * 1.5).float().double())
    graph = graph_from_source(_source(op, layers, bi, bias, extra))
    scope = next(n for n in graph.nodes if n.op == op).weights
    weights = {f"{scope}.{k}": v.numpy().astype(np.float32) for k, v in module.state_dict().items()}
    x = np.random.default_rng(3).standard_normal((B, T, D)).astype(np.float32)
    with torch.no_grad():
        seq, state = module(torch.from_numpy(x.astype(np.float64)))
    want = {"y": seq.numpy()}
    if op == "lstm":
        want |= {"h": state[0].numpy(), "c": state[1].numpy()}
    else:
        want["h"] = state.numpy()
    return graph, weights, {"x": x}, want


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_loads_by_renaming_and_results_are_torch_shaped(name):
    graph, weights, inputs, want = _case(name)
    check_weights(graph, weights)  # every key present, every shape torch's
    assert set(expected_weights(graph)) == set(weights)
    out_types = {label: graph.value_types()[value] for label, value in graph.outputs}
    assert {k: tuple(t.shape) for k, t in out_types.items()} == {k: v.shape for k, v in want.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_torch(name):
    graph, weights, inputs, want = _case(name)
    for label, (err32, err64) in reference_errors(graph, weights, inputs, want).items():
        assert err32 <= TOL32 and err64 <= TOL64, (label, err32, err64)


def test_the_comparison_can_fail():
    """Swapping the two directions' weights changes the result: the reverse pass is really reversed."""
    graph, weights, inputs, want = _case("lstm_2_bi")
    def swap(key: str) -> str:  # layer 0's forward and reverse weights change places
        if key.endswith("_l0_reverse"):
            return key.removesuffix("_reverse")
        return key + "_reverse" if key.endswith("_l0") else key

    swapped = {swap(k): v for k, v in weights.items()}
    assert set(swapped) == set(weights)
    (bad32, _) = reference_errors(graph, swapped, inputs, {"y": want["y"]})["y"]
    assert bad32 > 1e-2


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_matches_torch(name, cpu_cache):
    from irc.backends.cpu import compile_graph

    graph, weights, inputs, want = _case(name)
    got = compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs)
    for label in want:
        assert rel_error(got[label], want[label]) <= TOL32, label


@pytest.mark.parametrize("name", ["lstm_2_bi", "gru_2_bi", "rnn_2_relu", "lstm_1_bi_nobias"])
def test_cuda_simulator_matches_torch(name, cuda_cache):
    from irc.backends.cuda import compile_graph

    graph, weights, inputs, want = _case(name)
    got = compile_graph(graph, cache_dir=cuda_cache).run(weights, inputs)
    for label in want:
        assert rel_error(got[label], want[label]) <= TOL32, label


ZAREMBA_LARGE = """model zaremba_large(B, T) {
  const vocab = 10000, hidden = 1500
  input tokens: i32[B, T]
  emb = embedding(vocab, hidden)
  seq, h, c = lstm(dropout(emb(tokens), 0.65), hidden, layers=2, dropout=0.65, layout=torch)
  output logits = linear(dropout(seq, 0.65), vocab)
}
"""


def test_zaremba_large_parameter_count_is_torchs():
    graph = graph_from_source(ZAREMBA_LARGE, {"B": 1, "T": 35})
    lm = [nn.Embedding(10000, 1500), nn.LSTM(1500, 1500, num_layers=2, dropout=0.65), nn.Linear(1500, 10000)]
    torch_count = sum(p.numel() for m in lm for p in m.parameters())
    assert count_params(graph)[0] == torch_count == 66_034_000  # 15,000,000 + 2·18,012,000 + 15,010,000
    one_bias = graph_from_source("""model chapter_layout(B, T) {
  input tokens: i32[B, T]
  s1, h1, c1 = lstm(embedding(tokens, 10000, 1500), 1500)
  seq, h, c = lstm(s1, 1500)
  output logits = linear(seq, 10000)
}""", {"B": 1, "T": 35})
    assert torch_count - count_params(one_bias)[0] == 12_000  # one 4·1,500 bias vector per layer fewer


@pytest.mark.parametrize("name", sorted(CASES))
def test_flops_follow_the_per_step_formula(name):
    op, layers, bi, bias, _, _ = CASES[name]
    graph = _case(name)[0]
    node = next(n for n in graph.nodes if n.op == op)
    types = graph.value_types()
    cost = node_cost(node, [types[v] for v in node.inputs])
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[op]
    dirs = 2 if bi else 1
    macs = sum(dirs * T * B * gates * H * ((D if layer == 0 else dirs * H) + H) for layer in range(layers))
    assert cost.flops["linear"] == 2 * macs  # a MAC is 2 FLOPs
    act, other = {"rnn": (1, 0), "lstm": (5, 4), "gru": (3, 5)}[op]
    assert cost.flops["activation"] == layers * dirs * T * B * H * act
    adds = layers * dirs * T * B * gates * H * 2 if bias else 0  # b_ih and b_hh
    assert cost.flops.get("elementwise", 0) == layers * dirs * T * B * H * other + adds


def test_init_puts_the_forget_gate_bias_on_bias_ih_only():
    graph = graph_from_source(_source("lstm", 2, True, True, ", forget_bias=2.0"))
    w = init_weights(graph)
    for key, value in w.items():
        if ".bias_ih_" in key:
            assert np.all(value[H:2 * H] == 2.0) and not np.any(np.delete(value, np.s_[H:2 * H]))
        elif ".bias_hh_" in key:
            assert not np.any(value)
    assert len([k for k in w if ".bias_ih_" in k]) == 4  # 2 layers × 2 directions


def test_recurrent_state_and_internals():
    graph = graph_from_source(_source("lstm", 2, True, True, ""))
    assert analyse_kv(graph, "f16", "f32").recurrent_state_bytes == 2 * (2 * 2 * B * H) * 4  # h and c, f32
    node = next(n for n in graph.nodes if n.op == "lstm")
    types = graph.value_types()
    saved = get_op("lstm").internal_elements(node.attrs, [types[v] for v in node.inputs])
    assert saved == 4 * B * T * H * 6 + B * T * 2 * H  # 4 passes' gates + layer 0's output sequence


def test_default_layout_prints_and_counts_as_before():
    plain = graph_from_source(f"model m() {{ input x: f32[{B}, {T}, {D}]\n y, h, c = lstm(x, {H})\n output y }}")
    text = print_graph(plain)
    assert "layout" not in text and "layers" not in text and "bidirectional" not in text
    assert count_params(plain)[0] == 4 * H * (D + H + 1)


@pytest.mark.parametrize("src,message", [
    ("lstm(x, 4, layers=2)", "layers= needs layout=torch"),
    ("lstm(x, 4, bidirectional=true, dropout=0.1)", "bidirectional, dropout= need layout=torch"),
    ("gru(x, 4, layout=torch)", "it needs variant=torch"),
    ("lstm(x, 4, layers=2, dropout=1.5, layout=torch)", "dropout=1.5 must be at least 0 and below 1"),
])
def test_layout_errors(src, message):
    with pytest.raises(IrcError, match=message):
        graph_from_source(f"model m() {{ input x: f32[2, 3, 5]\n output y = {src} }}")
