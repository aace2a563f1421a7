"""What a CUDA renderer sees of one node: operands and results as value indices, their
concrete types, its weights, and the module being built.

In the generated driver, value ``i`` is ``V[i]`` (shaped device array) and ``F[i]`` (the
same memory, flat); both are made once by ``views()``, so a run allocates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import ClassVar

from irc.backends.cuda.module import CudaParts
from irc.backends.literals import f32_literal, int_literal, str_literal, tuple_literal
from irc.backends.node_view import NodeView
from irc.types import TensorType

BLOCK = 256  # threads per block of the one-thread-per-element kernels


def device_dtype(t: TensorType) -> str:
    """Floats run in float32, integers in int64 (token ids)."""
    return "f32" if t.is_float else "i64"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dims(*values: int) -> str:
    """A launch dimension tuple: ``(a, b)``."""
    return tuple_literal([int_literal(max(1, int(v))) for v in values])


@dataclass
class Ctx(NodeView):
    BACKEND: ClassVar[str] = "cuda"

    parts: CudaParts
    ins: list[int]  # value indices of the operands

    def __post_init__(self) -> None:
        self.outs: list[int | None] = [None] * len(self.out_types)

    # -- reading the node ----------------------------------------------------------
    def unread(self, i: int) -> bool:
        """Result ``i`` is never read (nor an output): a kernel may skip writing it."""
        return self.node.outputs[i] in self.parts.unread

    def need_float(self) -> None:
        for t in self.in_types + self.out_types:
            if not t.is_float:
                raise self.error(f"runs on floating-point tensors only, got {t}")

    # -- values ----------------------------------------------------------------------
    def V(self, i: int) -> str:
        return f"V[{self.ins[i]}]"

    def F(self, i: int) -> str:
        return f"F[{self.ins[i]}]"

    @staticmethod
    def v(index: int) -> str:
        return f"V[{index}]"

    @staticmethod
    def f(index: int) -> str:
        return f"F[{index}]"

    def alloc(self, i: int = 0) -> int:
        """Storage for result ``i``; returns its value index."""
        index = self.parts.plan.slot_value(self.out_shape(i), device_dtype(self.out_types[i]))
        self.outs[i] = index
        return index

    def alias(self, i: int, of: int) -> int:
        """Result ``i`` is value ``of`` seen with the result's shape (no copy)."""
        index = self.parts.plan.view(of, self.out_shape(i))
        self.outs[i] = index
        return index

    def temp(self, shape: tuple[int, ...], dtype: str = "f32") -> int:
        return self.parts.plan.temp(shape, dtype)

    def view(self, index: int, shape: tuple[int, ...]) -> int:
        """Another shape of a value (a view made once, in ``views()``)."""
        if tuple(shape) == self.parts.plan.values[index].shape:
            return index
        view = self.parts.plan.view(index, tuple(shape))
        self.parts.plan.release(view)  # views die with the node that asked for them
        return view

    # -- weights -------------------------------------------------------------------
    def weight_key(self, name: str) -> str:
        self.weight_shape(name)  # an error when the node has no such parameter
        return f"{self.node.weights}.{name}"

    def weight(self, name: str, key: str | None = None) -> int:
        """The value index of one of this node's weights (or an explicit key, for tied weights)."""
        key = self.declared(key if key is not None else self.weight_key(name))
        return self.parts.plan.weight_value(key, self.weight_keys[key])

    def host_weight(self, name: str) -> str:
        """``w['<key>']``: the host array, for expressions of ``prepare(w)``."""
        return f"w[{str_literal(self.weight_key(name))}]"

    def derive(self, expression: str, shape: tuple[int, ...]) -> int:
        return self.parts.derive(expression, tuple(shape))

    def weight_or_const(self, name: str, size: int, fill: float) -> int:
        """The weight, or a constant vector (``prepare`` makes it) where the node has none."""
        if self.has_weight(name):
            return self.weight(name)
        return self.derive(f"np.full({int_literal(size)}, {float(fill)!r})", (size,))

    # -- writing the driver ----------------------------------------------------------
    def launch(self, kernel: str, grid: str, block: str, args: list[str]) -> None:
        self.parts.launches += 1
        self.emit(f"{kernel}[{grid}, {block}]({', '.join(args)})")

    @staticmethod
    def i(value: int) -> str:
        return int_literal(int(value))

    @staticmethod
    def f32(value: float) -> str:
        return f32_literal(value)

    def flat_grid(self, n: int) -> tuple[str, str]:
        return dims(cdiv(max(n, 1), BLOCK)), dims(BLOCK)


def rows_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, last axis) of a shape."""
    return prod(shape[:-1]), (shape[-1] if shape else 1)
