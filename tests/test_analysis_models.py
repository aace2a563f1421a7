"""Real CNNs at 224×224: multiply-adds within 1% of the published figures, parameters exact.

Sources: torchvision's model documentation (the "GFLOPS" column there counts multiply-adds,
as fvcore does): ResNet-18 1.814 G and 11,689,512 parameters; VGG-16 15.47 G and
138,357,544 parameters. Both models are the shipped models/*.arch files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize("name, gmacs, params", [
    ("resnet18", 1.814, 11_689_512),
    ("vgg16", 15.47, 138_357_544),
])
def test_cnn_multiply_adds_match_published(irc_cli: Callable, name: str, gmacs: float, params: int) -> None:
    result = irc_cli(["analyze", str(MODELS / f"{name}.arch"), "--json", "-D", "H=224", "-D", "W=224"])
    assert result.rc == 0, result.err
    totals = json.loads(result.out)["totals"]
    assert abs(totals["macs_forward"] / (gmacs * 1e9) - 1) < 0.01
    assert totals["params"] == params
