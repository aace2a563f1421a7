#!/usr/bin/env python3
"""The CUDA backend on a GPU: every kernel checked at full size against torch, and timed
against torch on the same card in the same run. Results go to benchmarks/RESULTS-gpu.md.

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA) and numba-cuda
(irc need not be installed, and lark is not needed: graphs are built from IR text):

    python3 benchmarks/gpu.py                 # everything: about 5 minutes on an H200
    python3 benchmarks/gpu.py --quick         # no variant sweeps, no CPU-backend run
    python3 benchmarks/gpu.py --only norm,attention
    NUMBA_ENABLE_CUDASIM=1 python3 benchmarks/gpu.py --dry-run   # tiny sizes, simulator, CPU torch

Checks: fresh random inputs for every case, outputs poisoned with NaN before every checked
run, ‖out − ref‖/‖ref‖ < 1e-4 against torch in float64 (fp16: 1e-2); the check is repeated
after the timing runs (a result that moves between runs is a race). Timing: CUDA events
around a batch of launches queued behind a spin kernel (so Python's launch overhead is not
counted as kernel time), the median of several batches. Every case fails soft: an error is
a FAIL row with its message and the run goes on. With $OUT set, RESULTS-gpu.md, gpu.json
and gpu.log are copied there as well (the device machine keeps nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4


def _import_irc() -> None:
    """Use this checkout's irc, installed or not: irc.backends lives in backends/ (setuptools
    maps it when installed; here the irc package's search path gets the repository root)."""
    sys.path.insert(0, str(ROOT))
    import irc

    try:
        import irc.backends  # noqa: F401
    except ImportError:
        irc.__path__.append(str(ROOT))


_import_irc()

import numpy as np  # noqa: E402

from irc.backends.cuda.device import cuda_module, is_simulator  # noqa: E402  (the np.row_stack shim first)

cuda = cuda_module()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from irc.backends.cuda import compile_graph  # noqa: E402
from irc.backends.cuda.render.gemm_src import TILES as GEMM_TILES  # noqa: E402
from irc.backends.cuda.render.gemm_src import GemmSpec, gemm_kernel  # noqa: E402
from irc.backends.cuda.render.sdpa_src import TILES as ATTN_TILES  # noqa: E402
from irc.backends.cuda.render.sdpa_src import AttnSpec, sdpa_kernel  # noqa: E402
from irc.backends.cuda.standalone import load_kernels  # noqa: E402
from irc.ir_parser import parse_ir  # noqa: E402
from irc.passes import PASSES  # noqa: E402

SIM = is_simulator(cuda)
DEV = "cpu" if SIM else "cuda"


# -- results ------------------------------------------------------------------------------------------


@dataclass
class Row:
    group: str
    case: str
    status: str = "ok"  # ok, FAIL (wrong or error), skip
    err: float | None = None  # ‖out − ref‖ / ‖ref‖
    ms: float | None = None
    rate: str = ""  # achieved GB/s or TFLOP/s
    torch_ms: float | None = None
    torch_rate: str = ""
    note: str = ""

    @property
    def speedup(self) -> float | None:
        return self.torch_ms / self.ms if self.ms and self.torch_ms else None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)  # kernel -> seconds (cold cache)
    resources: dict[str, str] = field(default_factory=dict)  # kernel -> registers, local memory, shared
    facts: dict[str, Any] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        speed = f"  {row.speedup:.2f}x torch" if row.speedup else ""
        err = f"  err {row.err:.1e}" if row.err is not None else ""
        ms = f"  {row.ms:.4g} ms" if row.ms is not None else ""
        print(f"[{time.perf_counter() - self.start:6.1f}s] {row.status:4s} {row.group}/{row.case}{err}{ms}"
              f"  {row.rate}{speed}  {row.note}", flush=True)
        return row


def log(message: str) -> None:
    print(message, flush=True)


# -- device helpers ------------------------------------------------------------------------------------


def sync() -> None:
    if SIM:
        return
    torch.cuda.synchronize()
    cuda.synchronize()


def bench(fn: Callable[[], Any], batch: int, reps: int) -> float:
    """Milliseconds per call: the median over ``reps`` batches of ``batch`` queued calls."""
    if SIM:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    fn()
    sync()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # keep the GPU busy while Python queues the batch
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / batch)
    return statistics.median(times)


def as_torch(dev_array: Any) -> torch.Tensor:
    """A device array as a torch tensor: the same memory on a GPU, a copy in the simulator."""
    if SIM:
        return torch.from_numpy(dev_array.copy_to_host())
    return torch.as_tensor(dev_array, device="cuda")


def fill(dev_array: Any, value: torch.Tensor) -> None:
    if SIM:
        dev_array.copy_to_device(np.ascontiguousarray(value.cpu().numpy()))
    else:
        as_torch(dev_array).copy_(value)


def poison(dev_array: Any) -> None:
    fill(dev_array, torch.full(tuple(dev_array.shape), float("nan"), dtype=torch.float32, device=DEV))


def kernel_arg(t: torch.Tensor) -> Any:
    """A torch tensor as a numba kernel argument (the simulator writes numpy arrays in place)."""
    return t.numpy() if SIM else cuda.as_cuda_array(t)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.to(DEV, torch.float64), ref.to(DEV, torch.float64)
    if not torch.isfinite(out64).all():
        return float("inf")  # NaN: an element was never written (or a real overflow)
    return float(torch.linalg.norm(out64 - ref64) / torch.linalg.norm(ref64))


def randn(*shape: int, gen: torch.Generator, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32) * scale).to(dtype)


def gbs(nbytes: float, ms: float) -> str:
    return f"{nbytes / ms / 1e6:.0f} GB/s"


def tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.1f} TFLOP/s"


# -- graphs from IR text (no .arch parser needed) ------------------------------------------------------


def graph_of(ir: str):
    return PASSES["shape-infer"](parse_ir(ir))


def shape_text(shape: tuple[int, ...]) -> str:
    return "f32[" + ",".join(str(d) for d in shape) + "]"


class GraphCase:
    """A small graph compiled by the cuda backend, its values reachable as torch tensors."""

    def __init__(self, ir: str, report: Report, weights: dict[str, np.ndarray] | None = None):
        self.graph = graph_of(ir)
        cache = report.facts["cache_dir"]
        start = time.perf_counter()
        self.compiled = compile_graph(self.graph, cache_dir=cache)
        self.compile_s = time.perf_counter() - start
        report.compile_s.update(self.compiled.stats.compile_seconds)
        self.module = self.compiled.module
        shapes = dict(self.module.WEIGHTS)
        rng = np.random.default_rng(int(time.time_ns() % 2**32))
        self.weights = weights or {k: (rng.standard_normal(s) * 0.5 + (1.0 if k.endswith("gain") else 0.0))
                                   .astype(np.float32) for k, s in shapes.items()}
        self.V, self.F = self.compiled.values(self.weights)
        self.H: dict[int, np.ndarray] = {}
        self.inputs = {name: self.V[i] for (name, _, _), i in zip(self.module.INPUTS, self.module.INPUT_VALUES)}
        self.outputs = {label: self.V[i] for label, i in zip(self.module.OUTPUTS, self.module.OUTPUT_VALUES)}
        self.first_launch_s: float | None = None  # seconds; large means a lazy compile (a signature mismatch)
        resources(self.module, report)

    def set_input(self, name: str, value: torch.Tensor) -> None:
        fill(self.inputs[name], value)

    def set_ids(self, name: str, ids: np.ndarray) -> None:
        self.inputs[name].copy_to_device(ids.astype(np.int64))
        index = self.module.INPUT_VALUES[[n for n, _, _ in self.module.INPUTS].index(name)]
        self.H[index] = ids.astype(np.int64)

    def weight(self, key: str) -> torch.Tensor:
        return torch.from_numpy(self.weights[key]).to(DEV)

    def run(self) -> None:
        if self.first_launch_s is None:
            start = time.perf_counter()
            self.module.launch(self.V, self.F, self.H)
            sync()
            self.first_launch_s = time.perf_counter() - start
            if self.first_launch_s > 0.5 and not SIM:
                log(f"  note: first launch took {self.first_launch_s:.1f} s: a kernel compiled lazily "
                    "(its eager signature did not match the call)")
            return
        self.module.launch(self.V, self.F, self.H)

    def checked(self, refs: dict[str, torch.Tensor]) -> float:
        """Poison every output, run once, return the worst relative error."""
        for out in self.outputs.values():
            poison(out)
        self.run()
        sync()
        return max(rel_err(as_torch(self.outputs[k]), ref) for k, ref in refs.items())


def resources(module: Any, report: Report) -> None:
    """Registers, local (spill) memory and shared memory of each compiled kernel (GPU only)."""
    if SIM:
        return
    for name, _ in getattr(module, "SIGNATURES", ()):
        kernel = getattr(module, name, None)
        if kernel is None or name in report.resources or not getattr(kernel, "overloads", None):
            continue
        try:
            regs = kernel.get_regs_per_thread()
            local = kernel.get_local_mem_per_thread()
            shared = kernel.get_shared_mem_per_block()
            one = (lambda d: next(iter(d.values())) if isinstance(d, dict) and d else d)
            report.resources[name] = f"{one(regs)} regs, {one(local)} B local, {one(shared)} B shared"
        except Exception as e:  # an API this numba-cuda lacks: say so once
            report.resources[name] = f"n/a ({type(e).__name__})"


# -- cases ------------------------------------------------------------------------------------------------


def case_ceilings(report: Report, args: argparse.Namespace) -> None:
    """The card's measured ceilings: device-to-device copy, fp32 (no TF32) and bf16 matmul."""
    n = (1 << 28) if not args.dry_run else (1 << 16)  # 1 GiB of float32
    src = torch.randn(n, device=DEV)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), 5, args.reps)
    report.facts["copy_GBs"] = 2 * n * 4 / ms / 1e6
    report.add(Row("ceiling", "device copy 1 GiB", ms=ms, rate=gbs(2 * n * 4, ms), note="bytes read + written"))
    size = 8192 if not args.dry_run else 64
    a, b = torch.randn(size, size, device=DEV), torch.randn(size, size, device=DEV)
    ms = bench(lambda: a @ b, 3, args.reps)
    report.facts["fp32_TFLOPs"] = 2 * size**3 / ms / 1e9
    report.add(Row("ceiling", f"torch matmul fp32 {size}³ (TF32 off)", ms=ms, rate=tflops(2 * size**3, ms)))
    if not SIM:
        a16, b16 = a.bfloat16(), b.bfloat16()
        ms = bench(lambda: a16 @ b16, 3, args.reps)
        report.facts["bf16_TFLOPs"] = 2 * size**3 / ms / 1e9
        report.add(Row("ceiling", f"torch matmul bf16 {size}³ (tensor cores)", ms=ms, rate=tflops(2 * size**3, ms)))


def _norm_ir(kind: str, rows: int, d: int, residual: bool, keep_sum: bool) -> str:
    t = shape_text((rows, d))
    attrs = "eps=1e-05, affine=true, bias=true" if kind == "layernorm" else "eps=1e-06, affine=true"
    lines = [f"graph @{kind}() {{", f"  %x = input : {t}"]
    if residual:
        lines += [f"  %r = input : {t}",
                  f"  %s, %y = add_norm %x, %r {{kind={kind}, {attrs}}} : ({t}, {t}) scope(\"n\")"]
    else:
        lines.append(f"  %y = {kind} %x {{{attrs}}} : {t} scope(\"n\")")
    lines.append("  output y = %y")
    if residual and keep_sum:
        lines.append("  output s = %s")
    return "\n".join(lines + ["}", ""])


def case_norms(report: Report, args: argparse.Namespace) -> None:
    shapes = [(16384, 4096), (65536, 1024)] if not args.dry_run else [(64, 256), (8, 1024)]
    copy = report.facts.get("copy_GBs")
    for rows, d in shapes:
        for kind in ("layernorm", "rmsnorm"):
            def one(kind=kind, rows=rows, d=d) -> None:
                case = GraphCase(_norm_ir(kind, rows, d, False, False), report)
                gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
                x = randn(rows, d, gen=gen, scale=3.0)
                x += randn(rows, 1, gen=gen)  # rows with a mean of their own
                case.set_input("x", x)
                g = case.weight("n.gain")
                if kind == "layernorm":
                    b = case.weight("n.bias")
                    ref = F.layer_norm(x.double(), (d,), g.double(), b.double(), 1e-5)
                    torch_fn = lambda: F.layer_norm(x, (d,), g, b, 1e-5)  # noqa: E731
                else:
                    ref = F.rms_norm(x.double(), (d,), g.double(), 1e-6)
                    torch_fn = lambda: F.rms_norm(x, (d,), g, 1e-6)  # noqa: E731
                err = case.checked({"y": ref})
                ms = bench(case.run, 10, args.reps)
                err = max(err, case.checked({"y": ref}))
                tms = bench(torch_fn, 10, args.reps)
                nbytes = 2 * rows * d * 4
                note = f"{nbytes / ms / 1e6 / copy:.0%} of copy" if copy else ""
                report.add(Row("norm", f"{kind} {rows}x{d}", "ok" if err < TOL else "FAIL", err, ms, gbs(nbytes, ms),
                               tms, gbs(nbytes, tms), note + f"; path {case.compiled.reduction}"))
            guarded(report, "norm", f"{kind} {rows}x{d}", one)

        def fused(rows=rows, d=d, keep_sum=True) -> None:
            case = GraphCase(_norm_ir("layernorm", rows, d, True, keep_sum), report)
            gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
            x, r = randn(rows, d, gen=gen), randn(rows, d, gen=gen)
            case.set_input("x", x)
            case.set_input("r", r)
            g, b = case.weight("n.gain"), case.weight("n.bias")
            s64 = x.double() + r.double()
            refs = {"y": F.layer_norm(s64, (d,), g.double(), b.double(), 1e-5)}
            if keep_sum:
                refs["s"] = s64
            err = case.checked(refs)
            ms = bench(case.run, 10, args.reps)
            err = max(err, case.checked(refs))
            tms = bench(lambda: F.layer_norm(x + r, (d,), g, b, 1e-5), 10, args.reps)
            nbytes = (4 if keep_sum else 3) * rows * d * 4
            what = "sum and norm written" if keep_sum else "sum unread: norm only"
            report.add(Row("norm", f"add+layernorm fused {rows}x{d}" + ("" if keep_sum else " (no sum)"),
                           "ok" if err < TOL else "FAIL", err, ms, gbs(nbytes, ms), tms,
                           "x + r, F.layer_norm", f"{what}; torch moves {5 * rows * d * 4 / 1e9:.2f} GB"))
        guarded(report, "norm", f"add+layernorm {rows}x{d}", fused)
        guarded(report, "norm", f"add+layernorm {rows}x{d} (no sum)", lambda r=rows, d=d: fused(r, d, False))


def case_softmax(report: Report, args: argparse.Namespace) -> None:
    rows, d = (16384, 4096) if not args.dry_run else (16, 256)
    t = shape_text((rows, d))
    case = GraphCase(f"graph @sm() {{\n  %x = input : {t}\n  %y = softmax %x {{axis=-1}} : {t}\n  output y = %y\n}}\n",
                     report)
    gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
    x = randn(rows, d, gen=gen, scale=4.0)
    case.set_input("x", x)
    ref = torch.softmax(x.double(), -1)
    err = case.checked({"y": ref})
    ms = bench(case.run, 10, args.reps)
    err = max(err, case.checked({"y": ref}))
    tms = bench(lambda: torch.softmax(x, -1), 10, args.reps)
    nbytes = 2 * rows * d * 4
    report.add(Row("softmax", f"{rows}x{d}", "ok" if err < TOL else "FAIL", err, ms, gbs(nbytes, ms), tms,
                   gbs(nbytes, tms)))


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
    gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
    q, k, v = randn(b, h, t, d, gen=gen), randn(b, g, t, d, gen=gen), randn(b, g, t, d, gen=gen)
    for key, val in (("q", q), ("k", k), ("v", v)):
        case.set_input(key, val)
    gqa = {"enable_gqa": True} if g != h else {}
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal, **gqa)
    err = case.checked({"o": ref})
    ms = bench(case.run, 3, args.reps)
    err = max(err, case.checked({"o": ref}))
    del ref
    tms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa), 3, args.reps)
    flops = attention_flops(b, h, t, t, d, causal)
    report.add(Row("attention", name, "ok" if err < TOL else "FAIL", err, ms, tflops(flops, ms), tms,
                   tflops(flops, tms), f"tile {_attn_tile_of(case.module)}; fp32 FMA, no tensor cores"))


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


def _attention_fp16(report: Report, args: argparse.Namespace) -> None:
    b, h, t, d = (8, 16, 1024, 64) if not args.dry_run else (1, 2, 40, 16)
    gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
    q, k, v = (randn(b, h, t, d, gen=gen, dtype=torch.float16) for _ in range(3))
    out = torch.full((b, h, t, d), float("nan"), dtype=torch.float16, device=DEV)
    start = time.perf_counter()
    run = _launch_sdpa(AttnSpec(ATTN_TILES["narrow"], d, d, True, False, "shared" if SIM else "shuffle"),
                       q, k, v, out, report)
    run()
    sync()
    report.compile_s["k_sdpa fp16 (lazy, first launch)"] = time.perf_counter() - start
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    err = rel_err(out, ref)
    ms = bench(run, 3, args.reps)
    tms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3, args.reps)
    flops = attention_flops(b, h, t, t, d, True)
    report.add(Row("attention", f"fp16 B{b} H{h} T{t} d{d} causal", "ok" if err < 1e-2 else "FAIL", err, ms,
                   tflops(flops, ms), tms, tflops(flops, tms),
                   "fp16 in/out, fp32 accumulation; torch uses tensor cores"))


def case_attention_sweep(report: Report, args: argparse.Namespace) -> None:
    """Every attention tile, with and without launch bounds, on the two target shapes (causal)."""
    shapes = [(8, 16, 1024, 64), (4, 32, 2048, 128)] if not args.dry_run else [(1, 2, 70, 16)]
    for b, h, t, d in shapes:
        gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
        q, k, v = (randn(b, h, t, d, gen=gen) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        flops = attention_flops(b, h, t, t, d, True)
        for tile in ATTN_TILES:
            for blocks in (0, 2):
                spec = AttnSpec(ATTN_TILES[tile], d, d, True, False, "shared" if SIM else "shuffle", blocks)

                def one(spec=spec) -> None:
                    out = torch.full((b, h, t, d), float("nan"), device=DEV)
                    start = time.perf_counter()
                    run = _launch_sdpa(spec, q, k, v, out, report)
                    run()
                    sync()
                    report.compile_s[spec.name] = time.perf_counter() - start
                    err = rel_err(out, ref)
                    ms = bench(run, 3, args.reps)
                    report.add(Row("attention sweep", f"d{d} {spec.name}", "ok" if err < TOL else "FAIL", err, ms,
                                   tflops(flops, ms)))
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


def case_gemm(report: Report, args: argparse.Namespace) -> None:
    shapes = [(8192, 768, 2304, True, "none", "GPT-2 QKV"), (8192, 768, 3072, True, "gelu_tanh", "GPT-2 FFN up"),
              (8192, 3072, 768, True, "none", "GPT-2 FFN down"), (8192, 768, 50257, False, "none", "GPT-2 logits"),
              (4096, 4096, 4096, False, "none", "square")]
    if args.dry_run:
        shapes = [(70, 48, 40, True, "gelu_tanh", "tiny"), (33, 20, 65, False, "none", "tiny 2")]
    for m, k, n, bias, act, what in shapes:
        def one(m=m, k=k, n=n, bias=bias, act=act, what=what) -> None:
            case = GraphCase(_gemm_ir(m, k, n, bias, act), report)
            gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
            x = randn(m, k, gen=gen)
            case.set_input("x", x)
            w = case.weight("fc.weight")  # N(0, 0.25): the relative error does not care about scale
            b = case.weight("fc.bias") if bias else None
            ref = F.linear(x.double(), w.double(), None if b is None else b.double())
            if act == "gelu_tanh":
                ref = F.gelu(ref, approximate="tanh")
            err = case.checked({"y": ref})
            ms = bench(case.run, 3, args.reps)
            err = max(err, case.checked({"y": ref}))
            del ref

            def torch_fn():
                y = F.linear(x, w, b)
                return F.gelu(y, approximate="tanh") if act == "gelu_tanh" else y
            tms = bench(torch_fn, 3, args.reps)
            flops = 2 * m * n * k
            tile = [n_ for n_ in case.module.__dict__ if n_.startswith("k_gemm")]
            report.add(Row("gemm", f"{what} {m}x{k} @ {k}x{n}" + ("" if act == "none" else f" +{act}"),
                           "ok" if err < TOL else "FAIL", err, ms, tflops(flops, ms), tms, tflops(flops, tms),
                           f"{tile[0] if tile else '?'}; fp32 FMA (torch: TF32 off)"))
        guarded(report, "gemm", what, one)


def case_gemm_sweep(report: Report, args: argparse.Namespace) -> None:
    """Each GEMM tile, with and without launch bounds and prefetching, on GPT-2's FFN shape."""
    m, k, n = (8192, 768, 3072) if not args.dry_run else (70, 24, 40)
    gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
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
                start = time.perf_counter()
                launch(*kargs)
                sync()
                report.compile_s[spec.name] = time.perf_counter() - start
                err = rel_err(out, ref)
                ms = bench(lambda: launch(*kargs), 3, args.reps)
                report.add(Row("gemm sweep", spec.name, "ok" if err < TOL else "FAIL", err, ms,
                               tflops(2 * m * n * k, ms)))
            guarded(report, "gemm sweep", spec.name, one)


def case_small_ops(report: Report, args: argparse.Namespace) -> None:
    """GELU (elementwise), the embedding gather, and a ResNet-sized 3×3 convolution."""
    rows, d = (16384, 4096) if not args.dry_run else (16, 64)
    t = shape_text((rows, d))

    def gelu() -> None:
        case = GraphCase(f"graph @g() {{\n  %x = input : {t}\n  %y = gelu %x {{approx=tanh}} : {t}\n"
                         f"  output y = %y\n}}\n", report)
        gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
        x = randn(rows, d, gen=gen, scale=3.0)
        case.set_input("x", x)
        ref = F.gelu(x.double(), approximate="tanh")
        err = max(case.checked({"y": ref}), 0.0)
        ms = bench(case.run, 10, args.reps)
        tms = bench(lambda: F.gelu(x, approximate="tanh"), 10, args.reps)
        report.add(Row("elementwise", f"gelu(tanh) {rows}x{d}", "ok" if err < TOL else "FAIL", err, ms,
                       gbs(2 * rows * d * 4, ms), tms, gbs(2 * rows * d * 4, tms)))
    guarded(report, "elementwise", "gelu", gelu)

    def embedding() -> None:
        b, s, vocab, dim = (8, 1024, 50257, 768) if not args.dry_run else (2, 16, 100, 32)
        case = GraphCase(f"graph @e() {{\n  %ids = input : i32[{b},{s}]\n"
                         f"  %y = embedding %ids {{vocab={vocab}, dim={dim}}} : {shape_text((b, s, dim))}"
                         f" scope(\"wte\")\n  output y = %y\n}}\n", report)
        ids = np.random.default_rng(time.time_ns() % 2**32).integers(0, vocab, (b, s))
        case.set_ids("ids", ids)
        table = case.weight("wte.weight")
        tids = torch.from_numpy(ids).to(DEV)
        err = case.checked({"y": F.embedding(tids, table.double())})
        ms = bench(case.run, 10, args.reps)
        tms = bench(lambda: F.embedding(tids, table), 10, args.reps)
        nbytes = 2 * b * s * dim * 4
        report.add(Row("embedding", f"gather {b}x{s} from {vocab}x{dim}", "ok" if err < TOL else "FAIL", err, ms,
                       gbs(nbytes, ms), tms, gbs(nbytes, tms), "ids checked on the host before each launch"))
    guarded(report, "embedding", "gather", embedding)

    def conv() -> None:
        b, c, hw, o = (32, 64, 56, 64) if not args.dry_run else (1, 4, 9, 6)
        x_t, y_t = shape_text((b, c, hw, hw)), shape_text((b, o, hw, hw))
        case = GraphCase(f"graph @c() {{\n  %x = input : {x_t}\n"
                         f"  %y = conv2d %x {{out={o}, kernel=3, padding=1}} : {y_t} scope(\"conv\")\n"
                         f"  output y = %y\n}}\n", report)
        gen = torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)
        x = randn(b, c, hw, hw, gen=gen)
        case.set_input("x", x)
        w, bias = case.weight("conv.weight"), case.weight("conv.bias")
        ref = F.conv2d(x.double(), w.double(), bias.double(), padding=1)
        err = case.checked({"y": ref})
        del ref
        ms = bench(case.run, 3, args.reps)
        tms = bench(lambda: F.conv2d(x, w, bias, padding=1), 3, args.reps)
        flops = 2 * b * o * hw * hw * c * 9
        report.add(Row("conv", f"conv2d 3x3 B{b} {c}->{o} {hw}x{hw}", "ok" if err < TOL else "FAIL", err, ms,
                       tflops(flops, ms), tms, tflops(flops, tms), "im2col + GEMM (torch: cuDNN, TF32 off)"))
    guarded(report, "conv", "conv2d", conv)


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
start = time.perf_counter()
out = compiled.run(w, {"tokens": ids})
run_s = time.perf_counter() - start
print(json.dumps({"compile_s": compile_s, "run_s": run_s, "finite": bool(np.isfinite(out["logits"]).all())}))
'''


def case_gpt2(report: Report, args: argparse.Namespace) -> None:
    b, t, layers = (8, 1024, 12) if not args.dry_run else (1, 8, 1)
    d, heads, vocab, ctx = (768, 12, 50257, 1024) if not args.dry_run else (32, 2, 61, 16)
    ir = gpt2_ir(b, t, layers, d, heads, vocab, ctx)
    graph = graph_of(ir)
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
    report.facts["gpt2_case"] = f"GPT-2 small forward B{b} T{t}"
    row = report.add(Row("gpt2", f"GPT-2 small forward B{b} T{t}", "ok" if err < TOL else "FAIL", err,
                         min(wall), tflops(flops, min(wall)),
                         note=f"{launches} launches/pass; GPU time {ms:.1f} ms; compile {compile_s:.1f} s "
                              f"(cold), upload {upload_s:.2f} s, first pass {first_s:.2f} s"))
    if args.quick or args.no_cpu:
        row.note += "; CPU backend not run (--quick/--no-cpu)"
        return
    left = args.budget - (time.perf_counter() - report.start)
    if left < 90:
        row.note += "; CPU backend skipped (time budget)"
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt2.ir"
        path.write_text(ir)
        try:
            done = subprocess.run([sys.executable, "-c", CPU_RUN, str(ROOT), str(path), str(Path(tmp) / "cache"),
                                   str(vocab)],
                                  capture_output=True, text=True, timeout=min(left - 30, 400))
            result = json.loads(done.stdout.strip().splitlines()[-1])
            report.facts["gpt2_cpu_s"] = result["run_s"]
            report.add(Row("gpt2", f"CPU backend, same graph ({os.cpu_count()} cores)", ms=result["run_s"] * 1e3,
                           note=f"GPU {result['run_s'] * 1e3 / min(wall):.1f}x faster; CPU compile "
                                f"{result['compile_s']:.0f} s; outputs finite: {result['finite']}"))
        except Exception as e:  # a timeout or a crash of the CPU run: report, go on
            report.add(Row("gpt2", "CPU backend, same graph", "skip", note=f"{type(e).__name__}: {str(e)[:200]}"))


def case_launch(report: Report, args: argparse.Namespace) -> None:
    """The cost of one launch from Python: a one-element kernel, timed on the host clock."""
    case = GraphCase("graph @tiny() {\n  %x = input : f32[1]\n  %y = relu %x : f32[1]\n  output y = %y\n}\n", report)
    n = 2000 if not args.dry_run else 5
    for _ in range(10):
        case.run()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        case.run()
    sync()
    ours = (time.perf_counter() - start) / n * 1e6
    x = torch.zeros(1, device=DEV)
    for _ in range(10):
        x.relu_()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        x.relu_()
    sync()
    theirs = (time.perf_counter() - start) / n * 1e6
    report.facts["launch_us"] = ours
    report.add(Row("launch", "one-element kernel from Python", ms=ours / 1e3, rate=f"{ours:.1f} µs/launch",
                   torch_ms=theirs / 1e3, torch_rate=f"{theirs:.1f} µs/op", note="host wall clock, 2000 launches"))


def guarded(report: Report, group: str, case: str, fn: Callable[[], None]) -> None:
    """Run one case; an exception is a FAIL row (with its message), never the end of the run."""
    if time.perf_counter() - report.start > report.facts["budget"]:
        report.add(Row(group, case, "skip", note="time budget spent"))
        return
    try:
        fn()
    except Exception as e:
        report.add(Row(group, case, "FAIL", note=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
        traceback.print_exc(limit=6)
    finally:
        if not SIM:
            torch.cuda.empty_cache()


CASES: dict[str, Callable[[Report, argparse.Namespace], None]] = {
    "ceiling": case_ceilings,
    "norm": case_norms,
    "attention": case_attention,
    "gemm": case_gemm,
    "gpt2": case_gpt2,
    "softmax": case_softmax,
    "small": case_small_ops,
    "launch": case_launch,
    "attention-sweep": case_attention_sweep,
    "gemm-sweep": case_gemm_sweep,
}
SWEEPS = ("attention-sweep", "gemm-sweep")


# -- the report -----------------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import numba

    env = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "host": platform.node(), "python": platform.python_version(),
           "numpy": np.__version__, "numba": numba.__version__, "torch": torch.__version__,
           "numba.cuda": getattr(cuda, "implementation", "?")}
    try:
        from importlib.metadata import version

        env["numba-cuda"] = version("numba-cuda")
    except Exception:
        env["numba-cuda"] = "not installed (numba's built-in numba.cuda)"
    if SIM:
        env["card"] = "numba CUDA simulator (dry run: sizes are tiny, times mean nothing)"
        return env
    props = torch.cuda.get_device_properties(0)
    env["card"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, " \
                  f"compute capability {props.major}.{props.minor}"
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                                        "--format=csv,noheader"], capture_output=True, text=True,
                                       timeout=20).stdout.strip()
    except Exception:
        env["driver"] = "?"
    return env


def fmt(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table(rows: list[Row]) -> list[str]:
    out = ["| group | case | check | ms | achieved | torch ms | torch | vs torch | notes |",
           "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        check = r.status if r.err is None else f"{r.status} {r.err:.1e}"
        speed = f"{r.speedup:.2f}x" if r.speedup else ""
        out.append(f"| {r.group} | {r.case} | {check} | {fmt(r.ms)} | {r.rate} | {fmt(r.torch_ms)} | {r.torch_rate} "
                   f"| {speed} | {r.note} |")
    return out


def targets(report: Report) -> list[str]:
    """The issue's targets, each with the measured figure and met / not met."""
    rows = {(r.group, r.case): r for r in report.rows}
    copy = report.facts.get("copy_GBs")
    lines = []

    def rate_of(row: Row) -> float:
        return float(row.rate.split()[0]) if row.rate else 0.0

    for key, r in rows.items():
        if key[0] == "norm" and "fused" not in key[1] and r.ms and copy:
            share = rate_of(r) / copy
            lines.append(f"- {key[1]}: {rate_of(r):.0f} GB/s = {share:.0%} of copy (target ≥ 85 %): "
                         f"{'met' if share >= 0.85 and r.status == 'ok' else 'NOT met'}")
        if key[0] == "norm" and "fused" in key[1] and r.speedup:
            lines.append(f"- {key[1]}: {r.speedup:.2f}x torch's x + r then F.layer_norm (target ≥ 1.5x): "
                         f"{'met' if r.speedup >= 1.5 and r.status == 'ok' else 'NOT met'}")
        if key[0] == "attention" and r.speedup and "fp16" not in key[1] and " G" not in key[1]:
            bar = "goal met (≥ 1.0x)" if r.speedup >= 1.0 else "first bar met (≥ 0.5x)" if r.speedup >= 0.5 \
                else "NOT met (< 0.5x)"
            lines.append(f"- attention {key[1]}: {r.rate} = {r.speedup:.2f}x torch SDPA fp32: {bar}")
    if "gpt2_ms" in report.facts and "gpt2_cpu_s" in report.facts:
        ratio = report.facts["gpt2_cpu_s"] * 1e3 / report.facts["gpt2_ms"]
        lines.append(f"- {report.facts.get('gpt2_case', 'GPT-2 small forward')}: GPU {report.facts['gpt2_ms']:.1f} ms"
                     " vs CPU backend "
                     f"{report.facts['gpt2_cpu_s']:.1f} s = {ratio:.0f}x (target ≥ 20x): "
                     f"{'met' if ratio >= 20 else 'NOT met'}")
    return lines or ["- (no target case ran)"]


def write_report(report: Report, path: Path) -> str:
    e = report.env
    lines = ["# CUDA backend on a GPU", "",
             f"Card: {e.get('card')}; driver {e.get('driver', '?')}. Date: {e.get('date')}.",
             f"Software: Python {e.get('python')}, numpy {e.get('numpy')}, numba {e.get('numba')}, "
             f"numba-cuda {e.get('numba-cuda')}, torch {e.get('torch')}.",
             "Written by `python3 benchmarks/gpu.py` (method in its docstring and in docs/cuda.md). "
             "Check: ‖out − ref‖/‖ref‖ against torch in float64 on fresh random inputs, outputs poisoned first; "
             "times are medians of CUDA-event batches; 'vs torch' is torch's time over ours (> 1: faster).", "",
             "## Targets", ""] + targets(report) + ["", "## Results", ""] + table(report.rows)
    lines += ["", "## Compile times (cold cache, per kernel)", "", "| kernel | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in sorted(report.compile_s.items(), key=lambda kv: -kv[1])]
    if report.resources:
        lines += ["", "## Kernel resources (numba-cuda's report)", "", "| kernel | registers, spills, shared |",
                  "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(report.resources.items())]
    lines += ["", f"Run took {time.perf_counter() - report.start:.0f} s.", ""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated groups: {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help="no sweeps, no CPU-backend run, fewer repeats")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU-backend GPT-2 run")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes: a smoke test (with the simulator)")
    parser.add_argument("--reps", type=int, default=7, help="timed batches per case (median)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; later cases are skipped past it")
    parser.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "RESULTS-gpu.md"))
    args = parser.parse_args()
    if args.quick:
        args.reps = min(args.reps, 5)
    if SIM and not args.dry_run:
        print("gpu.py: numba's simulator is on (NUMBA_ENABLE_CUDASIM=1): use --dry-run for a smoke test",
              file=sys.stderr)
        return 2
    if not SIM and not torch.cuda.is_available():
        print("gpu.py: no CUDA GPU visible to torch; nothing to measure", file=sys.stderr)
        return 1
    if not SIM:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the comparison is FMA against FMA
        torch.backends.cudnn.allow_tf32 = False
    report = Report()
    report.env = environment()
    report.facts["budget"] = args.budget
    cache = tempfile.mkdtemp(prefix="irc-gpu-cache-")  # cold: compile times are first compiles
    os.chmod(cache, 0o700)
    report.facts["cache_dir"] = cache
    log(f"gpu.py: {report.env['card']}; cache {cache}")
    chosen = [c.strip() for c in args.only.split(",")] if args.only else list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        print(f"gpu.py: unknown group(s) {', '.join(unknown)} (known: {', '.join(CASES)})", file=sys.stderr)
        return 2
    for name in chosen:
        if args.quick and name in SWEEPS and not args.only:
            continue
        guarded(report, name, "(case setup)", lambda name=name: CASES[name](report, args))
    text = write_report(report, Path(args.output))
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "RESULTS-gpu.md").write_text(text)
        Path(out_dir, "gpu.json").write_text(json.dumps({"env": report.env, "facts": report.facts,
                                                          "rows": [asdict(r) for r in report.rows],
                                                          "compile_s": report.compile_s,
                                                          "resources": report.resources}, indent=1, default=str))
    print("\n" + "\n".join(["## Targets"] + targets(report) + [""] + table(report.rows)))
    failed = [r for r in report.rows if r.status == "FAIL"]
    print(f"\n{len(report.rows)} rows, {len(failed)} FAIL; report written to {args.output}"
          + (" and $OUT" if out_dir else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
