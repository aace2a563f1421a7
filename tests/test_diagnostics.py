"""Golden diagnostics: each tests/golden/errors/* input gives exactly its .err text on stderr.

A case is ``NAME.arch`` (or ``NAME.ir``, read as IR text) with its expected stderr in
``NAME.err``; ``# args:`` and ``# exit:`` lines at the top add CLI arguments and set the
expected exit status (default 1), and ``# command: run`` (or analyze, lint) runs that command
instead of ``compile``. Files under ``errors/inc/`` are helpers that cases ``use`` or read:
the weight and input files are made by ``inc/make_fixtures.py``.
Rewrite the .err files with ``pytest --update-golden`` (tests/conftest.py) and read every
changed message before committing it.

Messages that are correct in substance but should read better are kept at their current
text and listed in WANTED with what each should say, so the code and the golden change
together.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from irc.diagnostics import SOURCE_LINE_LIMIT, SOURCE_WINDOW
from irc.ops import OPS

ERRORS_DIR = Path(__file__).resolve().parent / "golden" / "errors"
CASES = sorted([*ERRORS_DIR.glob("*.arch"), *ERRORS_DIR.glob("*.ir")])

# case -> the message it should give instead (the golden keeps the current text). Empty: every
# message reads as wanted; add an entry here when a golden is correct in substance but not in wording.
WANTED: dict[str, str] = {}

# cases whose message has no file:line:col: the command line, not a file, is wrong, or there is no file
NO_LOCATION = {
    # usage errors
    "define_conflict", "define_not_integer", "define_zero", "define_malformed", "define_too_large", "unknown_pass",
    "output_unwritable", "output_device_full", "model_option_unknown", "analyze_context_zero", "lint_unknown_warning",
    "lint_misspelt_warning", "output_missing_folder", "output_empty_name", "ir_define_decimal",
    # a file that is not a model at all: the message says what it is
    "compile_hf_config",
    # irc import and irc weights: a config file or folder that is not there, flags
    "hf_import_missing_config", "hf_import_folder_no_config", "hf_import_output_not_arch", "hf_import_bad_name",
    "weights_template_bad_suffix",
    # a clash between two weight keys of the whole graph, at no one node
    "emit_numba_derived_key_taken",
    # inputs with no line to point at
    "missing_file",
    # irc run: flags, and weight and input files (binary: the message names the file, the key, both shapes)
    *(c.stem for c in CASES if c.stem.startswith("run_") and c.stem != "run_unbound_size"),
    # analyze and lint flags: --train plans, --hardware tables, --list / -o
    *(c.stem for c in CASES if c.stem.startswith(("analyze_usage_", "lint_usage_"))),
}

_LOCATED = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): error: \S")
_WARNING_FLAGS = {"compile", "analyze", "lint"}  # commands that take -W (lints are tested in tests/test_lint.py)


def case_argv(case: Path) -> tuple[list[str], int]:
    """The ``irc`` command line of a case, run from its folder, and its expected exit status."""
    import shlex

    head = {}
    for line in case.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        head[key.strip()] = value.strip()
    command = head.get("command", "compile")
    quiet = ["-W", "no-all"] if command in _WARNING_FLAGS else []
    return [command, head.get("file", case.name), *quiet, *shlex.split(head.get("args", ""))], int(head.get("exit", 1))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_error_golden(case: Path, golden, irc_cli) -> None:
    argv, expected_exit = case_argv(case)
    result = irc_cli(argv, cwd=case.parent)
    assert result.rc == expected_exit, result.err
    assert result.out == ""  # also: no pickled payload in inc/ was ever loaded (each prints when unpickled)
    assert "Traceback" not in result.err and "internal error" not in result.err
    golden.check(case.with_suffix(".err"), result.err)


@pytest.mark.parametrize("case", [c for c in CASES if c.stem not in NO_LOCATION], ids=lambda p: p.stem)
def test_error_has_location_source_line_and_caret(case: Path) -> None:
    """file:line:col: error: message, then the quoted source line, then a caret under the column."""
    lines = case.with_suffix(".err").read_text(encoding="utf-8").splitlines()
    m = _LOCATED.match(lines[0])
    assert m, lines[0]
    where = ERRORS_DIR / m["file"]
    # a file that is not UTF-8 is quoted with U+FFFD for its bad bytes, as irc quotes it
    src = where.read_bytes().decode("utf-8", errors="replace").splitlines() if where.exists() else []
    line, col = int(m["line"]), int(m["col"])
    if not src:  # an empty file has no line to quote
        return
    assert 1 <= line <= len(src)
    text = src[line - 1].expandtabs(1)
    assert col <= len(src[line - 1]) + 1
    underline = lines[2].removeprefix("       | ")
    if len(text) <= SOURCE_LINE_LIMIT and text.isprintable():  # quoted whole
        assert lines[1] == f"  {line:>4} | {text}"
        assert underline.index("^") == col - 1
        _check_underline(text, underline)
        return
    # a long line is cut to a window around the caret, a control character shown as \xNN (both marked)
    shown = lines[1].removeprefix(f"  {line:>4} | ")
    caret = underline.index("^")
    assert len(shown) <= SOURCE_WINDOW * 4 + 2 and shown.isprintable()
    assert "…" in shown or "\\x" in shown
    if text[col - 1:col].isprintable() and text[col - 1:col]:
        assert shown[caret] == text[col - 1]  # the caret still points at the character it names


def _check_underline(text: str, underline: str) -> None:
    """One unbroken run of marks: '~' around a single '^', starting and ending on a character that
    is not a space (a span is a name, a call or an expression, never the blanks around it)."""
    marks = underline.lstrip(" ")
    first = len(underline) - len(marks)
    assert re.fullmatch(r"~*\^~*", marks), underline
    if first == len(text):  # the line ends early: a lone caret just after it
        assert marks == "^"
        return
    assert text[first] != " " and text[len(underline) - 1] != " ", (text, underline)


def test_source_lines_are_counted_at_newlines_only(tmp_path: Path) -> None:
    """A form feed or U+0085 in a comment starts no line for the parser, so none for the quote."""
    from irc.diagnostics import IrcError, render
    from irc.pipeline import load_graph

    text = "model m(B) {\n  # a form feed \x0c and a next-line \x85 in a comment\n  input x: f32[B, 8]\n" \
           "  output y = linear(x, 0)\n}\n"
    (tmp_path / "m.arch").write_text(text, encoding="utf-8")
    with pytest.raises(IrcError) as info:
        load_graph(tmp_path / "m.arch")
    assert render(info.value).splitlines()[1] == "     4 |   output y = linear(x, 0)"


def test_usage_errors_have_no_location() -> None:
    for name in ("define_conflict", "define_not_integer", "define_zero", "define_malformed", "define_too_large"):
        text = (ERRORS_DIR / f"{name}.err").read_text(encoding="utf-8")
        assert text.startswith("irc: error: -D"), name


def test_every_op_has_an_error_case() -> None:
    texts = "\n".join(p.read_text(encoding="utf-8") for p in ERRORS_DIR.glob("*.err"))
    missing = sorted(op for op in OPS if op != "input" and f"'{op}'" not in texts)
    assert not missing, f"ops no golden diagnostic names: {missing}"


def test_at_least_40_cases() -> None:
    assert len(CASES) >= 40


def test_wanted_list_names_real_cases() -> None:
    stems = {c.stem for c in CASES}
    assert set(WANTED) <= stems
    assert NO_LOCATION <= stems


def test_no_orphan_expectations() -> None:
    stems = {c.stem for c in CASES}
    assert sorted(p.stem for p in ERRORS_DIR.glob("*.err") if p.stem not in stems) == []


def test_no_location_list_is_current() -> None:
    """A case listed as having no location must still lack one (drop it from the set once fixed)."""
    for name in sorted(NO_LOCATION):
        first = (ERRORS_DIR / f"{name}.err").read_text(encoding="utf-8").splitlines()[0]
        assert not _LOCATED.match(first), f"{name} now has a location: remove it from NO_LOCATION"


# -- the catalogue covers every error path (issue 7) ---------------------------------------
# Every IrcError / ShapeError / AttrError / UsageError records where it was raised (its
# origin, path:line), and so does a backend renderer's ``raise ctx.error(...)``. The cases
# above, and the STAGED cases of tests/test_error_catalogue_{runtime,backends}.py, must reach
# every such raise in the files below.

CATALOGUE_SCOPE = ["frontends/arch/*.py", "irc/ops/*.py", "irc/passes/*.py", "irc/pipeline.py", "irc/ir_parser.py",
                   "irc/graph.py", "irc/cli.py", "irc/diagnostics.py", "irc/analysis/*.py", "irc/lint/*.py",
                   "irc/runtime/weights.py", "irc/runtime/array_files.py", "irc/runtime/safetensors_files.py",
                   "irc/runtime/inputs.py", "irc/runtime/memory.py", "irc/runtime/compare.py", "irc/runtime/init.py",
                   "irc/runtime/graphs.py", "irc/runtime/cli.py", "irc/runtime/weight_headers.py",
                   "irc/output_files.py", "irc/file_kinds.py", "backends/**/*.py", "frontends/hf/*.py",
                   "irc/runtime/weight_map.py", "irc/weights_cli.py", "irc/import_cli.py"]
_ERRORS = {"IrcError", "ShapeError", "AttrError", "UsageError"}
ROOT = ERRORS_DIR.parents[2]

# (file, text of the raise) for paths no input can reach today, or that CI cannot afford
UNREACHED: dict[tuple[str, str], str] = {
    ("frontends/arch/parse.py", "str(e).splitlines()[0]"): "other Lark errors do not occur with lexer='basic'",
    ("frontends/arch/builder.py", "unknown dtype"): "the grammar's DTYPE only matches INPUT_DTYPES",
    ("frontends/arch/build_exprs.py", "f\"unexpected '{tree}'\""): "bare tokens never reach _expr",
    ("frontends/arch/build_exprs.py", "bad number"):
        "every NUMBER token that passes the digit limit is a valid Fraction",
    ("irc/passes/shape_infer.py", "unknown op"): "verify() and the IR parser reject unknown ops first",
    ("irc/graph.py", "unknown op"): "the IR parser rejects unknown ops first",
    ("irc/graph.py", "before it is defined"): "the IR parser reports it first, at the operand; the builder cannot",
    ("irc/graph.py", "is defined twice"): "the IR parser reports it first, with both places; the builder cannot",
    ("irc/graph.py", "is not defined"): "the IR parser reports it first, at the output; the builder cannot",
    ("irc/diagnostics.py", "cannot read"): "permission and I/O errors cannot be staged in a checked-in case",
    ("irc/ops/cost.py", "cannot count the cost"): "analyze_graph checks that every type is concrete first",
    ("irc/analysis/flops.py", "no FLOP formula"): "every op has a formula; tests/test_analysis_flops.py checks the "
                                                  "table, and stages this error by removing one",
    ("backends/__init__.py", "cannot emit source yet"): "both code-generating backends (cpu, cuda) define emit_source",
    ("irc/runtime/safetensors_files.py", "the file ends first"):
        "the file would have to shrink between the header check and the read",
    ("irc/runtime/safetensors_files.py", "does not fit in the"):
        "tests/test_hardening_files.py runs it under a memory limit in a child process",
    ("irc/runtime/array_files.py", "but only {got:,} follow"):
        "the header check reports a short entry first; this one needs the file to shrink while it is read",
    ("irc/runtime/array_files.py", "do not fit in the memory left"):
        "tests/test_hardening_files.py runs it under a memory limit in a child process",
    ("backends/cpu/render/elementwise.py", "needs a floating-point input"):
        "the shape inference of every activation rejects an integer input first",
    ("backends/cuda/render/attention.py", "not a multiple of"):
        "sdpa's and attention's shape inference reject query heads that are no multiple of the key/value heads first",
    ("backends/node_view.py", "has no parameter"):
        "renderers ask only for parameters their op always declares, or check has_weight first",
}


def _makes_error(func: object) -> bool:
    """``IrcError(...)`` and the like, or a renderer's ``ctx.error(...)`` / ``self.error(...)``
    (backends/node_view.py: an IrcError recorded as raised where that ``raise`` stands)."""
    import ast

    return ((isinstance(func, ast.Name) and func.id in _ERRORS)
            or (isinstance(func, ast.Attribute) and func.attr == "error"))


def _raise_sites() -> list[tuple[str, int, int, str]]:
    """(path, first line, last line, source) of each raise that creates a user-facing error."""
    import ast

    sites = []
    for pattern in CATALOGUE_SCOPE:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            for n in ast.walk(ast.parse(text)):
                if not (isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and _makes_error(n.exc.func)):
                    continue
                if any(k.arg == "origin" for k in n.exc.keywords):
                    continue  # re-raises an inner error, whose origin is the one recorded
                rel = path.relative_to(ROOT).as_posix()
                sites.append((rel, n.lineno, n.end_lineno or n.lineno, ast.get_source_segment(text, n) or ""))
    return sites


def _case_origin(case: Path) -> str | None:
    """Where the error of ``case`` was raised: run its command as irc.cli.main does."""
    import contextlib
    import io

    from irc.cli import build_parser, check_own_files
    from irc.diagnostics import IrcError, UsageError

    argv, _ = case_argv(case)
    with (contextlib.chdir(case.parent), contextlib.redirect_stdout(io.StringIO()),
          contextlib.redirect_stderr(io.StringIO())):
        args = build_parser().parse_args(argv)
        try:
            check_own_files(args)  # as irc.cli.main does before every command
            args.func(args)
        except (IrcError, UsageError) as e:
            return e.origin
        except RecursionError:
            return None
    return None


def test_catalogue_covers_every_error_raise() -> None:
    # the errors no command line can stage, raised through the Python API
    from test_error_catalogue_backends import staged_origins as backend_origins
    from test_error_catalogue_runtime import staged_origins as runtime_origins

    reached: set[tuple[str, int]] = set()
    origins = [_case_origin(case) for case in CASES] + sorted(runtime_origins() | backend_origins())
    for origin in origins:
        if origin:
            path, _, line = origin.rpartition(":")
            reached.add((path, int(line)))
    sites = _raise_sites()
    assert len(sites) > 100  # the scan found the raises

    def covered(site: tuple[str, int, int, str]) -> bool:
        return any(p == site[0] and site[1] <= line <= site[2] for p, line in reached)

    def excused(site: tuple[str, int, int, str]) -> bool:
        return any(p == site[0] and needle in site[3] for p, needle in UNREACHED)

    missing = [f"{p}:{a}: {src.splitlines()[0].strip()}" for p, a, b, src in sites
               if not covered((p, a, b, src)) and not excused((p, a, b, src))]
    assert not missing, (f"{len(missing)} of {len(sites)} error raises have no case in tests/golden/errors "
                         "or in STAGED (tests/test_error_catalogue_{runtime,backends}.py):\n"
                         + "\n".join(missing))
    stale = [k for k in UNREACHED if not any(p == k[0] and k[1] in src for p, _, _, src in sites)]
    assert not stale, f"UNREACHED entries that match no raise any more: {stale}"
