"""Cases that stream rows through memory: the card's ceilings, norms (plain and fused with the
residual add), softmax, GELU, the embedding gather, a 3×3 convolution, and the launch cost."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from gpu_suite.device import DEV, SIM, bench, fresh_generator, gbs, randn, shape_text, sync, tflops
from gpu_suite.harness import GraphCase, Report, Row, guarded, status


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


def _norm(report: Report, args: argparse.Namespace, kind: str, rows: int, d: int) -> None:
    case = GraphCase(_norm_ir(kind, rows, d, False, False), report)
    gen = fresh_generator()
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
    err, ms, tms = case.measure({"y": ref}, torch_fn, 10, args.reps)
    nbytes = 2 * rows * d * 4
    copy = report.facts.get("copy_GBs")
    note = f"{nbytes / ms / 1e6 / copy:.0%} of copy" if copy else ""
    report.add(Row("norm", f"{kind} {rows}x{d}", status(err), err, ms, gbs(nbytes, ms), tms, gbs(nbytes, tms),
                   note + f"; path {case.compiled.reduction}"))


def _add_norm(report: Report, args: argparse.Namespace, rows: int, d: int, keep_sum: bool) -> None:
    case = GraphCase(_norm_ir("layernorm", rows, d, True, keep_sum), report)
    gen = fresh_generator()
    x, r = randn(rows, d, gen=gen), randn(rows, d, gen=gen)
    case.set_input("x", x)
    case.set_input("r", r)
    g, b = case.weight("n.gain"), case.weight("n.bias")
    s64 = x.double() + r.double()
    refs = {"y": F.layer_norm(s64, (d,), g.double(), b.double(), 1e-5)}
    if keep_sum:
        refs["s"] = s64
    err, ms, tms = case.measure(refs, lambda: F.layer_norm(x + r, (d,), g, b, 1e-5), 10, args.reps)
    nbytes = (4 if keep_sum else 3) * rows * d * 4
    what = "sum and norm written" if keep_sum else "sum unread: norm only"
    report.add(Row("norm", f"add+layernorm fused {rows}x{d}" + ("" if keep_sum else " (no sum)"), status(err), err,
                   ms, gbs(nbytes, ms), tms, "x + r, F.layer_norm",
                   f"{what}; torch moves {5 * rows * d * 4 / 1e9:.2f} GB"))


def case_norms(report: Report, args: argparse.Namespace) -> None:
    shapes = [(16384, 4096), (65536, 1024)] if not args.dry_run else [(64, 256), (8, 1024)]
    for rows, d in shapes:
        for kind in ("layernorm", "rmsnorm"):
            guarded(report, "norm", f"{kind} {rows}x{d}", lambda k=kind, r=rows, d=d: _norm(report, args, k, r, d))
        guarded(report, "norm", f"add+layernorm {rows}x{d}", lambda r=rows, d=d: _add_norm(report, args, r, d, True))
        guarded(report, "norm", f"add+layernorm {rows}x{d} (no sum)",
                lambda r=rows, d=d: _add_norm(report, args, r, d, False))


def case_softmax(report: Report, args: argparse.Namespace) -> None:
    rows, d = (16384, 4096) if not args.dry_run else (16, 256)
    t = shape_text((rows, d))
    case = GraphCase(f"graph @sm() {{\n  %x = input : {t}\n  %y = softmax %x {{axis=-1}} : {t}\n  output y = %y\n}}\n",
                     report)
    x = randn(rows, d, gen=fresh_generator(), scale=4.0)
    case.set_input("x", x)
    err, ms, tms = case.measure({"y": torch.softmax(x.double(), -1)}, lambda: torch.softmax(x, -1), 10, args.reps)
    nbytes = 2 * rows * d * 4
    report.add(Row("softmax", f"{rows}x{d}", status(err), err, ms, gbs(nbytes, ms), tms, gbs(nbytes, tms)))


def _gelu(report: Report, args: argparse.Namespace) -> None:
    rows, d = (16384, 4096) if not args.dry_run else (16, 64)
    t = shape_text((rows, d))
    case = GraphCase(f"graph @g() {{\n  %x = input : {t}\n  %y = gelu %x {{approx=tanh}} : {t}\n"
                     f"  output y = %y\n}}\n", report)
    x = randn(rows, d, gen=fresh_generator(), scale=3.0)
    case.set_input("x", x)
    err, ms, tms = case.measure({"y": F.gelu(x.double(), approximate="tanh")},
                                lambda: F.gelu(x, approximate="tanh"), 10, args.reps, recheck=False)
    report.add(Row("elementwise", f"gelu(tanh) {rows}x{d}", status(err), err, ms, gbs(2 * rows * d * 4, ms), tms,
                   gbs(2 * rows * d * 4, tms)))


def _embedding(report: Report, args: argparse.Namespace) -> None:
    b, s, vocab, dim = (8, 1024, 50257, 768) if not args.dry_run else (2, 16, 100, 32)
    case = GraphCase(f"graph @e() {{\n  %ids = input : i32[{b},{s}]\n"
                     f"  %y = embedding %ids {{vocab={vocab}, dim={dim}}} : {shape_text((b, s, dim))}"
                     f" scope(\"wte\")\n  output y = %y\n}}\n", report)
    ids = np.random.default_rng(time.time_ns() % 2**32).integers(0, vocab, (b, s))
    case.set_ids("ids", ids)
    table = case.weight("wte.weight")
    tids = torch.from_numpy(ids).to(DEV)
    err, ms, tms = case.measure({"y": F.embedding(tids, table.double())}, lambda: F.embedding(tids, table), 10,
                                args.reps, recheck=False)
    nbytes = 2 * b * s * dim * 4
    report.add(Row("embedding", f"gather {b}x{s} from {vocab}x{dim}", status(err), err, ms, gbs(nbytes, ms), tms,
                   gbs(nbytes, tms), "ids checked on the host before each launch"))


def _conv(report: Report, args: argparse.Namespace) -> None:
    b, c, hw, o = (32, 64, 56, 64) if not args.dry_run else (1, 4, 9, 6)
    x_t, y_t = shape_text((b, c, hw, hw)), shape_text((b, o, hw, hw))
    case = GraphCase(f"graph @c() {{\n  %x = input : {x_t}\n"
                     f"  %y = conv2d %x {{out={o}, kernel=3, padding=1}} : {y_t} scope(\"conv\")\n"
                     f"  output y = %y\n}}\n", report)
    x = randn(b, c, hw, hw, gen=fresh_generator())
    case.set_input("x", x)
    w, bias = case.weight("conv.weight"), case.weight("conv.bias")
    ref = F.conv2d(x.double(), w.double(), bias.double(), padding=1)
    err, ms, tms = case.measure({"y": ref}, lambda: F.conv2d(x, w, bias, padding=1), 3, args.reps, recheck=False)
    flops = 2 * b * o * hw * hw * c * 9
    report.add(Row("conv", f"conv2d 3x3 B{b} {c}->{o} {hw}x{hw}", status(err), err, ms, tflops(flops, ms), tms,
                   tflops(flops, tms), "im2col + GEMM (torch: cuDNN, TF32 off)"))


def case_small_ops(report: Report, args: argparse.Namespace) -> None:
    """GELU (elementwise), the embedding gather, and a ResNet-sized 3×3 convolution."""
    guarded(report, "elementwise", "gelu", lambda: _gelu(report, args))
    guarded(report, "embedding", "gather", lambda: _embedding(report, args))
    guarded(report, "conv", "conv2d", lambda: _conv(report, args))


def _host_time_us(fn, n: int) -> float:
    for _ in range(10):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e6


def case_launch(report: Report, args: argparse.Namespace) -> None:
    """The cost of one launch from Python: a one-element kernel, timed on the host clock."""
    case = GraphCase("graph @tiny() {\n  %x = input : f32[1]\n  %y = relu %x : f32[1]\n  output y = %y\n}\n", report)
    n = 2000 if not args.dry_run else 5
    ours = _host_time_us(case.run, n)
    x = torch.zeros(1, device=DEV)
    theirs = _host_time_us(x.relu_, n)
    report.facts["launch_us"] = ours
    report.add(Row("launch", "one-element kernel from Python", ms=ours / 1e3, rate=f"{ours:.1f} µs/launch",
                   torch_ms=theirs / 1e3, torch_rate=f"{theirs:.1f} µs/op", note="host wall clock, 2000 launches"))
