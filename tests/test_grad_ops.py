"""Every op's vector-Jacobian product, op by op: the grad pass's gradients (of inputs and parameters)
against torch.autograd within 1e-5 in float32 and 1e-10 in float64 (relative to the largest entry of
each gradient), and against central finite differences of irc's own forward in float64.

Each case is one op (its vjp, and the backward primitives it emits) on small shapes, under a mean
squared error against a random target (or its own loss), with PyTorch's functional form of the op.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.backends.numpy_ref import run_graph
from irc.graph import Graph
from irc.passes.grad import grad_label
from irc.pipeline import load_graph, run_passes
from irc.runtime.init import init_weights

# the backward primitives and losses this file, and from "slice_grad" on tests/test_grad_ops_more.py, check
# against torch.autograd (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({
    "sum_to", "act_grad", "softmax_grad", "causal_mask_grad", "layernorm_grad", "rmsnorm_grad", "embedding_grad",
    "position_grad", "cross_entropy", "cross_entropy_grad", "mse", "mse_grad", "conv1d_grad", "conv2d_grad",
    "maxpool1d_grad", "maxpool2d_grad", "avgpool1d_grad", "avgpool2d_grad", "global_avgpool_grad", "batchnorm_grad",
    "lstm_grad", "rel_position_bias_grad",
    "slice_grad", "minmax_grad", "rope_grad", "groupnorm_grad", "instancenorm_grad", "rnn_grad", "gru_grad",
    "conv_transpose1d_grad", "conv_transpose2d_grad", "adaptive_avgpool2d_grad", "upsample_grad", "dropout_mask",
})

T = dict[str, torch.Tensor]
Fn = Callable[[T, T], torch.Tensor]


def _act(name: str, **kw) -> tuple[str, Fn]:
    attrs = "".join(f", {k}={v}" for k, v in kw.items())
    return f"{name}(x{attrs})", lambda i, w: _TORCH_ACT[name](i["x"], **kw)


_TORCH_ACT: dict[str, Callable] = {
    "relu": lambda x: F.relu(x), "leaky_relu": lambda x, slope=0.01: F.leaky_relu(x, slope),
    "gelu": lambda x, approx="none": F.gelu(x, approximate=approx), "silu": F.silu, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "abs": torch.abs, "relu6": F.relu6,
    "hardtanh": lambda x, min=-1.0, max=1.0: F.hardtanh(x, min, max),
    "clamp": lambda x, min=None, max=None: torch.clamp(x, min, max), "hardswish": F.hardswish,
    # F.hardsigmoid's backward multiplies by 1.0f/6 (a float32 constant) even in float64: its autograd
    # through relu6(x + 3)/6 is the same function with an exact derivative
    "hardsigmoid": lambda x: F.relu6(x + 3) / 6, "mish": F.mish, "elu": lambda x, alpha=1.0: F.elu(x, alpha),
    "identity": lambda x: x, "dropout": lambda x, p=0.1: x,
}

X = "x: f32[2, 3, 5]"
# id -> (input declarations, the op's expression, torch's form); weights are keyed out.<name>
CASES: dict[str, tuple[list[str], str, Fn]] = {
    **{f"act_{name}": ([X], *_act(name)) for name in
       ("relu", "silu", "tanh", "sigmoid", "abs", "relu6", "hardswish", "hardsigmoid", "mish", "identity")},
    "act_leaky_relu": ([X], *_act("leaky_relu", slope=0.2)),
    "act_gelu": ([X], *_act("gelu")),
    "act_gelu_tanh": ([X], "gelu(x, approx=tanh)", lambda i, w: F.gelu(i["x"], approximate="tanh")),
    "act_hardtanh": ([X], *_act("hardtanh", min=-0.5, max=1.5)),
    "act_clamp": ([X], "clamp(x, min=-0.3)", lambda i, w: torch.clamp(i["x"], min=-0.3)),
    "act_elu": ([X], *_act("elu", alpha=0.7)),
    "dropout": ([X], "dropout(x, p=0.3)", lambda i, w: i["x"]),  # the identity the reference runs
    "softmax": ([X], "softmax(x, axis=1)", lambda i, w: torch.softmax(i["x"], 1)),
    "add_broadcast": ([X, "y: f32[3, 1]"], "x + y", lambda i, w: i["x"] + i["y"]),
    "sub_broadcast": ([X, "y: f32[5]"], "y - x", lambda i, w: i["y"] - i["x"]),
    "mul_broadcast": ([X, "y: f32[2, 1, 5]"], "x * y", lambda i, w: i["x"] * i["y"]),
    "div_broadcast": ([X, "y: f32[1, 5]"], "x / (y * y + 1.0)", lambda i, w: i["x"] / (i["y"] * i["y"] + 1)),
    "mul_self": ([X], "x * x", lambda i, w: i["x"] * i["x"]),
    "scalars": ([X], "2.0 - (x * 3.0) / 4.0 + 1.0 / (x * x + 2.0)",
                lambda i, w: 2 - (i["x"] * 3) / 4 + 1 / (i["x"] * i["x"] + 2)),
    "matmul_batched": (["x: f32[2, 3, 4]", "y: f32[4, 5]"], "matmul(x, y)", lambda i, w: i["x"] @ i["y"]),
    "reshape_transpose_flatten": ([X], "flatten(transpose(reshape(x, [2, 15, 1]), [0, 2, 1]))",
                                  lambda i, w: i["x"].reshape(2, 15, 1).permute(0, 2, 1).flatten(1)),
    "linear": ([X], "linear(x, 4)", lambda i, w: F.linear(i["x"], w["out.weight"], w["out.bias"])),
    "ffn": ([X], "ffn(x, hidden=6, act=gelu)",
            lambda i, w: F.linear(F.gelu(F.linear(i["x"], w["out.w1"], w["out.b1"])), w["out.w2"], w["out.b2"])),
    "swiglu": ([X], "swiglu(x, hidden=6)",
               lambda i, w: F.linear(F.silu(F.linear(i["x"], w["out.w_gate"])) * F.linear(i["x"], w["out.w_up"]),
                                     w["out.w_down"])),
    "layernorm": ([X], "layernorm(x)",
                  lambda i, w: F.layer_norm(i["x"], (5,), w["out.gain"], w["out.bias"])),
    "layernorm_axis1_no_bias": ([X], "layernorm(x, axis=1, bias=false)",
                                lambda i, w: F.layer_norm(i["x"].transpose(1, 2), (3,), w["out.gain"])
                                .transpose(1, 2)),
    "rmsnorm": ([X], "rmsnorm(x, eps=0.001)",
                lambda i, w: i["x"] * torch.rsqrt((i["x"] ** 2).mean(-1, keepdim=True) + 1e-3) * w["out.gain"]),
    "embedding_repeated_ids": (["ids: i32[2, 4]"], "embedding(ids, 6, 3)",
                               lambda i, w: F.embedding(i["ids"], w["out.weight"])),
    "positional_learned": ([X], "positional(x, learned, max_len=7)", lambda i, w: i["x"] + w["out.weight"][:3]),
    "positional_sinusoidal": (["x: f32[2, 3, 4]"], "positional(x)",
                              lambda i, w: i["x"] + torch.tensor(_sinusoid(3, 4), dtype=i["x"].dtype)),
    "attention_causal_gqa_window_bias": (["x: f32[2, 5, 8]", "bias: f32[5, 5]"],
                                         "attention(x, heads=4, kv_heads=2, causal=true, window=3, bias=true, "
                                         "attn_bias=bias)", lambda i, w: _attention(i, w, 4, 2, 3)),
    "attention_cross": (["x: f32[2, 4, 8]", "kv: f32[2, 6, 8]"], "attention(x, kv, heads=2)",
                        lambda i, w: _attention(i, w, 2, 2, None, kv=i["kv"])),
    "rel_position_bias": (["x: f32[2, 6, 4]", "kv: f32[2, 40, 4]"],
                          "rel_position_bias(x, kv, heads=3, buckets=8, max_distance=20)",
                          lambda i, w: _rel_bias(w["out.weight"], 6, 40, 8, 20)),
    "unembed": (["x: f32[2, 3, 4]"], "unembed(x, 7, bias=true)",
                lambda i, w: F.linear(i["x"], w["out.weight"], w["out.bias"])),
    "conv2d_stride_pad_dilation_groups": (["x: f32[2, 4, 7, 6]"],
                                          "conv2d(x, 6, [3, 2], stride=[2, 1], padding=[1, 2], dilation=[1, 2], "
                                          "groups=2)",
                                          lambda i, w: F.conv2d(i["x"], w["out.weight"], w["out.bias"], (2, 1),
                                                                (1, 2), (1, 2), 2)),
    "conv2d_same": (["x: f32[1, 2, 5, 5]"], "conv2d(x, 3, 3, padding=same, bias=false)",
                    lambda i, w: F.conv2d(i["x"], w["out.weight"], None, 1, "same")),
    "conv1d": (["x: f32[2, 3, 9]"], "conv1d(x, 4, 3, stride=2, padding=1)",
               lambda i, w: F.conv1d(i["x"], w["out.weight"], w["out.bias"], 2, 1)),
    "maxpool2d": (["x: f32[2, 3, 7, 6]"], "maxpool2d(x, 3, stride=2, padding=1)",
                  lambda i, w: F.max_pool2d(i["x"], 3, 2, 1)),
    "maxpool1d_dilated": (["x: f32[2, 3, 9]"], "maxpool1d(x, 2, stride=1, dilation=2)",
                          lambda i, w: F.max_pool1d(i["x"], 2, 1, 0, 2)),
    "avgpool2d_exclude_pad": (["x: f32[2, 3, 6, 5]"], "avgpool2d(x, 3, stride=2, padding=1, count_include_pad=false)",
                              lambda i, w: F.avg_pool2d(i["x"], 3, 2, 1, count_include_pad=False)),
    "avgpool1d": (["x: f32[2, 3, 8]"], "avgpool1d(x, 2)", lambda i, w: F.avg_pool1d(i["x"], 2)),
    "global_avgpool": (["x: f32[2, 3, 4, 5]"], "global_avgpool(x)", lambda i, w: i["x"].mean((2, 3))),
    "batchnorm": (["x: f32[2, 3, 4, 5]"], "batchnorm(x)",
                  lambda i, w: F.batch_norm(i["x"], w["out.running_mean"].detach(), w["out.running_var"].detach(),
                                            w["out.gain"], w["out.bias"], False, 0.0, 1e-5)),
    "lstm": (["x: f32[3, 4, 5]"], "lstm(x, 6)", lambda i, w: _lstm(i["x"], w, 6)),
}


def _sinusoid(t: int, d: int):
    pos = np.arange(t)[:, None] / 10000.0 ** (np.arange(0, d, 2)[None, :] / d)
    out = np.empty((t, d))
    out[:, 0::2], out[:, 1::2] = np.sin(pos), np.cos(pos)
    return out


def _rel_bias(table: torch.Tensor, t: int, s: int, buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bias as a gather from the table (bucket ids from irc's index rule, which the Hugging Face
    oracle test checks): autograd differentiates the gather."""
    from irc.backends.numpy_ref.attention import t5_buckets

    index = torch.tensor(t5_buckets(t, s, buckets, max_distance, True))
    return table[index].permute(2, 0, 1)[None]


def _attention(i: T, w: T, heads: int, groups: int, window: int | None, kv: torch.Tensor | None = None):
    x = i["x"]
    kv = x if kv is None else kv
    b, t, d = x.shape
    s, hd = kv.shape[1], d // heads

    def proj(y: torch.Tensor, c: str, n: int) -> torch.Tensor:
        return F.linear(y, w[f"out.w{c}"], w.get(f"out.b{c}")).view(b, y.shape[1], n, hd).transpose(1, 2)

    q, k, v = proj(x, "q", heads), proj(kv, "k", groups), proj(kv, "v", groups)
    k, v = k.repeat_interleave(heads // groups, 1), v.repeat_interleave(heads // groups, 1)
    scores = q @ k.transpose(-1, -2) / hd**0.5 + (i["bias"] if "bias" in i else 0)
    if window is not None:  # causal with a sliding window: key j visible to query i when i − window < j <= i
        j, q_i = torch.arange(s)[None, :], torch.arange(t)[:, None]
        scores = scores.masked_fill((j > q_i) | (j <= q_i - window), float("-inf"))
    out = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, d)
    return F.linear(out, w["out.wo"], w.get("out.bo"))


def _lstm(x: torch.Tensor, w: T, hidden: int) -> torch.Tensor:
    h = c = torch.zeros(x.shape[0], hidden, dtype=x.dtype)
    seq = []
    for t in range(x.shape[1]):
        i, f, g, o = (x[:, t] @ w["lstm.weight_ih"].T + h @ w["lstm.weight_hh"].T + w["lstm.bias"]).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        seq.append(h)
    return torch.stack(seq, 1)


def _graph(tmp_path: Path, decls: list[str], expr: str) -> Graph:
    """``out = expr`` under mse against a random target of its type (LSTM: its sequence)."""
    lines = [f"  input {d}" for d in decls]
    target = "out" if not expr.startswith("lstm") else "seq"
    lhs = "out" if target == "out" else "seq, h, c"
    body = "\n".join(lines) + f"\n  {lhs} = {expr}\n"
    text = f"model m() {{\n{body}  output y = {target}\n}}\n"
    probe = tmp_path / "probe.arch"
    probe.write_text(text, encoding="utf-8")
    shape = load_graph(probe).value_types()[target]
    dims = ", ".join(str(d) for d in shape.shape)
    text = f"model m() {{\n{body}  input target: f32[{dims}]\n  output loss = mse({target}, target)\n}}\n"
    path = tmp_path / "case.arch"
    path.write_text(text, encoding="utf-8")
    return load_graph(path)


def _data(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    weights = {k: (rng.uniform(0.5, 1.5, v.shape) if k.endswith("running_var") else rng.normal(0, 0.5, v.shape))
               for k, v in init_weights(graph, seed=seed).items()}
    inputs = {}
    for node in graph.inputs():
        t = node.types[0]
        shape = tuple(int(d) for d in t.shape)
        inputs[node.outputs[0]] = rng.integers(0, 3, shape) if not t.is_float else rng.normal(0, 1.5, shape)
    return weights, inputs


def _torch_grads(fn: Fn, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], dtype: torch.dtype):
    w = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    i = {k: torch.tensor(v, dtype=dtype, requires_grad=True) if v.dtype.kind == "f" else torch.tensor(v)
         for k, v in inputs.items()}
    loss = F.mse_loss(fn(i, w), i["target"])
    loss.backward()
    return loss.item(), {k: v.grad for k, v in {**w, **i}.items() if v.dtype.is_floating_point}


def _compare(graph: Graph, fn: Fn, dtype: type, tol: float) -> int:
    weights, inputs = _data(graph)
    backward = run_passes(graph, ["grad"])
    out = run_graph(backward, weights, inputs, dtype=dtype)
    loss, want = _torch_grads(fn, weights, inputs, torch.float64 if dtype is np.float64 else torch.float32)
    assert abs(float(out["loss"]) - loss) <= tol * max(abs(loss), 1e-3)
    taken = {"loss"}
    checked = 0
    # a gradient that is 0 in exact arithmetic (an attention key bias: softmax ignores a per-row shift) is
    # rounding only: measure it against the case's largest gradient
    largest = max(float(g.abs().max()) for g in want.values() if g is not None)
    for key, g in want.items():
        label = grad_label(key, taken)
        if g is None:  # a BatchNorm statistic: a buffer, constant to the loss
            assert label not in out, key
            continue
        g = g.numpy()
        assert out[label].shape == g.shape, key
        scale = np.abs(g).max() if np.abs(g).max() > 1e-4 * largest else largest
        assert np.abs(out[label] - g).max() <= tol * scale, (key, np.abs(out[label] - g).max())
        checked += 1
    return checked


@pytest.mark.parametrize("case", sorted(CASES))
def test_against_torch_autograd(case: str, tmp_path: Path) -> None:
    decls, expr, fn = CASES[case]
    graph = _graph(tmp_path, decls, expr)
    assert _compare(graph, fn, np.float64, 1e-10) >= 1
    assert _compare(graph, fn, np.float32, 1e-5) >= 1


# a sample of the cases (every family: activations, arithmetic, norms, tables, attention, windows, recurrence)
FD_CASES = ("act_gelu", "act_mish", "div_broadcast", "matmul_batched", "layernorm_axis1_no_bias", "rmsnorm",
            "embedding_repeated_ids", "positional_learned", "attention_causal_gqa_window_bias", "swiglu",
            "conv2d_stride_pad_dilation_groups", "conv1d", "maxpool2d", "avgpool2d_exclude_pad", "batchnorm", "lstm",
            "softmax", "rel_position_bias")


def central_differences(graph, entries: int) -> int:
    """(L(θ + h) − L(θ − h))/2h on irc's own float64 forward against the grad pass's gradient, for ``entries``
    random entries of every gradient (weights and float inputs); how many were checked."""
    weights, inputs = _data(graph)
    out = run_graph(run_passes(graph, ["grad"]), weights, inputs, dtype=np.float64)
    rng = np.random.default_rng(1)
    h = 1e-6
    taken = {"loss"}
    checked = 0
    for key, table in [*weights.items(), *((k, v) for k, v in inputs.items() if v.dtype.kind == "f")]:
        label = grad_label(key, taken)
        if label not in out:
            continue
        for flat in rng.choice(table.size, min(entries, table.size), replace=False):
            idx = np.unravel_index(flat, table.shape)

            def loss_at(delta: float) -> float:
                bumped = table.copy()
                bumped[idx] += delta
                w = {**weights, key: bumped} if key in weights else weights
                i = {**inputs, key: bumped} if key in inputs else inputs
                return float(run_graph(graph, w, i, dtype=np.float64)["loss"])

            numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
            assert abs(out[label][idx] - numeric) <= 1e-6 * max(np.abs(out[label]).max(), 1e-3), (key, idx)
            checked += 1
    return checked


@pytest.mark.parametrize("case", FD_CASES)
def test_against_central_differences(case: str, tmp_path: Path) -> None:
    """(L(θ + h) − L(θ − h))/2h on irc's own float64 forward, for 5 entries of every gradient."""
    decls, expr, _ = CASES[case]
    assert central_differences(_graph(tmp_path, decls, expr), 5) >= 5


def test_cross_entropy_with_ignore_index(tmp_path: Path) -> None:
    path = tmp_path / "ce.arch"
    path.write_text("model m() {\n  input z: f32[4, 3, 6]\n  input t: i32[4, 3]\n"
                    "  output loss = cross_entropy(z, t, ignore_index=2)\n}\n", encoding="utf-8")
    graph = load_graph(path)
    rng = np.random.default_rng(5)
    z, t = rng.normal(0, 2, (4, 3, 6)), rng.integers(0, 6, (4, 3))
    t[0, 0] = t[3, 1] = 2
    for dtype, tdtype, tol in ((np.float64, torch.float64, 1e-10), (np.float32, torch.float32, 1e-5)):
        out = run_graph(run_passes(graph, ["grad"]), {}, {"z": z, "t": t}, dtype=dtype)
        tz = torch.tensor(z, dtype=tdtype, requires_grad=True)
        loss = F.cross_entropy(tz.reshape(-1, 6), torch.tensor(t).reshape(-1), ignore_index=2)
        loss.backward()
        assert abs(float(out["loss"]) - loss.item()) <= tol * loss.item()
        assert np.abs(out["grad_z"] - tz.grad.numpy()).max() <= tol * np.abs(tz.grad.numpy()).max()
        assert not out["grad_z"][0, 0].any()  # an ignored row gets no gradient
