"""``config.json`` (or a checkpoint folder) to an .arch model and its weight map, by ``model_type``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from irc.diagnostics import did_you_mean
from irc.frontends.hf.arch_text import Imported, model_name
from irc.frontends.hf.bert import import_bert
from irc.frontends.hf.config import HFConfig, config_path, load_config
from irc.frontends.hf.gemma import import_gemma
from irc.frontends.hf.gpt2 import import_gpt2
from irc.frontends.hf.llama import import_llama
from irc.frontends.hf.t5 import import_t5

Importer = Callable[[HFConfig, str, str], Imported]
IMPORTERS: dict[str, Importer] = {
    "gpt2": import_gpt2,
    "llama": import_llama,
    "mistral": import_llama,
    "qwen2": import_llama,
    "bert": import_bert,
    "t5": import_t5,
    "gemma": import_gemma,
}
# families irc knows of but cannot build exactly, and why (an error, never an approximate model)
NOT_BUILT = {
    "gemma2": "Gemma 2 soft-caps its attention scores and logits (tanh) and alternates sliding-window and global "
              "layers, which irc's attention cannot express",
    "gemma3": "Gemma 3 normalises queries and keys (QK-norm) and alternates local and global RoPE layers",
    "roberta": "RoBERTa's positions start at padding_idx + 1 and skip padding tokens, which irc's learned "
               "positions (rows 0..T-1) do not reproduce",
}


def import_hf(path: str | Path, name: str | None = None) -> Imported:
    """The model a config describes; ``name`` defaults to the config folder's or file's name."""
    cfg = load_config(path)
    where = config_path(path)
    kind = cfg.model_type
    if kind in NOT_BUILT:
        raise cfg.error("model_type", f"irc cannot build '{kind}' exactly: {NOT_BUILT[kind]}")
    if kind not in IMPORTERS:
        raise cfg.error("model_type", f"irc does not import this architecture{did_you_mean(kind, IMPORTERS)} "
                        f"(it imports: {', '.join(sorted(IMPORTERS))})")
    stem = where.parent.name if where.name == "config.json" else where.stem
    imported = IMPORTERS[kind](cfg, model_name(name or stem or kind), str(path))
    unread = cfg.unread()
    if unread:
        imported.notes.append(f"config keys irc does not read (check that they leave the model unchanged): "
                              f"{', '.join(unread)}")
    return imported
