"""Output files and exit codes (issue 19, items 7 and 8): stdout that cannot be written, -o's
mode, folder, name length and empty names, writing over one's own input, bad backends, and the
temporary file of an interrupted or killed write."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

MODEL = "model m() {\n  input x: f32[2, 4]\n  output y = linear(x, 3)\n}\n"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.arch"
    path.write_text(MODEL)
    return path


def test_stdout_that_cannot_be_written_is_exit_1_not_a_bug(model: Path) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "irc.cli", "compile", str(model)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "irc: error: cannot write to standard output: no space left on the device\n"


def test_output_mode_follows_the_umask_and_an_existing_file(model: Path, tmp_path: Path, irc_cli) -> None:
    out = tmp_path / "m.ir"
    old = os.umask(0o022)
    try:
        assert irc_cli(["compile", str(model), "-o", str(out)]).rc == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644  # as open() would leave it, not mkstemp's 0600
        out.chmod(0o640)
        assert irc_cli(["compile", str(model), "-o", str(out)]).rc == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640  # an existing file keeps its mode
        os.umask(0o077)
        fresh = tmp_path / "out.npz"
        assert irc_cli(["run", str(model), "-o", str(fresh)]).rc == 0
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_output_into_a_missing_folder_is_refused(model: Path, tmp_path: Path, irc_cli) -> None:
    r = irc_cli(["compile", str(model), "-o", str(tmp_path / "a" / "b" / "m.ir")])
    assert r.rc == 2
    assert r.err == (f"irc: error: cannot write '{tmp_path / 'a' / 'b' / 'm.ir'}': the folder "
                     f"'{tmp_path / 'a' / 'b'}' does not exist (irc does not create folders; make it first)\n")
    assert not (tmp_path / "a").exists()


def test_a_long_file_name_is_written(model: Path, tmp_path: Path, irc_cli) -> None:
    out = tmp_path / ("n" * 245 + ".npz")  # 249 characters: fine for the file system, once too long with the temp
    r = irc_cli(["run", str(model), "-o", str(out)])
    assert r.rc == 0, r.err
    assert sorted(np.load(out).files) == ["y"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("argv, message", [
    (["run", "{m}", "--weights", ""], "--weights: the file name is empty"),
    (["run", "{m}", "-o", ""], "-o: the file name is empty"),
    (["compile", "{m}", "-o", ""], "-o: the file name is empty"),
    (["run", "{m}", "--backend", "nosuch"], "--backend: unknown backend 'nosuch' (known: numpy, cpu, cuda"),
])
def test_empty_names_and_unknown_backends_are_bad_usage(model: Path, irc_cli, argv: list[str], message: str) -> None:
    r = irc_cli([a.replace("{m}", str(model)) for a in argv])
    assert (r.rc, r.out) == (2, "")
    assert r.err.startswith(f"irc: error: {message}"), r.err


def test_output_over_an_own_input_is_refused(model: Path, tmp_path: Path, irc_cli) -> None:
    weights = tmp_path / "w.npz"
    np.savez(weights, **{"y.weight": np.zeros((3, 4), np.float32), "y.bias": np.zeros(3, np.float32)})
    before = weights.read_bytes()
    r = irc_cli(["run", str(model), "--weights", str(weights), "-o", str(tmp_path / "." / "w.npz")])
    assert r.rc == 2 and "is the weights file; writing there would destroy it" in r.err
    assert weights.read_bytes() == before
    text = model.read_text()
    r = irc_cli(["compile", str(model), "-o", str(model)])
    assert r.rc == 2 and "is the model file" in r.err
    assert model.read_text() == text
    x = tmp_path / "x.npz"
    x.write_bytes(b"")
    r = irc_cli(["run", str(model), "--input", f"x={x}", "-o", str(x)])
    assert r.rc == 2 and "is the input file of x" in r.err


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporary_files_of_a_killed_write_are_removed(model: Path, tmp_path: Path, irc_cli) -> None:
    dead = tmp_path / f".out.npz.{_dead_pid()}-abcd1234.irc-tmp"
    dead.write_bytes(b"half a file")
    alive = tmp_path / f".out.npz.{os.getpid() + 0}-zzzz9999.irc-tmp"  # ours: a write in progress
    other = tmp_path / ".someone-else.tmp"
    for p in (alive, other):
        p.write_bytes(b"x")
    assert irc_cli(["run", str(model), "-o", str(tmp_path / "out.npz")]).rc == 0
    assert not dead.exists()
    assert alive.exists() and other.exists()


WRITER = """
import sys, time
from irc.cli import Terminated, terminate_as_exception
from irc.output_files import write_atomically

def slow(f):
    f.write(b"x" * 65536)
    f.flush()
    print("writing", flush=True)
    time.sleep(30)

try:
    with terminate_as_exception():
        write_atomically(sys.argv[1], slow)
except Terminated:
    sys.exit(143)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_write_removes_the_temporary_file(tmp_path: Path, signum: int, code: int) -> None:
    target = tmp_path / "out.npz"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        temps = [p.name for p in tmp_path.iterdir()]
        assert len(temps) == 1 and temps[0].startswith(".out.npz.") and temps[0].endswith(".irc-tmp")
        child.send_signal(signum)
        assert child.wait(timeout=20) == code
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []


def test_main_turns_sigterm_into_exit_143(tmp_path: Path) -> None:
    """The real command line: a run killed with SIGTERM says so and leaves no temporary file."""
    slow = tmp_path / "slow.arch"  # a model big enough to take a moment on NumPy, small in memory
    slow.write_text("model s() {\n  input x: f32[32768, 256]\n  block layer(h) { return linear(h, 256) }\n"
                    "  output y = repeat(500) layer(x)\n}\n")  # half a minute of NumPy or more, 300 MB
    child = subprocess.Popen([sys.executable, "-m", "irc.cli", "run", str(slow), "-o", str(tmp_path / "o.npz")],
                             stderr=subprocess.PIPE, text=True)
    time.sleep(3.0)  # past start-up (the handler is set first thing), far from the run's end
    child.send_signal(signal.SIGTERM)
    try:
        rc = child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.stderr is not None
    err = child.stderr.read()
    assert rc == 143, err
    assert err.endswith("irc: terminated\n")
    assert [p.name for p in tmp_path.iterdir()] == ["slow.arch"]
