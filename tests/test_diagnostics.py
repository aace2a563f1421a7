"""Golden diagnostics: each tests/golden/errors/* input gives exactly its .err text on stderr.

A case is ``NAME.arch`` (or ``NAME.ir``, read as IR text) with its expected stderr in
``NAME.err``; ``# args:`` and ``# exit:`` lines at the top add CLI arguments and set the
expected exit status (default 1). Files under ``errors/inc/`` are helpers that cases ``use``.
Rewrite the .err files with ``pytest --update-golden`` (tests/conftest.py) and read every
changed message before committing it.

Messages that are correct in substance but should read better are kept at their current
text; WANTED below says what each should say, so the lead can change the code and the
golden together.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from irc.ops import OPS

ERRORS_DIR = Path(__file__).resolve().parent / "golden" / "errors"
CASES = sorted([*ERRORS_DIR.glob("*.arch"), *ERRORS_DIR.glob("*.ir")])

# case -> the message it should give instead (the golden keeps the current text).
WANTED: dict[str, str] = {
    # -- wrong: the message names the wrong problem --------------------------------------
    # a misspelled tensor name becomes an enum value, then an attribute of relu
    "undefined_name_as_input": "undefined name 'inpt'; did you mean 'inp'?",
    "number_as_tensor_input": "'relu' needs a tensor input, got the number 3",
    # relu is an op, and the suggestion repeats the name
    "repeat_not_a_block": "repeat needs a block, but 'relu' is a layer; wrap it in a block",
    # the cycle is missed when paths differ (inc/../x.arch): key loaded files by Path.resolve()
    "use_cycle_two_files": "use_cycle_two_files.arch:2:5 (in inc/cycle_b.arch:1:5): error: 'use' cycle: "
                           "use_cycle_two_files.arch → cycle_b.arch → use_cycle_two_files.arch",
    # a name close to nothing still gets a suggestion (difflib cutoff 0.6 is too low)
    "unknown_op_no_suggestion": "unknown layer or block 'frobnicate' (no suggestion)",
    # an unknown name in a shape is reported as a type problem
    "undefined_name_in_shape": "undefined name 'dd'; did you mean 'd'?",
    "unbound_symbol": "undefined name 'N'; to make it a symbolic size, declare it in the header: model m(B, N)",
    # the size is caught as an element-count overflow at the input's name, with a 60-digit count
    "dim_too_large": "a dimension must be below 2**62, got 1000000000000000000000000000000 (caret at 'n' in the shape)",
    # -- missing: a did-you-mean that 'output NAME' already gives ---------------------------
    "undefined_name_in_layer_args": "undefined name 'inpt'; did you mean 'inp'?",
    "undefined_name_in_arithmetic": "undefined name 'inpt'; did you mean 'inp'?",
    "undefined_enum_value": "... one of sinusoidal, learned; got 'lerned'; did you mean 'learned'?",
    "attr_wrong_enum": "... one of relu, gelu, gelu_tanh, silu, tanh; got 'gelu_fast'; did you mean 'gelu'?",
    "repeat_undefined_block": "unknown block 'layr'; did you mean 'layer'? (repeat takes only blocks)",
    "tied_undefined": "undefined name 'embb'; tied= needs an embedding instance (emb = embedding(V, d))",
    # -- value descriptions ------------------------------------------------------------------
    "attr_none": "attribute 'heads' of 'attention' must be an integer, got none (not 'NoneType')",
    "attr_string": "attribute 'out' of 'linear' must be a positive size, got the string \"four\" (not 'name')",
    "attr_float_for_int": "attribute 'axis' of 'softmax' must be an integer, got 1.5 (not 'rational 3/2')",
    # -- clumsier than needed ----------------------------------------------------------------
    "matmul_batch_mismatch": "'matmul': batch dimensions [2,3] and [3,1] do not broadcast "
                             "(not 'cannot broadcast f32[2,3] with f32[3,1]', which are not operand types)",
    "matmul_contraction": "'matmul': inner sizes differ (8 and 6): f32[4,8] @ f32[6,3]",
    "unembed_tied_width": "'unembed': tied to 'emb', whose rows have 64 features, but the input has 32",
    "reshape_two_minus_one": "'reshape': the shape [-1, 2, -1] has two -1 entries; at most one is allowed",
    "block_too_many_args": "block 'f' takes 1 argument, got 2",
    "output_layer_instance": "'relu' needs 1 tensor input, got 0",
    "duplicate_block": "'f' is already defined in this scope, with 'note: first defined at 4:9'",
    "split_to_one_name": "same text, caret under 'split' (4:14), not under 'output'",
    # -- syntax: say what is missing, not every token that could follow ----------------------
    "syntax_unterminated_string": "unterminated string (not 'unexpected character '\"'')",
    "syntax_unterminated_block": "unexpected end of file; expected '}' to close the model opened at 2:12",
    "syntax_eof_in_expression": "unexpected end of file; expected an expression",
    "syntax_double_operator": "unexpected '@'; expected an expression",
    "syntax_missing_paren": "expected ')' or ',' — caret at the end of line 4, where the ')' belongs",
    "use_error_in_used_file": "unexpected '}'; expected ')' to close the call opened at 2:14 "
                              "(today ')' is lost in an alphabetical list cut at 8 entries)",
    # -- IR input ----------------------------------------------------------------------------
    "ir_undefined_value": "ir_undefined_value.ir:4:13: error: %z is used before it is defined (no location today)",
    "ir_bad_dim": "ir_bad_dim.ir:3:23: error: bad dimension '8$' (caret under '$', no second column count)",
    # the column counts from the stripped line: indentation and the skipped space are lost
    "ir_bad_character": "ir_bad_character.ir:4:16: error: unexpected character '~' (caret under it, not under %x)",
    "ir_expected_token": "expected '=', got 'relu' (quote the expected token too)",
    "ir_operand_count": "ir_operand_count.ir:4:3: error: 'linear' takes 1 operand, got 2 (no location today: "
                        "nodes read from IR without loc() should carry their IR line)",
    "ir_result_count": "ir_result_count.ir:4:3: error: 'relu' has 1 result but 2 names",
    "ir_type_count": "ir_type_count.ir:4:3: error: 'relu' has 2 results but 1 type",
    "ir_no_outputs": "ir_no_outputs.ir:2:1: error: graph 'm' has no outputs (at the graph line)",
    "ir_undefined_output": "ir_undefined_output.ir:4:14: error: output y = %zz is not defined",
    "ir_value_defined_twice": "ir_value_defined_twice.ir:4:3: error: value %x is defined twice (note: first at 3:3)",
    "ir_define_unknown_symbol": "located at the graph header, as the .arch case is (define_unknown_symbol)",
    "not_utf8": "inc/not_utf8.arch:2:21: error: the file is not UTF-8 text (byte 0xff)",
    "ir_not_utf8": "inc/not_utf8.ir:2:14: error: the file is not UTF-8 text (byte 0xfe)",
    "use_a_directory": "'inc' is a folder, not an .arch file (not '[Errno 21] Is a directory: 'inc'')",
    "output_unwritable": "cannot write 'inc/lib.arch/out.ir': 'inc/lib.arch' is not a folder (not 'File exists')",
    "symbolic_modulo": "'%' is not defined for symbolic sizes (today's text is wrong: 2 is a constant integer divisor)",
    # -- exit status -------------------------------------------------------------------------
    "model_option_unknown": "exit 2: --model naming nothing in the file is bad usage, like an unknown -D format",
}

# cases whose message has no file:line:col today (each is in WANTED or is a usage error)
NO_LOCATION = {
    # usage errors: the command line, not a file, is wrong
    "define_conflict", "define_not_integer", "define_zero", "define_malformed", "define_too_large", "unknown_pass",
    "output_unwritable", "model_option_unknown",
    # inputs with no line to point at
    "missing_file",
    # each of these is in WANTED
    "use_cycle_two_files", "not_utf8", "ir_not_utf8", "ir_define_unknown_symbol", "ir_undefined_value",
    "ir_operand_count", "ir_result_count", "ir_type_count", "ir_no_outputs", "ir_undefined_output",
    "ir_value_defined_twice",
}

_LOCATED = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): error: \S")


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_error_golden(case: Path, golden, golden_case) -> None:
    run = golden_case(case, expected_exit=1)
    result = run.result
    assert result.rc == run.expected_exit, result.err
    assert result.out == ""
    assert "Traceback" not in result.err and "internal error" not in result.err
    golden.check(case.with_suffix(".err"), result.err)


@pytest.mark.parametrize("case", [c for c in CASES if c.stem not in NO_LOCATION], ids=lambda p: p.stem)
def test_error_has_location_source_line_and_caret(case: Path) -> None:
    """file:line:col: error: message, then the quoted source line, then a caret under the column."""
    lines = case.with_suffix(".err").read_text(encoding="utf-8").splitlines()
    m = _LOCATED.match(lines[0])
    assert m, lines[0]
    where = ERRORS_DIR / m["file"]
    src = where.read_text(encoding="utf-8").splitlines() if where.exists() else []
    line, col = int(m["line"]), int(m["col"])
    if not src:  # an empty file has no line to quote
        return
    assert 1 <= line <= len(src)
    assert lines[1] == f"  {line:>4} | {src[line - 1].expandtabs(1)}"
    assert lines[2] == "       | " + " " * (col - 1) + "^"
    assert col <= len(src[line - 1]) + 1


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
# origin, path:line). The cases above must reach every such raise in the files below.

CATALOGUE_SCOPE = ["frontends/arch/*.py", "irc/ops/*.py", "irc/passes/shape_infer.py", "irc/passes/bind.py",
                   "irc/pipeline.py", "irc/ir_parser.py", "irc/graph.py", "irc/cli.py"]
_ERRORS = {"IrcError", "ShapeError", "AttrError", "UsageError"}
ROOT = ERRORS_DIR.parents[2]

# (file, text of the raise) for paths no input can reach today, or that CI cannot afford
UNREACHED: dict[tuple[str, str], str] = {
    ("frontends/arch/parse.py", "unexpected end of file"): "the LALR parser reports EOF as UnexpectedToken $END",
    ("frontends/arch/parse.py", "str(e).splitlines()[0]"): "other Lark errors do not occur with lexer='basic'",
    ("frontends/arch/builder.py", "unknown dtype"): "the grammar's DTYPE only matches INPUT_DTYPES",
    ("frontends/arch/builder.py", "f\"unexpected '{tree}'\""): "bare tokens never reach _expr",
    ("frontends/arch/builder.py", "raise IrcError(f\"undefined name '{v.name}'\", v.loc)"):
        "two identical raises: _value's is reached; _list_item's never is (list items pass _value first)",
    ("frontends/arch/builder.py", "bad number"): "every NUMBER token is a valid Fraction",
    ("frontends/arch/builder.py", "the model expands to more than"): "2,000,000 nodes take too long for CI",
    ("irc/ops/dense.py", "expects floating-point input"): "_check_not_int is never called (dead code)",
    ("irc/passes/shape_infer.py", "unknown op"): "verify() and the IR parser reject unknown ops first",
    ("irc/graph.py", "unknown op"): "the IR parser rejects unknown ops first",
}


def _raise_sites() -> list[tuple[str, int, int, str]]:
    """(path, first line, last line, source) of each raise that creates a user-facing error."""
    import ast

    sites = []
    for pattern in CATALOGUE_SCOPE:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            for n in ast.walk(ast.parse(text)):
                if not (isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
                        and isinstance(n.exc.func, ast.Name) and n.exc.func.id in _ERRORS):
                    continue
                if any(k.arg == "origin" for k in n.exc.keywords):
                    continue  # re-raises an inner error, whose origin is the one recorded
                rel = path.relative_to(ROOT).as_posix()
                sites.append((rel, n.lineno, n.end_lineno or n.lineno, ast.get_source_segment(text, n) or ""))
    return sites


def _case_origin(case: Path) -> str | None:
    """Where the error of ``case`` was raised: run the compile command as irc.cli.main does."""
    import contextlib
    import io
    import shlex

    from irc.cli import build_parser
    from irc.diagnostics import IrcError, UsageError

    head = {}
    for line in case.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        head[key.strip()] = value.strip()
    argv = ["compile", head.get("file", case.name), *shlex.split(head.get("args", ""))]
    with contextlib.chdir(case.parent), contextlib.redirect_stdout(io.StringIO()):
        args = build_parser().parse_args(argv)
        try:
            args.func(args)
        except (IrcError, UsageError) as e:
            return e.origin
        except RecursionError:
            return None
    return None


def test_catalogue_covers_every_error_raise() -> None:
    reached: set[tuple[str, int]] = set()
    for case in CASES:
        origin = _case_origin(case)
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
    assert not missing, (f"{len(missing)} of {len(sites)} error raises have no case in tests/golden/errors:\n"
                         + "\n".join(missing))
    stale = [k for k in UNREACHED if not any(p == k[0] and k[1] in src for p, _, _, src in sites)]
    assert not stale, f"UNREACHED entries that match no raise any more: {stale}"
