"""``irc run``: bind, size-check, initialise or load weights, run a backend, report, check.

stdout carries the results (output shapes and statistics, the check, the profile);
stderr carries notes and progress. Exit 1 when ``--check`` finds the backend off.

The cpu backend runs the fused graph: the ``fuse`` and ``fold-bn`` passes run before code generation unless
``--no-fuse`` is given, and ``--passes a,b`` runs exactly those passes instead (the cuda
backend fuses in its own emitter). ``--check`` compares with the NumPy reference on the graph as written, so the
passes are checked along with the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError, did_you_mean, quote
from irc.graph import Graph
from irc.output_files import write_atomically
from irc.runtime.compare import nonfinite, rel_error
from irc.runtime.memory import available_bytes, fmt_bytes, parse_size, run_phases

DEFAULT_TOLERANCE = 1e-4  # fp32 backend against the float64 reference, normwise
FUSING_BACKENDS = ("cpu",)  # backends that get the fused graph by default
TOP_NODES = 8  # the profile's list of the slowest single nodes
PROGRESS_AFTER_S = 0.5  # a compile that takes longer than this gets a progress line
PROGRESS_EVERY_S = 1.0  # and then at most one line this often


def note(message: str) -> None:
    print(f"irc: note: {message}", file=sys.stderr)


def load_bound_graph(args: argparse.Namespace) -> Graph:
    """Load with -D bindings; unbound sizes take the defaults ``analyze`` gives them (said in a note),
    and a symbol with no default is an error naming it."""
    from irc.pipeline import defaults_note, load_with_defaults, parse_defines

    graph, defaulted = load_with_defaults(args.file, parse_defines(args.defines), getattr(args, "model", None))
    if defaulted:
        note(defaults_note(defaulted))
    return graph


def guard_memory(graph: Graph, check: bool, max_memory: str | None, backend: str = "numpy",
                 random_weights: bool = True) -> None:
    """Refuse before allocating when the run's largest phase would not fit in the tightest limit
    (--max-memory, else the memory available, the container's cgroup limit and ``ulimit -v``)."""
    phases = run_phases(graph, backend, check, random_weights)
    name, parts = max(phases, key=lambda p: sum(p[1].values()))
    need = sum(parts.values())
    if max_memory is not None:
        try:
            limit: int | None = parse_size(max_memory)
        except ValueError as e:
            raise UsageError(f"--max-memory: {e}") from None
        where = "the --max-memory limit"
    else:
        found = available_bytes()
        limit, where = found if found is not None else (None, "")
    if limit is not None and need > limit:
        listed = " + ".join(f"{part} {fmt_bytes(n)}" for part, n in parts.items())
        raise IrcError(f"running '{graph.name}' needs about {fmt_bytes(need)} ({listed}), more than {where} "
                       f"({fmt_bytes(limit)}); bind smaller sizes with -D, or pass --max-memory SIZE to override")


def _weights(graph: Graph, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], str]:
    from irc.runtime.init import init_weights
    from irc.runtime.weights import load_for_model

    if args.weights:  # a file, a checkpoint folder or a sharded index; HF names through the model's weight map
        return load_for_model(args.weights, graph, args.file, note), f"'{args.weights}'"
    from irc.frontends.onnx.importer import initializer_weights

    found = initializer_weights(args.file, graph)  # an ONNX model's initializers are its weights
    if found is not None:
        return found, f"the initializers of '{args.file}'"
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
                self._say(f"compiling '{self.graph.name}' for the {self.backend} backend (or loading it from the "
                          "kernel cache)...")

    def __call__(self, done: int, total: int, what: str) -> None:
        with self.lock:
            now = time.perf_counter()
            if self.shown and done < total and now - self.last >= PROGRESS_EVERY_S:
                self._say(f"  compiled {done}/{total} kernels ({now - self.start:.0f} s), now {what}")

    def finish(self, ok: bool = True, compiled: object = None) -> None:
        """Stop the timer; say how long it took only if the compile succeeded (an error speaks for itself),
        and whether the kernels came from the cache (a backend's ``stats.compiled`` counts the fresh ones)."""
        self.timer.cancel()
        with self.lock:
            if self.shown and ok:
                seconds = time.perf_counter() - self.start
                fresh = getattr(getattr(compiled, "stats", None), "compiled", None)
                if fresh == 0:
                    self._say(f"loaded from the kernel cache in {seconds:.1f} s")
                elif fresh is not None:
                    self._say(f"compiled in {seconds:.1f} s (the first compile of a model takes a while; "
                              "later runs load it from the cache)")
                else:
                    self._say(f"compiled in {seconds:.1f} s")


def backend_passes(args: argparse.Namespace) -> list[str]:
    """The passes to run before the backend: ``--passes``, else ``fuse`` and ``fold-bn`` (BatchNorm folded
    into the convolution before it) for the CPU backend unless ``--no-fuse``."""
    given = getattr(args, "passes", None)
    no_fuse = bool(getattr(args, "no_fuse", False))
    if given is not None:
        if no_fuse:
            raise UsageError("--passes and --no-fuse cannot be combined (leave 'fuse' out of --passes)")
        return [p.strip() for p in given.split(",") if p.strip()]
    if no_fuse or args.backend not in FUSING_BACKENDS:
        return []
    return ["fuse", "fold-bn"]


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
    progress.finish(compiled=compiled)
    return compiled


SUMMARY_CHUNK = 1 << 20  # elements per step of the summary statistics: its scratch stays a few MiB


def summary_line(label: str, arr: np.ndarray) -> str:
    dtype = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}.get(str(arr.dtype), str(arr.dtype))
    shape = f"{dtype}[{','.join(str(d) for d in arr.shape)}]"
    if arr.size == 0:
        return f"  {label}  {shape}  (empty)"
    stats = finite_stats(arr)
    bad = nonfinite(arr)
    if stats is None:
        return f"  {label}  {shape}  no finite values ({bad})"
    mean, std, lo, hi = stats
    text = f"mean={mean:.6g}  std={std:.6g}  min={lo:.6g}  max={hi:.6g}"
    return f"  {label}  {shape}  {text}" + (f"  ({bad}; statistics over the finite values)" if bad else "")


def finite_stats(arr: np.ndarray) -> tuple[float, float, float, float] | None:
    """(mean, std, min, max) over the finite values, or None when there are none.

    Two passes over chunks of SUMMARY_CHUNK elements (the mean, then the squared deviations
    from it, both summed in float64), so an output of gigabytes costs a few MiB here rather
    than the float64 copy, mask and filtered copy of a one-line NumPy version.
    """
    flat = arr.reshape(-1)
    count, total, lo, hi = 0, 0.0, np.inf, -np.inf
    for start in range(0, flat.size, SUMMARY_CHUNK):
        part = flat[start:start + SUMMARY_CHUNK].astype(np.float64)
        part = part[np.isfinite(part)]
        if part.size:
            count += part.size
            total += float(part.sum())
            lo, hi = min(lo, float(part.min())), max(hi, float(part.max()))
    if count == 0:
        return None
    mean = total / count
    square = 0.0
    for start in range(0, flat.size, SUMMARY_CHUNK):
        part = flat[start:start + SUMMARY_CHUNK].astype(np.float64)
        part = part[np.isfinite(part)] - mean
        square += float(np.dot(part, part))
    return mean, (square / count) ** 0.5, lo, hi


def print_profile(profile: dict[str, float] | None, backend: str, total: float,
                  nodes: list[tuple[str, str, float]] | None = None, runs: int = 1) -> None:
    """Per-op time and share (the median of the timed runs); then the slowest nodes (``%name (op)``)."""
    if not profile:
        print(f"profile: the {backend} backend reports no per-op times; the whole run took {total * 1e3:.2f} ms"
              + (" (median)" if runs > 1 else ""))
        return
    spent = sum(profile.values()) or 1e-12
    width = max(len(op) for op in profile)
    print(f"profile ({backend} backend, " + (f"median of {runs} runs):" if runs > 1 else "one run):"))
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


PROFILE_WARMUP = 1  # with --profile: untimed runs first (first-touch page faults, caches)
PROFILE_REPEAT = 3  # and timed runs, of which the median is reported


def check_backend(name: str) -> None:
    """An unknown ``--backend`` is bad usage (exit 2), found before the model is even read."""
    from irc.backends import BACKENDS

    if name not in BACKENDS:
        raise UsageError(f"--backend: unknown backend '{quote(name)}' (known: {', '.join(BACKENDS)})"
                         f"{did_you_mean(name, BACKENDS)}")


def _warmup(args: argparse.Namespace) -> int:
    given = getattr(args, "warmup", None)
    return given if given is not None else (PROFILE_WARMUP if args.profile else 0)


def _repeat(args: argparse.Namespace) -> int:
    given = getattr(args, "repeat", None)
    return given if given is not None else (PROFILE_REPEAT if args.profile else 1)


def timed_runs(compiled: object, weights: dict, inputs: dict, args: argparse.Namespace):
    """Run ``--warmup`` untimed times, then ``--repeat`` timed times: (outputs of the last run,
    seconds of each timed run, the median seconds per op, the median per node) when profiling."""
    profiling = bool(args.profile) and hasattr(compiled, "profile")
    for _ in range(_warmup(args)):
        compiled.run(weights, inputs)  # type: ignore[attr-defined]
    seconds: list[float] = []
    per_op: list[dict[str, float]] = []
    per_node: list[list[tuple[str, str, float]]] = []
    outputs: dict = {}
    for _ in range(_repeat(args)):
        if profiling:
            compiled.profile = {}  # type: ignore[attr-defined]
        start = time.perf_counter()
        outputs = compiled.run(weights, inputs)  # type: ignore[attr-defined]
        seconds.append(time.perf_counter() - start)
        if profiling:
            per_op.append(dict(compiled.profile or {}))  # type: ignore[attr-defined]
            per_node.append(node_times(compiled) or [])
    profile = _median_table(per_op) if per_op and any(per_op) else None
    nodes = None
    if per_node and per_node[0]:
        nodes = [(name, op, statistics.median(run[i][2] for run in per_node if i < len(run)))
                 for i, (name, op, _) in enumerate(per_node[0])]
    return outputs, seconds, profile, nodes


def _median_table(runs: list[dict[str, float]]) -> dict[str, float]:
    ops = sorted({op for run in runs for op in run})
    return {op: statistics.median(run.get(op, 0.0) for run in runs) for op in ops}


def run_line(seconds: list[float], warmup: int) -> str:
    """``run: 1.23 ms`` for one run; the median, spread and warm-up for several."""
    if len(seconds) == 1 and not warmup:
        return f"run: {seconds[0] * 1e3:.2f} ms"
    after = f" after {warmup} warm-up run{'s' if warmup != 1 else ''}" if warmup else ""
    if len(seconds) == 1:
        return f"run: {seconds[0] * 1e3:.2f} ms{after}"
    return (f"run: median {statistics.median(seconds) * 1e3:.2f} ms of {len(seconds)} runs (min "
            f"{min(seconds) * 1e3:.2f}, max {max(seconds) * 1e3:.2f}){after}")


def cmd_run(args: argparse.Namespace) -> int:
    from irc.backends.numpy_ref import run_graph
    from irc.runtime.inputs import load_input_files, random_inputs

    if args.tolerance is not None and not args.tolerance > 0:
        raise UsageError(f"--tolerance must be positive, got {args.tolerance}")
    check_backend(args.backend)
    tolerance = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
    if args.output:
        save_outputs(args.output, {}, rehearse=True)
    graph = load_bound_graph(args)
    guard_memory(graph, args.check, args.max_memory, args.backend, random_weights=args.weights is None)
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
    outputs, seconds, profile, per_node = timed_runs(compiled, weights, inputs, args)

    binds = ", ".join(f"{k}={graph.bindings[k]}" for k in graph.symbols if k in graph.bindings)
    drawn = [n for n in inputs if n not in given]
    print(f"model {graph.name}({binds}) on the {args.backend} backend; weights {origin}"
          + (f"; random inputs {', '.join(drawn)} (seed {args.seed})" if drawn else ""))
    if passes:
        print(f"passes: {', '.join(passes)} ({len(graph.nodes)} nodes -> {len(executed.nodes)})")
    for label, _ in graph.outputs:
        print(summary_line(label, np.asarray(outputs[label])))
    print(run_line(seconds, _warmup(args)))
    if args.profile:
        print_profile(profile, args.backend, statistics.median(seconds), per_node, len(seconds))
    if args.output:
        save_outputs(args.output, {label: np.asarray(outputs[label]) for label, _ in graph.outputs})
    if args.check:
        reference = run_graph(graph, weights, inputs, np.float64)
        if not check_outputs(outputs, reference, tolerance):
            return 1
    return 0
