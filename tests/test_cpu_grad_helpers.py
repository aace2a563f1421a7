"""What the tests of the CPU backend's backward kernels share (this module holds no tests): a small model with
a loss, differentiated by the grad pass (in training mode when asked), compiled by the CPU backend and run
against the NumPy reference in float64 on random weights and inputs. Every output — the loss and each
gradient — must agree within 1e-5 of its largest entry (float32 kernels against a float64 reference)."""

from __future__ import annotations

from pathlib import Path

from backend_cases import build, random_inputs, random_weights, reference
from test_cpu_backend_helpers import rel_error

from irc.backends.cpu import compile_graph
from irc.graph import Graph
from irc.ops.grad_train import training_graph
from irc.passes import PASSES

TOL = 1e-5


def step_graph(source: str, train: bool = False, flash: bool = False, **sizes: int) -> Graph:
    """The model's training step: (training mode,) the grad pass (and flash-grad)."""
    graph = build(source, **sizes)
    if train:
        graph = training_graph(graph, seed=5)
    graph = PASSES["grad"](graph)
    return PASSES["flash-grad"](graph) if flash else graph


def check(cache: Path, graph: Graph, ops: set[str], tol: float = TOL, id_bound: int = 8) -> dict[str, float]:
    """Compile ``graph``, run it and the reference on the same random weights and inputs; every op of ``ops``
    must be in the graph (so the test exercises the kernel it names) and every output within ``tol``."""
    present = {n.op for n in graph.nodes}
    assert ops <= present, f"the graph lacks {sorted(ops - present)}"
    weights, inputs = random_weights(graph), random_inputs(graph, id_bound=id_bound)
    want = reference(graph, weights, inputs)
    got = compile_graph(graph, cache_dir=cache).run(weights, inputs)
    assert sorted(got) == sorted(want)
    errors = {label: rel_error(got[label], want[label]) for label in want}
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"outputs off the reference (normwise relative error > {tol}): {bad}"
    return errors


def one_loss(inputs: str, body: str) -> str:
    """A model whose loss is mse(y·y, y) of the value ``y`` that ``body`` defines (nonlinear in y, so every
    gradient reaching y is a nontrivial function of it)."""
    return f"model m() {{\n{inputs}\n  {body}\n  output loss = mse(y * y, y)\n}}\n"

