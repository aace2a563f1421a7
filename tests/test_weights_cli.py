"""``irc weights``: the keys a model reads, and what a wrong weights file is told.

Oracles: the published GPT-2 small count (124,439,808), the keys and shapes ``irc run
--weights`` accepts (a template file must load), the initialiser's own values for each listed
rule, and hand-built wrong files whose every fault must be named.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from irc.diagnostics import IrcError
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import check_weights, expected_weights, load_checked

ROOT = Path(__file__).resolve().parents[1]
GPT2 = str(ROOT / "models" / "gpt2_small.arch")


def test_json_lists_every_weight_of_gpt2_small(irc_cli) -> None:
    result = irc_cli(["weights", GPT2, "--json"])
    assert result.rc == 0, result.err
    doc = json.loads(result.out)
    assert doc["total"] == 124_439_808  # HF "gpt2", the head tied to wte
    assert len(doc["weights"]) == 2 + 12 * 16 + 2  # wte, wpe; per layer 2 norms (4), attention (8), FFN (4); ln_f
    row = {r["key"]: r for r in doc["weights"]}["pre_ln_decoder.3.attn.wq"]
    assert (row["shape"], row["dtype"], row["init"], row["layer"], row["op"]) == (
        [768, 768], "float32", "normal", "pre_ln_decoder.3.attn", "attention")


def test_table_names_rules_and_layers(irc_cli) -> None:
    result = irc_cli(["weights", GPT2, "-D", "layers=1"])
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    one_layer = 50257 * 768 + 1024 * 768 + 7_087_872 + 2 * 768  # wte, wpe, a layer (the README's subtotal), ln_f
    assert lines[0] == f"model gpt2_small(B=1, T=1024): 20 weights, {one_layer:,} elements"
    assert any(line.split()[:5] == ["ln_f.gain", "[768]", "float32", "ones", "ln_f"] for line in lines)
    assert "  zeros: all zeros (biases, running means)" in lines


def test_listed_init_rules_are_what_the_initialiser_does(irc_cli) -> None:
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights

    model = str(ROOT / "models" / "resnet18.arch")
    rows = json.loads(irc_cli(["weights", model, "--json"]).out)["weights"]
    values = init_weights(load_graph(model, {"B": 1, "H": 32, "W": 32}), seed=0)
    for r in rows:
        v = values[r["key"]].astype(np.float64)
        if r["init"] == "zeros":
            assert not v.any(), r["key"]
        elif r["init"] == "ones":
            assert (v == 1).all(), r["key"]
        elif r["init"] == "he":  # normal, Var = 2 / fan_in
            fan_in = int(np.prod(r["shape"][1:]))
            assert abs(v.std() / np.sqrt(2 / fan_in) - 1) < 0.1, r["key"]
    assert {r["init"] for r in rows} >= {"he", "zeros", "ones"}


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_template_has_every_key_and_loads(irc_cli, tmp_path: Path, suffix: str) -> None:
    model = str(ROOT / "models" / "mlp.arch")
    out = tmp_path / f"t{suffix}"
    result = irc_cli(["weights", model, "--template", str(out)])
    assert result.rc == 0, result.err
    from irc.pipeline import load_graph

    graph = load_graph(model)
    loaded = load_checked(out, graph)
    assert sorted(loaded) == sorted(expected_weights(graph))


def test_template_suffix_is_a_usage_error(irc_cli, tmp_path: Path) -> None:
    result = irc_cli(["weights", GPT2, "--template", str(tmp_path / "t.pt")])
    assert result.rc == 2
    assert result.err == f"irc: error: --template: the template is a .safetensors or .npz file, got " \
                         f"'{tmp_path / 't.pt'}'\n"


# -- what a wrong file is told ------------------------------------------------------------

TINY = ("model m() {\n  input tokens: i32[2, 5]\n  wte = embedding(10, 4)\n  h = linear(wte(tokens), 4)\n"
        "  output y = unembed(h, 10)\n}\n")


def _tiny() -> tuple:
    graph = graph_from_source(TINY)
    return graph, {k: np.zeros(s, np.float32) for k, s in expected_weights(graph).items()}


def test_a_key_ending_with_the_missing_name_ranks_first() -> None:
    """HF saves GPT2LMHeadModel's table as transformer.wte.weight; lm_head.weight looks alike but is not it."""
    graph, w = _tiny()
    table = w.pop("wte.weight")
    w["lm_head.weight"] = table.copy()
    w["transformer.wte.weight"] = table
    w.pop("y.weight")
    with pytest.raises(IrcError) as e:
        check_weights(graph, w, "'f'")
    assert e.value.message == (
        "'f': missing 2 weights: 'wte.weight' of shape [10, 4] (the file has 'transformer.wte.weight' instead, "
        "renamed?), 'y.weight' of shape [10, 4] (the file has 'lm_head.weight' instead, renamed?)")


def test_every_missing_and_extra_key_is_named() -> None:
    graph, w = _tiny()
    for k in ("h.weight", "h.bias"):
        w.pop(k)
    w.update({f"extra.{i}": np.zeros(3, np.float32) for i in range(3)})
    with pytest.raises(IrcError) as e:
        check_weights(graph, w, "'f'")
    msg = e.value.message
    assert "missing 2 weights: 'h.weight' of shape [4, 4]" in msg and "'h.bias' of shape [4]" in msg
    assert all(f"'extra.{i}' of shape [3]" in msg for i in range(3))


def test_a_transposed_matrix_is_called_so() -> None:
    graph, w = _tiny()
    w["y.weight"] = np.zeros((4, 10), np.float32)
    w["wte.weight"] = np.zeros((4, 10), np.float32)
    with pytest.raises(IrcError) as e:
        check_weights(graph, w, "'f'")
    assert e.value.message == (
        "'f': weight 'wte.weight' has shape [4, 10], but the model expects [10, 4]; transposed?; "
        "weight 'y.weight' has shape [4, 10], but the model expects [10, 4]; transposed?")


def test_rows_name_their_checkpoint_source_through_the_weight_map(irc_cli, tmp_path: Path) -> None:
    config = ROOT / "tests" / "fixtures" / "hf" / "gpt2-medium.json"
    assert irc_cli(["import", str(config), "-o", str(tmp_path / "g.arch")]).rc == 0
    result = irc_cli(["weights", str(tmp_path / "g.arch"), "-D", "n_layer=1", "--json"])
    assert result.rc == 0, result.err
    rows = {r["key"]: r for r in json.loads(result.out)["weights"]}
    assert rows["pre_ln_decoder.0.attn.wk"]["source"] == \
        "transformer.h.0.attn.c_attn.weight, part 2 of 3 along axis 1, transposed"
    assert rows["ln_f.gain"]["source"] == "transformer.ln_f.weight"
