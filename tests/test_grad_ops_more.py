"""The vector-Jacobian products of the shape ops, maximum/minimum, the per-sample norms, training-mode
BatchNorm and dropout, the recurrent layers (every layout), transposed convolutions, adaptive pooling,
upsampling, pixel (un)shuffle and RoPE: gradients of inputs and parameters against torch.autograd within
1e-5 (float32) and 1e-10 (float64) of each gradient's largest entry, and central differences of irc's own
float64 forward (tests/test_grad_ops.py's harness; PyTorch's own modules where it has them).

Each case's body ends in ``out``; the loss is a mean squared error of ``out`` against a random target.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_grad_ops import _compare, central_differences

from irc.backends.numpy_ref import run_graph
from irc.graph import Graph
from irc.ops.grad_train import training_graph
from irc.pipeline import load_graph, run_passes

T = dict[str, torch.Tensor]
Fn = Callable[[T, T], torch.Tensor]
X = "x: f32[2, 3, 5]"
IMG = "x: f32[2, 4, 5, 6]"


def _rnn_cell(kind: str, act: str = "tanh") -> Callable:
    """The chapter-layout recurrences written out (PyTorch has no one-bias RNN or reset-before GRU)."""
    def run(x: torch.Tensor, w: T, hidden: int, p: str) -> tuple[torch.Tensor, ...]:
        h = c = torch.zeros(x.shape[0], hidden, dtype=x.dtype)
        seq = []
        for t in range(x.shape[1]):
            px = x[:, t] @ w[f"{p}.weight_ih"].T + w[f"{p}.bias"]
            if kind == "rnn":
                pre = px + h @ w[f"{p}.weight_hh"].T
                h = torch.tanh(pre) if act == "tanh" else torch.relu(pre)
            else:  # the chapter's GRU: r before the hidden matmul, h = (1 − z)·h + z·n
                u_r, u_z, u_n = w[f"{p}.weight_hh"].chunk(3, 0)
                x_r, x_z, x_n = px.chunk(3, -1)
                r, z = torch.sigmoid(x_r + h @ u_r.T), torch.sigmoid(x_z + h @ u_z.T)
                n = torch.tanh(x_n + (r * h) @ u_n.T)
                h = (1 - z) * h + z * n
            seq.append(h)
        return torch.stack(seq, 1), h, c
    return run


def _module(cls, p: str, x: torch.Tensor, w: T, **kw) -> tuple[torch.Tensor, ...]:
    """PyTorch's own nn.RNN/GRU/LSTM (batch_first) with irc's weights, as autograd leaves (one layer of the
    chapter layout: its names without the _l0)."""
    m = cls(x.shape[-1], batch_first=True, **kw).to(x.dtype)
    params = {k[len(p) + 1:]: v for k, v in w.items() if k.startswith(p + ".")}
    params = {k if "_l" in k else f"{k}_l0": v for k, v in params.items()}
    assert set(params) == set(dict(m.named_parameters())), sorted(params)
    out = torch.func.functional_call(m, params, (x,))
    states = out[1] if isinstance(out[1], tuple) else (out[1],)
    return (out[0], *states)


def _finals(h: torch.Tensor, dirs: int) -> torch.Tensor:
    """The last layer's final states [B, 1, dirs·H], as the .arch bodies below concatenate them."""
    return torch.cat(list(h[-dirs:]), -1)[:, None]


def _rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE (Hugging Face's apply_rotary_pos_emb)."""
    t, hd = x.shape[-2:]
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * freq[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1).to(x.dtype), torch.cat([angle.sin()] * 2, -1).to(x.dtype)
    return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin


GRU_TORCH = dict(hidden_size=4, num_layers=2, bidirectional=True)
# id -> (input declarations, body ending in `out`, torch's form)
CASES: dict[str, tuple[list[str], str, Fn]] = {
    "concat": ([X, "y: f32[2, 4, 5]"], "out = concat(x, y * y, x, axis=1)",
               lambda i, w: torch.cat([i["x"], i["y"] * i["y"], i["x"]], 1)),
    "concat_equal_parts": ([X, "y: f32[2, 3, 5]"], "out = tanh(concat(x, y, axis=-1))",
                           lambda i, w: torch.tanh(torch.cat([i["x"], i["y"]], -1))),
    "split_all_parts": ([X], "a, b = split(x, [2, 3], axis=2)\n  out = concat(b, a * a, axis=2)",
                        lambda i, w: torch.cat([i["x"][..., 2:], i["x"][..., :2] ** 2], 2)),
    "split_unused_part": ([X], "a, b, c = split(x, [1, 3, 1], axis=-1)\n  out = a * c",
                          lambda i, w: i["x"][..., :1] * i["x"][..., 4:]),
    "slice": ([X], "out = slice(x, axis=2, start=-4, end=3)", lambda i, w: i["x"][:, :, -4:3]),
    "select": ([X], "out = select(x, axis=1, index=-1) * select(x, 1, 0)",
               lambda i, w: i["x"][:, -1] * i["x"][:, 0]),
    "expand": (["x: f32[3, 1]"], "out = expand(x, [2, 3, 4])", lambda i, w: i["x"].expand(2, 3, 4)),
    "maximum_broadcast": ([X, "y: f32[5]"], "out = maximum(x, y)", lambda i, w: torch.maximum(i["x"], i["y"])),
    "minimum_broadcast": ([X, "y: f32[3, 1]"], "out = minimum(y, x)", lambda i, w: torch.minimum(i["y"], i["x"])),
    "groupnorm": ([IMG], "out = groupnorm(x, 2)",
                  lambda i, w: F.group_norm(i["x"], 2, w["out.gain"], w["out.bias"])),
    "groupnorm_plain": ([X], "out = groupnorm(x, 3, eps=0.01, affine=false)",
                        lambda i, w: F.group_norm(i["x"], 3, eps=0.01)),
    "instancenorm": ([IMG], "out = instancenorm(x)", lambda i, w: F.instance_norm(i["x"])),
    "instancenorm_affine": ([X], "out = instancenorm(x, affine=true, eps=0.001)",
                            lambda i, w: F.instance_norm(i["x"], weight=w["out.gain"], bias=w["out.bias"], eps=1e-3)),
    "batchnorm_train": ([IMG], "out = batchnorm(x, train=true)",
                        lambda i, w: F.batch_norm(i["x"], None, None, w["out.gain"], w["out.bias"], True)),
    "batchnorm_train_last_axis": ([X], "out = batchnorm(x, axis=-1, eps=0.001, train=true)",
                                  lambda i, w: F.batch_norm(i["x"].transpose(1, 2), None, None, w["out.gain"],
                                                            w["out.bias"], True, eps=1e-3).transpose(1, 2)),
    "rnn_tanh": ([X], "s, h = rnn(x, 4)\n  out = s + reshape(h, [2, 1, 4])",
                 lambda i, w: (lambda s, h, c: s + h[:, None])(*_rnn_cell("rnn")(i["x"], w, 4, "rnn"))),
    "rnn_relu_final_state_only": ([X], "s, h = rnn(x, 4, act=relu)\n  out = h",
                                  lambda i, w: _rnn_cell("rnn", "relu")(i["x"], w, 4, "rnn")[1]),
    "gru_chapter": ([X], "s, h = gru(x, 4)\n  out = s + reshape(h, [2, 1, 4])",
                    lambda i, w: (lambda s, h, c: s + h[:, None])(*_rnn_cell("gru")(i["x"], w, 4, "gru"))),
    "gru_torch_variant": ([X], "s, h = gru(x, 4, variant=torch)\n  out = s",
                          lambda i, w: _module(torch.nn.GRU, "gru", i["x"], w, hidden_size=4)[0]),
    "gru_torch_layout": ([X], "s, h = gru(x, 4, variant=torch, layers=2, bidirectional=true, layout=torch)\n"
                              "  out = s + reshape(concat(select(h, 0, 2), select(h, 0, 3)), [2, 1, 8])",
                         lambda i, w: (lambda s, h: s + _finals(h, 2))(*_module(torch.nn.GRU, "gru", i["x"], w,
                                                                                 **GRU_TORCH))),
    "lstm_torch_layout": ([X], "s, h, c = lstm(x, 4, layers=2, bidirectional=true, layout=torch)\n"
                               "  out = s + reshape(concat(select(h, 0, 2), select(c, 0, 3)), [2, 1, 8])",
                          lambda i, w: (lambda s, h, c: s + torch.cat([h[2], c[3]], -1)[:, None])(
                              *_module(torch.nn.LSTM, "lstm", i["x"], w, hidden_size=4, num_layers=2,
                                       bidirectional=True))),
    "lstm_final_cell_only": ([X], "s, h, c = lstm(x, 4)\n  out = c",
                             lambda i, w: _lstm_c(i["x"], w)),
    "rnn_torch_layout_no_bias": ([X], "s, h = rnn(x, 4, layers=2, bias=false, act=relu, layout=torch)\n  out = s",
                                 lambda i, w: _module(torch.nn.RNN, "rnn", i["x"], w, hidden_size=4, num_layers=2,
                                                      bias=False, nonlinearity="relu")[0]),
    "conv_transpose2d": ([IMG], "out = conv_transpose2d(x, 6, [3, 2], stride=[2, 1], padding=[1, 0], "
                                "output_padding=[1, 0], dilation=[1, 2], groups=2)",
                         lambda i, w: F.conv_transpose2d(i["x"], w["out.weight"], w["out.bias"], (2, 1), (1, 0),
                                                         (1, 0), 2, (1, 2))),
    "conv_transpose1d": ([X], "out = conv_transpose1d(x, 2, 4, stride=3, padding=2, dilation=2, bias=false)",
                         lambda i, w: F.conv_transpose1d(i["x"], w["out.weight"], None, 3, 2, 0, 1, 2)),
    "adaptive_avgpool2d": (["x: f32[2, 3, 7, 5]"], "out = adaptive_avgpool2d(x, [3, 2])",
                           lambda i, w: F.adaptive_avg_pool2d(i["x"], (3, 2))),
    "upsample_nearest2d": ([IMG], "out = upsample(x, [2, 3])",
                           lambda i, w: F.interpolate(i["x"], scale_factor=(2, 3), mode="nearest")),
    "upsample_nearest1d": ([X], "out = upsample(x, 2)", lambda i, w: F.interpolate(i["x"], scale_factor=2)),
    "upsample_bilinear": ([IMG], "out = upsample(x, 2, mode=bilinear)",
                          lambda i, w: F.interpolate(i["x"], scale_factor=2, mode="bilinear")),
    "upsample_bilinear_corners": ([IMG], "out = upsample(x, [3, 2], mode=bilinear, align_corners=true)",
                                  lambda i, w: F.interpolate(i["x"], scale_factor=(3, 2), mode="bilinear",
                                                             align_corners=True)),
    "pixel_shuffle": ([IMG], "out = pixel_shuffle(x, 2) * 2.0", lambda i, w: F.pixel_shuffle(i["x"], 2) * 2),
    "pixel_unshuffle": (["x: f32[2, 3, 4, 6]"], "out = pixel_unshuffle(x, 2) * 2.0",
                        lambda i, w: F.pixel_unshuffle(i["x"], 2) * 2),
    "rope": (["x: f32[2, 3, 5, 8]"], "out = rope(x) * x", lambda i, w: _rope(i["x"]) * i["x"]),
    "rope_theta": (["x: f32[1, 2, 6, 4]"], "out = rope(x, theta=500.0)", lambda i, w: _rope(i["x"], 500.0)),
    "attention_rope_gqa": (["x: f32[2, 5, 8]"], "out = attention(x, heads=4, kv_heads=2, causal=true, rope=true)",
                           lambda i, w: _rope_attention(i["x"], w)),
}


def _lstm_c(x: torch.Tensor, w: T) -> torch.Tensor:
    """The chapter LSTM's final cell state (one bias: nn.LSTM with bias_hh = 0)."""
    m = {"weight_ih_l0": w["lstm.weight_ih"], "weight_hh_l0": w["lstm.weight_hh"], "bias_ih_l0": w["lstm.bias"],
         "bias_hh_l0": torch.zeros_like(w["lstm.bias"])}
    return _module(torch.nn.LSTM, "m", x, {f"m.{k}": v for k, v in m.items()}, hidden_size=4)[2][0]


def _rope_attention(x: torch.Tensor, w: T) -> torch.Tensor:
    b, t, d = x.shape

    def proj(c: str, n: int) -> torch.Tensor:
        return F.linear(x, w[f"out.w{c}"]).view(b, t, n, 2).transpose(1, 2)

    q, k, v = _rope(proj("q", 4)), _rope(proj("k", 2)), proj("v", 2)
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    return F.linear(o.transpose(1, 2).reshape(b, t, d), w["out.wo"])


def _graph(tmp_path: Path, decls: list[str], body: str) -> Graph:
    """``body`` (ending in ``out``) under mse against a random target of out's type."""
    head = "\n".join(f"  input {d}" for d in decls) + f"\n  {body}\n"
    probe = tmp_path / "probe.arch"
    probe.write_text(f"model m() {{\n{head}  output y = out\n}}\n", encoding="utf-8")
    graph = load_graph(probe)
    dims = ", ".join(str(d) for d in graph.value_types()[dict(graph.outputs)["y"]].shape)
    path = tmp_path / "case.arch"
    path.write_text(f"model m() {{\n{head}  input target: f32[{dims}]\n  output loss = mse(out, target)\n}}\n",
                    encoding="utf-8")
    return load_graph(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_against_torch_autograd(case: str, tmp_path: Path) -> None:
    decls, body, fn = CASES[case]
    graph = _graph(tmp_path, decls, body)
    assert _compare(graph, fn, np.float64, 1e-10) >= 1
    assert _compare(graph, fn, np.float32, 1e-5) >= 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_against_central_differences(case: str, tmp_path: Path) -> None:
    """(L(θ + h) − L(θ − h))/2h on irc's own float64 forward, for 4 entries of every gradient."""
    decls, body, _ = CASES[case]
    assert central_differences(_graph(tmp_path, decls, body), 4) >= 4


def _run(tmp_path: Path, text: str) -> Graph:
    path = tmp_path / "m.arch"
    path.write_text(text, encoding="utf-8")
    return load_graph(path)


def test_maximum_and_minimum_share_a_tie(tmp_path: Path) -> None:
    """torch.maximum/minimum give each operand half the gradient where they are equal."""
    graph = _run(tmp_path, "model m() {\n  input x: f32[4, 5]\n  input y: f32[4, 5]\n  input target: f32[4, 5]\n"
                           "  output loss = mse(maximum(x, y) + minimum(y, x) * 3.0, target)\n}\n")
    rng = np.random.default_rng(0)
    x, target = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    y = np.where(rng.random((4, 5)) < 0.5, x, rng.normal(size=(4, 5)))  # half the entries tie
    out = run_graph(run_passes(graph, ["grad"]), {}, {"x": x, "y": y, "target": target}, dtype=np.float64)
    tx, ty = (torch.tensor(v, requires_grad=True) for v in (x, y))
    F.mse_loss(torch.maximum(tx, ty) + torch.minimum(ty, tx) * 3, torch.tensor(target)).backward()
    for label, want in (("grad_x", tx.grad), ("grad_y", ty.grad)):
        assert np.abs(out[label] - want.numpy()).max() <= 1e-12 * np.abs(want.numpy()).max(), label


DROP = ("model m() {\n  input x: f32[64, 32]\n  input target: f32[64, 32]\n"
        "  h = dropout(tanh(x), p=0.25)\n  output loss = mse(dropout(h * h, p=0.5), target)\n}\n")


def test_training_dropout_reuses_its_mask(tmp_path: Path) -> None:
    """In training, dropout is x·dropout_mask(x): the gradient is dy times the very mask the forward drew."""
    train = training_graph(_run(tmp_path, DROP), seed=7)
    masks = [n.outputs[0] for n in train.nodes if n.op == "dropout_mask"]
    assert len(masks) == 2 and not any(n.op == "dropout" for n in train.nodes)
    backward = run_passes(train, ["grad"])
    backward.outputs += [(f"mask{i}", m) for i, m in enumerate(masks)]
    rng = np.random.default_rng(2)
    inputs = {"x": rng.normal(size=(64, 32)), "target": rng.normal(size=(64, 32))}
    out = run_graph(backward, {}, inputs, dtype=np.float64)
    m0, m1 = out["mask0"], out["mask1"]
    assert set(np.unique(m0)) == {0.0, 1 / 0.75} and set(np.unique(m1)) == {0.0, 2.0}
    assert abs((m0 == 0).mean() - 0.25) < 0.03 and abs((m1 == 0).mean() - 0.5) < 0.03
    tx = torch.tensor(inputs["x"], requires_grad=True)
    h = torch.tanh(tx) * torch.tensor(m0)
    loss = F.mse_loss(h * h * torch.tensor(m1), torch.tensor(inputs["target"]))
    loss.backward()
    assert abs(float(out["loss"]) - loss.item()) <= 1e-12 * loss.item()
    assert np.abs(out["grad_x"] - tx.grad.numpy()).max() <= 1e-12 * np.abs(tx.grad.numpy()).max()
    # float32 draws the same mask; another step's seed another one; the same seed the same one
    assert np.array_equal(run_graph(backward, {}, inputs, dtype=np.float32)["mask0"], m0.astype(np.float32))
    again = [n.attrs["seed"] for n in training_graph(_run(tmp_path, DROP), seed=7).nodes if n.op == "dropout_mask"]
    other = [n.attrs["seed"] for n in training_graph(_run(tmp_path, DROP), seed=8).nodes if n.op == "dropout_mask"]
    seeds = [n.attrs["seed"] for n in train.nodes if n.op == "dropout_mask"]
    assert again == seeds and len(set(seeds + other)) == 4


def test_training_batchnorm_updates_running_averages_as_torch(tmp_path: Path) -> None:
    """batchnorm(train=true) normalises with the batch's statistics and returns them; the update of the running
    averages from them matches nn.BatchNorm2d's after a training forward."""
    from irc.ops.grad_train import apply_running_updates, running_updates

    graph = _run(tmp_path, "model m() {\n  input x: f32[4, 3, 5, 5]\n  input target: f32[4, 3, 5, 5]\n"
                           "  y = batchnorm(x, momentum=0.3)\n  output loss = mse(y, target)\n}\n")
    train = training_graph(graph)
    (update,) = running_updates(train)
    train.outputs += [("mean", update.mean_value), ("var", update.var_value)]
    rng = np.random.default_rng(4)
    x, target = rng.normal(1.0, 2.0, (4, 3, 5, 5)), rng.normal(size=(4, 3, 5, 5))
    weights = {"y.gain": rng.normal(size=3), "y.bias": rng.normal(size=3), "y.running_mean": rng.normal(size=3),
               "y.running_var": rng.uniform(0.5, 1.5, 3)}
    out = run_graph(train, weights, {"x": x, "target": target}, dtype=np.float64)
    new = apply_running_updates(weights, [update], {update.mean_value: out["mean"], update.var_value: out["var"]})
    bn = torch.nn.BatchNorm2d(3, momentum=0.3).double().train()
    with torch.no_grad():
        bn.weight[:], bn.bias[:] = torch.tensor(weights["y.gain"]), torch.tensor(weights["y.bias"])
        bn.running_mean[:], bn.running_var[:] = torch.tensor(weights["y.running_mean"]), \
            torch.tensor(weights["y.running_var"])
        y = bn(torch.tensor(x))
    assert abs(float(out["loss"]) - F.mse_loss(y, torch.tensor(target)).item()) <= 1e-12
    assert np.allclose(new["y.running_mean"], bn.running_mean.numpy(), rtol=1e-12, atol=0)
    assert np.allclose(new["y.running_var"], bn.running_var.numpy(), rtol=1e-12, atol=0)
