"""RESULTS-gpu.md: the card and software, a line per target (met or not), every row, compile times
and kernel resources."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpu_suite.device import SIM, cuda
from gpu_suite.harness import Report, Row


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
    if "gpt2_gpu_ms" in report.facts and report.facts.get("gpt2_torch_ms"):
        ratio = report.facts["gpt2_gpu_ms"] / report.facts["gpt2_torch_ms"]
        lines.append(f"- {report.facts.get('gpt2_case', 'GPT-2 small forward')}: GPU time "
                     f"{report.facts['gpt2_gpu_ms']:.1f} ms vs torch eager fp32 {report.facts['gpt2_torch_ms']:.1f} ms"
                     f" = {ratio:.2f}x torch's time (target ≤ 2x): {'met' if ratio <= 2 else 'NOT met'}")
    for name, z in report.facts.get("zoo", {}).items():
        lines.append(f"- {name} forward: {z['ms']:.1f} ms vs torch eager fp32 {z['torch_ms']:.1f} ms = "
                     f"{z['torch_ms'] / z['ms']:.2f}x torch (no target set; GPT-2's ≤ 2x is the bar)")
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
