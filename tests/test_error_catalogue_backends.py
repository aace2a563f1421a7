"""Backend error paths no command line can stage: each raised through the Python API.

A compiled model's ``run`` with a weight or an input it cannot take, the cache directory
of generated code, numba.cuda missing or no GPU, the cuda backend's environment settings,
emitting a graph that shape inference never typed, a backend without a kernel for an op,
and the NumPy reference's own checks. Each case states the exact text irc prints; their
origins count toward the catalogue in tests/test_diagnostics.py, with those of
tests/test_error_catalogue_runtime.py.

The cpu cases share one compiled model (Numba compiles it once per process, a few
seconds); the cuda run goes through numba's CUDA simulator, switched on the way
tests/test_cuda_helpers.py does, with the environment variable restored afterwards.
"""

from __future__ import annotations

import builtins
import errno
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_error_catalogue_runtime import Staged, printed_text, raise_staged
from test_export_onnx import EXPORT_STAGED

# ids in [0, 10) pick rows of the table e.weight [10, 4]; y = x @ y.weight.T + y.bias
MODEL = """model m() {
  input ids: i32[2, 3]
  input x: f32[2, 4]
  output e = embedding(ids, 10, 4)
  output y = linear(x, 3)
}
"""
BAD_IDS = np.array([[1, 2, 12], [0, 0, 0]], np.int32)  # 12 is past the vocabulary of 10, at flat position 2


def _graph(text: str = MODEL):
    from irc.runtime.graphs import graph_from_source

    return graph_from_source(text)


def _weights() -> dict[str, np.ndarray]:
    return {"e.weight": np.ones((10, 4), np.float32), "y.weight": np.ones((3, 4), np.float32),
            "y.bias": np.zeros(3, np.float32)}


def _inputs() -> dict[str, np.ndarray]:
    return {"ids": np.array([[1, 2, 3], [0, 0, 0]], np.int32), "x": np.ones((2, 4), np.float32)}


@contextmanager
def _scratch(mp: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory, so the messages name short relative paths."""
    with tempfile.TemporaryDirectory() as d:
        mp.chdir(d)
        yield Path(d)


# -- a compiled model's run(): weights and inputs ----------------------------------------

_CACHE = tempfile.TemporaryDirectory(prefix="irc-catalogue-")  # removed when the process ends


@functools.cache
def _cpu_model() -> Any:
    """MODEL compiled by the cpu backend once per process."""
    from irc.backends.cpu import compile_graph

    return compile_graph(_graph(), cache_dir=Path(_CACHE.name) / "cpu")


def _run_cpu(weights: dict[str, Any], inputs: dict[str, Any]) -> None:
    _cpu_model().run(weights, inputs)


def _cpu_missing_weight(mp: pytest.MonkeyPatch) -> None:
    w = _weights()
    del w["y.weight"]
    _run_cpu(w, _inputs())


def _cpu_weight_shape(mp: pytest.MonkeyPatch) -> None:
    _run_cpu({**_weights(), "e.weight": np.ones((4, 10), np.float32)}, _inputs())


def _cpu_weight_not_numbers(mp: pytest.MonkeyPatch) -> None:
    _run_cpu({**_weights(), "y.bias": np.zeros(3, bool)}, _inputs())


def _cpu_unknown_input(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {**_inputs(), "z": np.ones(2, np.float32)})


def _cpu_missing_input(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {"ids": _inputs()["ids"]})


def _cpu_input_shape(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {**_inputs(), "x": np.ones((4, 2), np.float32)})


def _cpu_input_float_ids(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {**_inputs(), "ids": np.ones((2, 3), np.float32)})


def _cpu_input_not_numbers(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {**_inputs(), "x": np.ones((2, 4), bool)})


def _cpu_token_out_of_range(mp: pytest.MonkeyPatch) -> None:
    _run_cpu(_weights(), {**_inputs(), "ids": BAD_IDS})


# -- the cuda backend: numba.cuda, the device, its settings --------------------------------

def _simulated_cuda(mp: pytest.MonkeyPatch) -> None:
    """numba's CUDA simulator for this process (numba.cuda stays imported as the simulator,
    as tests/test_cuda_helpers.py leaves it); the environment variable is restored after."""
    from irc.backends.cuda.device import REDUCE_ENV, SIM_ENV, is_simulator, use_simulator

    mp.setenv(SIM_ENV, "1")
    mp.delenv(REDUCE_ENV, raising=False)
    loaded = sys.modules.get("numba.cuda")
    if loaded is None or is_simulator(loaded):
        use_simulator()
    # else: a real numba.cuda was imported first, so a GPU is there to run on


def _cuda_token_out_of_range(mp: pytest.MonkeyPatch) -> None:
    from irc.backends.cuda import compile_graph

    _simulated_cuda(mp)
    compiled = compile_graph(_graph(), cache_dir=Path(_CACHE.name) / "cuda")
    compiled.run(_weights(), {**_inputs(), "ids": BAD_IDS})


def _cuda_not_importable(mp: pytest.MonkeyPatch) -> None:
    """``from numba import cuda`` fails, as where numba-cuda is not installed."""
    from irc.backends import get_backend

    real = builtins.__import__

    def import_(name: str, globals=None, locals=None, fromlist=(), level: int = 0):
        if name == "numba.cuda" or (name == "numba" and "cuda" in (fromlist or ())):
            raise ModuleNotFoundError("No module named 'numba.cuda'", name="numba.cuda")
        return real(name, globals, locals, fromlist, level)

    graph = _graph()
    mp.setattr(builtins, "__import__", import_)
    get_backend("cuda").compile(graph)


def _cuda_no_gpu(mp: pytest.MonkeyPatch) -> None:
    """numba.cuda imports, but finds no device (the same on a machine with a GPU)."""
    from irc.backends import get_backend
    from irc.backends.cuda import device

    def to_device(array: Any) -> Any:  # defined here, so not the simulator's
        return array

    mp.setattr(device, "cuda_module", lambda: SimpleNamespace(to_device=to_device, is_available=lambda: False))
    get_backend("cuda").compile(_graph())


def _cuda_reduce_setting(mp: pytest.MonkeyPatch) -> None:
    from irc.backends import get_backend
    from irc.backends.cuda.device import REDUCE_ENV

    _simulated_cuda(mp)
    mp.setenv(REDUCE_ENV, "warp")
    get_backend("cuda").compile(_graph())


ATTENTION = """model m() {
  input x: f32[1, 4, 8]
  output y = attention(x, heads=2)
}
"""


def _cuda_attention_tile_setting(mp: pytest.MonkeyPatch) -> None:
    from irc.backends import emit_source
    from irc.backends.cuda.render.sdpa_src import TILE_ENV

    mp.setenv(TILE_ENV, "huge")
    emit_source(_graph(ATTENTION), "cuda")


# -- the cpu backend's cache of generated code ----------------------------------------------

def _cpu_compile_into(cache_dir: str) -> None:
    from irc.backends.cpu import compile_graph

    compile_graph(_graph(), cache_dir=cache_dir)  # the directory is checked before anything compiles


def _cache_is_a_file(mp: pytest.MonkeyPatch) -> None:
    with _scratch(mp) as d:
        (d / "cache").write_text("not a directory")
        _cpu_compile_into("cache")


def _cache_cannot_be_made(mp: pytest.MonkeyPatch) -> None:
    with _scratch(mp) as d:
        (d / "file").write_text("not a directory")
        _cpu_compile_into("file/cache")


def _cache_of_another_user(mp: pytest.MonkeyPatch) -> None:
    with _scratch(mp) as d:
        (d / "cache").mkdir(mode=0o700)
        uid = os.geteuid()
        mp.setattr(os, "geteuid", lambda: uid + 1)  # the directory belongs to uid, not to "us"
        _cpu_compile_into("cache")


def _cache_writable_by_others(mp: pytest.MonkeyPatch) -> None:
    with _scratch(mp) as d:
        (d / "cache").mkdir()
        (d / "cache").chmod(0o777)
        _cpu_compile_into("cache")


def _cache_inside_a_folder_others_can_write(mp: pytest.MonkeyPatch) -> None:
    """The cache itself is private, the folder above it is not (and not sticky, as /tmp is)."""
    with _scratch(mp) as d:
        (d / "open").mkdir()
        (d / "open" / "cache").mkdir(mode=0o700)
        (d / "open").chmod(0o777)
        _cpu_compile_into("open/cache")


def _cache_inside_a_folder_of_another_user(mp: pytest.MonkeyPatch) -> None:
    """The folder above the cache belongs to someone else (its owner seen as another uid)."""
    with _scratch(mp) as d:
        (d / "theirs" / "cache").mkdir(mode=0o700, parents=True)
        (d / "theirs").chmod(0o755)
        theirs, real = (d / "theirs").resolve(), Path.stat

        def stat(self: Path, *args: Any, **kwargs: Any) -> os.stat_result:
            st = real(self, *args, **kwargs)
            if self != theirs:
                return st
            fields = list(st[:10])
            fields[4] = os.geteuid() + 12345  # st_uid
            return os.stat_result(fields)

        mp.setattr(Path, "stat", stat)
        _cpu_compile_into("theirs/cache")


def _cache_and_fresh_folder_full(mp: pytest.MonkeyPatch) -> None:
    """No file can be written anywhere (a full disk): the fresh folder fails as the cache did."""
    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    with _scratch(mp):
        mp.setattr(tempfile, "mkstemp", mkstemp)
        _cpu_compile_into("cache")


def _cache_from_environment(mp: pytest.MonkeyPatch) -> None:
    """IRC_CACHE_DIR names the cache; its cpu/ subdirectory is what is refused."""
    from irc.backends import get_backend

    with _scratch(mp) as d:
        (d / "shared").mkdir()
        (d / "shared" / "cpu").mkdir()
        (d / "shared" / "cpu").chmod(0o775)
        mp.setenv("IRC_CACHE_DIR", "shared")
        get_backend("cpu").compile(_graph())


# -- generating code from a graph that is not ready -----------------------------------------

def _emit_untyped(mp: pytest.MonkeyPatch) -> None:
    """A graph straight from the builder: shape inference has not run."""
    from irc.backends import emit_source
    from irc.frontends.arch import build_source

    emit_source(build_source(MODEL, "<input>"), "numba")


def _emit_without_a_kernel(mp: pytest.MonkeyPatch) -> None:
    """An op the backend has no renderer for (as for a new op before its kernel is written)."""
    from irc.backends import emit_source
    from irc.backends.cpu.render import RENDERERS

    mp.delitem(RENDERERS, "linear")
    emit_source(_graph(), "numba")


BN_TRAIN = """model m() {
  input x: f32[2, 3, 4, 4]
  y, m, v = batchnorm(x, train=true)
  output out = y
}
"""


def _emit_training_mode(mp: pytest.MonkeyPatch) -> None:
    """BatchNorm with batch statistics is a training step's forward: a backend without a renderer for it (CUDA;
    the CPU backend's batchnorm runs it, for irc train --backend cpu) refuses it."""
    from irc.backends import emit_source

    emit_source(_graph(BN_TRAIN), "cuda")


# -- the NumPy reference interpreter ------------------------------------------------------

def _run_numpy(weights: dict[str, Any], inputs: dict[str, Any]) -> None:
    from irc.backends import get_backend

    get_backend("numpy").compile(_graph()).run(weights, inputs)


def _numpy_input_shape(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {**_inputs(), "x": np.ones((4, 2), np.float32)})


def _numpy_input_float_ids(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {**_inputs(), "ids": np.ones((2, 3), np.float32)})


def _numpy_input_not_numbers(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {**_inputs(), "x": np.full((2, 4), "a")})


def _numpy_unknown_input(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {**_inputs(), "z": np.ones(2, np.float32)})


def _numpy_missing_input(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {"ids": _inputs()["ids"]})


def _numpy_missing_weight(mp: pytest.MonkeyPatch) -> None:
    w = _weights()
    del w["y.bias"]
    _run_numpy(w, _inputs())


def _numpy_token_out_of_range(mp: pytest.MonkeyPatch) -> None:
    _run_numpy(_weights(), {**_inputs(), "ids": BAD_IDS})


def _numpy_without_an_op(mp: pytest.MonkeyPatch) -> None:
    """An op the reference has no function for (as for a new op before it is written)."""
    from irc.backends.numpy_ref import interpreter

    mp.delitem(interpreter.OPS, "linear")
    _run_numpy(_weights(), _inputs())


def _at(line: int, source: str, col: int, span: str) -> str:
    """The quoted line and underline irc prints under a located message about MODEL at <input>:
    '^' at ``col`` and '~' under the rest of ``span``, the text there (a name, or a call to its ')')."""
    assert source[col - 1:].startswith(span)
    return f"\n  {line:>4} | {source}\n       | {' ' * (col - 1)}^{'~' * (len(span) - 1)}"


INPUT_IDS = _at(2, "  input ids: i32[2, 3]", 9, "ids")
INPUT_X = _at(3, "  input x: f32[2, 4]", 9, "x")
EMBEDDING = _at(4, "  output e = embedding(ids, 10, 4)", 14, "embedding(ids, 10, 4)")
LINEAR = _at(5, "  output y = linear(x, 3)", 14, "linear(x, 3)")

STAGED = [
    # a compiled model's checks (backends/common/compiled.py), the same in the cpu and cuda backends
    Staged("cpu_missing_weight", _cpu_missing_weight,
           "irc: error: missing weight 'y.weight' (expected shape [3, 4])"),
    Staged("cpu_weight_shape", _cpu_weight_shape,
           "irc: error: weight 'e.weight' has shape [4, 10], the model expects [10, 4]"),
    Staged("cpu_weight_not_numbers", _cpu_weight_not_numbers, "irc: error: weight 'y.bias' holds bool, not numbers"),
    Staged("cpu_unknown_input", _cpu_unknown_input, "irc: error: unknown input 'z' (the model's inputs: ids, x)"),
    Staged("cpu_missing_input", _cpu_missing_input, "irc: error: missing input 'x' (f32[2,4])"),
    Staged("cpu_input_shape", _cpu_input_shape,
           "irc: error: input 'x' has shape [4, 2], the model expects [2, 4]"),
    Staged("cpu_input_float_ids", _cpu_input_float_ids,
           "irc: error: input 'ids' must hold integers (i32), got float32"),
    Staged("cpu_input_not_numbers", _cpu_input_not_numbers, "irc: error: input 'x' holds bool, not numbers"),
    Staged("cpu_token_out_of_range", _cpu_token_out_of_range,
           "irc: error: embedding 'e': token id 12 (at flat position 2) is outside its vocabulary [0, 10)"),
    Staged("cuda_token_out_of_range", _cuda_token_out_of_range,
           "irc: error: embedding 'e': token id 12 (at flat position 2) is outside its vocabulary [0, 10)"),
    # numba.cuda and the device (backends/cuda/device.py), the cuda backend's settings
    Staged("cuda_not_importable", _cuda_not_importable,
           "irc: error: the cuda backend cannot import numba.cuda: ModuleNotFoundError: No module named 'numba.cuda'"),
    Staged("cuda_no_gpu", _cuda_no_gpu,
           "irc: error: the cuda backend needs an NVIDIA GPU with a working CUDA driver, and none was found\n"
           "note: to run the kernels in numba's CUDA simulator instead (slow; small sizes only), "
           "set NUMBA_ENABLE_CUDASIM=1\n"
           "note: or use --backend cpu"),
    Staged("cuda_reduce_setting", _cuda_reduce_setting,
           "irc: error: IRC_CUDA_REDUCE='warp': expected one of shuffle, shared"),
    Staged("cuda_attention_tile_setting", _cuda_attention_tile_setting,
           "irc: error: IRC_CUDA_ATTN_TILE='huge': expected one of narrow, wide, compact"),
    # the cache of generated code (backends/common/cache.py), shared by the cpu and cuda backends
    Staged("cache_is_a_file", _cache_is_a_file, "irc: error: cache directory 'cache' is not a directory "
           "(set IRC_CACHE_DIR to a directory)"),
    Staged("cache_cannot_be_made", _cache_cannot_be_made,
           "irc: error: cannot use cache directory 'file/cache': a part of the path is not a folder"),
    Staged("cache_of_another_user", _cache_of_another_user,
           "irc: error: cache directory 'cache' belongs to another user; its files would run as code "
           "(set IRC_CACHE_DIR to a directory of your own)"),
    Staged("cache_writable_by_others", _cache_writable_by_others,
           "irc: error: cache directory 'cache' is writable by others; its files would run as code "
           "(chmod go-w it, or set IRC_CACHE_DIR)"),
    Staged("cache_from_environment", _cache_from_environment,
           "irc: error: cache directory 'shared/cpu' is writable by others; its files would run as code "
           "(chmod go-w it, or set IRC_CACHE_DIR)"),
    Staged("cache_inside_a_folder_others_can_write", _cache_inside_a_folder_others_can_write,
           "irc: error: cache directory 'open/cache' is inside 'open', which others can write; its files would "
           "run as code (set IRC_CACHE_DIR to a directory of your own)"),
    Staged("cache_inside_a_folder_of_another_user", _cache_inside_a_folder_of_another_user,
           "irc: error: cache directory 'theirs/cache' is inside 'theirs', which belongs to another user; its files "
           "would run as code (set IRC_CACHE_DIR to a directory of your own)"),
    Staged("cache_and_fresh_folder_full", _cache_and_fresh_folder_full,
           "irc: error: cannot compile: the kernel cache 'cache' cannot be used (no space left on the device), "
           "nor a fresh folder for this run (no space left on the device)"),
    # code generation (backends/emit_checks.py)
    Staged("emit_untyped", _emit_untyped,
           "<input>:4:14: error: cpu backend: 'embedding' has no type; run shape inference first"
           + EMBEDDING),
    Staged("emit_training_mode", _emit_training_mode,
           "<input>:3:13: error: cuda backend: 'batchnorm' with train=true runs in training mode (BatchNorm: the "
           "batch's own statistics; a stacked recurrent layer: dropout between its layers), a training step's forward "
           "(irc.ops.grad_train): export or compile the inference graph (leave train= out), and train with irc train"
           + _at(3, "  y, m, v = batchnorm(x, train=true)", 13,
                                                   "batchnorm(x, train=true)")),
    Staged("emit_without_a_kernel", _emit_without_a_kernel,
           "<input>:5:14: error: cpu backend: no kernel for op 'linear'" + LINEAR),
    # the NumPy reference (backends/numpy_ref)
    Staged("numpy_input_shape", _numpy_input_shape,
           "<input>:3:9: error: input 'x' has shape [4, 2], but the model expects [2, 4]" + INPUT_X),
    Staged("numpy_input_float_ids", _numpy_input_float_ids,
           "<input>:2:9: error: input 'ids' must hold integers (i32), got float32" + INPUT_IDS),
    Staged("numpy_input_not_numbers", _numpy_input_not_numbers,
           "<input>:3:9: error: input 'x' must hold numbers, got <U1" + INPUT_X),
    Staged("numpy_unknown_input", _numpy_unknown_input, "irc: error: model 'm' has no input 'z' (inputs: ids, x)"),
    Staged("numpy_missing_input", _numpy_missing_input, "<input>:3:9: error: missing input 'x' (f32[2,4])" + INPUT_X),
    Staged("numpy_missing_weight", _numpy_missing_weight,
           "<input>:5:14: error: missing weight 'y.bias' for 'linear'" + LINEAR),
    Staged("numpy_token_out_of_range", _numpy_token_out_of_range,
           "<input>:4:14: error: token id 12 is outside the embedding's vocabulary [0, 10) (1 id(s) out of range)"
           + EMBEDDING),
    Staged("numpy_without_an_op", _numpy_without_an_op,
           "<input>:5:14: error: the numpy reference cannot run op 'linear'" + LINEAR),
    # the exporters (backends/onnx, backends/torch, backends/dot): their cases live with their tests
    *EXPORT_STAGED,
]


def staged_origins() -> set[str]:
    """``path:line`` of the raise each case reaches (for the catalogue in test_diagnostics)."""
    return {raise_staged(case).origin for case in STAGED}


@pytest.mark.parametrize("case", STAGED, ids=lambda c: c.name)
def test_staged_error_text(case: Staged) -> None:
    assert printed_text(raise_staged(case)) == case.text


def test_the_shared_model_runs() -> None:
    """The weights and inputs the cases damage are good ones: y = x @ W.T + b, e = table rows (NumPy)."""
    w, x = _weights(), _inputs()
    got = _cpu_model().run(w, x)
    np.testing.assert_allclose(got["y"], x["x"] @ w["y.weight"].T + w["y.bias"], rtol=1e-6)
    np.testing.assert_array_equal(got["e"], w["e.weight"][x["ids"]])


def test_cases_leave_the_environment_as_it_was() -> None:
    before = dict(os.environ), os.getcwd(), builtins.__import__, os.getuid()
    for case in STAGED:
        raise_staged(case)
    assert (dict(os.environ), os.getcwd(), builtins.__import__, os.getuid()) == before
