"""What ``irc import`` refuses, and says: an unknown model_type or an unsupported key value is an
error naming the key, never a silently different model. The golden cases hf_import_* and the
checkpoint run_weights_* cases read the files tests/golden/errors/hf/make_fixtures.py writes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from irc.diagnostics import IrcError, render

HF_FIXTURES = Path(__file__).resolve().parent / "golden" / "errors" / "hf"
PUBLISHED = Path(__file__).resolve().parent / "fixtures" / "hf"
GPT2 = json.loads((PUBLISHED / "gpt2-medium.json").read_text())
LLAMA = json.loads((PUBLISHED / "llama-2-7b.json").read_text())


def test_fixture_files_are_what_the_script_makes() -> None:
    spec = importlib.util.spec_from_file_location("make_hf_fixtures", HF_FIXTURES / "make_fixtures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = module.build()
    on_disk = {p.relative_to(HF_FIXTURES).as_posix() for p in HF_FIXTURES.rglob("*") if p.is_file()
               and p.name != "make_fixtures.py" and "__pycache__" not in p.parts}
    assert on_disk == set(built), "rerun tests/golden/errors/hf/make_fixtures.py"
    stale = sorted(n for n, data in built.items() if (HF_FIXTURES / n).read_bytes() != data)
    assert not stale, f"rerun tests/golden/errors/hf/make_fixtures.py: {stale}"


def _import(tmp_path: Path, data: dict, name: str = "config.json") -> str:
    from irc.frontends.hf.importer import import_hf

    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(IrcError) as e:
        import_hf(path)
    return render(e.value, color=False)


@pytest.mark.parametrize("key, value, why", [
    ("activation_function", "gelu_fast", "irc has no such activation"),
    ("scale_attn_by_inverse_layer_idx", True, "irc supports only false: irc's attention has no per-layer score"),
    ("scale_attn_weights", False, "always scales scores by 1/sqrt(head)"),
    ("n_inner", -3, "must be a positive integer or null"),
    ("n_head", 15, "n_embd = 1024 is not divisible by n_head = 15"),
    ("layer_norm_epsilon", "small", "must be a float"),
])
def test_gpt2_key_errors_name_the_key(tmp_path: Path, key: str, value: object, why: str) -> None:
    text = _import(tmp_path, {**GPT2, key: value})
    assert f"error: key '{key}' = {json.dumps(value)}: " in text and why in text
    assert text.startswith(f"{tmp_path / 'config.json'}:")  # at the key's line


@pytest.mark.parametrize("key, value, why", [
    ("hidden_act", "gelu", "irc supports only \"silu\""),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}, "rope_type 'yarn'"),
    ("head_dim", 256, "irc supports only 128"),
    ("num_key_value_heads", 5, "num_attention_heads = 32 is not a multiple of it"),
])
def test_llama_key_errors_name_the_key(tmp_path: Path, key: str, value: object, why: str) -> None:
    text = _import(tmp_path, {**LLAMA, key: value})
    assert f"key '{key}'" in text and why in text


def test_qwen2_sliding_window_layers_are_refused(tmp_path: Path) -> None:
    data = {**json.loads((PUBLISHED / "qwen2-0.5b.json").read_text()), "use_sliding_window": True}
    assert "key 'use_sliding_window' = true: irc supports only false" in _import(tmp_path, data)


def test_t5_gated_gelu_and_head_width_are_refused(tmp_path: Path) -> None:
    base = {"model_type": "t5", "d_model": 64, "d_kv": 16, "num_heads": 4}
    assert "key 'feed_forward_proj' = \"gated-gelu\"" in _import(tmp_path, {**base, "feed_forward_proj": "gated-gelu"})
    assert "d_kv · num_heads = 128 differs from d_model = 64" in _import(tmp_path, {**base, "d_kv": 32})


def test_bert_relative_positions_are_refused(tmp_path: Path) -> None:
    data = {"model_type": "bert", "position_embedding_type": "relative_key"}
    assert "key 'position_embedding_type' = \"relative_key\": irc supports only \"absolute\"" in _import(
        tmp_path, data)


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    from irc.frontends.hf.importer import import_hf

    with pytest.raises(IrcError, match=f"'{tmp_path}' is a folder without a config.json \\(it holds: "
                                       "model.safetensors\\)"):
        import_hf(tmp_path)


def test_unread_keys_are_noted_and_output_is_an_arch_file(tmp_path: Path, irc_cli) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA, "num_hidden_layers": 2, "brand_new_switch": True}))
    result = irc_cli(["import", str(config), "-o", str(tmp_path / "m.arch")])
    assert result.rc == 0, result.err
    assert "irc: note: config keys irc does not read (check that they leave the model unchanged): " \
           "brand_new_switch" in result.err
    assert result.out.startswith(f"wrote {tmp_path / 'm.arch'} (model m, LlamaForCausalLM: ")
    assert (tmp_path / "m.weightmap.json").is_file()
    bad = irc_cli(["import", str(config), "-o", str(tmp_path / "m.json")])
    assert (bad.rc, bad.err) == (2, f"irc: error: -o: the imported model is written as an .arch file, got "
                                    f"'{tmp_path / 'm.json'}'\n")
    bad = irc_cli(["import", str(config), "--name", "9lives"])
    assert bad.rc == 2 and "--name: '9lives' is not a valid model name" in bad.err


def test_import_to_stdout_writes_no_map(tmp_path: Path, irc_cli) -> None:
    result = irc_cli(["import", str(PUBLISHED / "gpt2-medium.json")], cwd=tmp_path)
    assert result.rc == 0
    assert "model gpt2_medium(B, T) {" in result.out and "tied=wte" in result.out
    assert "the weight map is written only with -o" in result.err
    assert list(tmp_path.iterdir()) == []
