"""The kernel cache runs only what irc checked (issue 19): planted bytecode and pickles never
run, damaged or replaced files are rebuilt, a full disk compiles elsewhere, and the compile
child dies with irc.

Every case starts from one pristine cache (compiled once per module, copied with its mtimes,
so Numba's stamps still match), plants or damages something, compiles again, and checks that
the planted code did not run (its marker file is absent) and that the outputs equal the
NumPy reference. Each plant is first shown to be live: the same bytes, given to what Python
or Numba would do with them, do create a marker.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from test_cpu_backend_helpers import TINY, assert_matches, reference, tiny_case

from irc.backends.common.cache import cache_key, entry_path
from irc.backends.common.manifest import numba_cache_files
from irc.backends.cpu import BACKEND_VERSION, compile_graph


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("pristine") / "cpu"
    graph, _, _ = tiny_case()
    compile_graph(graph, cache_dir=cache)
    return cache


@pytest.fixture
def cache(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cpu"
    shutil.copytree(pristine, copy, symlinks=True)  # copy2: mtimes kept, so Numba's index stays fresh
    return copy


def _check_runs(cache: Path, marker: Path) -> object:
    graph, w, x = tiny_case()
    compiled = compile_graph(graph, cache_dir=cache)
    assert not marker.exists(), "the planted code ran"
    assert_matches(compiled.run(w, x), reference(graph, w, x))
    return compiled


def _entry(cache: Path) -> Path:
    graph, _, _ = tiny_case()
    return entry_path(cache, cache_key(graph, "cpu", BACKEND_VERSION))


def _kernel_files(cache: Path) -> list[Path]:
    return sorted((cache / "kernels").glob("k_*.py"))


def _plant_pyc(source: Path, marker: Path) -> Path:
    """A .pyc for ``source`` that Python's import would run (its stamp is the source's mtime
    and size) and that writes ``marker`` before doing what the source does."""
    from importlib._bootstrap_external import _code_to_timestamp_pyc  # the format import checks

    evil = f"open({str(marker)!r}, 'w').write('ran')\n" + source.read_text()
    code = compile(evil, str(source), "exec")
    st = source.stat()
    pyc = Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(mode=0o700, exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    return pyc


def _plain_import(source: Path, name: str) -> None:
    """What ``importlib`` does with a file: uses its .pyc when the stamp matches."""
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("which", ["graph", "kernel"])
def test_a_planted_pyc_never_runs(cache: Path, tmp_path: Path, which: str) -> None:
    source = _entry(cache) if which == "graph" else _kernel_files(cache)[0]
    marker = tmp_path / "ran"
    _plant_pyc(source, marker)
    _check_runs(cache, marker)
    shown = tmp_path / "shown"
    _plant_pyc(source, shown)  # the source is unchanged, so the same stamp
    _plain_import(source, "irc_trust_probe")
    assert shown.exists(), "the plant is live: a plain import runs it"


class Plant:
    """Unpickling this creates a file (as a hostile pickle could do anything)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_numba_index_is_never_unpickled(cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    indexes = [f for p in _kernel_files(cache) for f in numba_cache_files(p) if f.suffix == ".nbi"]
    assert indexes
    for f in indexes:
        f.write_bytes(pickle.dumps(Plant(marker)))
    compiled = _check_runs(cache, marker)
    assert compiled.stats.compiled == 2, "deleted before numba read them, and compiled again"
    pickle.loads(pickle.dumps(Plant(tmp_path / "shown")))
    assert (tmp_path / "shown").exists(), "the plant is live: unpickling runs it"
    assert compile_graph(tiny_case()[0], cache_dir=cache).stats.cache_hits == 2, "sealed again"


def test_an_unlisted_numba_file_is_deleted(cache: Path, tmp_path: Path) -> None:
    kernel = _kernel_files(cache)[0]
    extra = kernel.parent / "__pycache__" / f"{kernel.stem}.extra-1.py311.nbc"
    extra.write_bytes(pickle.dumps(Plant(tmp_path / "ran")))
    _check_runs(cache, tmp_path / "ran")
    assert not extra.exists()


@pytest.mark.parametrize("folder", ["kernels/__pycache__", "kernels", "__pycache__"])
def test_a_folder_others_can_write_is_made_again(cache: Path, tmp_path: Path, folder: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    target = cache / folder
    target.mkdir(exist_ok=True)
    marker = tmp_path / "ran"
    for f in [f for p in _kernel_files(cache) for f in numba_cache_files(p)]:
        f.write_bytes(pickle.dumps(Plant(marker)))  # what another user could have written
    target.chmod(0o777)
    _check_runs(cache, marker)
    assert (target.stat().st_mode & 0o077) == 0, "private again"
    assert f"deleted '{target}' from the kernel cache and made it again: others can write it" in capsys.readouterr().err


def test_a_folder_of_another_user_is_made_again(cache: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    target = cache / "kernels" / "__pycache__"
    os.chown(target, 12345, 12345)
    _check_runs(cache, tmp_path / "ran")
    assert target.stat().st_uid == 0
    assert "it belongs to another user" in capsys.readouterr().err


def test_a_folder_above_that_others_can_write_is_refused(pristine: Path, tmp_path: Path) -> None:
    from irc.diagnostics import IrcError

    (tmp_path / "open").mkdir()
    shutil.copytree(pristine, tmp_path / "open" / "cpu", symlinks=True)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(IrcError, match="which others can write"):
        compile_graph(tiny_case()[0], cache_dir=tmp_path / "open" / "cpu")
    (tmp_path / "open").chmod(0o1777)  # sticky, as /tmp: others cannot move our entries
    _check_runs(tmp_path / "open" / "cpu", tmp_path / "ran")


def test_a_damaged_pyc_is_ignored(cache: Path, tmp_path: Path) -> None:
    for source in [_entry(cache), *_kernel_files(cache)]:
        pyc = _plant_pyc(source, tmp_path / "ran")
        data = bytearray(pyc.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pyc.write_bytes(bytes(data))
    compiled = _check_runs(cache, tmp_path / "ran")
    assert not compiled.rebuilt and compiled.stats.cache_hits == 2


@pytest.mark.parametrize("what", ["entry", "lock", "kernel", "kernel lock", "manifest"])
def test_a_file_replaced_by_a_folder_is_rebuilt(cache: Path, tmp_path: Path, what: str) -> None:
    entry, kernel = _entry(cache), _kernel_files(cache)[0]
    target = {"entry": entry, "lock": entry.with_suffix(".lock"), "kernel": kernel,
              "kernel lock": kernel.parent / f"g_{kernel.stem}.lock", "manifest": kernel.with_suffix(".numba")}[what]
    assert target.exists(), target
    target.unlink()
    target.mkdir()
    (target / "inside").write_text("x")
    _check_runs(cache, tmp_path / "ran")
    assert target.is_file()


def test_a_full_disk_compiles_in_a_fresh_folder(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if str(kwargs.get("dir", "")).startswith(str(cache)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    _entry(cache).unlink()  # so the entry must be written
    compiled = _check_runs(cache, tmp_path / "ran")
    assert not str(compiled.path).startswith(str(cache))
    assert f"cannot use the kernel cache '{cache}': no space left on the device" in capsys.readouterr().err


# -- the compile child ends with irc ------------------------------------------------------

CHILD_PROGRAM = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_cpu_backend_helpers import build
    from irc.backends.cpu import compile_graph
    graph = build({model!r}, B=2)
    compile_graph(graph, cache_dir={cache!r})
""")

# many distinct kernels, so the cold compile lasts long enough to be interrupted
SLOW = """
model slow(B) {
  input x: f32[B, 8, 8, 8]
  output a = gelu(layernorm(x))
  output b = softmax(tanh(x))
  output c = rmsnorm(sigmoid(x))
  output d = silu(conv2d(x, 4, 3, padding=same))
}
"""


def _compile_children(pid: int) -> list[int]:
    """The compile children of ``pid`` (not the short-lived helpers a library may spawn)."""
    try:
        found = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [c for c in found if b"child_main" in _cmdline(c)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_compile_child_dies_with_irc(tmp_path: Path, sig: signal.Signals) -> None:
    if not Path("/proc/self/task").exists():
        pytest.skip("needs Linux /proc to find the child")
    program = CHILD_PROGRAM.format(tests=str(Path(__file__).parent), model=SLOW, cache=str(tmp_path / "cpu"))
    parent = subprocess.Popen([sys.executable, "-c", program], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    children: list[int] = []
    while not children and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.05)
        children = _compile_children(parent.pid)
    assert children, "the compile child did not start"
    time.sleep(0.5)  # the child is compiling
    assert all(_alive(c) for c in children), "the compile child ended before the signal: the test shows nothing"
    parent.send_signal(sig)
    parent.wait(timeout=30)
    # a child left alone would go on to the end of its kernel (seconds: these take 1-5 s each)
    deadline = time.monotonic() + 2.0
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(_alive(c) for c in children), "the compile child outlived irc"


def test_irc_run_repairs_a_tampered_cache_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      irc_cli) -> None:
    """End to end: after another user could write Numba's folder and planted its pickles,
    `irc run --check` exits 0, says what it deleted, matches the reference, runs no plant."""
    model = tmp_path / "tiny.arch"
    model.write_text(TINY)
    monkeypatch.setenv("IRC_CACHE_DIR", str(tmp_path / "cache"))
    first = irc_cli(["run", str(model), "-DB=2", "--backend", "cpu", "--check"])
    assert first.rc == 0, first.err
    kernels = tmp_path / "cache" / "cpu" / "kernels"
    marker = tmp_path / "ran"
    planted = [f for p in kernels.glob("k_*.py") for f in numba_cache_files(p)]
    assert planted
    for f in planted:
        f.write_bytes(pickle.dumps(Plant(marker)))
    (kernels / "__pycache__").chmod(0o777)
    again = irc_cli(["run", str(model), "-DB=2", "--backend", "cpu", "--check"])
    assert again.rc == 0, again.err
    assert " ok" in again.out
    assert "irc: note: deleted" in again.err and "others can write it" in again.err
    assert not marker.exists()
