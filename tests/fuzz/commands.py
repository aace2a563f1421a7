"""The commands a user runs on a model that compiles: ``irc analyze``, ``irc lint``, ``irc run``.

Each is a stage of the verdict, called the way the CLI calls it (irc/analysis/cli.py,
irc/lint/cli.py, irc/runtime/cli.py) on the graph the compile stage built:

- analyze: default bindings by role, the lints analyze prints, the analysis, and the report
  as text and as JSON; for a sequence model once more with ``--context`` and other dtypes.
- lint: every rule, rendered; a warning's location must point into the file, as an error's.
- run: the NumPy reference on seeded weights and inputs, with B bound to 1 as ``irc run``
  binds it, for graphs with no other free symbol and small enough by the analysis's own
  figures (RUN_MAX_BYTES, RUN_MAX_FLOPS). Every output must have the shape irc inferred,
  and for a generated valid model the shape PyTorch's formulas predict.

A stage ends with its result or with an IrcError/UsageError (judged as the compile's are
when it carries a location); anything else is a finding whose message starts with the
stage's name ("analyze: ", "lint: ", "run: "). ``Verdict.stages`` records how each ended.
"""

from __future__ import annotations

import io
import json
import traceback
from collections.abc import Callable
from pathlib import Path

from fuzz.case import Case
from fuzz.judge import BAD_LOC, CRASH, ERROR, OK, REJECTED, RUN_SHAPE, WRONG_TYPE, Verdict, _frames, check_location

SKIPPED = "skipped"
# the second analysis of a sequence model: a small --context (not the default 1,024) and the other dtypes
ANALYZE_FLAGS = {"context": 24, "dtype": "bf16", "kv_dtype": "int8", "act_dtype": "f16"}
RUN_MAX_BYTES = 32 << 20         # weights + peak activations (f32) of a graph CI runs
RUN_MAX_FLOPS = 20_000_000       # forward FLOPs of a graph CI runs (the reference runs ~1 GFLOP/s on small ops)
RUN_SEED = 0                     # irc run's default --seed


class _Stage:
    """One command of one case: turns the exception it ended with into a verdict named after it."""

    def __init__(self, name: str, case: Case, written: dict[str, str]):
        self.name, self.case, self.written = name, case, written

    def failed(self, e: BaseException) -> Verdict:
        from irc.diagnostics import IrcError, UsageError, render

        if isinstance(e, UsageError):
            verdict = Verdict(ERROR, f"{self.name}: usage: {e}")
        elif isinstance(e, IrcError):
            if e.loc is None or self.case.kind == "ir":  # 'irc: error: ...', or located by the IR's loc() trailers
                render(e)
                verdict = Verdict(ERROR, f"{self.name}: {e.message}")
            else:
                verdict = check_location(e, self.written)
                verdict.message = f"{self.name}: {verdict.message}"
        else:
            return Verdict(CRASH, f"{self.name}: {str(e)[:500]}", type(e).__name__,
                           _frames(traceback.extract_tb(e.__traceback__)))
        if verdict.status == ERROR and self.case.valid:  # every size of a generated model is sensible
            where = f"{e.loc}: " if getattr(e, "loc", None) else ""
            return Verdict(REJECTED, f"{self.name}: {where}{getattr(e, 'message', e)}")
        return verdict


def _guarded(stage: _Stage, fn: Callable[[], Verdict]) -> Verdict:
    try:
        return fn()
    except Exception as e:
        return stage.failed(e)


# -- irc analyze ------------------------------------------------------------------------------


def analyze(graph: object, case: Case, written: dict[str, str], flags: dict[str, object] | None = None
            ) -> tuple[Verdict, object]:
    """``irc analyze [--context N --dtype ...]``, as text and ``--json``: (verdict, the Analysis or None)."""
    from irc.analysis.analyze import Options, analyze_graph
    from irc.analysis.bindings import default_bindings
    from irc.analysis.report_json import analysis_to_json
    from irc.analysis.report_text import analysis_to_text
    from irc.lint.cli import print_lints
    from irc.passes.bind import bind_symbols
    from irc.passes.shape_infer import shape_infer
    from irc.pipeline import parse_defines

    flags = flags or {}
    context: int | None = flags.get("context")  # type: ignore[assignment]
    name = " ".join(["analyze", *(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())])
    stage = _Stage(name, case, written)
    result: list[object] = [None]

    def go() -> Verdict:
        given = parse_defines(list(case.defines))
        # load_for_analysis, on the graph already loaded with the same -D flags
        bindings = default_bindings(graph, given, context)  # type: ignore[arg-type]
        missing = {b.name: b.value for b in bindings
                   if b.name in graph.symbols and b.name not in graph.bindings}  # type: ignore[attr-defined]
        bound = shape_infer(bind_symbols(graph, missing)) if missing else graph  # type: ignore[arg-type]
        lints = _lint_verdict(_Stage(f"{name} lints", case, written),
                              lambda: print_lints(bound, [], io.StringIO(), context))  # as emit_lints does
        if lints.is_finding:
            return lints
        analysis = analyze_graph(bound, bindings, Options(**flags))  # type: ignore[arg-type]
        text = analysis_to_text(analysis, case.main)
        report = json.dumps(analysis_to_json(analysis, case.main), indent=2)
        if not text.strip() or not report.strip():
            return Verdict(CRASH, f"{name}: an empty report", "EmptyReport")
        result[0] = analysis
        return Verdict(OK)

    return _guarded(stage, go), result[0]


def _lint_verdict(stage: _Stage, lint: Callable[[], object]) -> Verdict:
    """Lints may fail with an IrcError (emit_lints swallows it), never with anything else."""
    from irc.diagnostics import IrcError

    try:
        lint()
    except IrcError:
        return Verdict(OK)
    except Exception as e:
        return stage.failed(e)
    return Verdict(OK)


# -- irc lint ---------------------------------------------------------------------------------


def lint(graph: object, case: Case, written: dict[str, str]) -> Verdict:
    """``irc lint``: every rule, rendered; each warning's location inside the file it names."""
    from irc.diagnostics import IrcError
    from irc.lint import lint_graph
    from irc.lint.render import render_warning, summary

    stage = _Stage("lint", case, written)

    def go() -> Verdict:
        warnings = lint_graph(graph)  # type: ignore[arg-type]
        for w in warnings:
            render_warning(w)
            if w.loc is not None and case.kind != "ir":
                verdict = check_location(IrcError(w.message, w.loc), written)
                if verdict.is_finding:
                    return Verdict(BAD_LOC, f"lint: {w.code}: {verdict.message}")
        summary(len(warnings), 0)
        return Verdict(OK)

    return _guarded(stage, go)


# -- irc run (numpy reference) ------------------------------------------------------------------


def runnable(graph: object, analysis: object) -> str | None:
    """Why the run stage skips this graph, or None when it runs it."""
    from irc.runtime.memory import estimate_bytes

    free = [s for s in graph.symbols if s not in graph.bindings]  # type: ignore[attr-defined]
    if [s for s in free if s != "B"]:
        return "unbound symbols"
    if analysis is None:
        return "no analysis"
    totals = analysis.totals  # type: ignore[attr-defined]
    if totals["flops_forward"] > RUN_MAX_FLOPS:
        return "too many FLOPs"
    if totals["weight_bytes"] + totals["peak_activation_bytes"] > RUN_MAX_BYTES:
        return "too large"
    weights, activations = estimate_bytes(analysis.graph)  # type: ignore[attr-defined]  # irc run's guard
    if weights + activations > RUN_MAX_BYTES:
        return "too large"
    return None


def run(graph: object, case: Case, root: Path, written: dict[str, str]) -> Verdict:
    """``irc run --backend numpy``: bind B=1 if free (load_bound_graph), seeded weights and inputs, run_graph."""
    import numpy as np

    from irc.backends.numpy_ref import run_graph
    from irc.pipeline import load_graph, parse_defines
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    stage = _Stage("run", case, written)

    def go() -> Verdict:
        bound = graph
        if "B" in graph.symbols and "B" not in graph.bindings:  # type: ignore[attr-defined]
            bound = load_graph(root / case.main, {**parse_defines(list(case.defines)), "B": 1}, case.model)
        weights = init_weights(bound, RUN_SEED)  # type: ignore[arg-type]
        inputs = random_inputs(bound, RUN_SEED)  # type: ignore[arg-type]
        outputs = run_graph(bound, weights, inputs)  # type: ignore[arg-type]
        types = bound.value_types()  # type: ignore[attr-defined]
        for label, value in bound.outputs:  # type: ignore[attr-defined]
            if label not in outputs:
                return Verdict(RUN_SHAPE, f"run: output {label} is missing from the reference's results")
            got = tuple(np.asarray(outputs[label]).shape)
            if got != tuple(types[value].shape):
                return Verdict(RUN_SHAPE, f"run: output {label} has shape {got}, but irc typed it {types[value]}")
        for label, want in case.expect:
            shape = _bound_shape(want, {"B": 1, **dict(bound.bindings)})  # type: ignore[attr-defined]
            got = tuple(np.asarray(outputs[label]).shape) if label in outputs else None
            if shape is not None and got != shape:
                return Verdict(WRONG_TYPE, f"run: output {label} has shape {got}, PyTorch's formulas give {want}")
        return Verdict(OK)

    return _guarded(stage, go)


def _bound_shape(type_text: str, values: dict[str, int]) -> tuple[int, ...] | None:
    """'f32[B,4]' with B=1 -> (1, 4); None when a dim stays symbolic."""
    dims = type_text.partition("[")[2].rstrip("]")
    out = []
    for d in dims.split(",") if dims else []:
        value = values.get(d, d)
        if not str(value).isdigit():
            return None
        out.append(int(value))
    return tuple(out)


# -- all three ------------------------------------------------------------------------------------


def check_commands(graph: object, case: Case, root: Path, written: dict[str, str],
                   phase: Callable[[str], None]) -> Verdict:
    """analyze, lint and run in turn; the first finding, else OK with each stage's ending in ``stages``."""
    stages: dict[str, str] = {}

    def record(name: str, verdict: Verdict) -> bool:
        stages[name] = verdict.status
        return verdict.is_finding

    verdict, analysis = analyze(graph, case, written)
    if record("analyze", verdict):
        return _with(verdict, stages)
    if analysis is None or analysis.tokens is not None:  # type: ignore[attr-defined]  # a sequence model
        verdict, _ = analyze(graph, case, written, ANALYZE_FLAGS)
        if record("analyze-context", verdict):
            return _with(verdict, stages)
    verdict = lint(graph, case, written)
    if record("lint", verdict):
        return _with(verdict, stages)
    why = runnable(graph, analysis)
    if why is not None:
        stages["run"] = f"{SKIPPED} ({why})"
        return _with(Verdict(OK), stages)
    phase("running")
    verdict = run(graph, case, root, written)
    record("run", verdict)
    return _with(verdict if verdict.is_finding else Verdict(OK), stages)


def _with(verdict: Verdict, stages: dict[str, str]) -> Verdict:
    verdict.stages = stages
    return verdict
