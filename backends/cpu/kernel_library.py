"""Kernels shared by every graph: each distinct kernel source is compiled once per cache.

A graph's module holds its kernels' source (readable, self-contained), but Numba caches
compiled code per source file, so the same kernel in two graphs (``k_gemm_none`` is in
almost every model) would compile twice. Instead each kernel is also written, with the
device functions it calls, to ``kernels/<name>_<digest>.py`` beside the graph entries, and
the loader runs the graph with that file's compiled kernel (loaded from Numba's cache when
any graph compiled it before): a new model compiles only the kernels no model compiled.
Files are written and validated as cache entries are (:mod:`..common.cache`: header with key
and checksum, atomic replace, a lock per file), run from the checked text (never a ``.pyc``),
and Numba's files for each are used only as irc sealed them (:mod:`..common.manifest`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from irc.backends.common import manifest
from irc.backends.common.cache import entry_lock, header, private_subdir, read_entry, write_entry
from irc.backends.common.kernel import ModuleParts
from irc.backends.common.loader import exec_source

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

    def stem(self, name: str) -> str:
        return f"{name}_{self.key(name)[:24]}"

    def path(self, name: str) -> Path:
        return self.directory / f"{self.stem(name)}.py"

    def module_name(self, name: str) -> str:
        return f"irc_cpu_kernel_{self.stem(name)}"

    def file_text(self, name: str) -> str:
        """The whole file as irc writes it (header and body): what is executed."""
        return header(self.key(name), self.texts[name]) + self.texts[name]

    def write(self, name: str) -> Path:
        """The kernel's file, written when missing or not exactly what this irc would write."""
        private_subdir(self.directory)
        key, path = self.key(name), self.path(name)
        with entry_lock(self.directory, self.stem(name)):
            if read_entry(path, key) != self.texts[name]:
                write_entry(path, key, self.texts[name])
        return path

    def cached(self, name: str) -> bool:
        """Numba has compiled code for the kernel's file, sealed by irc (anything else is deleted)."""
        path = self.write(name)
        with entry_lock(self.directory, self.stem(name)):
            return manifest.verify(path)

    def load(self, name: str, sig: str) -> tuple[Any, bool]:
        """The shared dispatcher for kernel ``name`` compiled for ``sig`` (from Numba's cache
        when irc sealed it there; compiled here and sealed otherwise), and whether it was a hit."""
        path = self.write(name)
        with entry_lock(self.directory, self.stem(name)):
            sealed = manifest.verify(path)
            fn = getattr(exec_source(path, self.module_name(name), self.file_text(name)), name)
            hit = compile_signature(fn, sig)
            if not (sealed and hit):
                manifest.seal(path)
        return fn, hit

    def forget(self, name: str) -> None:
        """Delete Numba's cache files of ``name`` (they could not be read)."""
        with entry_lock(self.directory, self.stem(name)):
            manifest.forget(self.path(name))

    def compile_elsewhere(self, kernels: list[tuple[str, str]], done: Callable[[str], None] | None = None) -> bool:
        """Compile ``(name, signature)`` pairs in a child process that fills Numba's cache.

        This process then runs only code loaded from the cache, as every later process does:
        a process that compiled a kernel itself runs Numba's in-memory code, which can differ
        from the cached object code in the last bit where reductions are reassociated, and
        runs of one graph must agree bit for bit. False when the child failed (the caller
        then compiles here, where a real error shows itself).

        The child ends with this process: it is killed if this one is interrupted, and it
        exits by itself when its stdin (held open here) closes because this process died.
        """
        spec = [{"name": n, "sig": sig, "path": str(self.write(n)), "module": self.module_name(n),
                 "text": self.file_text(n), "lock": str(self.directory), "lock_name": self.stem(n)}
                for n, sig in kernels]
        try:
            proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return False
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith("compiled ") and done is not None:
                    done(line.split()[1])
            return proc.wait() == 0
        except BrokenPipeError:  # the child died before reading its work
            return False
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C, an error): the child goes too
                proc.kill()
                proc.wait()
            proc.stdin.close()
            proc.stdout.close()


CHILD = "from irc.backends.cpu.kernel_library import child_main; child_main()"


def _exit_with_parent() -> None:
    """In the child: stdin reaches end of file only when the parent closes it or dies."""
    sys.stdin.read()
    os._exit(1)


def child_main() -> None:
    """The child of :meth:`KernelLibrary.compile_elsewhere`: compile each kernel into the cache."""
    spec = json.loads(sys.stdin.readline())
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    for item in spec:
        path = Path(item["path"])
        with entry_lock(Path(item["lock"]), item["lock_name"]):
            manifest.verify(path)
            fn = getattr(exec_source(path, item["module"], item["text"]), item["name"])
            fn.compile(item["sig"])
            manifest.seal(path)
        print(f"compiled {item['name']}", flush=True)


def compile_signature(fn: Any, sig: str) -> bool:
    """Compile (or load from Numba's cache) one signature; True when it came from a cache."""
    before = len(fn.overloads)
    fn.compile(sig)
    if len(fn.overloads) == before:  # compiled earlier in this process (a kernel shared by graphs)
        return True
    return bool(sum(fn.stats.cache_hits.values()))
