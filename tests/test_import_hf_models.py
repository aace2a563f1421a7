"""irc import + irc run --weights against Hugging Face transformers, family by family.

Each case builds a tiny random model with transformers (2 layers, small widths), perturbs every
parameter (HF's init leaves biases at 0 and norm gains at 1, where a wrong mapping would not
show), saves it with save_pretrained (safetensors), imports its folder with ``irc import``,
runs it with ``irc run --weights FOLDER`` on the numpy and cpu backends, and compares the
outputs with HF's own forward pass: max|irc − HF| / max|HF| < 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from test_cpu_backend_helpers import cpu_cache  # noqa: F401  (a fixture: one kernel cache for the session)

from irc.runtime.compare import rel_error

TOLERANCE = 1e-5
B, T = 2, 12
VOCAB = 96


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]  # irc input name -> array
    forward: Callable[[torch.nn.Module, dict[str, np.ndarray]], dict[str, np.ndarray]]  # irc output -> HF's
    defines: tuple[str, ...] = (f"B={B}", f"T={T}")


def _tokens(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"tokens": rng.integers(0, VOCAB, (B, T)).astype(np.int32)}


def _lm_logits(model: torch.nn.Module, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"logits": model(input_ids=torch.from_numpy(x["tokens"]).long()).logits.numpy()}


def _decoder(config: transformers.PretrainedConfig, cls: type) -> Callable[[], torch.nn.Module]:
    return lambda: cls(config)


def _bert_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    mask = np.ones((B, T), np.float32)
    mask[1, -4:] = 0  # the second sequence is padded
    return {"tokens": rng.integers(0, VOCAB, (B, T)).astype(np.int32),
            "token_types": rng.integers(0, 2, (B, T)).astype(np.int32), "attention_mask": mask}


def _bert_forward(model: torch.nn.Module, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = model(input_ids=torch.from_numpy(x["tokens"]).long(),
                token_type_ids=torch.from_numpy(x["token_types"]).long(),
                attention_mask=torch.from_numpy(x["attention_mask"]).long())
    return {"hidden": out.last_hidden_state.numpy(), "pooled": out.pooler_output.numpy()}


def _t5_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"tokens": rng.integers(0, VOCAB, (B, T)).astype(np.int32),
            "decoder_tokens": rng.integers(0, VOCAB, (B, T // 2)).astype(np.int32)}


def _t5_forward(model: torch.nn.Module, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = model(input_ids=torch.from_numpy(x["tokens"]).long(),
                decoder_input_ids=torch.from_numpy(x["decoder_tokens"]).long())
    return {"logits": out.logits.numpy()}


LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
CASES = [
    Case("gpt2", _decoder(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, n_positions=64, vocab_size=VOCAB),
                          transformers.GPT2LMHeadModel), _tokens, _lm_logits),
    Case("gpt2_untied", _decoder(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, n_positions=64,
                                                         vocab_size=VOCAB, activation_function="gelu",
                                                         tie_word_embeddings=False),
                                 transformers.GPT2LMHeadModel), _tokens, _lm_logits),
    Case("llama2", _decoder(transformers.LlamaConfig(**LLAMA, rms_norm_eps=1e-5), transformers.LlamaForCausalLM),
         _tokens, _lm_logits),
    # Llama 3: grouped-query attention, rope_theta 500,000; with attention biases and a tied head
    Case("llama3_gqa_bias_tied", _decoder(transformers.LlamaConfig(**LLAMA, num_key_value_heads=2, rope_theta=500000.0,
                                                                   attention_bias=True, tie_word_embeddings=True),
                                          transformers.LlamaForCausalLM), _tokens, _lm_logits),
    # a window shorter than the sequence, so the sliding mask matters
    Case("mistral", _decoder(transformers.MistralConfig(**LLAMA, num_key_value_heads=2, sliding_window=5),
                             transformers.MistralForCausalLM), _tokens, _lm_logits),
    Case("qwen2", _decoder(transformers.Qwen2Config(**LLAMA, num_key_value_heads=2, rope_theta=1000000.0,
                                                    tie_word_embeddings=True), transformers.Qwen2ForCausalLM),
         _tokens, _lm_logits),
    # Gemma: scaled embeddings, head_dim ≠ hidden / heads, GeGLU (tanh GELU), (1 + w) norm gains, MQA
    Case("gemma", _decoder(transformers.GemmaConfig(**LLAMA, num_key_value_heads=1, head_dim=16),
                           transformers.GemmaForCausalLM), _tokens, _lm_logits),
    Case("bert", _decoder(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=48,
                                                  max_position_embeddings=40), transformers.BertModel),
         _bert_inputs, _bert_forward),
    Case("t5", _decoder(transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                              num_heads=4, relative_attention_num_buckets=8,
                                              relative_attention_max_distance=16, feed_forward_proj="relu"),
                        transformers.T5ForConditionalGeneration), _t5_inputs, _t5_forward,
         (f"B={B}", f"S={T}", f"T={T // 2}")),
]


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter off HF's init (zero biases, unit gains), reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)


@dataclass
class Built:
    folder: Path
    model_file: Path
    inputs: dict[str, Path]
    want: dict[str, np.ndarray]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def built(request, tmp_path_factory) -> tuple[Case, Built]:
    case: Case = request.param
    root = tmp_path_factory.mktemp(case.name)
    torch.manual_seed(0)
    model = case.make().eval()
    perturb(model, 1)
    model.save_pretrained(root / "checkpoint")
    x = case.inputs(np.random.default_rng(0))
    with torch.no_grad():
        want = case.forward(model, x)
    files = {}
    for name, arr in x.items():
        files[name] = root / f"{name}.npy"
        np.save(files[name], arr)
    from conftest import run_irc

    result = run_irc(["import", str(root / "checkpoint"), "-o", str(root / f"{case.name}.arch")])
    assert result.rc == 0, result.err
    return case, Built(root / "checkpoint", root / f"{case.name}.arch", files, want)


def run_model(case: Case, b: Built, backend: str, weights: Path, out: Path) -> dict[str, np.ndarray]:
    from conftest import run_irc

    argv = ["run", str(b.model_file), "--backend", backend, "--weights", str(weights), "-o", str(out)]
    for d in case.defines:
        argv += ["-D", d]
    for name, path in b.inputs.items():
        argv += ["--input", f"{name}={path}"]
    result = run_irc(argv)
    assert result.rc == 0, result.err
    return dict(np.load(out))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_imported_model_matches_hf(built, backend, tmp_path, monkeypatch, cpu_cache) -> None:  # noqa: F811
    case, b = built
    monkeypatch.setenv("IRC_CACHE_DIR", str(cpu_cache))
    got = run_model(case, b, backend, b.folder, tmp_path / "out.npz")
    assert set(got) == set(b.want)
    for name, want in b.want.items():
        assert got[name].shape == want.shape, name
        assert rel_error(got[name], want) < TOLERANCE, (name, rel_error(got[name], want))


def test_parameter_count_matches_hf(built) -> None:
    """irc's exact count of the imported model is HF's count of the model it came from."""
    from irc.analysis.params import count_params
    from irc.pipeline import load_graph, parse_defines

    case, b = built
    hf = {"bert": transformers.AutoModel, "t5": transformers.AutoModelForSeq2SeqLM}.get(
        case.name, transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        reference = hf.from_config(transformers.AutoConfig.from_pretrained(b.folder))
    graph = load_graph(b.model_file, parse_defines(list(case.defines)))
    assert count_params(graph)[0] == sum(p.numel() for p in reference.parameters())



def test_sharded_checkpoint_by_folder_index_and_file(tmp_path) -> None:
    """save_pretrained's own shards (model.safetensors.index.json + model-0000k-of-0000n.safetensors) load by
    folder and by index; a single shard alone is told which weights it lacks."""
    case = next(c for c in CASES if c.name == "llama2")
    torch.manual_seed(0)
    model = case.make().eval()
    perturb(model, 2)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    x = case.inputs(np.random.default_rng(0))
    with torch.no_grad():
        want = case.forward(model, x)["logits"]
    np.save(tmp_path / "tokens.npy", x["tokens"])
    from conftest import run_irc

    assert run_irc(["import", str(tmp_path / "sharded"), "-o", str(tmp_path / "m.arch")]).rc == 0
    b = Built(tmp_path / "sharded", tmp_path / "m.arch", {"tokens": tmp_path / "tokens.npy"}, {})
    for source in (tmp_path / "sharded", tmp_path / "sharded" / "model.safetensors.index.json"):
        got = run_model(case, b, "numpy", source, tmp_path / "out.npz")["logits"]
        assert rel_error(got, want) < TOLERANCE
    result = run_irc(["run", str(tmp_path / "m.arch"), "-D", f"T={T}", "--weights",
                      str(tmp_path / "sharded" / shards[0])])
    assert result.rc == 1 and "weight(s) the weight map reads: 'model." in result.err
