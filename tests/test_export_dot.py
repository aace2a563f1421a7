"""irc compile --emit dot|svg|png: one box per op (type, attributes, parameters, FLOPs), the type of the
value on every edge, repeat(N) blocks as clusters, --depth collapsing deeper scopes into one box each.

The golden is GPT-2 small at --depth 1; the counts asserted next to it come from the model's
published structure (12 blocks of 6 ops, 124,439,808 parameters in all), not from irc's output.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_export_onnx import MODEL_FILES

from irc.analysis.units import si

GOLDEN = Path(__file__).resolve().parent / "golden" / "export"
ROOT = Path(__file__).resolve().parents[1]


def _dot(irc_cli, model: str, *args: str) -> str:
    result = irc_cli(["compile", str(MODEL_FILES[model]), "--emit", "dot", *args])
    assert result.rc == 0, result.err
    return result.out


def test_gpt2_at_depth_1_is_twelve_blocks_in_one_cluster(irc_cli, golden) -> None:
    text = _dot(irc_cli, "gpt2_small", "--depth", "1")
    golden.check(GOLDEN / "gpt2_small_depth1.dot", text)
    clusters = re.findall(r'subgraph "cluster_([^"]+)"', text)
    assert clusters == ["pre_ln_decoder"]
    assert 'label="pre_ln_decoder × 12"' in text
    blocks = re.findall(r'^\s+"scope:pre_ln_decoder\.(\d+)" \[label="([^"]*)"', text, re.M)
    assert [int(i) for i, _ in blocks] == list(range(12))
    # a pre-LN block: 2 layernorms, attention, 2 residual adds, the FFN; 12·d² + 13·d parameters at d = 768
    d = 768
    assert all(f"6 ops · {si(12 * d * d + 13 * d, '').replace(' ', '')} params" in label for _, label in blocks)
    assert text.count('[label="f32[B,T,768]"]') >= 13  # shapes on the edges, symbols kept


def test_without_depth_every_op_is_a_box(irc_cli) -> None:
    from irc.pipeline import load_graph

    text = _dot(irc_cli, "resnet18")
    graph = load_graph(MODEL_FILES["resnet18"])
    boxes = re.findall(r'^\s*"([^"]+)" \[label=', text, re.M)
    assert sorted(b for b in boxes if not b.startswith("output:")) == sorted(n.outputs[0] for n in graph.nodes)
    assert "conv2d {out=64, kernel=7, stride=2, padding=3, bias=false}" in text
    assert 'label="layer1.basic × 2"' in text
    assert "stem.conv1 -> " not in text  # edges join quoted ids
    assert '"stem.conv1" -> "stem.bn1" [label="f32[B,64,((H + 1)//2),((W + 1)//2)]"];' in text


@pytest.mark.parametrize("name", sorted(MODEL_FILES))
def test_every_model_draws_one_box_per_op(name: str) -> None:
    from irc.backends.dot import emit_source
    from irc.pipeline import load_graph

    graph = load_graph(MODEL_FILES[name])
    text = emit_source(graph)
    boxes = re.findall(r'^\s*"([^"]+)" \[label=', text, re.M)
    assert sorted(b for b in boxes if not b.startswith("output:")) == sorted(n.outputs[0] for n in graph.nodes)
    assert text.count(" -> ") >= len(graph.nodes) - len(graph.inputs())


def test_depth_0_draws_each_top_scope_as_one_box(irc_cli) -> None:
    text = _dot(irc_cli, "resnet18", "--depth", "0")
    assert "subgraph" not in text
    assert '"scope:layer1"' in text and '"scope:stem"' in text


def test_dot_is_deterministic(irc_cli) -> None:
    assert _dot(irc_cli, "t5_small") == _dot(irc_cli, "t5_small")


@pytest.mark.parametrize("kind, magic", [("svg", b"<svg"), ("png", b"\x89PNG")])
def test_render_writes_the_picture_or_says_how_to_install_graphviz(kind: str, magic: bytes, tmp_path: Path,
                                                                   irc_cli) -> None:
    out = tmp_path / f"m.{kind}"
    result = irc_cli(["compile", str(MODEL_FILES["mlp"]), "--emit", kind, "-o", str(out)])
    if shutil.which("dot") is None:
        assert result.rc == 1
        assert "needs Graphviz's 'dot' program" in result.err and "apt-get install graphviz" in result.err
        assert not out.exists()
    else:
        assert result.rc == 0, result.err
        assert magic in out.read_bytes()[:400]


def test_render_without_graphviz_is_a_clear_error(tmp_path: Path, irc_cli, monkeypatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    result = irc_cli(["compile", str(MODEL_FILES["mlp"]), "--emit", "svg", "-o", str(tmp_path / "m.svg")])
    assert result.rc == 1
    assert result.err.startswith("irc: error: --emit svg needs Graphviz's 'dot' program, which is not on PATH")


def test_docs_show_the_resnet18_picture() -> None:
    svg = (ROOT / "docs" / "images" / "resnet18.svg").read_text(encoding="utf-8")
    assert "<svg" in svg and "layer4.basic" in svg and "global_avgpool" in svg
    assert "images/resnet18.svg" in (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
