"""The cpu backend's cache: hits and misses, corrupted entries rebuilt, concurrent compiles."""

from __future__ import annotations

import hashlib
import multiprocessing
import stat
from pathlib import Path

import numpy as np
import pytest
from test_cpu_backend_helpers import TINY, assert_matches, build, reference, tiny_case

from irc.backends.common.cache import cache_key, entry_path, read_entry
from irc.backends.common.manifest import numba_cache_files
from irc.backends.cpu import BACKEND_VERSION, compile_graph, emit_source
from irc.diagnostics import IrcError
from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.printer import print_graph


def test_miss_then_hit(tmp_path):
    graph, w, x = tiny_case()
    first = compile_graph(graph, cache_dir=tmp_path)
    assert first.rebuilt and first.stats.kernels == 2 and first.stats.compiled == 2
    path = entry_path(tmp_path, first.key)
    assert path == first.path and path.exists()
    assert path.read_text().split("\n", 1)[1] == emit_source(graph)
    kernels = sorted((tmp_path / "kernels").glob("k_*.py"))
    assert [p.name.split("_")[1] for p in kernels] == ["gemm", "relu"], "one shared file per kernel"
    assert all(numba_cache_files(p) for p in kernels), "numba wrote the compiled kernels beside them"
    second = compile_graph(graph, cache_dir=tmp_path)
    assert not second.rebuilt and second.stats.cache_hits == 2 and second.stats.compiled == 0
    assert_matches(second.run(w, x), reference(graph, w, x))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temporary file is left behind"


def test_key_is_the_ir_text_and_the_version(tmp_path):
    graph, _, _ = tiny_case()
    key = cache_key(graph, "cpu", BACKEND_VERSION)
    text = f"irc cpu backend v{BACKEND_VERSION}\n" + print_graph(graph, with_loc=False)
    assert key == hashlib.sha256(text.encode()).hexdigest()
    assert cache_key(graph, "cpu", BACKEND_VERSION + 1) != key
    moved = graph.copy()  # the same model read from another file: locations differ, the key does not
    for node in moved.nodes:
        node.loc = None
    assert cache_key(moved, "cpu", BACKEND_VERSION) == key
    assert cache_key(build(TINY, B=4), "cpu", BACKEND_VERSION) != key


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "header", "forged", "garbage"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    graph, w, x = tiny_case()
    compile_graph(graph, cache_dir=tmp_path)
    key = cache_key(graph, "cpu", BACKEND_VERSION)
    path = entry_path(tmp_path, key)
    data = path.read_bytes()
    if damage == "truncate":  # a half-written file
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # one byte of the body changed
        i = len(data) - 10
        path.write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "header":  # the header of another key
        path.write_bytes(data.replace(key.encode(), b"0" * 64, 1))
    elif damage == "forged":  # a valid header and checksum over a body irc would not write
        body = data.decode().split("\n", 1)[1] + "\nraise SystemExit('forged')\n"
        digest = hashlib.sha256(body.encode()).hexdigest()
        path.write_text(f"# irc-cache key={key} sha256={digest}\n" + body)
    else:
        path.write_bytes(b"\xff\xfe not python \x00")
    assert read_entry(path, key) != emit_source(graph)
    again = compile_graph(graph, cache_dir=tmp_path)
    assert again.rebuilt
    assert read_entry(path, key) == emit_source(graph)
    assert_matches(again.run(w, x), reference(graph, w, x))


def test_a_corrupted_numba_cache_is_cleared_and_recompiled(tmp_path):
    graph, w, x = tiny_case()
    compile_graph(graph, cache_dir=tmp_path)
    files = [f for p in (tmp_path / "kernels").glob("k_*.py") for f in numba_cache_files(p)]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[:7])  # truncated pickles and indexes
    again = compile_graph(graph, cache_dir=tmp_path)
    # the manifest no longer matches: the files are deleted before numba reads them, and rebuilt
    assert not again.rebuilt and again.stats.compiled == 2 and not again.stats.retried
    assert_matches(again.run(w, x), reference(graph, w, x))
    assert compile_graph(graph, cache_dir=tmp_path).stats.cache_hits == 2, "sealed again"


def test_default_directory_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("IRC_CACHE_DIR", str(tmp_path / "c"))
    graph, _, _ = tiny_case()
    compiled = compile_graph(graph)
    assert compiled.path.parent == tmp_path / "c" / "cpu"
    assert stat.S_IMODE((tmp_path / "c" / "cpu").stat().st_mode) & 0o077 == 0, "created private to the user"


def test_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    graph, _, _ = tiny_case()
    with pytest.raises(IrcError, match="writable by others"):
        compile_graph(graph, cache_dir=shared)


def test_progress_is_reported_per_kernel(tmp_path):
    graph, _, _ = tiny_case()
    seen: list[tuple[int, int, str]] = []
    compile_graph(graph, cache_dir=tmp_path, progress=lambda done, total, what: seen.append((done, total, what)))
    assert seen == [(0, 2, "k_gemm_stream3_none"), (1, 2, "k_relu"), (2, 2, "done")]  # 3 rows: gemm_stream.py


def test_ir_from_text_and_from_arch_share_an_entry(tmp_path):
    graph, _, _ = tiny_case()
    reparsed = PASSES["shape-infer"](parse_ir(print_graph(graph)))
    a = compile_graph(graph, cache_dir=tmp_path)
    b = compile_graph(reparsed, cache_dir=tmp_path)
    assert a.path == b.path and not b.rebuilt


# -- several processes compiling one model at once ----------------------------------------


def _worker(cache_dir: str, barrier, queue, lock: bool) -> None:
    if not lock:  # as on a file system without flock: atomic writes alone must suffice
        import contextlib

        import irc.backends.common.compiled as compiled

        compiled.entry_lock = lambda *args: contextlib.nullcontext()
    graph, w, x = tiny_case()
    barrier.wait()  # start together
    try:
        out = compile_graph(graph, cache_dir=cache_dir).run(w, x)["y"]
        queue.put(("ok", out.tobytes().hex()))
    except BaseException as e:  # report, never hang the parent
        queue.put(("error", f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize(("processes", "lock"), [(2, True), (4, True), (4, False)])
def test_concurrent_compiles_all_succeed_identically(tmp_path, processes, lock):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    queue = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(str(tmp_path), barrier, queue, lock)) for _ in range(processes)]
    for p in workers:
        p.start()
    results = [queue.get(timeout=240) for _ in workers]
    for p in workers:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(status == "ok" for status, _ in results), results
    assert len({out for _, out in results}) == 1, "every process computed the same bytes"
    graph, w, x = tiny_case()
    got = np.frombuffer(bytes.fromhex(results[0][1]), np.float32).reshape(3, 5)
    assert_matches({"y": got}, reference(graph, w, x))
    entries = [p for p in Path(tmp_path).iterdir() if p.suffix == ".py"]
    assert len(entries) == 1 and read_entry(entries[0], cache_key(graph, "cpu", BACKEND_VERSION)) == emit_source(graph)
