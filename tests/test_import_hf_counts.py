"""``irc import`` of published configs gives each model's published parameter count, exactly.

The configs under tests/fixtures/hf/ are the config.json files these models ship with on the
Hugging Face hub. Two oracles: the count the model card publishes, and transformers itself,
building the model on the meta device (no memory) and summing numel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers

from irc.analysis.params import count_params
from irc.runtime.graphs import graph_from_source

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"
PUBLISHED = {
    "gpt2-medium.json": 354_823_168,  # GPT2LMHeadModel, the head tied to wte (counted once)
    "llama-2-7b.json": 6_738_415_616,  # meta-llama/Llama-2-7b-hf
    "mistral-7b-v0.1.json": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "qwen2-0.5b.json": 494_032_768,  # Qwen/Qwen2-0.5B, tied head, q/k/v biases
    "bert-large-uncased.json": 335_141_888,  # BertModel with pooler
    "gemma-7b.json": 8_537_680_896,  # google/gemma-7b, tied head, head_dim 256 with d 3,072 and 16 heads
    "t5-small.json": 60_506_624,  # T5ForConditionalGeneration, one shared embedding (the head tied to it)
}


def _imported(name: str):
    from irc.frontends.hf.importer import import_hf

    imported = import_hf(FIXTURES / name)
    return imported, graph_from_source(imported.text, file=f"{imported.name}.arch")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_count(name: str) -> None:
    _, graph = _imported(name)
    assert count_params(graph)[0] == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_transformers_meta_device_count(name: str) -> None:
    data = json.loads((FIXTURES / name).read_text())
    config = transformers.AutoConfig.for_model(**data)
    cls = {"bert": transformers.AutoModel, "t5": transformers.AutoModelForSeq2SeqLM}.get(
        data["model_type"], transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = cls.from_config(config)
    _, graph = _imported(name)
    assert count_params(graph)[0] == sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


def test_constants_are_named_after_the_config_keys() -> None:
    imported, graph = _imported("mistral-7b-v0.1.json")
    for text in ("hidden_size = 4096", "num_key_value_heads = 8", "rms_norm_eps = 1e-05", "rope_theta = 10000",
                 "sliding_window = 4096", "max_position_embeddings = 32768", "llama_decoder("):
        assert text in imported.text
    assert {n.attrs["window"] for n in graph.nodes if n.op == "attention"} == {4096}


def test_llama3_rope_theta_reaches_every_attention() -> None:
    data = {**json.loads((FIXTURES / "llama-2-7b.json").read_text()), "rope_theta": 500000.0,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
    from irc.frontends.hf.config import HFConfig
    from irc.frontends.hf.llama import import_llama

    imported = import_llama(HFConfig(data, Path("llama3/config.json")), "llama3", "llama3/config.json")
    assert re.search(r"\brope_theta = 500000\b(?!\.)", imported.text)
    graph = graph_from_source(imported.text)
    assert {n.attrs["rope_theta"] for n in graph.nodes if n.op == "attention"} == {500000}
