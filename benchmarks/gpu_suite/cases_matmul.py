"""Cases that multiply: attention (fp32 and fp16 inputs, every tile in the sweep) and GEMM (GPT-2's
shapes, every tile in the sweep)."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gpu_suite.device import DEV, SIM, bench, fresh_generator, kernel_arg, randn, rel_err, shape_text, sync, tflops
from gpu_suite.harness import GraphCase, Report, Row, guarded, status

from irc.backends.cuda.render.gemm_src import TILES as GEMM_TILES
from irc.backends.cuda.render.gemm_src import GemmSpec, gemm_kernel
from irc.backends.cuda.render.sdpa_src import TILES as ATTN_TILES
from irc.backends.cuda.render.sdpa_src import AttnSpec, pick_tile, sdpa_kernel
from irc.backends.cuda.standalone import load_kernels


def attention_flops(b: int, h: int, t: int, s: int, d: int, causal: bool) -> float:
    """q·kᵀ and p·v: 4·B·H·T·S·d, half of it under a causal mask (the usual convention)."""
    return 4 * b * h * t * s * d * (0.5 if causal else 1.0)


def case_attention(report: Report, args: argparse.Namespace) -> None:
    shapes = [(8, 16, 16, 1024, 64), (4, 32, 32, 2048, 128)] if not args.dry_run else [(1, 2, 2, 70, 16),
                                                                                        (1, 2, 2, 40, 32)]
    shapes.append((8, 16, 4, 1024, 64) if not args.dry_run else (1, 4, 2, 40, 16))  # GQA
    for b, h, g, t, d in shapes:
        for causal in (True, False):
            if g != h and not causal:
                continue
            name = f"B{b} H{h}" + (f" G{g}" if g != h else "") + f" T{t} d{d}" + (" causal" if causal else "")
            guarded(report, "attention", name, lambda b=b, h=h, g=g, t=t, d=d, c=causal, n=name:
                    _attention_one(report, args, n, b, h, g, t, d, c))
    guarded(report, "attention", "fp16 inputs", lambda: _attention_fp16(report, args))


def _sdpa_ir(b: int, h: int, g: int, t: int, d: int, causal: bool) -> str:
    q, kv = shape_text((b, h, t, d)), shape_text((b, g, t, d))
    attrs = f"scale={d ** -0.5!r}, causal={str(causal).lower()}"
    return (f"graph @attn() {{\n  %q = input : {q}\n  %k = input : {kv}\n  %v = input : {kv}\n"
            f"  %o = sdpa %q, %k, %v {{{attrs}}} : {q}\n  output o = %o\n}}\n")


def _attention_one(report: Report, args: argparse.Namespace, name: str, b: int, h: int, g: int, t: int, d: int,
                   causal: bool) -> None:
    case = GraphCase(_sdpa_ir(b, h, g, t, d, causal), report)
    gen = fresh_generator()
    q, k, v = randn(b, h, t, d, gen=gen), randn(b, g, t, d, gen=gen), randn(b, g, t, d, gen=gen)
    for key, val in (("q", q), ("k", k), ("v", v)):
        case.set_input(key, val)
    gqa = {"enable_gqa": True} if g != h else {}
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal, **gqa)
    err, ms, tms = case.measure({"o": ref}, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa),
                                3, args.reps)
    flops = attention_flops(b, h, t, t, d, causal)
    report.add(Row("attention", name, status(err), err, ms, tflops(flops, ms), tms, tflops(flops, tms),
                   f"tile {_attn_tile_of(case.module)}; fp32 FMA, no tensor cores"))


def _attn_tile_of(module: Any) -> str:
    names = [n for n in getattr(module, "REDUCING", ()) if n.startswith("k_sdpa")]
    return names[0].split("_")[3] if names else "?"


def _launch_sdpa(spec: AttnSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 report: Report) -> Callable[[], None]:
    kernel = getattr(load_kernels([sdpa_kernel(spec)], report.facts["cache_dir"]), spec.name)
    b, h, t, d = q.shape
    grid, block = (-(-t // spec.tile.bm), b * h), (spec.tile.threads,)
    args = [kernel_arg(x) for x in (q, k, v, q, out)] + [np.float32(d ** -0.5), h, k.shape[1]]
    launch = kernel[grid, block]
    return lambda: launch(*args)


def _first_run(report: Report, name: str, run: Callable[[], None]) -> None:
    """Run a standalone kernel once, its cold compile counted under ``name``."""
    start = time.perf_counter()
    run()
    sync()
    report.compile_s[name] = time.perf_counter() - start


def _attention_fp16(report: Report, args: argparse.Namespace) -> None:
    b, h, t, d = (8, 16, 1024, 64) if not args.dry_run else (1, 2, 40, 16)
    gen = fresh_generator()
    q, k, v = (randn(b, h, t, d, gen=gen, dtype=torch.float16) for _ in range(3))
    out = torch.full((b, h, t, d), float("nan"), dtype=torch.float16, device=DEV)
    run = _launch_sdpa(AttnSpec(pick_tile(d), d, d, True, False, "shared" if SIM else "shuffle"),
                       q, k, v, out, report)
    _first_run(report, "k_sdpa fp16 (lazy, first launch)", run)
    err = rel_err(out, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True))
    ms = bench(run, 3, args.reps)
    tms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3, args.reps)
    flops = attention_flops(b, h, t, t, d, True)
    report.add(Row("attention", f"fp16 B{b} H{h} T{t} d{d} causal", status(err, 1e-2), err, ms,
                   tflops(flops, ms), tms, tflops(flops, tms),
                   "fp16 in/out, fp32 accumulation; torch uses tensor cores"))


def case_attention_sweep(report: Report, args: argparse.Namespace) -> None:
    """Every attention tile, with and without launch bounds, on the two target shapes (causal)."""
    shapes = [(8, 16, 1024, 64), (4, 32, 2048, 128)] if not args.dry_run else [(1, 2, 70, 16)]
    for b, h, t, d in shapes:
        gen = fresh_generator()
        q, k, v = (randn(b, h, t, d, gen=gen) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        flops = attention_flops(b, h, t, t, d, True)
        for tile in ATTN_TILES:
            for blocks in (0, 2):
                spec = AttnSpec(ATTN_TILES[tile], d, d, True, False, "shared" if SIM else "shuffle", blocks)

                def one(spec=spec) -> None:
                    out = torch.full((b, h, t, d), float("nan"), device=DEV)
                    run = _launch_sdpa(spec, q, k, v, out, report)
                    _first_run(report, spec.name, run)
                    err = rel_err(out, ref)
                    ms = bench(run, 3, args.reps)
                    report.add(Row("attention sweep", f"d{d} {spec.name}", status(err), err, ms, tflops(flops, ms)))
                guarded(report, "attention sweep", f"d{d} {spec.name}", one)


def _gemm_ir(m: int, k: int, n: int, bias: bool, act: str) -> str:
    lines = ["graph @gemm() {", f"  %x = input : {shape_text((m, k))}",
             f"  %w = param {{name=weight, shape=[{n}, {k}]}} : {shape_text((n, k))} scope(\"fc\")"]
    operands = "%x, %w"
    if bias:
        lines.append(f"  %b = param {{name=bias, shape=[{n}]}} : {shape_text((n,))} scope(\"fc\")")
        operands += ", %b"
    lines += [f"  %y = gemm {operands} {{act={act}}} : {shape_text((m, n))}", "  output y = %y", "}", ""]
    return "\n".join(lines)


def _gemm(report: Report, args: argparse.Namespace, m: int, k: int, n: int, bias: bool, act: str, what: str) -> None:
    case = GraphCase(_gemm_ir(m, k, n, bias, act), report)
    x = randn(m, k, gen=fresh_generator())
    case.set_input("x", x)
    w = case.weight("fc.weight")  # N(0, 0.25): the relative error does not care about scale
    b = case.weight("fc.bias") if bias else None

    def apply(y: torch.Tensor) -> torch.Tensor:
        return F.gelu(y, approximate="tanh") if act == "gelu_tanh" else y
    ref = apply(F.linear(x.double(), w.double(), None if b is None else b.double()))
    err, ms, tms = case.measure({"y": ref}, lambda: apply(F.linear(x, w, b)), 3, args.reps)
    flops = 2 * m * n * k
    tile = [n_ for n_ in case.module.__dict__ if n_.startswith("k_gemm")]
    name = f"{what} {m}x{k} @ {k}x{n}" + ("" if act == "none" else f" +{act}")
    report.add(Row("gemm", name, status(err), err, ms, tflops(flops, ms), tms, tflops(flops, tms),
                   f"{tile[0] if tile else '?'}; fp32 FMA (torch: TF32 off)"))


def case_gemm(report: Report, args: argparse.Namespace) -> None:
    shapes = [(8192, 768, 2304, True, "none", "GPT-2 QKV"), (8192, 768, 3072, True, "gelu_tanh", "GPT-2 FFN up"),
              (8192, 3072, 768, True, "none", "GPT-2 FFN down"), (8192, 768, 50257, False, "none", "GPT-2 logits"),
              (4096, 4096, 4096, False, "none", "square")]
    if args.dry_run:
        shapes = [(70, 48, 40, True, "gelu_tanh", "tiny"), (33, 20, 65, False, "none", "tiny 2")]
    for m, k, n, bias, act, what in shapes:
        guarded(report, "gemm", what,
                lambda m=m, k=k, n=n, b=bias, a=act, w=what: _gemm(report, args, m, k, n, b, a, w))


def case_gemm_sweep(report: Report, args: argparse.Namespace) -> None:
    """Each GEMM tile, with and without launch bounds and prefetching, on GPT-2's FFN shape."""
    m, k, n = (8192, 768, 3072) if not args.dry_run else (70, 24, 40)
    gen = fresh_generator()
    a = randn(1, m, k, gen=gen)
    b = randn(1, n, k, gen=gen) / math.sqrt(k)
    bias = randn(n, gen=gen)
    ref = (a.double() @ b.double().transpose(1, 2) + bias.double())
    for tile in ("large", "medium"):
        for blocks, prefetch in ((0, False), (2, False), (0, True), (2, True)):
            spec = GemmSpec(GEMM_TILES[tile], "nt", "col", min_blocks=blocks, prefetch=prefetch)

            def one(spec=spec) -> None:
                kernel = getattr(load_kernels([gemm_kernel(spec)], report.facts["cache_dir"]), spec.name)
                out = torch.full((1, m, n), float("nan"), device=DEV)
                t = spec.tile
                launch = kernel[(-(-n // t.bn), -(-m // t.bm), 1), (t.threads,)]
                kargs = [kernel_arg(x) for x in (a, b, bias, out)] + [m, n, k, 1, 1, 1, 1, 1]
                _first_run(report, spec.name, lambda: launch(*kargs))
                err = rel_err(out, ref)
                ms = bench(lambda: launch(*kargs), 3, args.reps)
                report.add(Row("gemm sweep", spec.name, status(err), err, ms, tflops(2 * m * n * k, ms)))
            guarded(report, "gemm sweep", spec.name, one)
