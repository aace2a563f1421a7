"""20 steps of irc's training loop against the same 20 steps in PyTorch, loss for loss.

irc: the grad pass's step graph on the NumPy reference and irc/runtime/optim.py (irc.runtime.train).
PyTorch: the same model written with torch.nn.functional, the same initial weights (irc's, loaded into
torch), the same batches (the dataset's batch for each step), torch.optim, a LambdaLR with Hugging
Face's cosine-with-warmup schedule and clip_grad_norm_. Every step's loss must agree within 1e-5
relative in float32 (1e-10 in float64), and the weights at the end within 100 times that: a small MLP
with SGD, momentum, Adam and AdamW, a small CNN (models/digits_cnn.arch) and a small transformer
(models/byte_lm.arch) with SGD and with Adam.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import get_cosine_schedule_with_warmup

from irc.pipeline import load_graph
from irc.runtime.init import init_weights
from irc.runtime.optim import OptimConfig
from irc.runtime.train import TrainConfig, build_step, fresh_state, train_steps
from irc.runtime.train_data import ArrayData

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
TOL = {np.float32: 1e-5, np.float64: 1e-10}  # relative, per step: the 1e-5; float64 leaves only rounding

MLP = """model mlp(B) {
  input x: f32[B, 12]
  h = tanh(linear(x, 16))
  h = relu(linear(h, 16))
  output logits = linear(h, 5)
}
"""

OPTIMIZERS: dict[str, tuple[dict, Callable]] = {
    "sgd": ({"lr": 0.1, "weight_decay": 0.01}, lambda p, c: torch.optim.SGD(p, lr=c["lr"], weight_decay=0.01)),
    "momentum": ({"lr": 0.05}, lambda p, c: torch.optim.SGD(p, lr=c["lr"], momentum=0.9)),
    "adam": ({"lr": 0.01}, lambda p, c: torch.optim.Adam(p, lr=c["lr"])),
    "adamw": ({"lr": 0.01, "weight_decay": 0.1}, lambda p, c: torch.optim.AdamW(p, lr=c["lr"], weight_decay=0.1)),
}


def _mlp(w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(F.linear(x, w["linear.weight"], w["linear.bias"]))
    h = F.relu(F.linear(h, w["linear_1.weight"], w["linear_1.bias"]))
    return F.linear(h, w["logits.weight"], w["logits.bias"])


def _cnn(w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = F.max_pool2d(F.relu(F.conv2d(x, w["conv1.weight"], w["conv1.bias"], padding=1)), 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, w["conv2.weight"], w["conv2.bias"], padding=1)), 2)
    x = F.relu(F.linear(x.flatten(1), w["fc1.weight"], w["fc1.bias"]))
    return F.linear(x, w["logits.weight"], w["logits.bias"])


def _gpt(w: dict[str, torch.Tensor], tokens: torch.Tensor, layers: int, heads: int) -> torch.Tensor:
    x = F.embedding(tokens, w["wte.weight"]) + w["wpe.weight"][:tokens.shape[1]]
    b, t, d = x.shape

    def attn(y: torch.Tensor, p: str) -> torch.Tensor:
        def split(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, heads, d // heads).transpose(1, 2)
        q, k, v = (split(F.linear(y, w[p + f"w{c}"], w[p + f"b{c}"])) for c in "qkv")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, t, d), w[p + "wo"], w[p + "bo"])

    for i in range(layers):
        p = f"pre_ln_decoder.{i}."
        h = x + attn(F.layer_norm(x, (d,), w[p + "ln1.gain"], w[p + "ln1.bias"]), p + "attn.")
        m = F.relu(F.linear(F.layer_norm(h, (d,), w[p + "ln2.gain"], w[p + "ln2.bias"]), w[p + "mlp.w1"],
                            w[p + "mlp.b1"]))
        x = h + F.linear(m, w[p + "mlp.w2"], w[p + "mlp.b2"])
    return F.linear(F.layer_norm(x, (d,), w["ln_f.gain"], w["ln_f.bias"]), w["wte.weight"])


def _compare(graph, data: ArrayData, forward: Callable, kind: str, dtype, schedule: bool = False) -> None:
    options, make = OPTIMIZERS[kind]
    warmup, clip = (4, 0.5) if schedule else (0, None)
    opt_options = {k: v for k, v in options.items() if k != "lr"}
    if kind == "momentum":
        opt_options["momentum"] = 0.9
    cfg = TrainConfig(steps=STEPS, batch=int(graph.inputs()[0].types[0].shape[0]), seed=7, lr=options["lr"],
                      warmup=warmup, schedule="cosine" if schedule else "constant", clip=clip,
                      optim=OptimConfig(kind, **opt_options), dtype=dtype)
    weights = init_weights(graph, seed=1)
    graphs = build_step(graph, "cross_entropy")
    state = fresh_state(weights, cfg)
    assert train_steps(graphs, state, data, cfg)
    ours = [row[2] for row in state.history]

    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    w = {k: torch.tensor(np.asarray(v), dtype=tdtype, requires_grad=True) for k, v in weights.items()}
    opt = make(list(w.values()), options)
    sched = get_cosine_schedule_with_warmup(opt, warmup, STEPS) if schedule else None
    theirs = []
    for step in range(STEPS):
        batch = data.batch(step, cfg.seed, cfg.batch)
        opt.zero_grad()
        inputs = {k: torch.tensor(v) for k, v in batch.items()}
        x = next(v for k, v in inputs.items() if k != graphs.target)
        logits = forward(w, x.to(tdtype) if x.is_floating_point() else x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs[graphs.target].reshape(-1))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(w.values()), clip)
        opt.step()
        if sched is not None:
            sched.step()
        theirs.append(loss.item())
    assert len(ours) == STEPS
    rel = np.abs(np.array(ours) - np.array(theirs)) / np.abs(np.array(theirs))
    assert rel.max() <= TOL[dtype], (rel.max(), ours, theirs)
    moved = 0.0
    for k, t in w.items():
        want = t.detach().numpy()
        assert np.abs(state.params[k] - want).max() <= 100 * TOL[dtype] * max(1.0, np.abs(want).max()), k
        moved = max(moved, float(np.abs(want - weights[k]).max()))
    assert moved > 1e-2  # it trained: a comparison of two runs that do nothing would prove nothing


def _arrays(rng: np.random.Generator, x: np.ndarray, classes: int) -> ArrayData:
    y = rng.integers(0, classes, len(x))
    return ArrayData("random", {"x" if x.ndim == 2 else "image": x, "targets": y})


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_mlp_twenty_steps_equal_torch(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "mlp.arch"
    path.write_text(MLP)
    rng = np.random.default_rng(0)
    data = _arrays(rng, rng.normal(0, 1, (96, 12)).astype(np.float32), 5)
    _compare(load_graph(path, {"B": 16}), data, _mlp, kind, np.float64)


def test_mlp_in_float32_with_warmup_cosine_and_clipping(tmp_path: Path) -> None:
    path = tmp_path / "mlp.arch"
    path.write_text(MLP)
    rng = np.random.default_rng(1)
    data = _arrays(rng, rng.normal(0, 1, (64, 12)).astype(np.float32), 5)
    _compare(load_graph(path, {"B": 16}), data, _mlp, "adam", np.float32, schedule=True)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_cnn_twenty_steps_equal_torch(kind: str) -> None:
    rng = np.random.default_rng(2)
    data = _arrays(rng, rng.uniform(0, 1, (64, 1, 8, 8)).astype(np.float32), 10)
    _compare(load_graph(ROOT / "models" / "digits_cnn.arch", {"B": 8}), data, _cnn, kind, np.float64,
             schedule=kind == "adam")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_transformer_twenty_steps_equal_torch(kind: str) -> None:
    sizes = {"B": 4, "T": 8, "d": 16, "heads": 2, "layers": 2, "ctx": 8}
    graph = load_graph(ROOT / "models" / "byte_lm.arch", sizes)
    rng = np.random.default_rng(3)
    text = rng.integers(0, 256, (32, 9))  # windows of T + 1 bytes, shifted by one as the text dataset does
    data = ArrayData("random", {"tokens": text[:, :-1], "targets": text[:, 1:]})
    _compare(graph, data, lambda w, x: _gpt(w, x, 2, 2), kind, np.float64, schedule=kind == "adam")


BN_CNN = """model bncnn(B) {
  input image: f32[B, 2, 6, 6]
  x = relu(batchnorm(conv2d(image, 4, 3, padding=1, bias=false), momentum=0.2))
  x = maxpool2d(x, 2)
  output logits = linear(flatten(x), 5)
}
"""


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batchnorm_trains_in_training_mode_as_torch(tmp_path: Path, dtype) -> None:
    """BatchNorm trains with the batch's statistics and its running averages follow nn.BatchNorm2d's in
    training mode (momentum 0.2, the unbiased variance), step after step; evaluation reads the running
    averages, as torch's model.eval()."""
    from irc.runtime.train import evaluate

    path = tmp_path / "bn.arch"
    path.write_text(BN_CNN)
    graph = load_graph(path, {"B": 8})
    rng = np.random.default_rng(5)
    images, labels = rng.normal(0.5, 2.0, (104, 2, 6, 6)).astype(np.float32), rng.integers(0, 5, 104)
    data = ArrayData("random", {"image": images[:80], "targets": labels[:80]},
                     {"image": images[80:], "targets": labels[80:]})
    cfg = TrainConfig(steps=STEPS, batch=8, seed=3, lr=0.01, optim=OptimConfig("adam"), dtype=dtype)
    weights = init_weights(graph, seed=2)
    weights["batchnorm.running_var"] = rng.uniform(0.5, 1.5, 4).astype(np.float32)  # not the init's ones
    graphs = build_step(graph, "cross_entropy")
    assert graphs.updates and graphs.step_input is None  # BatchNorm: running averages; no dropout: no step input
    state = fresh_state(weights, cfg)
    assert train_steps(graphs, state, data, cfg)
    ours = [row[2] for row in state.history]

    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    buffers = {k: torch.tensor(np.asarray(v), dtype=tdtype) for k, v in weights.items() if "running" in k}
    w = {k: torch.tensor(np.asarray(v), dtype=tdtype, requires_grad=True) for k, v in weights.items()
         if "running" not in k}

    def forward(x: torch.Tensor, training: bool) -> torch.Tensor:
        x = F.conv2d(x, w["conv2d.weight"], padding=1)  # no bias: BatchNorm's mean would cancel it
        x = F.batch_norm(x, buffers["batchnorm.running_mean"], buffers["batchnorm.running_var"],
                         w["batchnorm.gain"], w["batchnorm.bias"], training=training, momentum=0.2, eps=1e-5)
        x = F.max_pool2d(F.relu(x), 2)
        return F.linear(x.flatten(1), w["logits.weight"], w["logits.bias"])

    opt = torch.optim.Adam(list(w.values()), lr=0.01)
    theirs = []
    for step in range(STEPS):
        batch = data.batch(step, cfg.seed, cfg.batch)
        opt.zero_grad()
        loss = F.cross_entropy(forward(torch.tensor(batch["image"], dtype=tdtype), True),
                               torch.tensor(batch["targets"]))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    rel = np.abs(np.array(ours) - np.array(theirs)) / np.abs(np.array(theirs))
    assert rel.max() <= TOL[dtype], (rel.max(), ours, theirs)
    for k, t in {**w, **buffers}.items():
        want = t.detach().numpy()
        assert np.abs(state.params[k] - want).max() <= 100 * TOL[dtype] * max(1.0, np.abs(want).max()), k
    moved = float(np.abs(buffers["batchnorm.running_mean"].numpy() - weights["batchnorm.running_mean"]).max())
    assert moved > 1e-2  # the running averages did move
    held = evaluate(graphs, state.params, data, dtype)
    with torch.no_grad():
        want = F.cross_entropy(forward(torch.tensor(images[80:], dtype=tdtype), False),
                               torch.tensor(labels[80:])).item()
    assert abs(held.loss - want) <= 10 * TOL[dtype] * abs(want)
