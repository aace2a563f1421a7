"""Whole forward passes of zoo models on the card, the way users bring them.

BERT-base and a 2-layer Llama (TinyLlama's widths: grouped-query attention, RoPE, SwiGLU,
RMSNorm) are built by transformers from a config, saved with ``save_pretrained``, imported
with irc's Hugging Face importer and loaded through the weight map it writes; ResNet-18 is
models/resnet18.arch against the torch mirror the CPU benchmarks use
(benchmarks/torch_models.py). Every parameter is moved off its initial value first (zero
biases and unit gains hide a wrong mapping). Each is checked against the same torch model
in float64 on the card, then timed against torch eager fp32 (TF32 off) on the same inputs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpu_suite.device import DEV, ROOT, as_torch, bench, poison, rel_err, sync, tflops
from gpu_suite.harness import Report, Row, guarded, resources, status

from irc.backends.cuda import compile_graph


def _perturb(model: torch.nn.Module, seed: int, scale: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _hf_imported(model: torch.nn.Module, folder: Path, binds: dict[str, int]):
    """(graph, weights): ``model`` saved as HF ships it, imported and loaded by irc."""
    from irc.frontends.hf.importer import import_hf
    from irc.pipeline import load_graph
    from irc.runtime.weight_map import map_path_for
    from irc.runtime.weights import load_for_model

    checkpoint = folder / "checkpoint"
    model.save_pretrained(checkpoint)
    imported = import_hf(checkpoint, "imported")
    arch = folder / "imported.arch"
    arch.write_text(imported.text)
    map_path_for(arch).write_text(imported.weight_map.dumps())
    graph = load_graph(arch, binds)
    return graph, load_for_model(checkpoint, graph, arch)


def _run_model(report: Report, args: argparse.Namespace, name: str, graph: Any, weights: dict[str, np.ndarray],
               inputs: dict[str, np.ndarray], torch_fp32: Callable[[], Any],
               reference: Callable[[], dict[str, torch.Tensor]], flops: float) -> None:
    start = time.perf_counter()
    compiled = compile_graph(graph, cache_dir=report.facts["cache_dir"])
    compile_s = time.perf_counter() - start
    report.compile_s.update(compiled.stats.compile_seconds)
    resources(compiled.module, report)
    module = compiled.module
    V, F_ = compiled.values(weights)
    H = module.load(V, inputs)
    outs = dict(zip(module.OUTPUTS, module.OUTPUT_VALUES))
    for i in outs.values():
        poison(V[i])
    start = time.perf_counter()
    module.launch(V, F_, H)
    sync()
    first_s = time.perf_counter() - start
    ms = bench(lambda: module.launch(V, F_, H), 1, max(3, args.reps // 2))
    torch_ms = bench(torch_fp32, 1, max(3, args.reps // 2))
    for i in outs.values():  # checked after the timing runs too: a result that moves is a race
        poison(V[i])
    module.launch(V, F_, H)
    sync()
    wall = []
    for _ in range(3):  # the pass as a caller sees it: launches, Python and all
        sync()
        t0 = time.perf_counter()
        module.launch(V, F_, H)
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
    refs = reference()
    errs = {label: rel_err(as_torch(V[i]), refs[label]) for label, i in outs.items()}
    err = max(errs.values())
    report.facts.setdefault("zoo", {})[name] = {"ms": ms, "torch_ms": torch_ms, "wall_ms": min(wall)}
    report.add(Row("zoo", name, status(err), err, ms, tflops(flops, ms), torch_ms, tflops(flops, torch_ms),
                   note=f"{module.LAUNCHES} launches/pass, wall {min(wall):.1f} ms; compile {compile_s:.1f} s "
                        f"(cold), first pass {first_s:.2f} s; errors " +
                        ", ".join(f"{k} {v:.1e}" for k, v in errs.items())))


def _hf_case(report: Report, args: argparse.Namespace, name: str, model: torch.nn.Module, binds: dict[str, int],
             inputs: dict[str, np.ndarray], hf_inputs: Callable[[str], dict[str, torch.Tensor]],
             outputs: Callable[[Any], dict[str, torch.Tensor]], flops: float) -> None:
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        graph, weights = _hf_imported(model, Path(tmp), binds)
    model.to(DEV)

    def fp32() -> Any:
        with torch.no_grad():
            return model(**hf_inputs("fp32"))

    def reference() -> dict[str, torch.Tensor]:
        model.double()
        with torch.no_grad():
            return outputs(model(**hf_inputs("fp64")))

    _run_model(report, args, name, graph, weights, inputs, fp32, reference, flops)


def case_bert(report: Report, args: argparse.Namespace) -> None:
    import transformers

    b, t = (8, 512) if not args.dry_run else (2, 8)
    dims = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072) \
        if not args.dry_run else dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    vocab = 30522 if not args.dry_run else 50
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=vocab, max_position_embeddings=512, **dims))
    _perturb(model, 1)
    rng = np.random.default_rng(time.time_ns() % 2**31)
    mask = np.ones((b, t), np.float32)
    mask[1, -t // 4:] = 0  # a padded sequence: the mask reaches attention as a bias
    x = {"tokens": rng.integers(0, vocab, (b, t)).astype(np.int32),
         "token_types": rng.integers(0, 2, (b, t)).astype(np.int32), "attention_mask": mask}

    def hf_inputs(_: str) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.from_numpy(x["tokens"]).long().to(DEV),
                "token_type_ids": torch.from_numpy(x["token_types"]).long().to(DEV),
                "attention_mask": torch.from_numpy(x["attention_mask"]).long().to(DEV)}

    d, L, ff = dims["hidden_size"], dims["num_hidden_layers"], dims["intermediate_size"]
    flops = 2 * b * t * L * (4 * d * d + 2 * d * ff) + 4 * b * t * t * d * L
    _hf_case(report, args, f"BERT-base B{b} T{t}" if not args.dry_run else "BERT (tiny)", model, {"B": b, "T": t},
             x, hf_inputs, lambda o: {"hidden": o.last_hidden_state, "pooled": o.pooler_output}, flops)


def case_llama(report: Report, args: argparse.Namespace) -> None:
    import transformers

    b, t = (4, 1024) if not args.dry_run else (2, 8)
    dims = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
                vocab_size=32000, max_position_embeddings=2048) if not args.dry_run else \
        dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
             max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, rms_norm_eps=1e-5, **dims))
    _perturb(model, 2)
    ids = np.random.default_rng(time.time_ns() % 2**31).integers(0, dims["vocab_size"], (b, t)).astype(np.int32)
    d, ff, v = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    kv = d * dims["num_key_value_heads"] // dims["num_attention_heads"]
    flops = 2 * b * t * (2 * (2 * d * d + 2 * d * kv + 3 * d * ff) + d * v) + 2 * b * t * t * d * 2
    _hf_case(report, args, f"Llama 2-layer (d {d}, GQA 32/4) B{b} T{t}" if not args.dry_run else "Llama (tiny)",
             model, {"B": b, "T": t}, {"tokens": ids},
             lambda _: {"input_ids": torch.from_numpy(ids).long().to(DEV)}, lambda o: {"logits": o.logits}, flops)


def case_resnet(report: Report, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.torch_models import ResNet18
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights

    b, hw = (32, 224) if not args.dry_run else (1, 32)
    graph = load_graph(ROOT / "models" / "resnet18.arch", {"B": b, "H": hw, "W": hw})
    rng = np.random.default_rng(time.time_ns() % 2**31)
    w = init_weights(graph, int(rng.integers(2**31)))
    for k in w:  # inference BatchNorm with statistics and affine terms away from 0 and 1
        if k.endswith("running_mean") or k.endswith(".bias"):
            w[k] = (rng.standard_normal(w[k].shape) * 0.1).astype(np.float32)
        elif k.endswith("running_var") or k.endswith(".gain"):
            w[k] = rng.uniform(0.5, 1.5, w[k].shape).astype(np.float32)
    image = rng.standard_normal((b, 3, hw, hw), dtype=np.float32)
    net = ResNet18(w).eval()
    net.w = {k: v.to(DEV) for k, v in net.w.items()}
    x32 = torch.from_numpy(image).to(DEV)

    def fp32() -> Any:
        with torch.no_grad():
            return net(x32)

    def reference() -> dict[str, torch.Tensor]:
        net.w = {k: v.double() for k, v in net.w.items()}
        with torch.no_grad():
            return {"logits": net(x32.double())}

    flops = 2 * 1.814e9 * b * (hw / 224) ** 2  # ResNet-18: 1.81 GMACs at 224² (torchvision)
    _run_model(report, args, f"ResNet-18 B{b} {hw}²", graph, w, {"image": image}, fp32, reference, flops)


def case_zoo(report: Report, args: argparse.Namespace) -> None:
    for name, fn in (("BERT-base", case_bert), ("Llama 2-layer", case_llama), ("ResNet-18", case_resnet)):
        guarded(report, "zoo", name, lambda fn=fn: fn(report, args))
