"""Weight and input files are checked from their headers before their data is read (issue 19, items 3 and 5).

Each case runs ``irc run`` in a child process whose address space is capped a little above
what the interpreter has mapped once irc is imported (``resource.setrlimit(RLIMIT_AS)``, the
``ulimit -v`` of a shell): a reader that inflated or copied an entry the model never reads
would run out of memory there, where the header check answers within the cap.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

MODEL = "model m() {\n  input x: f32[2, 4]\n  output y = linear(x, 3)\n}\n"
BIG_MODEL = "model big() {\n  input x: f32[1, 8192]\n  output y = linear(x, 8192, bias=false)\n}\n"
HEADROOM = 160 * 2**20  # bytes the child may map beyond what it holds after importing irc
BIG = 2**26  # float32 elements in an entry the model does not read: 256 MiB, more than HEADROOM

CHILD = """
import resource, sys
import irc.cli, irc.runtime.cli, irc.pipeline, irc.runtime.weights, irc.frontends.arch
import irc.backends.numpy_ref
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(irc.cli.main(sys.argv[2:]))
"""


def run_capped(argv: list[str], cwd: Path, headroom: int = HEADROOM) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", CHILD, str(headroom), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=env)


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def good_weights() -> dict[str, np.ndarray]:
    return {"y.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "y.bias": np.zeros(3, np.float32)}


def write_bomb_npz(path: Path, extra_shape: tuple[int, ...] = (BIG,), name: str = "big") -> None:
    """The model's weights but ``name``, and an entry ``name`` of zeros that deflates from 256 MiB to 250 KB."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for key, arr in good_weights().items():
            if key != name:
                z.writestr(f"{key}.npy", npy_bytes(arr))
        info = zipfile.ZipInfo(f"{name}.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as f:
            f.write(npy_header("<f4", extra_shape))
            chunk = bytes(2**22)
            for _ in range(int(np.prod(extra_shape)) * 4 // len(chunk)):
                f.write(chunk)


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A .safetensors file whose data is one sparse hole: a few KB on disk, any size in the header."""
    header, at = {}, 0
    for key, (dtype, shape, nbytes) in tensors.items():
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + nbytes]}
        at += nbytes
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + at)


def test_an_npz_entry_the_model_lacks_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    (tmp_path / "m.arch").write_text(MODEL)
    write_bomb_npz(tmp_path / "w.npz")
    assert (tmp_path / "w.npz").stat().st_size < 2**20
    r = run_capped(["run", "m.arch", "--weights", "w.npz"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == ("irc: error: 'w.npz': unexpected weight 'big' of shape [67108864], "
                        "which model 'm' does not have\n")


def test_an_npz_entry_of_the_wrong_shape_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    (tmp_path / "m.arch").write_text(MODEL)
    write_bomb_npz(tmp_path / "w.npz", (BIG // 4, 4), "y.weight")  # y.weight claims [16M, 4]
    r = run_capped(["run", "m.arch", "--weights", "w.npz"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == ("irc: error: 'w.npz': weight 'y.weight' has shape [16777216, 4], "
                        "but the model expects [3, 4]\n")


def test_a_sparse_safetensors_with_an_extra_tensor_is_refused_from_its_header(tmp_path: Path) -> None:
    (tmp_path / "m.arch").write_text(MODEL)
    write_sparse_safetensors(tmp_path / "w.safetensors", {"y.weight": ("F32", [3, 4], 48),
                                                          "y.bias": ("F32", [3], 12),
                                                          "huge": ("F32", [2**30], 2**32)})
    r = run_capped(["run", "m.arch", "--weights", "w.safetensors"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == ("irc: error: 'w.safetensors': unexpected weight 'huge' of shape [1073741824], "
                        "which model 'm' does not have\n")


def test_a_weight_too_big_for_the_memory_limit_is_an_error_naming_it(tmp_path: Path) -> None:
    """Once the library's Rust reader panicked here; irc's reader says which weight did not fit."""
    (tmp_path / "big.arch").write_text(BIG_MODEL)
    write_sparse_safetensors(tmp_path / "w.safetensors", {"y.weight": ("F32", [8192, 8192], 2**28)})
    # --max-memory past the guard, which would refuse first: the reader's own check is what is tested
    r = run_capped(["run", "big.arch", "--weights", "w.safetensors", "--max-memory", "100G"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == ("irc: error: 'w.safetensors': weight 'y.weight' (268,435,456 bytes) does not fit in the "
                        "memory left\n")


def test_the_model_weights_read_back_exactly(tmp_path: Path) -> None:
    """The readers that check headers first still return the values written (NumPy and safetensors as oracles)."""
    from safetensors.numpy import save_file

    from irc.runtime.graphs import graph_from_source
    from irc.runtime.weights import load_checked

    graph = graph_from_source(MODEL)
    want = good_weights()
    np.savez_compressed(tmp_path / "w.npz", **want)
    save_file(want, str(tmp_path / "w.safetensors"))
    for name in ("w.npz", "w.safetensors"):
        got = load_checked(tmp_path / name, graph)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
            assert got[key].dtype == np.float32


def test_fortran_order_npz_reads_as_numpy_does(tmp_path: Path) -> None:
    from irc.runtime.array_files import read_npz, read_npz_header

    arr = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.savez(tmp_path / "w.npz", a=arr)
    spec = read_npz_header(tmp_path / "w.npz")["a"]
    assert (spec.shape, spec.dtype, spec.nbytes) == ((3, 4), np.dtype(np.float32), 48)
    np.testing.assert_array_equal(read_npz(tmp_path / "w.npz")["a"], np.load(tmp_path / "w.npz")["a"])
