"""A Hugging Face ``config.json``, read so that every key the importer looks at is accounted for.

An importer asks for each key it uses with HF's own default (the value the config class takes
when the key is absent), or states the only value it supports. A key whose value would build a
different model than irc can express is an error naming the key; keys the importer never asked
for are listed afterwards, so a config that carries something new is never silently dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from irc.diagnostics import IrcError, Loc, did_you_mean, raise_site, read_source, register_source

# keys of transformers' PretrainedConfig and of the hub's files that never change the forward pass
GENERIC_KEYS = frozenset({
    "_name_or_path", "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range",
    "initializer_factor", "gradient_checkpointing", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "task_specific_params", "tokenizer_class",
    "prefix", "max_length", "min_length", "do_sample", "num_beams", "early_stopping", "length_penalty",
    "no_repeat_ngram_size", "temperature", "top_k", "top_p", "repetition_penalty", "bad_words_ids",
    "is_encoder_decoder", "quantization_config_none", "model_type", "chunk_size_feed_forward", "tf_legacy_loss",
    "use_bfloat16", "torchscript", "pruned_heads", "cross_attention_hidden_size", "tie_encoder_decoder",
})
CONFIG_NAME = "config.json"


def _fmt(value: Any) -> str:
    return json.dumps(value)


class HFConfig:
    """The parsed JSON object, with the keys read so far (``used``)."""

    def __init__(self, data: dict[str, Any], path: Path, text: str | None = None):
        self.data = data
        self.path = path
        self.text = text  # the file's text, to point errors at a key's line
        self.used: set[str] = {"model_type"}

    @property
    def model_type(self) -> str:
        return self.data["model_type"]

    def error(self, key: str, why: str) -> IrcError:
        """An error about ``key``, at its line in the file (or about the file, when the key is absent)."""
        value = self.data.get(key)
        origin = raise_site()  # the importer's line that refuses the key, for the error catalogue
        if key not in self.data:
            return IrcError(f"'{self.path}': key '{key}' (absent, so HF's default): {why}", origin=origin)
        loc = key_loc(self.text, str(self.path), key) if self.text is not None else None
        where = "" if loc else f"'{self.path}': "
        return IrcError(f"{where}key '{key}' = {_fmt(value)}: {why}", loc, origin=origin)

    def get(self, key: str, default: Any) -> Any:
        """The key's value, or HF's default when the config leaves it out (or sets it to null)."""
        self.used.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def need(self, key: str, kind: type, default: Any = None, minimum: int | float | None = None) -> Any:
        """A number (``int`` or ``float``), a string or a bool, checked for its kind and range."""
        value = self.get(key, default)
        ok = (isinstance(value, bool) if kind is bool
              else isinstance(value, str) if kind is str
              else isinstance(value, int) and not isinstance(value, bool) if kind is int
              else isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            raise self.error(key, f"must be {'an integer' if kind is int else 'a ' + kind.__name__}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}")
        return float(value) if kind is float else value

    def expect(self, key: str, supported: tuple[Any, ...], default: Any, why: str = "") -> Any:
        """A key irc supports only with the given values (HF's default first); anything else is an error."""
        value = self.get(key, default)
        if value not in supported:
            allowed = " or ".join(_fmt(v) for v in supported)
            raise self.error(key, f"irc supports only {allowed}{': ' + why if why else ''}")
        return value

    def ignore(self, *keys: str) -> None:
        """Keys that do not change the inference-time forward pass (dropout rates, training switches)."""
        self.used.update(keys)

    def unread(self) -> list[str]:
        return sorted(k for k in self.data if k not in self.used and k not in GENERIC_KEYS)


def key_loc(text: str, file: str, key: str) -> Loc | None:
    """Where ``"key":`` first appears at the top level of the JSON text (one level of indentation or none)."""
    m = re.search(r'^[ \t]{0,4}"' + re.escape(key) + r'"\s*:', text, re.M) or re.search(
        r'"' + re.escape(key) + r'"\s*:', text)
    if m is None:
        return None
    start = m.start() + len(m.group(0)) - len(m.group(0).lstrip())
    line = text.count("\n", 0, start) + 1
    col = start - (text.rfind("\n", 0, start) + 1) + 1
    register_source(file, text)
    return Loc(file, line, col)


def config_path(path: str | Path) -> Path:
    """``config.json`` itself, or the one inside a checkpoint folder."""
    path = Path(path)
    if path.is_dir():
        inner = path / CONFIG_NAME
        if not inner.is_file():
            names = sorted(p.name for p in path.iterdir())
            raise IrcError(f"'{path}' is a folder without a {CONFIG_NAME} (it holds: {', '.join(names) or 'nothing'})")
        return inner
    if not path.is_file():
        folder = path.parent if path.parent.is_dir() else None
        near = did_you_mean(path.name, [p.name for p in folder.iterdir()]) if folder else ""
        raise IrcError(f"no such config file: '{path}'{near}")
    return path


def load_config(path: str | Path) -> HFConfig:
    path = config_path(path)
    text = read_source(path, str(path), "a config.json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        register_source(str(path), text)
        raise IrcError(f"the config is not valid JSON: {e.msg.lower()}", Loc(str(path), e.lineno, e.colno)) from None
    if not isinstance(data, dict):
        register_source(str(path), text)
        raise IrcError(f"the config is a JSON {type(data).__name__}, not an object of config keys",
                       Loc(str(path), 1, 1))
    if "model_type" not in data:
        register_source(str(path), text)
        raise IrcError("the config has no 'model_type' key, so irc cannot tell which architecture it describes",
                       Loc(str(path), 1, 1))
    cfg = HFConfig(data, path, text)
    if not isinstance(data["model_type"], str):
        raise cfg.error("model_type", "must be a string")
    return cfg
