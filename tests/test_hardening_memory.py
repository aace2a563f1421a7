"""The memory guard counts what a run allocates and respects the tightest limit (issue 19, item 4).

The limits: ``ulimit -v`` (tested in a child under ``resource.setrlimit(RLIMIT_AS)``), a
cgroup's ``memory.max`` (read from a fake cgroup tree), and the system's MemAvailable. The
chunked statistics and comparison that keep a run's extra memory bounded are checked
against NumPy's whole-array versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from irc.runtime import cli as run_cli
from irc.runtime import compare, memory
from irc.runtime.graphs import graph_from_source

CHILD = """
import resource, sys
import irc.cli, irc.runtime.cli, irc.pipeline, irc.frontends.arch, irc.backends.numpy_ref
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(irc.cli.main(sys.argv[2:]))
"""


def run_capped(argv: list[str], cwd: Path, headroom: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", CHILD, str(headroom), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def test_a_run_over_the_address_space_limit_is_refused_before_it_allocates(tmp_path: Path) -> None:
    # 256 MiB per activation: a few of them, with --check's float64 copies, are far above 200 MiB
    (tmp_path / "big.arch").write_text("model big() {\n  input x: f32[64, 1024, 1024]\n  output y = relu(x)\n}\n")
    r = run_capped(["run", "big.arch", "--check"], tmp_path, 200 * 2**20)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("irc: error: running 'big' needs about ")
    assert "more than the address-space limit (ulimit -v) less what irc has mapped" in r.stderr


def test_a_run_the_guard_lets_through_completes_under_the_limit(tmp_path: Path) -> None:
    """The estimate is honest: a run it admits does not run out of memory under the same limit."""
    (tmp_path / "m.arch").write_text("model m() {\n  input x: f32[16, 1024, 256]\n  h = relu(x)\n"
                                     "  output y = h * h\n}\n")  # 16 MiB per activation
    graph = graph_from_source((tmp_path / "m.arch").read_text())
    need = max(sum(p.values()) for _, p in memory.run_phases(graph, "numpy", True, True))
    r = run_capped(["run", "m.arch", "--check", "-o", "out.npz"], tmp_path, int(need * 1.2) + 64 * 2**20)
    assert r.returncode == 0, r.stderr
    assert "y: " in r.stdout and "ok" in r.stdout


def _fake_cgroup(tmp_path: Path, v2: bool, limit: str, usage: str) -> tuple[str, str]:
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    if v2:
        proc.write_text("0::/user.slice/job\n")
        folder = root / "user.slice" / "job"
        folder.mkdir(parents=True)
        (folder / "memory.max").write_text(limit + "\n")
        (folder / "memory.current").write_text(usage + "\n")
    else:
        proc.write_text("5:devices:/\n4:memory:/docker/abc\n0::/\n")
        folder = root / "memory" / "docker" / "abc"
        folder.mkdir(parents=True)
        (folder / "memory.limit_in_bytes").write_text(limit + "\n")
        (folder / "memory.usage_in_bytes").write_text(usage + "\n")
    return str(proc), str(root)


@pytest.mark.parametrize("v2", [True, False])
def test_the_container_limit_is_read_from_the_cgroup(tmp_path: Path, v2: bool) -> None:
    proc, root = _fake_cgroup(tmp_path, v2, str(8 * 2**30), str(3 * 2**30))
    assert memory._cgroup_room(proc, root) == 5 * 2**30
    unlimited = "max" if v2 else str(2**63 - 4096)
    (tmp_path / "u").mkdir()
    proc, root = _fake_cgroup(tmp_path / "u", v2, unlimited, "0")
    assert memory._cgroup_room(proc, root) is None


def test_the_tightest_limit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 20 * 2**30)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 2 * 2**30)
    monkeypatch.setattr(memory, "_address_space_room", lambda: None)
    assert memory.available_bytes() == (2 * 2**30, "the container's memory limit (cgroup) less its usage")


def test_check_and_the_cpu_backend_are_counted() -> None:
    graph = graph_from_source("model m() {\n  input x: f32[64, 256]\n  output y = linear(x, 256)\n}\n")

    def phase(backend: str, check: bool, name: str) -> int:
        return sum(dict(memory.run_phases(graph, backend, check, True))[name].values())

    weights = (256 * 256 + 256) * 4
    assert phase("cpu", False, "run") - phase("numpy", False, "run") == weights  # the cpu backend's merged copy
    assert phase("numpy", True, "check") > 2 * phase("numpy", True, "run")  # float64 weights and activations
    assert phase("numpy", False, "loading") == weights + 256 * 256 * 4  # the largest weight while it is drawn


def test_one_byte_formatter() -> None:
    from irc.analysis.units import binary_bytes

    for n in (0, 1023, 1024, 25.1 * 2**30, 3 * 2**40):
        assert memory.fmt_bytes(n) == binary_bytes(n)
    assert memory.fmt_bytes(25.1 * 2**30) == "25.1 GiB"


def test_chunked_statistics_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_cli, "SUMMARY_CHUNK", 7)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((13, 11)).astype(np.float32)
    a[2, 3], a[5, 5] = np.nan, np.inf
    mean, std, lo, hi = run_cli.finite_stats(a)
    finite = a[np.isfinite(a)].astype(np.float64)
    assert mean == pytest.approx(finite.mean(), rel=1e-12)
    assert std == pytest.approx(finite.std(), rel=1e-12)
    assert (lo, hi) == (finite.min(), finite.max())
    assert run_cli.finite_stats(np.full(5, np.nan, np.float32)) is None


def test_chunked_comparison_matches_the_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare, "CHUNK", 5)
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((9, 7))
    out = (ref + 1e-3 * rng.standard_normal((9, 7))).astype(np.float32)
    want = np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert compare.rel_error(out, ref) == pytest.approx(want, rel=1e-12)
    bad = out.copy()
    bad[0, 0], bad[8, 6] = np.nan, np.inf
    assert compare.nonfinite(bad) == "1 NaN, 1 Inf"
    # a NaN is never a match, in any chunk, whatever else the chunk holds (Python's max() drops NaN)
    assert np.isnan(compare.rel_error(np.full((9, 7), np.nan), ref))
    hidden = out.copy()
    hidden[0, 0], hidden[0, 1] = np.nan, 100.0  # one chunk: a NaN next to a 100× error
    assert not compare.rel_error(hidden, ref) <= 1e-5
