"""The decoder checkpoints the generation tests share: random-weight GPT-2, Llama (GQA) and Mistral (a
window of 5, shorter than every test's sequence, so the rolling buffer wraps), made with transformers,
perturbed off HF's init, saved and imported with ``irc import``; and HF's own greedy generation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from conftest import run_irc

VOCAB = 96
PROMPT = [5, 17, 3, 44, 12, 9, 30]
NEW = 12


def makers(positions: int) -> dict[str, Callable[[], torch.nn.Module]]:
    """name -> a fresh model with room for ``positions`` tokens."""
    llama = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=positions)
    return {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=32, n_head=4, n_layer=2, n_positions=positions, vocab_size=VOCAB)),
        "llama_gqa": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama, num_key_value_heads=2)),
        "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
            **llama, num_key_value_heads=2, sliding_window=5)),
    }


NAMES = sorted(makers(1))


def perturbed(hf: torch.nn.Module) -> torch.nn.Module:
    """Off HF's init (zero biases, unit gains), where a wrong weight mapping would not show."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in sorted(hf.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return hf.eval()


def imported(name: str, positions: int, root: Path) -> tuple[str, torch.nn.Module, Path]:
    """(name, the HF model, root): the checkpoint saved under root/ckpt and imported as root/<name>.arch."""
    torch.manual_seed(0)
    hf = perturbed(makers(positions)[name]())
    hf.save_pretrained(root / "ckpt")
    result = run_irc(["import", str(root / "ckpt"), "-o", str(root / f"{name}.arch")])
    assert result.rc == 0, result.err
    return name, hf, root


def hf_greedy(hf: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                          pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()
