"""Who owns the cores while a compiled graph runs: Numba's pool, with BLAS single-threaded.

OpenBLAS threads spin for a while after each call, and Numba's workers spin after each
parallel loop; on a 2-core machine two pools that spin take turns at scheduler-quantum
granularity, and small kernels ran 100× slower. So one pool owns the cores: while a graph
runs, every OpenBLAS in the process (SciPy's, which numba's ``np.dot`` calls, and NumPy's)
is set to one thread, and the generated kernels split their matmuls over Numba's threads
themselves (``prange`` over row or column blocks, each block one single-threaded BLAS call).
The previous BLAS thread counts come back afterwards, so a host program keeps its settings.

OpenBLAS is reached through ``ctypes`` (the libraries are already loaded; no extra
dependency): its ``*openblas_set_num_threads*`` / ``*openblas_get_num_threads*`` symbols,
under the prefixes SciPy's and NumPy's wheels give them.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


@dataclass(frozen=True)
class BlasLib:
    path: str
    set_threads: ctypes._CFuncPtr
    get_threads: ctypes._CFuncPtr

    def threads(self) -> int:
        return int(self.get_threads())


def _loaded_paths() -> list[str]:
    """Shared objects mapped into this process whose name says OpenBLAS."""
    paths: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in os.path.basename(parts[-1]).lower():
                    paths.add(parts[-1])
    except OSError:
        return []
    return sorted(paths)


def _symbol(lib: ctypes.CDLL, names: tuple[str, ...]) -> ctypes._CFuncPtr | None:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


_FOUND: dict[str, BlasLib] = {}
_SCANNED_AT = [-1]  # len(sys.modules) at the last scan of /proc/self/maps


def blas_libs() -> list[BlasLib]:
    """The OpenBLAS libraries loaded now (SciPy's is loaded first, so numba's BLAS is seen).

    Reading /proc/self/maps costs ~0.4 ms, more than a small graph's whole run: the maps are scanned
    again only after a Python module was imported since the last scan (what loads a new library)."""
    if len(sys.modules) == _SCANNED_AT[0]:
        return list(_FOUND.values())
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls this library)

    _SCANNED_AT[0] = len(sys.modules)
    for path in _loaded_paths():
        if path in _FOUND:
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter, getter = _symbol(lib, _SETTERS), _symbol(lib, _GETTERS)
        if setter is None or getter is None:
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], None
        getter.argtypes, getter.restype = [], ctypes.c_int
        _FOUND[path] = BlasLib(path, setter, getter)
    return list(_FOUND.values())


def configured_threads() -> int | None:
    """``IRC_NUM_THREADS``, when set to a positive integer: Numba's workers while a graph runs
    (default: all of Numba's, one per core). On a machine other programs keep busy, fewer
    threads can be faster: a parallel loop waits for its slowest thread."""
    value = os.environ.get("IRC_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


class _SinglePool:
    """The context of ``single_pool``. A class, not a generator: every ``CompiledGraph.run`` enters it, and a
    small graph's whole run is ~10 us, of which the generator-based version took 4.4 (re-reading each
    library's thread count three times through ctypes); this one reads each once and restores only what it
    changed."""

    __slots__ = ("_threads", "_changed", "_numba_before")

    def __init__(self, threads: int | None) -> None:
        self._threads = threads
        self._changed: list[tuple[BlasLib, int]] = []
        self._numba_before: int | None = None

    def __enter__(self) -> None:
        changed = []
        for lib in blas_libs():
            n = int(lib.get_threads())
            if n != 1:
                lib.set_threads(1)
                changed.append((lib, n))
        self._changed = changed
        if self._threads is not None:
            import numba

            self._numba_before = numba.get_num_threads()
            numba.set_num_threads(max(1, min(self._threads, numba.config.NUMBA_NUM_THREADS)))

    def __exit__(self, *exc: object) -> None:
        for lib, n in self._changed:
            lib.set_threads(n)
        self._changed = []
        if self._numba_before is not None:
            import numba

            numba.set_num_threads(self._numba_before)
            self._numba_before = None


def single_pool(threads: int | None = None) -> _SinglePool:
    """``with single_pool(threads):`` runs the body with BLAS single-threaded (and Numba at ``threads``
    workers, if given); the previous settings come back afterwards."""
    return _SinglePool(threads)


def describe() -> dict[str, str]:
    """The thread settings in force, for benchmark reports."""
    import numba

    out = {"numba threads": str(numba.get_num_threads()),
           "numba threading layer": _threading_layer()}
    for lib in blas_libs():
        out[f"BLAS {os.path.basename(lib.path)}"] = f"{lib.threads()} threads"
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER"):
        if var in os.environ:
            out[var] = os.environ[var]
    return out


def _threading_layer() -> str:
    import numba

    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel kernel has run yet
        return f"not started ({numba.config.THREADING_LAYER})"
