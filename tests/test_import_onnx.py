"""ONNX import: torchvision's ResNet-50, MobileNetV2 and ViT-B/16 exported here with torch.onnx.export.

Oracles: torchvision's published parameters and multiply-adds at 224² (read without weights), and
ONNX Runtime's outputs on the same file (numpy and cpu backends within 1e-5 relative, at a small side).
Export settings that keep every BatchNormalization node: the legacy exporter (``dynamo=False``; the
dynamo exporter needs onnxscript), ``do_constant_folding=False`` and ``TrainingMode.PRESERVE`` on an
eval-mode model.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from irc.analysis.flops import node_cost
from irc.analysis.params import count_params
from irc.backends.numpy_ref import run_graph
from irc.frontends.onnx.importer import onnx_weights
from irc.pipeline import load_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx_torchvision_nets as nets  # noqa: E402

# torchvision's docs (weights tables): parameters and GMACs at 224 × 224
PUBLISHED = {"resnet50": (25_557_032, 4.09), "mobilenet_v2": (3_504_872, 0.30), "vit_b_16": (86_567_656, 17.56)}
BUILD = {"resnet50": nets.ResNet, "mobilenet_v2": nets.MobileNetV2, "vit_b_16": nets.VisionTransformer}


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights, every vector distinct (the exporter shares equal initializers), norms kept sane."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("class_token", "pos_embedding")):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + base)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
    return model.eval()


def export(model: torch.nn.Module, side: int, path: Path, batch: int = 1) -> Path:
    x = torch.randn(batch, 3, side, side)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE, input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "B"}, "logits": {0: "B"}})
    return path


@pytest.fixture(scope="module")
def full_size(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("onnx224")
    torch.manual_seed(0)
    return {name: export(randomize(build()), 224, out / f"{name}.onnx") for name, build in BUILD.items()}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_params_and_macs_at_224(name: str, full_size: dict[str, Path], monkeypatch) -> None:
    path = full_size[name]
    kinds = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
    if name != "vit_b_16":
        assert kinds.count("BatchNormalization") == kinds.count("Conv")  # not folded into the convolutions
    from onnx import numpy_helper

    decode = numpy_helper.to_array

    def refuse(tensor, *args, **kwargs):
        if np.prod(tensor.dims) > 64:
            raise AssertionError(f"analysis read the weight '{tensor.name}'")
        return decode(tensor, *args, **kwargs)  # a Constant node's scalar (a Clip bound, a shape)

    monkeypatch.setattr(numpy_helper, "to_array", refuse)  # shapes only: no weight's data is decoded
    graph = load_graph(path, {"B": 1})
    params, _ = count_params(graph)
    macs = graph_macs(graph)
    want_params, want_gmacs = PUBLISHED[name]
    assert params == want_params
    assert round(macs / 1e9, 2) == want_gmacs


def graph_macs(graph) -> int:
    types = graph.value_types()
    return sum(node_cost(n, [types[v] for v in n.inputs]).macs for n in graph.nodes if n.op != "input")


# small sides keep the numeric runs fast; ViT-B/16 is built for its side (its position table has one row per patch)
SMALL = {"resnet50": (lambda: nets.ResNet(), 32), "mobilenet_v2": (lambda: nets.MobileNetV2(), 32),
         "vit_b_16": (lambda: nets.VisionTransformer(image_size=32), 32)}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict[str, tuple[Path, np.ndarray, np.ndarray]]:
    """Each model at a small side, batch 2: the file, an input and ONNX Runtime's output."""
    out = tmp_path_factory.mktemp("onnx_small")
    torch.manual_seed(1)
    files = {}
    for name, (build, side) in SMALL.items():
        path = export(randomize(build(), seed=1), side, out / f"{name}.onnx", batch=2)
        x = np.random.default_rng(0).standard_normal((2, 3, side, side)).astype(np.float32)
        files[name] = (path, x, ort.InferenceSession(str(path)).run(None, {"image": x})[0])
    return files


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", list(SMALL))
def test_numpy_backend_matches_onnx_runtime(name: str, small) -> None:
    path, x, want = small[name]
    graph = load_graph(path, {"B": 2})
    got = run_graph(graph, onnx_weights(path, graph), {"image": x}, np.float64)["logits"]
    assert got.shape == want.shape
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("name", list(SMALL))
def test_irc_run_cpu_reads_the_initializers(name: str, small, irc_cli, tmp_path: Path) -> None:
    """``irc run model.onnx`` needs no --weights: the initializers are the weights (cpu backend vs ONNX Runtime)."""
    path, x, want = small[name]
    np.save(tmp_path / "x.npy", x)
    result = irc_cli(["run", str(path), "-D", "B=2", "--backend", "cpu", "--input", f"image={tmp_path / 'x.npy'}",
                      "-o", str(tmp_path / "y.npz")], cwd=tmp_path)
    assert result.rc == 0, result.err
    assert "weights the initializers of" in result.out
    got = np.load(tmp_path / "y.npz")["logits"]
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("name, build, opset, folded", [
    ("vit_opset14", lambda: nets.VisionTransformer(image_size=32, layers=2), 14, False),  # LayerNorm spelled out
    ("mobilenet_v2_folded", nets.MobileNetV2, 11, True),  # BatchNorm folded into the convolutions, opset 11 ops
])
def test_other_export_settings(name: str, build, opset: int, folded: bool, tmp_path: Path) -> None:
    model = randomize(build(), seed=2)
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, do_constant_folding=folded, opset_version=opset,
                          input_names=["image"], output_names=["logits"])
    graph = load_graph(path)
    if not folded:  # exact parameters, the spelled-out LayerNorms become layernorm layers again
        assert count_params(graph)[0] == sum(p.numel() for p in model.parameters())
        assert sum(n.op == "layernorm" for n in graph.nodes) == 5
    want = ort.InferenceSession(str(path)).run(None, {"image": x.numpy()})[0]
    got = run_graph(graph, onnx_weights(path, graph), {"image": x.numpy()}, np.float64)["logits"]
    assert rel(got, want) < 1e-5
