"""Whole-model gradients of the grad pass against torch.autograd, weight for weight.

Each model (GPT-2 at 2 layers, the LSTM LM, ResNet-18 at 64×64, T5-small at 2 layers) is built from its
.arch file at small widths, a cross-entropy loss is attached, the grad pass appends the backward, and the
NumPy reference runs it in float64. A PyTorch mirror written with torch.nn.functional (the layout of
benchmarks/torch_models.py) runs on the same weights and batch; every parameter's gradient must agree
within 1e-10 of the largest entry of that gradient (the true gradient of an attention key bias is 0:
only rounding is left there, so the scale is the gradient's or the loss's). T5 runs against Hugging
Face's model itself, within 1e-6: HF's RMSNorm takes its mean of squares in float32.
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
from irc.ops.grad_train import training_graph
from irc.passes.grad import attach_loss, grad_label
from irc.pipeline import load_graph, run_passes
from irc.runtime.init import init_weights

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-10


def _grads(graph: Graph, inputs: dict[str, np.ndarray], seed: int = 1, train: bool = False):
    """(weights, irc's outputs) of the grad graph of ``graph`` with a cross-entropy loss, in float64 (in
    training mode with ``train``: irc.ops.grad_train's BatchNorm over batch statistics)."""
    weights = init_weights(graph, seed=seed)
    rng = np.random.default_rng(seed)  # init's BatchNorm statistics are 0 and 1: make them matter
    weights = {k: (rng.uniform(0.5, 1.5, v.shape) if k.endswith("running_var")
                   else rng.normal(0, 0.1, v.shape) if k.endswith(("running_mean", ".bias")) else v).astype(np.float32)
               for k, v in weights.items()}
    loss = attach_loss(graph)
    backward = run_passes(training_graph(loss) if train else loss, ["grad"])
    return weights, run_graph(backward, weights, inputs, dtype=np.float64)


def _leaf(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for k, v in weights.items()}


def _check(out: dict[str, np.ndarray], w: dict[str, torch.Tensor], loss: torch.Tensor,
           skip: Callable[[str], bool] = lambda k: False) -> int:
    loss.backward()
    assert abs(float(out["loss"]) - loss.item()) <= TOL * abs(loss.item())
    taken = {"loss"}
    checked = 0
    for key, t in w.items():
        label = grad_label(key, taken)
        if skip(key):
            assert label not in out and t.grad is None, key  # a buffer gets no gradient
            continue
        want = t.grad.numpy()
        scale = max(np.abs(want).max(), abs(loss.item()) * 1e-3)
        assert np.abs(out[label] - want).max() <= TOL * scale, key
        checked += 1
    return checked


def test_gpt2_two_layers() -> None:
    sizes = {"B": 2, "T": 6, "layers": 2, "d": 32, "heads": 4, "vocab": 50, "ctx": 8}
    graph = load_graph(ROOT / "models" / "gpt2_small.arch", sizes)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, (2, 6))
    targets = rng.integers(0, 50, (2, 6))
    targets[0, 2] = targets[1, 5] = -100  # ignored positions
    weights, out = _grads(graph, {"tokens": tokens, "targets": targets})
    w = _leaf(weights)
    x = F.embedding(torch.tensor(tokens), w["wte.weight"]) + w["wpe.weight"][:6]
    b, t, d = x.shape

    def attn(y: torch.Tensor, p: str) -> torch.Tensor:
        def heads(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, 4, d // 4).transpose(1, 2)
        q, k, v = (heads(F.linear(y, w[p + f"w{c}"], w[p + f"b{c}"])) for c in "qkv")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, t, d), w[p + "wo"], w[p + "bo"])

    for i in range(2):
        p = f"pre_ln_decoder.{i}."
        h = x + attn(F.layer_norm(x, (d,), w[p + "ln1.gain"], w[p + "ln1.bias"]), p + "attn.")
        m = F.gelu(F.linear(F.layer_norm(h, (d,), w[p + "ln2.gain"], w[p + "ln2.bias"]), w[p + "mlp.w1"],
                            w[p + "mlp.b1"]), approximate="tanh")
        x = h + F.linear(m, w[p + "mlp.w2"], w[p + "mlp.b2"])
    logits = F.linear(F.layer_norm(x, (d,), w["ln_f.gain"], w["ln_f.bias"]), w["wte.weight"])  # tied
    loss = F.cross_entropy(logits.reshape(-1, 50), torch.tensor(targets).reshape(-1), ignore_index=-100)
    assert _check(out, w, loss) == len(w) == 2 + 2 * 16 + 2


def test_lstm_lm_backpropagates_through_time() -> None:
    graph = load_graph(ROOT / "models" / "lstm_lm.arch", {"B": 2, "T": 7, "vocab": 30, "hidden": 12})
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 30, (2, 7)), rng.integers(0, 30, (2, 7))
    weights, out = _grads(graph, {"tokens": tokens, "targets": targets})
    w = _leaf(weights)
    x = F.embedding(torch.tensor(tokens), w["emb.weight"])  # dropout: the identity irc's reference runs
    for i in range(2):
        p = f"layer.{i}.lstm."
        h = c = torch.zeros(2, 12, dtype=torch.float64)
        seq = []
        for step in range(7):
            gi, gf, gg, go = (x[:, step] @ w[p + "weight_ih"].T + h @ w[p + "weight_hh"].T + w[p + "bias"]).chunk(4, -1)
            c = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gg)
            h = torch.sigmoid(go) * torch.tanh(c)
            seq.append(h)
        x = torch.stack(seq, 1)
    logits = F.linear(x, w["decoder.weight"], w["decoder.bias"])
    loss = F.cross_entropy(logits.reshape(-1, 30), torch.tensor(targets).reshape(-1))
    assert _check(out, w, loss) == len(w) == 1 + 2 * 3 + 2


def test_lstm_grad_against_nn_lstm() -> None:
    """The same recurrence as PyTorch's cuDNN-layout nn.LSTM (gates i, f, g, o; b_hh held at zero)."""
    graph = load_graph(ROOT / "models" / "lstm_lm.arch", {"B": 3, "T": 5, "vocab": 20, "hidden": 6, "layers": 1})
    rng = np.random.default_rng(2)
    tokens, targets = rng.integers(0, 20, (3, 5)), rng.integers(0, 20, (3, 5))
    weights, out = _grads(graph, {"tokens": tokens, "targets": targets}, seed=3)
    lstm = torch.nn.LSTM(6, 6, batch_first=True).double()
    w = _leaf(weights)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(w["layer.0.lstm.weight_ih"])
        lstm.weight_hh_l0.copy_(w["layer.0.lstm.weight_hh"])
        lstm.bias_ih_l0.copy_(w["layer.0.lstm.bias"])
        lstm.bias_hh_l0.zero_()
    seq, _ = lstm(F.embedding(torch.tensor(tokens), w["emb.weight"]))
    loss = F.cross_entropy(F.linear(seq, w["decoder.weight"], w["decoder.bias"]).reshape(-1, 20),
                           torch.tensor(targets).reshape(-1))
    loss.backward()
    for key, param in (("weight_ih", lstm.weight_ih_l0), ("weight_hh", lstm.weight_hh_l0), ("bias", lstm.bias_ih_l0)):
        want = param.grad.numpy()
        got = out[grad_label(f"layer.0.lstm.{key}", {"loss"})]
        assert np.abs(got - want).max() <= TOL * np.abs(want).max(), key


SMALL_RESNET = """use "resnet.arch"
model resnet18_small(B, H, W) {
  input image: f32[B, 3, H, W]
  block layer1(x) {
    return repeat(2) basic(x, 8)
  }
  block layer2(x) {
    return basic(basic_down(x, 16), 16)
  }
  block layer3(x) {
    return basic(basic_down(x, 16), 16)
  }
  block layer4(x) {
    return basic(basic_down(x, 16), 16)
  }
  fc = linear(global_avgpool(layer4(layer3(layer2(layer1(stem(image, 8)))))), 10)
  output logits = fc
}
"""


@pytest.mark.parametrize("train", [False, True], ids=["inference_bn", "training_bn"])
def test_resnet18_at_64x64(tmp_path: Path, train: bool) -> None:
    """models/resnet18.arch's blocks (frontends/arch/lib/resnet.arch) with 8-16 channels: convolutions with
    stride and padding, BatchNorm (inference mode, or training mode over the batch's statistics), max
    pooling, residual adds, global pooling."""
    path = tmp_path / "resnet18_small.arch"
    path.write_text(SMALL_RESNET, encoding="utf-8")
    graph = load_graph(path, {"B": 2, "H": 64, "W": 64})
    rng = np.random.default_rng(4)
    image, targets = rng.standard_normal((2, 3, 64, 64)), np.array([3, 7])
    weights, out = _grads(graph, {"image": image, "targets": targets}, train=train)
    w = _leaf(weights)

    def conv_bn(x: torch.Tensor, conv: str, bn: str, stride: int = 1) -> torch.Tensor:
        k = w[conv + ".weight"]
        y = F.conv2d(x, k, None, stride, k.shape[-1] // 2)
        stats = w[bn + ".running_mean"].detach(), w[bn + ".running_var"].detach()  # buffers: no gradient
        if train:  # the batch's statistics (the running averages' update is not differentiated)
            return F.batch_norm(y, None, None, w[bn + ".gain"], w[bn + ".bias"], True, 0.0, 1e-5)
        return F.batch_norm(y, *stats, w[bn + ".gain"], w[bn + ".bias"], False, 0.0, 1e-5)

    def block(x: torch.Tensor, p: str, down: bool) -> torch.Tensor:
        s = 2 if down else 1
        y = conv_bn(F.relu(conv_bn(x, p + "conv1", p + "bn1", s)), p + "conv2", p + "bn2")
        return F.relu(y + (conv_bn(x, p + "downsample_conv", p + "downsample", s) if down else x))

    x = F.max_pool2d(F.relu(conv_bn(torch.tensor(image), "stem.conv1", "stem.bn1", 2)), 3, 2, 1)
    x = block(block(x, "layer1.basic.0.", False), "layer1.basic.1.", False)
    for stage in ("layer2", "layer3", "layer4"):
        x = block(block(x, f"{stage}.basic_down.", True), f"{stage}.basic.", False)
    loss = F.cross_entropy(F.linear(x.mean(dim=(2, 3)), w["fc.weight"], w["fc.bias"]), torch.tensor(targets))
    checked = _check(out, w, loss, skip=lambda k: k.endswith(("running_mean", "running_var")))
    assert checked == 20 + 2 * 20 + 2  # 20 convolutions, 20 BatchNorms (gain, bias), fc


def test_t5_small_two_layers_against_hugging_face() -> None:
    """models/t5_small.arch at d 64 against transformers' T5: relative-position tables (scatter-add by
    bucket), RMSNorm, cross-attention, unscaled scores, and the embedding tied three ways (encoder,
    decoder, unembedding) with one accumulated gradient."""
    import transformers
    from test_t5_oracle import SIZES, irc_weights

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=SIZES["vocab"], d_model=SIZES["d"], d_kv=SIZES["d"] // SIZES["heads"], d_ff=SIZES["ff"],
        num_layers=SIZES["layers"], num_decoder_layers=SIZES["layers"], num_heads=SIZES["heads"],
        relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
        layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True)
    model = transformers.T5ForConditionalGeneration(config).eval().double()
    b, s, t = 2, 40, 12  # distances past the exact buckets reach the log-spaced ones
    graph = load_graph(ROOT / "models" / "t5_small.arch", {"B": b, "S": s, "T": t, **SIZES})
    rng = np.random.default_rng(6)
    tokens, dec = rng.integers(0, SIZES["vocab"], (b, s)), rng.integers(0, SIZES["vocab"], (b, t))
    targets = rng.integers(0, SIZES["vocab"], (b, t))
    weights = irc_weights(model)
    out = run_graph(run_passes(attach_loss(graph), ["grad"]), weights,
                    {"tokens": tokens, "decoder_tokens": dec, "targets": targets}, dtype=np.float64)
    logits = model(input_ids=torch.tensor(tokens), decoder_input_ids=torch.tensor(dec)).logits
    loss = F.cross_entropy(logits.reshape(-1, SIZES["vocab"]), torch.tensor(targets).reshape(-1))
    loss.backward()
    # HF's T5LayerNorm takes the mean of squares in float32 even in a float64 model: that, not irc, bounds
    # the agreement here (the other models' float64 oracles agree to 1e-10)
    tol = 1e-6
    assert abs(float(out["loss"]) - loss.item()) <= tol * loss.item()
    grads = irc_weights(type("Grads", (), {"state_dict": lambda self: dict(
        (k, p.grad) for k, p in model.named_parameters())})())
    taken = {"loss"}
    for key, want in grads.items():
        got = out[grad_label(key, taken)]
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), key
    assert len(grads) == len(weights) == 5 + SIZES["layers"] * (8 + 13)  # encoder and decoder layers
