"""PyTorch modules mirroring three .arch models, built from irc's weights dict (same keys).

Each mirrors the model file op for op, in PyTorch's eager idioms (nn.Linear-style matmuls,
``F.scaled_dot_product_attention``, ``nn.LSTM``, ``F.conv2d`` + ``F.batch_norm``), so a
forward pass here is what a PyTorch user would run. The benchmark checks each mirror's
output against irc's before it times anything.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _t(weights: dict[str, np.ndarray], key: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(weights[key], dtype=np.float32))


class GPT2(nn.Module):
    """models/gpt2_small.arch: pre-LN decoder blocks, learned positions, tied unembedding."""

    def __init__(self, w: dict[str, np.ndarray], layers: int = 12, heads: int = 12, eps: float = 1e-5):
        super().__init__()
        self.w = {k: _t(w, k) for k in w}
        self.layers, self.heads, self.eps = layers, heads, eps

    def _attn(self, x: torch.Tensor, p: str) -> torch.Tensor:
        w = self.w
        b, t, d = x.shape
        hd = d // self.heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, hd).transpose(1, 2)

        q = heads(F.linear(x, w[p + "wq"], w[p + "bq"]))
        k = heads(F.linear(x, w[p + "wk"], w[p + "bk"]))
        v = heads(F.linear(x, w[p + "wv"], w[p + "bv"]))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, t, d), w[p + "wo"], w[p + "bo"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        w = self.w
        t = tokens.shape[1]
        x = F.embedding(tokens, w["wte.weight"]) + w["wpe.weight"][:t]
        d = x.shape[-1]
        for i in range(self.layers):
            p = f"pre_ln_decoder.{i}."
            h = x + self._attn(F.layer_norm(x, (d,), w[p + "ln1.gain"], w[p + "ln1.bias"], self.eps), p + "attn.")
            m = F.layer_norm(h, (d,), w[p + "ln2.gain"], w[p + "ln2.bias"], self.eps)
            m = F.gelu(F.linear(m, w[p + "mlp.w1"], w[p + "mlp.b1"]), approximate="tanh")
            x = h + F.linear(m, w[p + "mlp.w2"], w[p + "mlp.b2"])
        x = F.layer_norm(x, (d,), w["ln_f.gain"], w["ln_f.bias"], self.eps)
        return F.linear(x, w["wte.weight"])


class LSTMLM(nn.Module):
    """models/lstm_lm.arch: embedding, two nn.LSTM layers (irc's one bias is b_ih; b_hh = 0), decoder."""

    def __init__(self, w: dict[str, np.ndarray], layers: int = 2):
        super().__init__()
        self.emb = _t(w, "emb.weight")
        hidden = w["layer.0.lstm.weight_hh"].shape[1]
        self.lstm = nn.LSTM(self.emb.shape[1], hidden, num_layers=layers, batch_first=True)
        with torch.no_grad():
            for i in range(layers):
                getattr(self.lstm, f"weight_ih_l{i}").copy_(_t(w, f"layer.{i}.lstm.weight_ih"))
                getattr(self.lstm, f"weight_hh_l{i}").copy_(_t(w, f"layer.{i}.lstm.weight_hh"))
                getattr(self.lstm, f"bias_ih_l{i}").copy_(_t(w, f"layer.{i}.lstm.bias"))
                getattr(self.lstm, f"bias_hh_l{i}").zero_()
        self.dec_w, self.dec_b = _t(w, "decoder.weight"), _t(w, "decoder.bias")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq, _ = self.lstm(F.embedding(tokens, self.emb))  # dropout is the identity at inference
        return F.linear(seq, self.dec_w, self.dec_b)


class ResNet18(nn.Module):
    """models/resnet18.arch (torchvision's resnet18 layout and names, inference-mode BatchNorm)."""

    def __init__(self, w: dict[str, np.ndarray], eps: float = 1e-5):
        super().__init__()
        self.w = {k: _t(w, k) for k in w}
        self.eps = eps

    def _bn(self, x: torch.Tensor, p: str) -> torch.Tensor:
        w = self.w
        return F.batch_norm(x, w[p + ".running_mean"], w[p + ".running_var"], w[p + ".gain"], w[p + ".bias"],
                            False, 0.0, self.eps)

    def _conv_bn(self, x: torch.Tensor, conv: str, bn: str, stride: int = 1) -> torch.Tensor:
        k = self.w[conv + ".weight"]
        return self._bn(F.conv2d(x, k, None, stride, k.shape[-1] // 2), bn)

    def _block(self, x: torch.Tensor, p: str, down: bool) -> torch.Tensor:
        stride = 2 if down else 1
        y = F.relu(self._conv_bn(x, p + "conv1", p + "bn1", stride))
        y = self._conv_bn(y, p + "conv2", p + "bn2")
        short = self._conv_bn(x, p + "downsample_conv", p + "downsample", stride) if down else x
        return F.relu(y + short)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = F.relu(self._conv_bn(image, "stem.conv1", "stem.bn1", 2))
        x = F.max_pool2d(x, 3, 2, 1)
        x = self._block(x, "layer1.basic.0.", False)
        x = self._block(x, "layer1.basic.1.", False)
        for stage in ("layer2", "layer3", "layer4"):
            x = self._block(x, f"{stage}.basic_down.", True)
            x = self._block(x, f"{stage}.basic.", False)
        x = x.mean(dim=(2, 3))
        return F.linear(x, self.w["fc.weight"], self.w["fc.bias"])


MODELS = {"gpt2_small": GPT2, "lstm_lm": LSTMLM, "resnet18": ResNet18}


def build(name: str, weights: dict[str, np.ndarray], **options: int) -> nn.Module:
    return MODELS[name](weights, **options).eval()
