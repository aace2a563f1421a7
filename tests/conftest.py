"""Shared fixtures: golden-file comparison and an in-process ``irc`` runner.

Golden files
------------
``tests/golden/ops/*.ir`` (expected IR dumps) and ``tests/golden/errors/*.err`` (expected
stderr) are checked-in text. A test compares the compiler's output with them byte for byte.

    pytest tests/test_golden.py tests/test_diagnostics.py --update-golden

rewrites every golden file from the current output instead of comparing (and creates the
missing ones). Review the diff before committing it: a golden is right only once each shape
in it has been checked by hand against its formula (tests/test_language.py holds those
checks as independent assertions), and each message reads well.

Case directives
---------------
A golden input may start with comment lines that the runner reads:

    # args: -D T=8 --model enc     extra command-line arguments (shell-split)
    # exit: 2                      expected exit status (error cases; default 1)
    # file: nothere.arch           compile this path (relative to the case) instead of the case
                                   itself: for inputs that cannot be a case file (missing, binary)
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite tests/golden/** expected files from the current output instead of comparing",
    )


@dataclass(frozen=True)
class CliResult:
    rc: int
    out: str
    err: str


def run_irc(argv: list[str], cwd: Path | None = None) -> CliResult:
    """Run ``irc.cli.main(argv)`` in this process, capturing stdout, stderr and the exit status.

    Any exception other than SystemExit escaping ``main`` propagates: that would be a traceback.
    """
    from irc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: --help, --version, usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return CliResult(rc, out.getvalue(), err.getvalue())


@pytest.fixture
def irc_cli() -> Callable[..., CliResult]:
    return run_irc


def directives(path: Path) -> dict[str, str]:
    """The ``# key: value`` comment lines at the top of a golden input."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in ("args", "exit", "file"):
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class CaseRun:
    result: CliResult
    expected_exit: int


def run_case(path: Path, expected_exit: int = 0) -> CaseRun:
    """``irc compile NAME [args]`` run from the case's folder, so locations read ``NAME:line:col``."""
    found = directives(path)
    args = shlex.split(found.get("args", ""))
    # lints are tested in tests/test_lint.py; here they would only add noise to the goldens
    result = run_irc(["compile", found.get("file", path.name), "-W", "no-all", *args], cwd=path.parent)
    return CaseRun(result, int(found.get("exit", expected_exit)))


@pytest.fixture
def golden_case() -> Callable[..., CaseRun]:
    return run_case


class Golden:
    """Compare text with a golden file, or rewrite it under ``--update-golden``."""

    def __init__(self, update: bool):
        self.update = update

    def check(self, path: Path, actual: str) -> None:
        if self.update:
            if not path.exists() or path.read_text(encoding="utf-8") != actual:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(actual, encoding="utf-8")
                os.replace(tmp, path)
            assert path.read_text(encoding="utf-8") == actual
            return
        assert path.exists(), f"{path.relative_to(ROOT)} is missing; create it with pytest --update-golden"
        expected = path.read_text(encoding="utf-8")
        if actual != expected:
            diff = "".join(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                fromfile=f"{path.name} (golden)", tofile=f"{path.name} (actual)",
            ))
            pytest.fail(f"output differs from {path.relative_to(ROOT)} (rerun with --update-golden if intended):\n"
                        + diff, pytrace=False)


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(bool(request.config.getoption("--update-golden")))
