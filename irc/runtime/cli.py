"""``irc run``: bind, size-check, initialise or load weights, run a backend, report, check.

stdout carries the results (output shapes and statistics, the check, the profile);
stderr carries notes and progress. Exit 1 when ``--check`` finds the backend off.

The cpu backend runs the fused graph: the ``fuse`` pass runs before code generation unless
``--no-fuse`` is given, and ``--passes a,b`` runs exactly those passes instead (the cuda
backend fuses in its own emitter). ``--check`` compares with the NumPy reference on the graph as written, so the
passes are checked along with the kernels.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError
from irc.graph import Graph
from irc.output_files import write_atomically
from irc.runtime.compare import nonfinite, rel_error
from irc.runtime.memory import available_bytes, estimate_bytes, fmt_bytes, parse_size

DEFAULT_TOLERANCE = 1e-4  # fp32 backend against the float64 reference, normwise
FUSING_BACKENDS = ("cpu",)  # backends that get the fused graph by default
TOP_NODES = 8  # the profile's list of the slowest single nodes
PROGRESS_AFTER_S = 0.5  # a compile that takes longer than this gets a progress line
PROGRESS_EVERY_S = 1.0  # and then at most one line this often


def note(message: str) -> None:
    print(f"irc: note: {message}", file=sys.stderr)


def load_bound_graph(args: argparse.Namespace) -> Graph:
    """Load with -D bindings; an unbound B defaults to 1 (said so), any other free symbol is an error."""
    from irc.pipeline import load_graph, parse_defines

    bindings = parse_defines(args.defines)
    graph = load_graph(args.file, bindings, getattr(args, "model", None))
    free = [s for s in graph.symbols if s not in graph.bindings]
    others = [s for s in free if s != "B"]
    if others:
        example = " ".join(f"-D {s}=64" for s in others)
        raise IrcError(f"model '{graph.name}' has unbound size(s) {', '.join(others)}; running needs concrete "
                       f"sizes: bind {'them' if len(others) > 1 else 'it'} with -D (for example: {example})",
                       notes=["an unbound B defaults to 1"] if "B" in free else None)
    if free:
        note("B is not bound; running with B=1 (bind it with -D B=N)")
        return load_graph(args.file, {**bindings, "B": 1}, getattr(args, "model", None))
    return graph


def guard_memory(graph: Graph, check: bool, max_memory: str | None) -> None:
    """Refuse before allocating when weights + activations would not fit."""
    w32, a32 = estimate_bytes(graph, 4)
    need = w32 + a32
    parts = f"weights {fmt_bytes(w32)} + activations {fmt_bytes(a32)}"
    if check:
        w64, a64 = estimate_bytes(graph, 8)
        need += w64 + a64
        parts += f" + float64 reference {fmt_bytes(w64 + a64)}"
    if max_memory is not None:
        try:
            limit = parse_size(max_memory)
        except ValueError as e:
            raise UsageError(f"--max-memory: {e}") from None
        where = "the --max-memory limit"
    else:
        limit = available_bytes()
        where = "the memory available"
    if limit is not None and need > limit:
        raise IrcError(f"running '{graph.name}' needs about {fmt_bytes(need)} ({parts}), more than {where} "
                       f"({fmt_bytes(limit)}); bind smaller sizes with -D, or pass --max-memory SIZE to override")


def _weights(graph: Graph, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], str]:
    from irc.runtime.init import init_weights
    from irc.runtime.weights import load_checked

    if args.weights:
        return load_checked(args.weights, graph), f"'{args.weights}'"
    return init_weights(graph, args.seed), f"random (seed {args.seed})"


class CompileProgress:
    """Progress lines on stderr, only once a compile has run longer than PROGRESS_AFTER_S.

    A timer prints the first line even for backends that report nothing; a backend that
    calls ``progress(done, total, what)`` gets at most one further line per PROGRESS_EVERY_S.
    """

    def __init__(self, graph: Graph, backend: str):
        self.graph, self.backend = graph, backend
        self.start = time.perf_counter()
        self.shown = False
        self.last = 0.0
        self.lock = threading.Lock()
        self.timer = threading.Timer(PROGRESS_AFTER_S, self._first)
        self.timer.daemon = True

    def _say(self, text: str) -> None:
        print(f"irc: {text}", file=sys.stderr, flush=True)
        self.shown = True
        self.last = time.perf_counter()

    def _first(self) -> None:
        with self.lock:
            if not self.shown:
                self._say(f"compiling '{self.graph.name}' for the {self.backend} backend (the first compile of a "
                          "model takes a while; later runs use the cache)...")

    def __call__(self, done: int, total: int, what: str) -> None:
        with self.lock:
            now = time.perf_counter()
            if self.shown and done < total and now - self.last >= PROGRESS_EVERY_S:
                self._say(f"  compiled {done}/{total} kernels ({now - self.start:.0f} s), now {what}")

    def finish(self, ok: bool = True) -> None:
        """Stop the timer; say how long it took only if the compile succeeded (an error speaks for itself)."""
        self.timer.cancel()
        with self.lock:
            if self.shown and ok:
                self._say(f"compiled in {time.perf_counter() - self.start:.1f} s")


def backend_passes(args: argparse.Namespace) -> list[str]:
    """The passes to run before the backend: ``--passes``, else ``fuse`` for generated backends
    unless ``--no-fuse``."""
    given = getattr(args, "passes", None)
    no_fuse = bool(getattr(args, "no_fuse", False))
    if given is not None:
        if no_fuse:
            raise UsageError("--passes and --no-fuse cannot be combined (leave 'fuse' out of --passes)")
        return [p.strip() for p in given.split(",") if p.strip()]
    if no_fuse or args.backend not in FUSING_BACKENDS:
        return []
    return ["fuse"]


def _compile(graph: Graph, backend_name: str):
    from irc.backends import get_backend

    backend = get_backend(backend_name)
    progress = CompileProgress(graph, backend_name)
    progress.timer.start()
    try:
        compiled = backend.compile(graph, progress=progress)
    except BaseException:
        progress.finish(ok=False)
        raise
    progress.finish()
    return compiled


def summary_line(label: str, arr: np.ndarray) -> str:
    dtype = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}.get(str(arr.dtype), str(arr.dtype))
    shape = f"{dtype}[{','.join(str(d) for d in arr.shape)}]"
    if arr.size == 0:
        return f"  {label}  {shape}  (empty)"
    a = arr.astype(np.float64)
    finite = a[np.isfinite(a)]
    bad = nonfinite(arr)
    if finite.size == 0:
        return f"  {label}  {shape}  no finite values ({bad})"
    stats = (f"mean={finite.mean():.6g}  std={finite.std():.6g}  min={finite.min():.6g}  max={finite.max():.6g}")
    return f"  {label}  {shape}  {stats}" + (f"  ({bad}; statistics over the finite values)" if bad else "")


def print_profile(profile: dict[str, float] | None, backend: str, total: float,
                  nodes: list[tuple[str, str, float]] | None = None) -> None:
    """Per-op time and share of the profiled run; then the slowest nodes (``%name (op)``)."""
    if not profile:
        print(f"profile: the {backend} backend reports no per-op times; the whole run took {total * 1e3:.2f} ms")
        return
    spent = sum(profile.values()) or 1e-12
    width = max(len(op) for op in profile)
    print(f"profile ({backend} backend, one run):")
    print(f"  {'op':<{width}}  {'ms':>10}  {'share':>6}")
    for op, sec in sorted(profile.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {op:<{width}}  {sec * 1e3:>10.3f}  {100 * sec / spent:>5.1f}%")
    print(f"  {'total':<{width}}  {spent * 1e3:>10.3f}  100.0%")
    if nodes:
        top = sorted(nodes, key=lambda n: -n[2])[:TOP_NODES]
        label_width = max(len(f"%{name} ({op})") for name, op, _ in top)
        print(f"slowest nodes (of {len(nodes)}):")
        for name, op, sec in top:
            print(f"  {f'%{name} ({op})':<{label_width}}  {sec * 1e3:>10.3f} ms  {100 * sec / spent:>5.1f}%")


def node_times(compiled: object) -> list[tuple[str, str, float]] | None:
    """(first result name, op, seconds) per node, when the backend timed nodes one by one."""
    per_node = getattr(compiled, "node_profile", None)
    timed = getattr(compiled, "graph", None)
    if not per_node or timed is None:
        return None
    return [(timed.nodes[i].outputs[0], timed.nodes[i].op, sec) for i, sec in per_node.items()
            if 0 <= i < len(timed.nodes) and timed.nodes[i].outputs]


def check_outputs(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], tolerance: float) -> bool:
    ok = True
    print(f"check against the numpy reference (float64), max relative error = max|out − ref| / max|ref|, "
          f"tolerance {tolerance:g}:")
    for label, ref in reference.items():
        out = outputs.get(label)
        if out is None:
            print(f"  {label}: missing from the backend's outputs  FAIL")
            ok = False
            continue
        if out.shape != ref.shape:
            print(f"  {label}: shape {out.shape} but the reference has {ref.shape}  FAIL")
            ok = False
            continue
        bad_out, bad_ref = nonfinite(out), nonfinite(ref)
        if bad_out or bad_ref:
            where = "; ".join(s for s in (f"output has {bad_out}" if bad_out else "",
                                         f"reference has {bad_ref}" if bad_ref else "") if s)
            print(f"  {label}: {where}  FAIL (non-finite values are never a match)")
            ok = False
            continue
        err = rel_error(out, ref)
        verdict = "ok" if err <= tolerance else "FAIL"
        ok &= err <= tolerance
        print(f"  {label}: {err:.3e}  {verdict}")
    return ok


def save_outputs(path: str, outputs: dict[str, np.ndarray], *, rehearse: bool = False) -> None:
    """Save the outputs to the .npz ``path``; ``rehearse`` checks the path before the run."""
    if Path(path).suffix != ".npz":
        raise UsageError(f"-o: outputs are saved as .npz, got '{path}'")
    write_atomically(path, lambda f: np.savez(f, **outputs), rehearse=rehearse)


def cmd_run(args: argparse.Namespace) -> int:
    from irc.backends.numpy_ref import run_graph
    from irc.runtime.inputs import load_input_files, random_inputs

    if args.tolerance is not None and not args.tolerance > 0:
        raise UsageError(f"--tolerance must be positive, got {args.tolerance}")
    tolerance = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
    if args.output:
        save_outputs(args.output, {}, rehearse=True)
    graph = load_bound_graph(args)
    guard_memory(graph, args.check, args.max_memory)
    given = load_input_files(graph, args.inputs)
    weights, origin = _weights(graph, args)
    inputs = random_inputs(graph, args.seed, given)
    passes = backend_passes(args)
    if passes:
        from irc.pipeline import run_passes

        executed = run_passes(graph, passes)
    else:
        executed = graph
    compiled = _compile(executed, args.backend)
    if args.profile and hasattr(compiled, "profile"):
        compiled.run(weights, inputs)  # warm: the profile shows steady-state times, not first-touch costs
        compiled.profile = {}
    start = time.perf_counter()
    outputs = compiled.run(weights, inputs)
    seconds = time.perf_counter() - start

    binds = ", ".join(f"{k}={graph.bindings[k]}" for k in graph.symbols if k in graph.bindings)
    drawn = [n for n in inputs if n not in given]
    print(f"model {graph.name}({binds}) on the {args.backend} backend; weights {origin}"
          + (f"; random inputs {', '.join(drawn)} (seed {args.seed})" if drawn else ""))
    if passes:
        print(f"passes: {', '.join(passes)} ({len(graph.nodes)} nodes -> {len(executed.nodes)})")
    for label, _ in graph.outputs:
        print(summary_line(label, np.asarray(outputs[label])))
    print(f"run: {seconds * 1e3:.2f} ms")
    if args.profile:
        print_profile(getattr(compiled, "profile", None), args.backend, seconds, node_times(compiled))
    if args.output:
        save_outputs(args.output, {label: np.asarray(outputs[label]) for label, _ in graph.outputs})
    if args.check:
        reference = run_graph(graph, weights, inputs, np.float64)
        if not check_outputs(outputs, reference, tolerance):
            return 1
    return 0
