"""The grad pass as a compiler pass: its IR round-trips and runs as printed, `irc analyze` counts the
training FLOPs of a step from it (against the chapter's 6·N per token and the 3× rule), and the saved
activations are the forward values the backward reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from irc.backends.numpy_ref import run_graph
from irc.ir_parser import parse_ir
from irc.passes.grad import attach_loss
from irc.passes.grad_cost import training_cost
from irc.pipeline import load_graph, run_passes
from irc.printer import print_graph
from irc.runtime.init import init_weights
from irc.runtime.inputs import random_inputs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PASSES = HERE / "golden" / "passes"


def test_grad_ir_round_trips_and_runs_as_printed() -> None:
    for case in sorted(PASSES.glob("grad_*.arch")):
        symbolic = load_graph(case)
        graph = load_graph(case, {s: {"B": 2, "T": 5, "S": 3}[s] for s in symbolic.symbols})
        backward = run_passes(graph, ["grad"])
        text = print_graph(backward)
        parsed = parse_ir(text, str(case))
        assert print_graph(parsed) == text, case.name
        weights, inputs = init_weights(graph, seed=3), random_inputs(graph, seed=4)
        a = run_graph(backward, weights, inputs, dtype=np.float64)
        b = run_graph(parsed, weights, inputs, dtype=np.float64)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), case.name
        assert print_graph(run_passes(graph, ["grad"])) == text  # deterministic


def _linear_stack(tmp_path: Path) -> Path:
    path = tmp_path / "stack.arch"
    path.write_text("model stack(B) {\n  input x: f32[B, 12]\n  input y: f32[B, 5]\n"
                    "  h = linear(linear(x, 20, bias=false), 16, bias=false)\n"
                    "  output loss = mse(linear(h, 5, bias=false), y)\n}\n", encoding="utf-8")
    return path


def test_training_flops_of_a_linear_stack_are_six_n_per_row(tmp_path: Path) -> None:
    """Without biases or activations, a step's products are exactly the chapter's 6·N per row: 2N
    forward, 2N for the weight gradients and 2N for the input gradients (x is a float input)."""
    graph = run_passes(load_graph(_linear_stack(tmp_path), {"B": 7}), ["grad"])
    cost = training_cost(graph)
    n = 12 * 20 + 20 * 16 + 16 * 5
    assert cost.six_n_flops == 6 * n * 7
    products = 0
    types = graph.value_types()
    from irc.analysis.flops import node_cost

    for node in graph.nodes:
        if node.op != "input":
            c = node_cost(node, [types[v] for v in node.inputs])
            products += c.flops.get("linear", 0) + c.flops.get("matmul", 0)
    assert products == 6 * n * 7
    # and the rest: the mse (3 per element), its gradient (2) and the target's (its negation, 1)
    assert cost.total_flops - products == 6 * 7 * 5
    # the 3× rule over-counts the loss's elementwise work, and matches the products
    assert cost.rule_3x_flops == 3 * 2 * n * 7 + 2 * 3 * 7 * 5


def test_irc_analyze_counts_the_training_step_from_the_grad_ir(irc_cli: Callable, tmp_path: Path) -> None:
    dump = tmp_path / "step.ir"
    result = irc_cli(["compile", str(_linear_stack(tmp_path)), "--passes", "grad", "-D", "B=7"])
    assert result.rc == 0, result.err
    dump.write_text(result.out, encoding="utf-8")
    analysis = irc_cli(["analyze", str(dump), "--json"])
    assert analysis.rc == 0, analysis.err
    totals = json.loads(analysis.out)["totals"]
    cost = training_cost(load_graph(dump))
    assert totals["flops_forward"] == cost.total_flops == 6 * (12 * 20 + 20 * 16 + 16 * 5) * 7 + 6 * 7 * 5


def test_saved_activations_are_what_the_backward_reads(tmp_path: Path) -> None:
    """MLP: gelu's derivative reads its input (the first gemm's output), the second weight's gradient
    reads h, cross_entropy's gradient reads the logits; x and the targets are inputs."""
    graph = run_passes(load_graph(PASSES / "grad_mlp.arch", {"B": 4}), ["grad"])
    cost = training_cost(graph)
    assert cost.saved == {"linear": 4 * 16 * 4, "h": 4 * 16 * 4, "logits": 4 * 16 * 4}
    assert cost.input_bytes == 4 * 8 * 4 + 4 * 4


def test_gpt2_step_against_the_rules() -> None:
    """GPT-2 at 2 layers (d 64, T 32): the exact step is 3× its forward products plus the backward's
    own elementwise work; 6·N per token leaves out attention's T² products and counts the embedding."""
    sizes = {"B": 2, "T": 32, "layers": 2, "d": 64, "heads": 4, "vocab": 100, "ctx": 32}
    graph = attach_loss(load_graph(ROOT / "models" / "gpt2_small.arch", sizes))
    cost = training_cost(run_passes(graph, ["grad"]))
    assert cost.six_n_flops == 6 * (100 * 64 + 32 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64) * 64
    assert 0.9 < cost.total_flops / cost.rule_3x_flops < 1.1
    assert cost.backward_flops > 2 * cost.forward_flops * 0.9
    # the backward keeps every layer's attention probabilities: [B, heads, T, T] per layer at least
    probs = [v for v in cost.saved if v.endswith(".probs")]
    assert len(probs) == 2 and all(cost.saved[v] == 2 * 4 * 32 * 32 * 4 for v in probs)


def test_attach_loss_names_its_target_apart_from_the_model(tmp_path: Path) -> None:
    path = tmp_path / "m.arch"
    path.write_text("model m(B) {\n  input targets: f32[B, 4]\n  output y = linear(targets, 3)\n}\n", encoding="utf-8")
    graph = attach_loss(load_graph(path), "cross_entropy")
    names = [n.outputs[0] for n in graph.inputs()]
    assert names == ["targets", "targets_1"] and graph.outputs == [("loss", "y_loss")]
