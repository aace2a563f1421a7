"""torchvision-style state_dicts for the ResNet/VGG zoo: models/resnet18.arch and models/vgg16.arch load them
through the weight maps next to them (models/*.weightmap.json).

torchvision is not a test dependency, so the oracles are PyTorch modules built here with
torchvision's exact layout and attribute names (torchvision/models/resnet.py BasicBlock and
ResNet, vgg.py's features/classifier Sequentials), random weights and BatchNorm statistics,
saved as safetensors and run by PyTorch in eval mode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from irc.backends.numpy_ref import run_graph
from irc.pipeline import load_graph
from irc.runtime.compare import rel_error
from irc.runtime.weights import load_for_model

ROOT = Path(__file__).resolve().parents[1]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class VGG16(nn.Module):
    def __init__(self, fc: int, classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, fc), nn.ReLU(True), nn.Dropout(), nn.Linear(fc, fc),
                                        nn.ReLU(True), nn.Dropout(), nn.Linear(fc, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _randomise(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * (0.05 if t.dim() > 1 else 0.5))


def _check(model: nn.Module, arch: str, bindings: dict[str, int], tmp_path: Path) -> None:
    _randomise(model)
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "tv.safetensors"))
    image = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(image)).numpy()
    graph = load_graph(ROOT / "models" / arch, {"B": 2, "H": 32, "W": 32, **bindings})
    weights = load_for_model(tmp_path / "tv.safetensors", graph, ROOT / "models" / arch)
    got = run_graph(graph, weights, {"image": image}, np.float32)["logits"]
    assert rel_error(got, want) < 1e-5


def test_torchvision_resnet18_state_dict(tmp_path: Path) -> None:
    _check(ResNet18(), "resnet18.arch", {}, tmp_path)


def test_torchvision_vgg16_state_dict(tmp_path: Path) -> None:
    """The classifier narrowed with -D (fc 64, 10 classes) to keep the file small; the map is the same."""
    _check(VGG16(64, 10), "vgg16.arch", {"fc": 64, "classes": 10}, tmp_path)
