"""A kernel as the code generators hold it (name, source, argument kinds), the argument
kinds' numba spellings, and the pieces of one generated module (its kernels, shared by name,
and its driver's lines): the same records in the cpu and cuda backends."""

from __future__ import annotations

from dataclasses import dataclass, field

from irc.backends.literals import check_identifier

# Argument kinds of kernels, by the names the generated module gives them. Every array
# is C-contiguous with a fixed rank, so one compiled signature serves every call site.
NUMBA_TYPES: dict[str, str] = {
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "A1": "float32[::1]",
    "A2": "float32[:, ::1]",
    "A3": "float32[:, :, ::1]",
    "A4": "float32[:, :, :, ::1]",
    "I1": "int64[::1]",
    "I2": "int64[:, ::1]",
}
F32, F64, I64, A1, A2, A3, A4, I1, I2 = NUMBA_TYPES  # the names, for renderers to list


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str  # the full ``def``, decorator included
    args: tuple[str, ...]  # kinds of the arguments (keys of NUMBA_TYPES), in order
    returns: str = "void"

    @property
    def signature(self) -> str:
        """The numba signature string, e.g. ``void(float32[:, ::1], float32)``."""
        spell = {**NUMBA_TYPES, "void": "void"}
        return f"{spell[self.returns]}({', '.join(spell[a] for a in self.args)})"

    @property
    def signature_code(self) -> str:
        """The same signature as the generated module writes it: ``signature(A2, F32)``."""
        ret = "" if self.returns == "void" else f", returns={self.returns}"
        return f"signature({', '.join(self.args)}{ret})"


@dataclass
class ModuleParts:
    kernels: dict[str, Kernel] = field(default_factory=dict)  # first use first
    driver: list[str] = field(default_factory=list)  # lines of run()'s body, unindented
    helpers: dict[str, str] = field(default_factory=dict)  # plain-Python helpers (no njit)
    devices: dict[str, str] = field(default_factory=dict)  # scalar njit functions kernels call
    derived: dict[str, str] = field(default_factory=dict)  # derived weight key -> expression over weights
    steps: list[int] = field(default_factory=list)  # the node index of each driver line (-1: none)
    step: int = -1  # the node whose lines are being written
    _next_var: int = 0

    def kernel(self, kernel: Kernel) -> str:
        """Register ``kernel`` (once per name) and return its name for a call."""
        check_identifier(kernel.name)
        known = self.kernels.get(kernel.name)
        if known is None:
            self.kernels[kernel.name] = kernel
        elif known != kernel:
            raise AssertionError(f"two different kernels named {kernel.name}")
        return kernel.name

    def helper(self, name: str, source: str) -> str:
        check_identifier(name)
        self.helpers.setdefault(name, source)
        return name

    def device(self, name: str, source: str) -> str:
        """Register a scalar ``@njit`` function (``fexp``, ``ftanh``...) that kernels call."""
        check_identifier(name)
        known = self.devices.setdefault(name, source)
        if known != source:
            raise AssertionError(f"two different device functions named {name}")
        return name

    def derive(self, key: str, expression: str) -> str:
        """A weight computed once per weights dict (``expression`` reads ``weights[...]``)."""
        known = self.derived.setdefault(key, expression)
        if known != expression:
            raise AssertionError(f"two recipes for derived weight {key}")
        return key

    def var(self) -> str:
        name = f"v{self._next_var}"
        self._next_var += 1
        return name

    def line(self, text: str = "") -> None:
        self.driver.append(text)
        self.steps.append(self.step)
