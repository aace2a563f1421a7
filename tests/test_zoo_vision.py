"""The vision zoo (models/mobilenet_v2, efficientnet_b0, convnext_tiny, vit_b_16, densenet121, unet)
against PyTorch modules written here layer for layer, and models/whisper_tiny_encoder against
Hugging Face's own WhisperEncoder (transformers is a test dependency).

torchvision is not a test dependency (and its PyPI wheel is built against CUDA torch), so each
oracle is an ``nn.Module`` with torchvision's (or milesial Pytorch-UNet's) exact layers, built
in forward order so that its ``state_dict`` lists the same tensors in the same order as irc's
weights. Checked per model:
- parameters: the published count (torchvision's model card, the milesial repository) and the
  torch module's own count;
- multiply-adds: irc's total equals ``torch.utils.flop_counter.FlopCounterMode``'s total / 2 on
  the torch module (on the meta device: shapes only), and the published figure to its stated
  precision (torchvision's "GFLOPS" column counts multiply-adds). The ViT oracle computes its
  attention with explicit matmuls: FlopCounterMode does not see inside nn.MultiheadAttention's
  fused inference path, nor CPU flash attention, so on torchvision's own module it counts
  11.27 G (eval, no grad) or 16.85 G (with grad) of the 17.56 G;
- outputs of the numpy (float64) and cpu (float32) backends against the torch module on the same
  weights: irc's initialiser, with random BatchNorm statistics and norm affines, exported to the
  module's state_dict by renaming (irc's norm ``gain`` is torch's ``weight``; q, k, v concatenated
  into nn.MultiheadAttention's ``in_proj_weight``).
- decompose and fuse keep each graph's parameters and FLOPs.
The lint expectations live in tests/test_lint.py's ZOO dict, the small bindings are shared with
tests/test_cpu_models_check.py (``irc run --backend cpu --check`` on each).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_cpu_backend_helpers import cpu_cache
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from irc.analysis.flops import node_cost
from irc.analysis.params import count_params
from irc.backends.numpy_ref import run_graph
from irc.pipeline import load_graph
from irc.runtime.compare import rel_error
from irc.runtime.init import init_weights
from irc.runtime.weights import node_weight_keys

_ = cpu_cache
MODELS = Path(__file__).resolve().parents[1] / "models"
TOLERANCE = 1e-5  # max|out − ref| / max|ref| for the float32 cpu backend against torch in float64


# -- the torch oracles ------------------------------------------------------------------------------

def cbn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
        act: type | None = nn.ReLU6) -> nn.Sequential:
    """torchvision's Conv2dNormActivation: bias-free conv, BatchNorm, activation."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class InvertedResidual(nn.Module):  # torchvision/models/mobilenetv2.py
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        hidden = cin * t
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(*([cbn(cin, hidden, 1)] if t != 1 else []), cbn(hidden, hidden, 3, stride, hidden),
                                  nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [cbn(3, 32, stride=2)]
        cin = 32
        for t, c, n, s in self.SETTING:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(cbn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class SqueezeExcitation(nn.Module):  # torchvision/ops/misc.py, activation SiLU
    def __init__(self, ch: int, squeeze: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(ch, squeeze, 1), nn.Conv2d(squeeze, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(F.silu(self.fc1(F.adaptive_avg_pool2d(x, 1))))) * x


class MBConv(nn.Module):  # torchvision/models/efficientnet.py (stochastic depth: identity in eval)
    def __init__(self, t: int, k: int, stride: int, cin: int, cout: int):
        super().__init__()
        hidden = cin * t
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(*([cbn(cin, hidden, 1, act=nn.SiLU)] if t != 1 else []),
                                   cbn(hidden, hidden, k, stride, hidden, act=nn.SiLU),
                                   SqueezeExcitation(hidden, max(1, cin // 4)), cbn(hidden, cout, 1, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class EfficientNetB0(nn.Module):
    SETTING = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
               (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [cbn(3, 32, stride=2, act=nn.SiLU)]
        for t, k, s, cin, cout, n in self.SETTING:
            layers.append(nn.Sequential(*[MBConv(t, k, s if i == 0 else 1, cin if i == 0 else cout, cout)
                                          for i in range(n)]))
        layers.append(cbn(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class LayerNorm2d(nn.LayerNorm):  # torchvision/models/convnext.py: LayerNorm over channels of [B, C, H, W]
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class LayerScale(nn.Module):
    """Holds CNBlock's ``layer_scale`` [C, 1, 1]; a module of its own so the state_dict lists it after the block."""

    def __init__(self, ch: int):
        super().__init__()
        self.layer_scale = nn.Parameter(torch.ones(ch, 1, 1))


class Permute(nn.Module):
    def __init__(self, dims: list[int]):
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)


class CNBlock(nn.Module):  # torchvision's: the same Sequential indices (0 dwconv, 2 norm, 3 and 5 linears)
    def __init__(self, ch: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(ch, ch, 7, padding=3, groups=ch), Permute([0, 2, 3, 1]),
                                   nn.LayerNorm(ch, eps=1e-6), nn.Linear(ch, 4 * ch), nn.GELU(),
                                   nn.Linear(4 * ch, ch), Permute([0, 3, 1, 2]))
        self.scale = LayerScale(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale.layer_scale * self.block(x)


class ConvNeXtTiny(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        dims, depths = [96, 192, 384, 768], [3, 3, 9, 3]
        layers: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, 96, 4, 4), LayerNorm2d(96, eps=1e-6))]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                layers.append(nn.Sequential(LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)))
            layers.append(nn.Sequential(*[CNBlock(dim) for _ in range(depth)]))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(LayerNorm2d(768, eps=1e-6), nn.Flatten(1), nn.Linear(768, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1))


class Holder(nn.Module):
    def __init__(self, name: str, shape: tuple[int, ...]):
        super().__init__()
        self.register_parameter(name, nn.Parameter(torch.zeros(shape)))


class SelfAttention(nn.Module):
    """nn.MultiheadAttention's parameters (in_proj_weight/bias, out_proj), computed with explicit matmuls."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.zeros(3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d))
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, -1).transpose(1, 2)
                   for y in F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        return self.out_proj(torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):  # torchvision/models/vision_transformer.py
    def __init__(self, d: int, heads: int, mlp: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-6)
        self.self_attention = SelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, d), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, d: int = 768, heads: int = 12, layers: int = 12,
                 mlp: int = 3072, classes: int = 1000):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, patch, patch)
        self.cls = Holder("class_token", (1, 1, d))
        self.pos = Holder("pos_embedding", (1, (image // patch) ** 2 + 1, d))
        self.layers = nn.Sequential(*[EncoderBlock(d, heads, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos.pos_embedding
        return self.head(self.ln(self.layers(x))[:, 0])


class DenseLayer(nn.Module):  # torchvision/models/densenet.py, growth 32, bn_size 4
    def __init__(self, cin: int):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 128, 1, bias=False)
        self.norm2, self.conv2 = nn.BatchNorm2d(128), nn.Conv2d(128, 32, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))], 1)


class DenseNet121(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]
        ch = 64
        for i, n in enumerate((6, 12, 24, 16)):
            layers += [DenseLayer(ch + 32 * j) for j in range(n)]
            ch += 32 * n
            if i < 3:
                layers += [nn.BatchNorm2d(ch), nn.ReLU(), nn.Conv2d(ch, ch // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                ch //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(ch))
        self.classifier = nn.Linear(ch, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.features(x)), 1), 1))


def double_conv(cin: int, cout: int) -> nn.Sequential:  # milesial Pytorch-UNet unet/unet_parts.py DoubleConv
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class Up(nn.Module):  # unet_parts.Up(bilinear=False); at sides divisible by 16 its F.pad is zero
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.up, self.conv = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2), double_conv(cin, cout)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x2, self.up(x1)], dim=1))


class UNet(nn.Module):  # unet/unet_model.py UNet(n_channels=3, n_classes=2, bilinear=False)
    def __init__(self, channels: int = 3, classes: int = 2):
        super().__init__()
        self.inc = double_conv(channels, 64)
        self.downs = nn.ModuleList([double_conv(c, 2 * c) for c in (64, 128, 256, 512)])
        self.ups = nn.ModuleList([Up(c, c // 2) for c in (1024, 512, 256, 128)])
        self.outc = nn.Conv2d(64, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


# name: (torch module factory, published parameters, published multiply-adds as (value, unit) or None,
#        bindings for the published size, small bindings for the numeric run)
ZOO = {
    "mobilenet_v2": (MobileNetV2, 3_504_872, (300.8, 1e6), {"B": 1, "H": 224, "W": 224}),
    "efficientnet_b0": (EfficientNetB0, 5_288_548, (0.39, 1e9), {"B": 1, "H": 224, "W": 224}),
    "convnext_tiny": (ConvNeXtTiny, 28_589_128, (4.46, 1e9), {"B": 1, "H": 224, "W": 224}),
    "vit_b_16": (ViT, 86_567_656, (17.56, 1e9), {"B": 1}),
    "densenet121": (DenseNet121, 7_978_856, (2.83, 1e9), {"B": 1, "H": 224, "W": 224}),
    # no published multiply-add figure: torch's count is the oracle (at 512×512)
    "unet": (UNet, 31_037_698, None, {"B": 1}),
}
# the numeric runs: small sides (and a small ViT: the position table fixes its image side); the same
# bindings as tests/test_cpu_models_check.py, so the cpu backend compiles each graph once
SMALL = {
    "mobilenet_v2": {"B": 2, "H": 32, "W": 32},
    "efficientnet_b0": {"B": 2, "H": 32, "W": 32},
    "convnext_tiny": {"B": 1, "H": 32, "W": 32},
    "vit_b_16": {"B": 2, "image": 32, "d": 64, "heads": 4, "layers": 2, "mlp": 128},
    "densenet121": {"B": 1, "H": 32, "W": 32},
    "unet": {"B": 1, "height": 32, "width": 32},
}
VIT_SMALL = {"image": 32, "d": 64, "heads": 4, "layers": 2, "mlp": 128}


def _module(name: str) -> nn.Module:
    return ViT(**VIT_SMALL) if name == "vit_b_16" else ZOO[name][0]()


def _macs(graph) -> int:
    types = graph.value_types()
    return sum(node_cost(n, [types[v] for v in n.inputs]).macs for n in graph.nodes if n.op != "input")


def _input_shape(graph) -> tuple[int, ...]:
    (node,) = graph.inputs()
    return tuple(graph.value_types()[node.outputs[0]].shape)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_parameters_published_and_torch(name: str) -> None:
    factory, published, _, bindings = ZOO[name]
    with torch.device("meta"):
        module = factory()
    params, _ = count_params(load_graph(MODELS / f"{name}.arch", bindings))
    assert params == published == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(ZOO))
def test_multiply_adds_torch_and_published(name: str) -> None:
    factory, _, published, bindings = ZOO[name]
    graph = load_graph(MODELS / f"{name}.arch", bindings)
    with torch.device("meta"):
        module = factory().eval()
        x = torch.empty(_input_shape(graph))
    with FlopCounterMode(display=False) as counter:
        module(x)
    macs = _macs(graph)
    assert 2 * macs == counter.get_total_flops()
    if published is not None:
        value, unit = published
        digits = len(str(value).split(".")[1])
        assert round(macs / unit, digits) == value


def _torch_state(graph, weights: dict[str, np.ndarray], module: nn.Module) -> dict[str, torch.Tensor]:
    """irc's weights as the module's state_dict: both list the tensors in forward order, so the i-th
    irc tensor is the i-th state_dict entry; its leaf name and shape must agree."""
    leaf = {"gain": "weight", "w1": "weight", "b1": "bias", "w2": "weight", "b2": "bias"}
    types = graph.value_types()
    ours: list[tuple[str, str, np.ndarray]] = []
    for node in graph.nodes:
        keys = node_weight_keys(node, types)
        if node.op == "attention":  # nn.MultiheadAttention's layout
            ours.append(("in_proj_weight", keys["wq"], np.concatenate([weights[keys[k]] for k in ("wq", "wk", "wv")])))
            ours.append(("in_proj_bias", keys["bq"], np.concatenate([weights[keys[k]] for k in ("bq", "bk", "bv")])))
            ours += [("weight", keys["wo"], weights[keys["wo"]]), ("bias", keys["bo"], weights[keys["bo"]])]
            continue
        ours += [(leaf.get(short, short), key, weights[key]) for short, key in keys.items()]
    theirs = [k for k in module.state_dict() if not k.endswith("num_batches_tracked")]
    assert len(theirs) == len(ours)
    state = {}
    for torch_key, (want_leaf, irc_key, value) in zip(theirs, ours):
        assert torch_key.rsplit(".", 1)[-1] == want_leaf, (torch_key, irc_key)
        assert tuple(module.state_dict()[torch_key].shape) == value.shape, (torch_key, irc_key)
        state[torch_key] = torch.from_numpy(np.asarray(value, dtype=np.float64))
    return state


def _weights(graph) -> dict[str, np.ndarray]:
    """irc's initialiser, with BatchNorm statistics, norm affines and layer scales made random (they start
    at 0 and 1, which would hide a swapped mean and variance or a lost gain)."""
    weights = init_weights(graph, seed=5)
    rng = np.random.default_rng(6)
    for key, value in weights.items():
        short = key.rsplit(".", 1)[-1]
        if short in ("running_var", "gain", "layer_scale"):
            weights[key] = rng.uniform(0.5, 1.5, value.shape).astype(np.float32)
        elif short == "running_mean" or (short == "bias" and value.ndim == 1):
            weights[key] = (0.1 * rng.standard_normal(value.shape)).astype(np.float32)
    return weights


@pytest.fixture(scope="module", params=sorted(ZOO))
def numeric_case(request):
    name = request.param
    graph = load_graph(MODELS / f"{name}.arch", SMALL[name])
    weights = _weights(graph)
    module = _module(name).double().eval()
    module.load_state_dict(_torch_state(graph, weights, module), strict=False)
    x = np.random.default_rng(7).standard_normal(_input_shape(graph)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x.astype(np.float64))).numpy()
    return name, graph, weights, {graph.inputs()[0].outputs[0]: x}, want


def test_numpy_and_cpu_backends_match_torch(numeric_case, cpu_cache) -> None:
    from irc.backends.cpu import compile_graph

    name, graph, weights, inputs, want = numeric_case
    ref = run_graph(graph, {k: v.astype(np.float64) for k, v in weights.items()},
                    {k: v.astype(np.float64) for k, v in inputs.items()}, np.float64)
    (got_ref,) = ref.values()
    assert got_ref.shape == want.shape and rel_error(got_ref, want) <= 1e-10, name
    (got_cpu,) = compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs).values()
    assert got_cpu.dtype == np.float32 and rel_error(got_cpu, want) <= TOLERANCE, name


# -- Whisper tiny's encoder against Hugging Face's WhisperEncoder ----------------------------------

WHISPER_TINY = {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
                "num_mel_bins": 80, "max_source_positions": 1500}  # the openai/whisper-tiny config
WHISPER_SMALL = {"B": 2, "mels": 8, "frames": 16, "d": 64, "heads": 4, "layers": 2, "ff": 128}
SMALL["whisper_tiny_encoder"] = WHISPER_SMALL


def _whisper(**config: int):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    return WhisperEncoder(WhisperConfig(**config, attn_implementation="eager")).eval()


def test_whisper_parameters_and_multiply_adds() -> None:
    with torch.device("meta"):
        hf = _whisper(**WHISPER_TINY)
        x = torch.empty(1, 80, 3000)
    graph = load_graph(MODELS / "whisper_tiny_encoder.arch", {"B": 1})
    params, _ = count_params(graph)
    frozen = sum(p.numel() for p in hf.parameters() if not p.requires_grad)
    # HF keeps the sinusoidal table as a frozen 1,500 × 384 parameter; irc computes it (positional)
    assert frozen == 1500 * 384 and params + frozen == sum(p.numel() for p in hf.parameters()) == 8_208_384
    with FlopCounterMode(display=False) as counter:
        hf(x)
    assert 2 * _macs(graph) == counter.get_total_flops()


def test_whisper_numpy_and_cpu_backends_match_hf(cpu_cache) -> None:
    from irc.backends.cpu import compile_graph

    s = WHISPER_SMALL
    hf = _whisper(d_model=s["d"], encoder_layers=s["layers"], encoder_attention_heads=s["heads"],
                  encoder_ffn_dim=s["ff"], num_mel_bins=s["mels"], max_source_positions=s["frames"] // 2).double()
    graph = load_graph(MODELS / "whisper_tiny_encoder.arch", s)
    weights = _weights(graph)
    hf_name = {"self_attn_layer_norm.gain": "self_attn_layer_norm.weight", "final_layer_norm.gain":
               "final_layer_norm.weight", "mlp.w1": "fc1.weight", "mlp.b1": "fc1.bias", "mlp.w2": "fc2.weight",
               "mlp.b2": "fc2.bias", "hidden.gain": "layer_norm.weight", "hidden.bias": "layer_norm.bias"}
    hf_name.update({f"self_attn.{w}{x}": f"self_attn.{p}_proj.{'weight' if w == 'w' else 'bias'}"
                    for w in "wb" for x, p in zip("qkvo", ("q", "k", "v", "out"))})
    state = {}
    for key, value in weights.items():
        short = key.removeprefix("encoder_layer.")
        layer, _, rest = short.partition(".") if short != key else ("", "", key)
        name = hf_name.get(rest, rest)
        state[f"layers.{layer}.{name}" if layer else name] = torch.from_numpy(value.astype(np.float64))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert missing == ["embed_positions.weight"] and unexpected == []  # HF's own sinusoids() table stays
    x = np.random.default_rng(8).standard_normal((s["B"], s["mels"], s["frames"])).astype(np.float32)
    with torch.no_grad():
        want = hf(torch.from_numpy(x.astype(np.float64))).last_hidden_state.numpy()
    (got_ref,) = run_graph(graph, {k: v.astype(np.float64) for k, v in weights.items()},
                           {"features": x.astype(np.float64)}, np.float64).values()
    # HF's sinusoids() table is computed in float32 (kept so by .double()); irc's angles are float64
    assert rel_error(got_ref, want) <= 1e-6
    (got_cpu,) = compile_graph(graph, cache_dir=cpu_cache).run(weights, {"features": x}).values()
    assert rel_error(got_cpu, want) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(SMALL))
def test_lowering_and_fusion_keep_parameters_and_flops(name: str) -> None:
    """decompose and fuse rewrite these graphs (grouped convs, channel-last linears, SE gates, qvo biases)
    without changing what they count; the cpu runs above execute the fused graph."""
    from irc.passes import PASSES

    graph = load_graph(MODELS / f"{name}.arch", SMALL[name])

    def flops(g) -> int:
        types = g.value_types()
        return sum(node_cost(n, [types[v] for v in n.inputs]).total for n in g.nodes)

    for lowered in (PASSES["decompose"](graph), PASSES["fuse"](graph)):
        assert count_params(lowered) == count_params(graph)
        assert flops(lowered) == flops(graph)
