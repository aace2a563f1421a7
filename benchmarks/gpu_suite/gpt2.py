"""GPT-2 small's whole forward pass on the card: the graph from IR text, GPT-2's initialisation,
torch's forward written out as the oracle, and the same graph on irc's CPU backend for the ratio."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gpu_suite.cases_matmul import attention_flops
from gpu_suite.device import DEV, ROOT, as_torch, bench, graph_of, poison, rel_err, shape_text, sync, tflops
from gpu_suite.harness import Report, Row, resources, status

from irc.backends.cuda import compile_graph


def gpt2_ir(b: int, t: int, layers: int, d: int = 768, heads: int = 12, vocab: int = 50257, ctx: int = 1024) -> str:
    x = shape_text((b, t, d))
    lines = ["graph @gpt2_small() {", f"  %tokens = input : i32[{b},{t}]",
             f"  %emb = embedding %tokens {{vocab={vocab}, dim={d}}} : {x} scope(\"wte\")",
             f"  %h0 = positional %emb {{kind=learned, max_len={ctx}}} : {x} scope(\"wpe\")"]
    for i in range(layers):
        p = f"h.{i}"
        lines += [
            f"  %{p}.ln1 = layernorm %h{i} {{eps=1e-05, affine=true, bias=true}} : {x} scope(\"{p}.ln1\")",
            f"  %{p}.attn = attention %{p}.ln1 {{heads={heads}, causal=true, bias=true, rope=false}} : {x}"
            f" scope(\"{p}.attn\")",
            f"  %{p}.mid = add %h{i}, %{p}.attn : {x}",
            f"  %{p}.ln2 = layernorm %{p}.mid {{eps=1e-05, affine=true, bias=true}} : {x} scope(\"{p}.ln2\")",
            f"  %{p}.mlp = ffn %{p}.ln2 {{hidden={4 * d}, act=gelu_tanh, bias=true}} : {x} scope(\"{p}.mlp\")",
            f"  %h{i + 1} = add %{p}.mid, %{p}.mlp : {x}",
        ]
    lines += [f"  %ln_f = layernorm %h{layers} {{eps=1e-05, affine=true, bias=true}} : {x} scope(\"ln_f\")",
              f"  %logits = unembed %ln_f {{vocab={vocab}, tied=wte, tied_dim={d}, bias=false}}"
              f" : {shape_text((b, t, vocab))} scope(\"logits\")",
              "  output logits = %logits", "}", ""]
    return "\n".join(lines)


def gpt2_weights(graph, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation scale: N(0, 0.02) matrices, zero biases, unit gains."""
    from irc.runtime.weights import expected_weights

    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in expected_weights(graph).items():
        if key.endswith("gain"):
            out[key] = np.ones(shape, np.float32)
        elif len(shape) == 1:
            out[key] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        else:
            out[key] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    return out


def gpt2_torch(w: dict[str, torch.Tensor], tokens: torch.Tensor, layers: int, heads: int) -> torch.Tensor:
    """GPT-2 small's forward pass written out in torch (float64 here): the oracle."""
    b, t = tokens.shape
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    d = x.shape[-1]
    for i in range(layers):
        p = f"h.{i}"
        h = F.layer_norm(x, (d,), w[f"{p}.ln1.gain"], w[f"{p}.ln1.bias"], 1e-5)

        def heads_of(y):
            return y.view(b, t, heads, d // heads).transpose(1, 2)
        q = heads_of(F.linear(h, w[f"{p}.attn.wq"], w[f"{p}.attn.bq"]))
        k = heads_of(F.linear(h, w[f"{p}.attn.wk"], w[f"{p}.attn.bk"]))
        v = heads_of(F.linear(h, w[f"{p}.attn.wv"], w[f"{p}.attn.bv"]))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + F.linear(a, w[f"{p}.attn.wo"], w[f"{p}.attn.bo"])
        h = F.layer_norm(x, (d,), w[f"{p}.ln2.gain"], w[f"{p}.ln2.bias"], 1e-5)
        h = F.gelu(F.linear(h, w[f"{p}.mlp.w1"], w[f"{p}.mlp.b1"]), approximate="tanh")
        x = x + F.linear(h, w[f"{p}.mlp.w2"], w[f"{p}.mlp.b2"])
    x = F.layer_norm(x, (d,), w["ln_f.gain"], w["ln_f.bias"], 1e-5)
    return x @ w["wte.weight"].T


CPU_RUN = r'''
import sys, time, json
sys.path.insert(0, sys.argv[1])
import irc
try:
    import irc.backends
except ImportError:
    irc.__path__.append(sys.argv[1])
import numpy as np
from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.backends.cpu import compile_graph
from irc.runtime.weights import expected_weights
graph = PASSES["shape-infer"](parse_ir(open(sys.argv[2]).read()))
start = time.perf_counter()
compiled = compile_graph(graph, cache_dir=sys.argv[3])
compile_s = time.perf_counter() - start
rng = np.random.default_rng(0)
w = {k: (rng.standard_normal(s, dtype=np.float32) * 0.02) for k, s in expected_weights(graph).items()}
ids = rng.integers(0, int(sys.argv[4]), [int(d) for d in graph.nodes[0].type.shape])
runs = []
for _ in range(2):  # the second run is the steady state
    start = time.perf_counter()
    out = compiled.run(w, {"tokens": ids})
    runs.append(time.perf_counter() - start)
run_s = min(runs)
print(json.dumps({"compile_s": compile_s, "run_s": run_s, "finite": bool(np.isfinite(out["logits"]).all())}))
'''


def case_gpt2(report: Report, args: argparse.Namespace) -> None:
    b, t, layers = (8, 1024, 12) if not args.dry_run else (1, 8, 1)
    d, heads, vocab, ctx = (768, 12, 50257, 1024) if not args.dry_run else (32, 2, 61, 16)
    ir = gpt2_ir(b, t, layers, d, heads, vocab, ctx)
    graph = graph_of(ir)
    cpu = None if args.quick or args.no_cpu else _start_cpu_run(ir, vocab)
    start = time.perf_counter()
    compiled = compile_graph(graph, cache_dir=report.facts["cache_dir"])
    compile_s = time.perf_counter() - start
    report.compile_s.update(compiled.stats.compile_seconds)
    resources(compiled.module, report)
    seed = time.time_ns() % 2**31
    w = gpt2_weights(graph, seed)
    start = time.perf_counter()
    V, F_ = compiled.values(w)
    sync()
    upload_s = time.perf_counter() - start
    ids = np.random.default_rng(seed).integers(0, vocab, (b, t))
    H = compiled.module.load(V, {"tokens": ids})
    out = compiled.module.OUTPUT_VALUES[0]
    poison(V[out])
    start = time.perf_counter()
    compiled.module.launch(V, F_, H)
    sync()
    first_s = time.perf_counter() - start  # seconds here mean a kernel compiled lazily
    tw = {k: torch.from_numpy(v).to(DEV, torch.float64) for k, v in w.items()}
    with torch.no_grad():
        ref = gpt2_torch(tw, torch.from_numpy(ids).to(DEV), layers, heads)
    err = rel_err(as_torch(V[out]), ref)
    del ref, tw
    ms = bench(lambda: compiled.module.launch(V, F_, H), 1, max(3, args.reps // 2))
    tw32 = {k: torch.from_numpy(v).to(DEV) for k, v in w.items()}
    tokens = torch.from_numpy(ids).to(DEV)

    def torch_fp32() -> None:
        with torch.no_grad():
            gpt2_torch(tw32, tokens, layers, heads)
    torch_ms = bench(torch_fp32, 1, max(3, args.reps // 2))
    wall = []
    for _ in range(3):  # the forward pass as a caller sees it: launches, Python and all
        sync()
        start = time.perf_counter()
        compiled.module.launch(V, F_, H)
        sync()
        wall.append((time.perf_counter() - start) * 1e3)
    launches = compiled.module.LAUNCHES
    flops = 2 * b * t * (12 * layers * d * d + d * vocab) + attention_flops(b, heads, t, t, d // heads, True) * layers
    report.facts["gpt2_ms"] = min(wall)
    report.facts["gpt2_gpu_ms"] = ms
    report.facts["gpt2_torch_ms"] = torch_ms
    report.facts["gpt2_case"] = f"GPT-2 small forward B{b} T{t}"
    row = report.add(Row("gpt2", f"GPT-2 small forward B{b} T{t}", status(err), err,
                         min(wall), tflops(flops, min(wall)), torch_ms, tflops(flops, torch_ms),
                         note=f"{launches} launches/pass; GPU time {ms:.1f} ms; compile {compile_s:.1f} s "
                              f"(cold), upload {upload_s:.2f} s, first pass {first_s:.2f} s; torch: the same "
                              "forward written out in torch, fp32, TF32 off"))
    if cpu is None:
        row.note += "; CPU backend not run (--quick/--no-cpu)"
        return
    process, tmp = cpu
    try:
        left = args.budget - (time.perf_counter() - report.start)
        stdout, _ = process.communicate(timeout=max(10.0, min(left, 400)))
        result = json.loads(stdout.strip().splitlines()[-1])
        report.facts["gpt2_cpu_s"] = result["run_s"]
        report.add(Row("gpt2", f"CPU backend, same graph ({CPU_THREADS} threads of {os.cpu_count()} cores)",
                       ms=result["run_s"] * 1e3,
                       note=f"GPU {result['run_s'] * 1e3 / min(wall):.1f}x faster; CPU compile "
                            f"{result['compile_s']:.0f} s; outputs finite: {result['finite']}; run beside the "
                            "GPU cases"))
    except Exception as e:  # a timeout or a crash of the CPU run: report, go on
        process.kill()
        report.add(Row("gpt2", "CPU backend, same graph", "skip", note=f"{type(e).__name__}: {str(e)[:200]}"))
    finally:
        tmp.cleanup()


CPU_THREADS = 8  # the rest of the cores stay with the GPU cases' compiles and launches


def _start_cpu_run(ir: str, vocab: int) -> tuple[subprocess.Popen, tempfile.TemporaryDirectory]:
    """The CPU backend on the same graph, in its own process, started before the GPU work so
    that its compile and run overlap the GPU cases instead of adding to the device time."""
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "gpt2.ir"
    path.write_text(ir)
    env = {**os.environ, "NUMBA_NUM_THREADS": str(CPU_THREADS)}
    process = subprocess.Popen([sys.executable, "-c", CPU_RUN, str(ROOT), str(path), str(Path(tmp.name) / "cache"),
                                str(vocab)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    return process, tmp
