"""Kernels shared by every graph: each distinct kernel source is compiled once per cache.

A graph's module holds its kernels' source (readable, self-contained), but Numba caches
compiled code per source file, so the same kernel in two graphs (``k_gemm_none`` is in
almost every model) would compile twice. Instead each kernel is also written, with the
device functions it calls, to ``kernels/<name>_<digest>.py`` beside the graph entries, and
the loader runs the graph with that file's compiled kernel (loaded from Numba's cache when
any graph compiled it before): a new model compiles only the kernels no model compiled.
Files are written and validated as cache entries are (:mod:`.cache`: header with key and
checksum, atomic replace, a lock per file).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from irc.backends.cpu.cache import entry_lock, read_entry, write_entry
from irc.backends.cpu.module import ModuleParts

HEAD = '''\
# A kernel of irc's Numba CPU backend, shared by every graph that uses it. Do not edit.
import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, prange
from numba import types as numba_types
from numba.extending import intrinsic
'''

_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\(")


def _devices_for(source: str, devices: dict[str, str]) -> list[str]:
    """The device functions ``source`` calls, with what they call, callees first."""
    out: list[str] = []
    seen: set[str] = set()

    def visit(text: str) -> None:
        for name in dict.fromkeys(_CALL.findall(text)):
            if name in devices and name not in seen:
                seen.add(name)
                visit(devices[name])
                out.append(name)
    visit(source)
    return out


def kernel_texts(parts: ModuleParts) -> dict[str, str]:
    """Kernel name -> the text of its shared file (without the cache header)."""
    out: dict[str, str] = {}
    for name, kernel in parts.kernels.items():
        deps = _devices_for(kernel.source, parts.devices)
        body = [HEAD] + ["\n\n" + parts.devices[d] for d in deps] + ["\n\n" + kernel.source]
        out[name] = "".join(body)
    return out


class KernelLibrary:
    """The shared kernel files of one cache directory, for one graph's kernels."""

    def __init__(self, directory: Path, texts: dict[str, str]):
        self.directory = directory / "kernels"
        self.texts = texts

    def key(self, name: str) -> str:
        return hashlib.sha256(f"{name}\n{self.texts[name]}".encode()).hexdigest()

    def path(self, name: str) -> Path:
        return self.directory / f"{name}_{self.key(name)[:24]}.py"

    def module_name(self, name: str) -> str:
        return f"irc_cpu_kernel_{name}_{self.key(name)[:24]}"

    def write(self, name: str) -> Path:
        """The kernel's file, written when missing or not exactly what this irc would write."""
        from irc.backends.cpu.cache import prepare_dir

        prepare_dir(self.directory)
        key, path = self.key(name), self.path(name)
        with entry_lock(self.directory, f"{name}_{key[:24]}"):
            if read_entry(path, key) != self.texts[name]:
                write_entry(path, key, self.texts[name])
        return path

    def cached(self, name: str) -> bool:
        """Numba has compiled code for the kernel's file (its index and data files exist)."""
        from irc.backends.cpu.loader import numba_cache_files

        files = numba_cache_files(self.path(name))
        return any(f.suffix == ".nbi" for f in files) and any(f.suffix == ".nbc" for f in files)

    def kernel(self, name: str) -> Any:
        """The shared dispatcher for kernel ``name`` (its file written if missing or damaged)."""
        path = self.write(name)
        with entry_lock(self.directory, f"{name}_{self.key(name)[:24]}"):
            module = _import(path, self.module_name(name))
        return getattr(module, name)

    def forget(self, name: str) -> None:
        """Delete Numba's cache files of ``name`` (they could not be read)."""
        from irc.backends.cpu.loader import numba_cache_files

        for f in numba_cache_files(self.path(name)):
            f.unlink(missing_ok=True)

    def compile_elsewhere(self, kernels: list[tuple[str, str]], done: Callable[[str], None] | None = None) -> bool:
        """Compile ``(name, signature)`` pairs in a child process that fills Numba's cache.

        This process then runs only code loaded from the cache, as every later process does:
        a process that compiled a kernel itself runs Numba's in-memory code, which can differ
        from the cached object code in the last bit where reductions are reassociated, and
        runs of one graph must agree bit for bit. False when the child failed (the caller
        then compiles here, where a real error shows itself).
        """
        spec = [{"name": n, "sig": sig, "path": str(self.write(n)), "module": self.module_name(n),
                 "lock": str(self.directory), "lock_name": f"{n}_{self.key(n)[:24]}"} for n, sig in kernels]
        try:
            proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return False
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        for line in proc.stdout:
            if line.startswith("compiled ") and done is not None:
                done(line.split()[1])
        return proc.wait() == 0


CHILD = "from irc.backends.cpu.kernel_library import child_main; child_main()"


def child_main() -> None:
    """The child of :meth:`KernelLibrary.compile_elsewhere`: compile each kernel into the cache."""
    for item in json.loads(sys.stdin.read()):
        with entry_lock(Path(item["lock"]), item["lock_name"]):
            fn = getattr(_import(Path(item["path"]), item["module"]), item["name"])
            fn.compile(item["sig"])
        print(f"compiled {item['name']}", flush=True)


def _import(path: Path, module_name: str) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # numba looks functions' modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
