"""Rows and the report they go into, a compiled graph whose values are torch tensors, and the one
measurement every kernel case repeats: check, time, check again, time torch."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gpu_suite.device import DEV, SIM, TOL, as_torch, bench, fill, graph_of, poison, rel_err, sync

from irc.backends.cuda import compile_graph


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


def status(err: float, tol: float = TOL) -> str:
    return "ok" if err < tol else "FAIL"


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

    def measure(self, refs: dict[str, torch.Tensor], torch_fn: Callable[[], Any] | None, batch: int,
                reps: int, recheck: bool = True) -> tuple[float, float, float | None]:
        """(worst error, ms, torch ms): checked, timed, checked again after the timing runs (a result
        that moves between runs is a race), then torch's version timed the same way."""
        err = self.checked(refs)
        ms = bench(self.run, batch, reps)
        if recheck:
            err = max(err, self.checked(refs))
        return err, ms, (bench(torch_fn, batch, reps) if torch_fn is not None else None)


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
