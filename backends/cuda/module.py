"""The pieces of one generated CUDA module: kernels, the weight preparation, and the driver.

Kernels are the shared :class:`~irc.backends.common.kernel.Kernel` record (name, source, argument kinds); a
kernel that reduces across a thread block comes in two variants, ``<name>__shuffle`` (warp
shuffles, for GPUs) and ``<name>__shared`` (a shared-memory tree, which numba's simulator can
run), and the module binds ``<name>`` to one of them when it is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from irc.backends.common.kernel import Kernel, ModuleParts
from irc.backends.cuda.plan import Plan
from irc.backends.literals import check_identifier, str_literal

PATHS = ("shuffle", "shared")

# The decorator of every kernel: cuda.jit(cache=True) (numba caches the compiled code beside
# the module on disk), through device.kernel_jit so that options the simulator lacks are dropped.
JIT = "@kernel_jit()"


def jit_bounded(threads: int, min_blocks: int) -> str:
    """The decorator with launch bounds: ptxas caps registers so ``min_blocks`` blocks fit."""
    return JIT if min_blocks <= 0 else f"@kernel_jit(launch_bounds=({int(threads)}, {int(min_blocks)}))"


@dataclass
class CudaParts(ModuleParts):
    plan: Plan = field(default_factory=Plan)
    reducing: dict[str, None] = field(default_factory=dict)  # kernel names bound per reduction path
    prepare: list[str] = field(default_factory=list)  # lines of prepare(w): derived host arrays
    derived: dict[str, str] = field(default_factory=dict)  # prepare expression -> derived key
    launches: int = 0  # kernel launches per run (for the module's header)
    host_inputs: dict[int, str] = field(default_factory=dict)  # input value index -> its host copy
    loads: list[str] = field(default_factory=list)  # lines of load(V, inputs): host -> device
    unread: set[str] = field(default_factory=set)  # values no node reads and no output names

    def reducing_kernel(self, make: Callable[[str], Kernel]) -> str:
        """Register both variants of a block-reducing kernel; ``make(path)`` builds one."""
        names = []
        for path in PATHS:
            kernel = make(path)
            suffix = f"__{path}"
            if not kernel.name.endswith(suffix):
                raise AssertionError(f"{kernel.name} should end with {suffix}")
            names.append(self.kernel(kernel)[: -len(suffix)])
        if names[0] != names[1]:
            raise AssertionError(f"variants {names} differ")
        base = check_identifier(names[0])
        self.reducing.setdefault(base, None)
        return base

    def derive(self, expression: str, shape: tuple[int, ...]) -> int:
        """A weight computed once from the host weights (``expression`` reads ``w``) and
        uploaded with them; returns its value index. Same expression, same array."""
        key = self.derived.get(expression)
        if key is None:
            key = f"#{len(self.derived)}"  # '#' never appears in a model's weight keys
            self.derived[expression] = key
            self.prepare.append(f"out[{str_literal(key)}] = np.ascontiguousarray({expression}, dtype=np.float32)")
        return self.plan.weight_value(key, shape)
