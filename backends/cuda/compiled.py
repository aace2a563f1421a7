"""``compile_graph`` for the GPU: cache lookup, code generation, import; and the runnable result.

Weights are uploaded once (with the arrays ``prepare`` derives from them) and kept on the
device while the same weight arrays are passed again; the values between kernels live in
buffers allocated once per compiled graph, so a forward pass moves only its inputs in and
its outputs out.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from irc.backends.common.cache import cache_key, header, prepare_dir
from irc.backends.common.cache import default_cache_dir as cache_dir_of
from irc.backends.common.compiled import CompiledModule, cached_build
from irc.backends.cuda.device import device_name, is_simulator, reduction_path, require_device
from irc.backends.cuda.emit import BACKEND_VERSION, emit_fused, fuse
from irc.backends.cuda.loader import LoadStats, Progress, load
from irc.diagnostics import IrcError
from irc.graph import Graph


def default_cache_dir() -> Path:
    return cache_dir_of("cuda")  # $IRC_CACHE_DIR/cuda or ~/.cache/irc/cuda


class CompiledGraph(CompiledModule):
    """A graph's generated CUDA module, imported and compiled: ``run(weights, inputs)``.

    Weight and input checks are those of every generated module (same tables in the module)."""

    def __init__(self, module: ModuleType, path: Path, key: str, source: str, stats: LoadStats,
                 rebuilt: bool, reduction: str, cuda: ModuleType):
        super().__init__(module, path, key, source, stats, rebuilt)
        self.reduction = reduction  # "shuffle" (warp shuffles) or "shared" (shared-memory tree)
        self.cuda = cuda
        self.simulator = is_simulator(cuda)
        self.device = device_name(cuda)
        self._bufs: list[Any] | None = None
        self._uploaded: tuple[dict[str, Any], dict[str, Any]] | None = None  # (host arrays, device arrays)
        self._views: tuple[list[Any], list[Any]] | None = None

    # -- device memory -------------------------------------------------------------------
    def buffers(self) -> list[Any]:
        """The slots every value between kernels lives in (allocated on first use)."""
        if self._bufs is None:
            dtypes = {"f32": np.float32, "i64": np.int64}
            self._bufs = [self.cuda.device_array(size, dtype=dtypes[dtype]) for dtype, size in self.module.SLOTS]
        return self._bufs

    def upload(self, weights: dict[str, Any]) -> dict[str, Any]:
        """Check, derive and copy the weights to the device; reused while the same arrays come back."""
        if self._uploaded is not None:
            host, device = self._uploaded
            if host.keys() <= weights.keys() and all(weights[k] is v for k, v in host.items()):
                return device
        checked = self._weights(weights)
        derived = self.module.prepare(checked)
        device = {k: self.cuda.to_device(v) for k, v in {**checked, **derived}.items()}
        self._uploaded = ({k: weights[k] for k, _ in self.module.WEIGHTS}, device)
        self._views = None
        return device

    def values(self, weights: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        device = self.upload(weights)
        if self._views is None:
            self._views = self.module.views(self.buffers(), device)
        return self._views

    # -- running -------------------------------------------------------------------------
    def run_device(self, weights: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        """Run; the outputs stay on the device (views of this graph's buffers: the next run
        overwrites them). Inputs are checked and copied in; launches are asynchronous."""
        V, F = self.values(weights)
        x = self._inputs(inputs)
        try:
            if self.profile is not None:
                return self._run_profiled(V, F, x, self.profile)
            return self.module.run(V, F, x)
        except self.module.InputError as e:
            raise IrcError(str(e)) from None

    def run(self, weights: dict[str, Any], inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        out = self.run_device(weights, inputs)
        return {label: arr.copy_to_host() for label, arr in out.items()}

    def _run_profiled(self, V: list, F: list, x: dict, profile: dict[str, float]) -> dict[str, Any]:
        """Every launch followed by a synchronize and timed; the rest is the driver's host work."""
        cuda = self.cuda
        names = [name for name, _ in self.module.SIGNATURES if hasattr(self.module, name)]
        names += list(self.module.REDUCING)
        originals = {name: getattr(self.module, name) for name in dict.fromkeys(names)}

        class Timed:
            def __init__(self, name: str, kernel: Any):
                self.name, self.kernel = name, kernel

            def __getitem__(self, config: Any) -> Any:
                launch = self.kernel[config]
                name = self.name

                def call(*args: Any) -> None:
                    cuda.synchronize()
                    start = time.perf_counter()
                    launch(*args)
                    cuda.synchronize()
                    profile[name] = profile.get(name, 0.0) + time.perf_counter() - start
                return call

        start = time.perf_counter()
        before = sum(profile.get(name, 0.0) for name in originals)
        try:
            for name, fn in originals.items():
                setattr(self.module, name, Timed(name, fn))
            out = self.module.run(V, F, x)
            cuda.synchronize()
            return out
        finally:
            for name, fn in originals.items():
                setattr(self.module, name, fn)
            in_kernels = sum(profile.get(name, 0.0) for name in originals) - before
            driver = "driver (input copies, launches)"
            profile[driver] = profile.get(driver, 0.0) + time.perf_counter() - start - in_kernels


def compile_graph(graph: Graph, cache_dir: str | Path | None = None, progress: Progress | None = None,
                  reduction: str | None = None) -> CompiledGraph:
    """Fuse ``graph``, generate (or find in the cache) its module, import it and compile its kernels.

    ``reduction`` forces a path ("shuffle"/"shared"); by default the GPU gets warp shuffles
    and the simulator the shared-memory tree. Without a GPU (and no simulator) this raises an
    IrcError saying so."""
    cuda = require_device()
    path_name = reduction or reduction_path(cuda)
    fused = fuse(graph)
    source = emit_fused(fused)
    key = cache_key(fused, "cuda", BACKEND_VERSION)
    directory = prepare_dir(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    text = header(key, source) + source

    def build(folder: Path, path: Path, rebuilt: bool) -> CompiledGraph:
        module, stats = load(path, key, text, path_name, is_simulator(cuda), progress)
        return CompiledGraph(module, path, key, source, stats, rebuilt, path_name, cuda)

    return cached_build(directory, key, source, build)
