"""Run one case through irc, in the worker process, and judge how it ended.

The property: every input ends with a typed graph whose IR text round-trips through
irc.printer / irc.ir_parser, or with an IrcError at a real line and column of a real
file. Anything else (another exception, a location outside the file, a round trip that
changes the text) is a finding, returned as a verdict rather than raised. A graph that
compiles then goes through the other commands (fuzz.commands: irc analyze, irc lint, irc
run on the NumPy reference), each held to the same property.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fuzz.case import Case

OK, ERROR = "ok", "error"
# findings
CRASH, NO_LOC, BAD_LOC, ROUNDTRIP, HANG = "crash", "no-loc", "bad-loc", "roundtrip", "hang"
IMPOSSIBLE = "impossible-type"  # a result type with a size that cannot be positive
REJECTED, WRONG_TYPE = "rejected-valid", "wrong-type"  # only for generated valid models
RUN_SHAPE = "run-shape"  # the reference backend's output has another shape than irc inferred
FINDINGS = (CRASH, NO_LOC, BAD_LOC, ROUNDTRIP, HANG, IMPOSSIBLE, REJECTED, WRONG_TYPE, RUN_SHAPE)


@dataclass
class Verdict:
    status: str
    message: str = ""
    exc_type: str = ""
    frames: list[tuple[str, str, int]] = field(default_factory=list)  # (file, function, line), innermost last
    cpu_s: float = 0.0
    stages: dict[str, str] = field(default_factory=dict)  # command -> ok / error / skipped, for the tallies

    @property
    def is_finding(self) -> bool:
        return self.status in FINDINGS

    def in_stack(self, prefix: str) -> int:
        """How many frames, as 'irc/file.py:function', start with ``prefix``."""
        return sum(f"{_short(file)}:{func}".startswith(prefix) for file, func, _ in self.frames)

    def where(self) -> str:
        """The innermost frame inside irc's own code: what a known-bug entry matches on."""
        for file, func, _ in reversed(self.frames):
            if any(marker in file for marker in _IRC_DIRS):
                return f"{_short(file)}:{func}"
        return "?"


_IRC_DIRS = ("/frontends/", "/backends/", "/irc/")  # irc's code (frontends and backends install as irc.*)


def _short(file: str) -> str:
    for marker in _IRC_DIRS:
        if marker in file:
            return file[file.rindex(marker) + 1:]
    return os.path.basename(file)


def _frames(tb: traceback.StackSummary) -> list[tuple[str, str, int]]:
    return [(f.filename, f.name, f.lineno or 0) for f in tb]


def _text_of(file: str, written: dict[str, str]) -> str | None:
    """The text irc read for ``file``, or None if it is not a real file."""
    from irc.diagnostics import SOURCES

    text = written.get(file)
    if text is None:
        text = SOURCES.get(file)
    if text is None and os.path.isfile(file):
        text = Path(file).read_text(encoding="utf-8", errors="replace")
    return text


def check_location(err: Exception, written: dict[str, str]) -> Verdict:
    """An IrcError is fine when it points at a line and column inside a real file."""
    from irc.diagnostics import quote, render

    loc = getattr(err, "loc", None)
    message = getattr(err, "message", str(err))
    if loc is None:
        return Verdict(NO_LOC, message, type(err).__name__)
    text = _text_of(loc.file, written)
    if text is None:
        return Verdict(BAD_LOC, f"{loc}: file does not exist: {message}", type(err).__name__)
    lines = text.split("\n")  # lines end at '\n', as Lark and irc.diagnostics count them
    if not isinstance(loc.line, int) or not 1 <= loc.line <= len(lines):
        return Verdict(BAD_LOC, f"{loc}: line outside 1..{len(lines)}: {message}", type(err).__name__)
    width = len(lines[loc.line - 1])
    if not isinstance(loc.col, int) or not 1 <= loc.col <= width + 1:
        return Verdict(BAD_LOC, f"{loc}: column outside 1..{width + 1}: {message}", type(err).__name__)
    quoted = _quoted_line(render(err), loc.line)  # rendering must not fail either
    want = lines[loc.line - 1].removesuffix("\r").expandtabs(1).strip()
    shown = quote(lines[loc.line - 1].removesuffix("\r").expandtabs(1), 10**9)  # as irc shows it: escaped
    if quoted is not None and quoted not in want and want not in quoted and quoted.strip("…") not in shown:
        return Verdict(BAD_LOC, f"{loc}: the diagnostic quotes {quoted!r}, not line {loc.line} {want!r}: {message}",
                       type(err).__name__)
    return Verdict(ERROR, message)


def _quoted_line(rendered: str, line: int) -> str | None:
    """The source line a rendered diagnostic quotes as '  NN | text', if it quotes one."""
    for row in rendered.split("\n"):
        head, sep, rest = row.partition(" | ")
        if sep and head.strip() == str(line):
            return rest.strip()
    return None


def never_positive(dim: object) -> bool:
    """An int below 1, or a polynomial in sizes (each >= 1) whose coefficients are all <= 0."""
    if isinstance(dim, int):
        return dim < 1
    terms = getattr(dim, "terms", None)
    return bool(terms) and all(c <= 0 for _, c in terms)


# Graphs bigger than this (a mutated 'layers = 10000') are only checked for types: their
# round trip and lowering take seconds and find nothing a small graph would not.
MAX_CHECKED_NODES = 5000


def check_graph(graph: object, full: bool = True) -> Verdict:
    """A result: every node typed, and print -> parse -> print byte-identical (with and without locs)."""
    from irc.ir_parser import parse_ir
    from irc.printer import print_graph

    for node in graph.nodes:  # type: ignore[attr-defined]
        if len(node.types) != len(node.outputs):
            return Verdict(ROUNDTRIP, f"node {node.outputs} of '{node.op}' is not typed")
        for t in node.types:
            if any(never_positive(d) for d in t.shape):
                where = f"{node.loc}: " if node.loc else ""
                return Verdict(IMPOSSIBLE, f"{where}'{node.op}' gives {t}, a size that cannot be positive")
    if not full:
        return Verdict(OK)
    for with_loc in (True, False):
        text = print_graph(graph, with_loc)  # type: ignore[arg-type]
        try:
            again = print_graph(parse_ir(text, "<roundtrip>"), with_loc)
        except Exception as e:  # the printer wrote something its own parser cannot read
            return Verdict(ROUNDTRIP, f"printed IR does not parse: {type(e).__name__}: {e}\n{text[:2000]}")
        if again != text:
            diff = next((f"{a!r} != {b!r}" for a, b in zip(text.splitlines(), again.splitlines()) if a != b), "")
            return Verdict(ROUNDTRIP, f"print -> parse -> print changed the text: {diff}")
    return Verdict(OK)


LOWERING = ["fuse"]  # `irc compile --passes fuse`: decompose to primitives, then every fusion rule


def check_lowering(graph: object, case: Case, written: dict[str, str]) -> Verdict:
    """The rest of the compile pipeline: the lowered, fused graph verifies and round-trips too."""
    from irc.diagnostics import IrcError, render
    from irc.pipeline import run_passes

    try:
        lowered = run_passes(graph.copy(), LOWERING)  # type: ignore[attr-defined]
    except IrcError as e:
        if case.kind == "ir":  # located by the IR's loc() trailers, as in IrLoadError
            render(e)
            return Verdict(ERROR, e.message)
        verdict = check_location(e, written)
        if verdict.status == ERROR and case.valid:
            return Verdict(REJECTED, f"--passes {','.join(LOWERING)}: {e.loc}: {e.message}")
        return verdict
    except Exception as e:
        return Verdict(CRASH, f"--passes {','.join(LOWERING)}: {str(e)[:500]}", type(e).__name__,
                       _frames(traceback.extract_tb(e.__traceback__)))
    verdict = check_graph(lowered)
    if verdict.is_finding:
        verdict.message = f"after --passes {','.join(LOWERING)}: {verdict.message}"
    return verdict


def check_types(graph: object, expect: tuple[tuple[str, str], ...]) -> Verdict:
    """Output types predicted by the generator's own shape model (PyTorch's formulas)."""
    types = graph.value_types()  # type: ignore[attr-defined]
    outputs = dict(graph.outputs)  # type: ignore[attr-defined]
    for label, want in expect:
        got = str(types[outputs[label]]) if label in outputs else "missing"
        if got != want:
            return Verdict(WRONG_TYPE, f"output {label}: irc infers {got}, PyTorch's formulas give {want}")
    return Verdict(OK)


class IrLoadError(Exception):
    """An IrcError from verifying or typing a parsed .ir file.

    Those point where the IR's ``loc(...)`` trailers say the node came from (the original
    .arch file, which need not exist here), or nowhere when the IR has no trailers; so
    only the parser's own errors are held to a line and column of the IR text.
    """

    def __init__(self, err: Exception):
        super().__init__(str(err))
        self.err = err


def _compile(case: Case, root: Path) -> object:
    from irc.diagnostics import IrcError
    from irc.pipeline import load_graph, parse_defines

    bindings = parse_defines(list(case.defines))
    path = root / case.main
    if case.kind != "ir":
        return load_graph(path, bindings, case.model)
    from irc.ir_parser import parse_ir

    try:
        text = path.read_bytes().decode("utf-8-sig")  # as irc reads it: no newline translation
    except UnicodeDecodeError:
        text = None  # load_graph reports that one
    if text is not None:
        parse_ir(text, str(path))  # the parser alone: a graph or an IrcError in the text
    try:
        return load_graph(path, bindings, case.model)
    except IrcError as e:
        raise IrLoadError(e) from None


def encode(text: str) -> bytes:
    """UTF-8, except that undecodable bytes read from a seed, and lone surrogates, are written raw."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def judge(case: Case, phase: Callable[[str], None] = lambda name: None) -> Verdict:
    """Compile ``case`` in a fresh folder, carry the graph through the other commands, and judge the ending.

    ``phase`` is called with 'compiled' between the compile and the round trip, 'commands'
    before analyze and lint, and 'running' before the run, so the sandbox can bound each
    phase separately (a 20,000-node graph compiles in under a second but takes seconds
    more to print and parse twice).
    """
    from fuzz.commands import check_commands
    from irc.diagnostics import SOURCES, IrcError, UsageError, render

    SOURCES.clear()  # a location must point into a file of this case, not one a previous case registered
    root = Path(tempfile.mkdtemp(prefix="ircfuzz-"))
    written: dict[str, str] = {}
    start = time.process_time()
    try:
        for name, text in case.files:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            data = encode(text)
            path.write_bytes(data)
            # the text as irc sees it: bytes decoded, a byte-order mark dropped, no newline translation
            written[str(path)] = data.decode("utf-8-sig", errors="replace")
        try:
            graph = _compile(case, root)
        except IrcError as e:
            verdict = check_location(e, written)
            if verdict.status == ERROR and case.valid:
                verdict = Verdict(REJECTED, f"{e.loc}: {e.message}")
        except UsageError as e:  # only -D flags may give one; a location is not expected there
            verdict = Verdict(ERROR, f"usage: {e}")
        except IrLoadError as e:
            render(e.err)  # type: ignore[arg-type]
            verdict = Verdict(ERROR, str(e))
        except Exception as e:
            verdict = Verdict(CRASH, str(e)[:500], type(e).__name__, _frames(traceback.extract_tb(e.__traceback__)))
        else:
            phase("compiled")
            small = len(graph.nodes) <= MAX_CHECKED_NODES
            verdict = check_graph(graph, full=small)
            if verdict.status == OK and case.expect:
                verdict = check_types(graph, case.expect)
            if verdict.status == OK and small:
                verdict = check_lowering(graph, case, written)
            if not verdict.is_finding and small:  # a lowering error still leaves the graph as built to analyze
                phase("commands")
                stages = verdict.stages = {"lower": verdict.status}
                commands = check_commands(graph, case, root, written, phase)
                stages.update(commands.stages)
                if commands.is_finding:
                    verdict = commands
                verdict.stages = stages
    except Exception as e:  # a failure inside the judging itself (render, round trip) is a crash too
        verdict = Verdict(CRASH, str(e)[:500], type(e).__name__, _frames(traceback.extract_tb(e.__traceback__)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    verdict.cpu_s = time.process_time() - start
    return verdict
