"""The CPU backend's backward kernels of the element-wise and row-wise primitives, the losses, the norms and the
tables (backends/cpu/render/grad_*.py) against the NumPy reference in float64: each case is a small model with
a loss, differentiated by the grad pass and compiled whole, every gradient within 1e-5 of its largest entry."""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import build, random_inputs, random_weights
from test_cpu_backend_helpers import cpu_cache
from test_cpu_grad_helpers import check, one_loss, step_graph

from irc.backends.cpu import compile_graph
from irc.backends.numpy_ref import run_graph
from irc.diagnostics import IrcError

_ = cpu_cache  # a fixture, used by name below

# every activation on its own row of x, so each derivative has its own rows of grad_x
ACTIVATIONS = """model acts() {
  input x: f32[15, 64]
  input y: f32[64]
  a = relu(select(x, axis=0, index=0)) + leaky_relu(select(x, axis=0, index=1), slope=0.2)
  a = a + gelu(select(x, axis=0, index=2)) + gelu(select(x, axis=0, index=3), approx=tanh)
  a = a + silu(select(x, axis=0, index=4)) + tanh(select(x, axis=0, index=5)) + sigmoid(select(x, axis=0, index=6))
  a = a + abs(select(x, axis=0, index=7)) + relu6(select(x, axis=0, index=8) * 4.0)
  a = a + hardtanh(select(x, axis=0, index=9), min=-0.5, max=0.7) + clamp(select(x, axis=0, index=10), min=-0.3)
  a = a + hardswish(select(x, axis=0, index=11) * 4.0) + hardsigmoid(select(x, axis=0, index=12) * 4.0)
  a = a + mish(select(x, axis=0, index=13) * 3.0) + elu(select(x, axis=0, index=14), alpha=0.7)
  output loss = mse(a, y)
}
"""

# softmax on the last and a middle axis, the causal mask with and without a window, RoPE, maximum,
# a broadcasting product (sum_to over a leading axis), slices (slice_grad)
ROWS = """model rows() {
  input x: f32[2, 3, 6, 6]
  input y: f32[2, 3, 6, 6]
  s = softmax(causal_mask(x, window=2)) + softmax(causal_mask(x)) * 2.0 + softmax(x, axis=1)
  b = rope(x) + maximum(x, y) + x * select(x, axis=0, index=1) + slice(x, axis=3, start=0, end=6) * 0.5
  output loss = mse(s + b + relu(x), y)
}
"""

LM = """model lm(B, T) {
  input tokens: i32[B, T]
  input targets: i64[B, T]
  emb = embedding(8, 24)
  x = positional(emb(tokens), learned, max_len=16)
  h = layernorm(x) + rmsnorm(x) + layernorm(x, affine=false) + rmsnorm(x, 1e-5, false) + layernorm(x, bias=false)
  output loss = cross_entropy(unembed(h, tied=emb), targets, ignore_index=3)
}
"""

NORMS = """model norms(B) {
  input x: f32[B, 4, 5, 5]
  input y: f32[B, 4, 5, 5]
  h = batchnorm(x) * 2.0 + groupnorm(x, 2) + instancenorm(x) + layernorm(x, axis=1) + groupnorm(x, 4, affine=false)
  output loss = mse(h + batchnorm(x, axis=-1), y)
}
"""


def test_activation_derivatives(cpu_cache) -> None:
    check(cpu_cache, step_graph(ACTIVATIONS), {"act_grad", "mse", "mse_grad", "slice_grad"})


def test_softmax_mask_rope_minmax_sum_to_and_slice_gradients(cpu_cache) -> None:
    check(cpu_cache, step_graph(ROWS), {"softmax_grad", "causal_mask_grad", "rope_grad", "minmax_grad", "sum_to",
                                        "slice_grad", "act_grad"})


def test_cross_entropy_norms_and_tables(cpu_cache) -> None:
    graph = step_graph(LM, B=3, T=10)
    check(cpu_cache, graph, {"cross_entropy", "cross_entropy_grad", "layernorm_grad", "rmsnorm_grad",
                             "embedding_grad", "position_grad"})


def test_batchnorm_groupnorm_instancenorm_and_channels_first_layernorm(cpu_cache) -> None:
    check(cpu_cache, step_graph(NORMS, B=3), {"batchnorm_grad", "groupnorm_grad", "instancenorm_grad",
                                             "layernorm_grad"})


def test_batchnorm_in_training_mode(cpu_cache) -> None:
    check(cpu_cache, step_graph(NORMS, train=True, B=3), {"batchnorm", "batchnorm_grad"})


def test_cross_entropy_refuses_a_class_outside_the_logits(cpu_cache) -> None:
    graph = step_graph(LM, B=2, T=4)
    weights, inputs = random_weights(graph), random_inputs(graph)
    inputs["targets"] = inputs["targets"].astype(np.int64)
    inputs["targets"][1, 2] = 8  # 8 classes: ids 0..7, and 3 is the ignore index
    with pytest.raises(IrcError, match=r"target class 8 is outside \[0, 8\) and is not the ignore_index 3"):
        compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs)


def test_every_row_ignored_gives_nan_as_torch(cpu_cache) -> None:
    graph = step_graph(LM, B=2, T=4)
    weights, inputs = random_weights(graph), random_inputs(graph)
    inputs["targets"] = np.full((2, 4), 3, np.int64)
    out = compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs)
    assert np.isnan(out["loss"])  # 0/0, as F.cross_entropy over ignored rows only


def test_dropout_masks_are_the_references(cpu_cache) -> None:
    """The CPU backend draws training dropout's masks exactly as the reference, with and without a step."""
    from irc.ops.grad_train import training_graph

    source = "model m() {\n  input x: f32[64, 48]\n  output y = dropout(x, p=0.3) + dropout(x, p=0.6)\n}\n"
    graph = training_graph(build(source), seed=11, step_input="step")
    plain = training_graph(build(source), seed=11)
    for g, feed in ((graph, {"step": np.array(7, np.int64)}), (plain, {})):
        inputs = {"x": np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32), **feed}
        want = run_graph(g, {}, inputs, np.float32)["y"]
        got = compile_graph(g, cache_dir=cpu_cache).run({}, inputs)["y"]
        assert np.array_equal(got, want)
    # another step, other masks
    other = compile_graph(graph, cache_dir=cpu_cache).run({}, {"x": inputs["x"], "step": np.array(8, np.int64)})
    assert not np.array_equal(other["y"], run_graph(graph, {}, {"x": inputs["x"], "step": np.array(7, np.int64)},
                                                    np.float32)["y"])


def test_mse_over_a_broadcast_prediction(cpu_cache) -> None:
    src = one_loss("  input x: f32[5, 7]\n  input b: f32[7]", "y = tanh(x + b) * 3.0")
    check(cpu_cache, step_graph(src), {"mse", "mse_grad", "act_grad", "sum_to"})


def test_loss_gradients_scale_by_a_given_dloss(cpu_cache) -> None:
    source = ("model m() {\n  input l: f32[6, 5]\n  input t: i64[6]\n  input dl: f32[]\n  input p: f32[4, 3]\n"
              "  input q: f32[4, 3]\n  output g1 = cross_entropy_grad(l, t, dl, ignore_index=2)\n"
              "  output g2 = mse_grad(p, q, dl)\n}\n")
    check(cpu_cache, build(source), {"cross_entropy_grad", "mse_grad"}, id_bound=5)
