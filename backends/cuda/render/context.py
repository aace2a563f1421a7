"""What a CUDA renderer sees of one node: operands and results as value indices, their
concrete types, its weights, and the module being built.

In the generated driver, value ``i`` is ``V[i]`` (shaped device array) and ``F[i]`` (the
same memory, flat); both are made once by ``views()``, so a run allocates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from irc.backends.cpu.literals import comment_text, f32_literal, int_literal, str_literal
from irc.backends.cpu.module import Kernel
from irc.backends.cuda.module import CudaParts
from irc.diagnostics import IrcError
from irc.graph import Node
from irc.types import TensorType

BLOCK = 256  # threads per block of the one-thread-per-element kernels


def concrete(shape: tuple) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def device_dtype(t: TensorType) -> str:
    """Floats run in float32, integers in int64 (token ids)."""
    return "f32" if t.is_float else "i64"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dims(*values: int) -> str:
    """A launch dimension tuple: ``(a, b)``."""
    items = [int_literal(max(1, int(v))) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


@dataclass
class Ctx:
    node: Node
    parts: CudaParts
    ins: list[int]  # value indices of the operands
    in_types: list[TensorType]
    out_types: list[TensorType]
    params: dict[str, tuple[int, ...]]  # this node's parameters and buffers by short name
    weight_keys: dict[str, tuple[int, ...]]  # every key the graph reads, with its shape

    def __post_init__(self) -> None:
        self.outs: list[int | None] = [None] * len(self.out_types)

    # -- reading the node ----------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        value = self.node.attrs.get(name)
        return default if value is None else value

    def in_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.in_types[i].shape)

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.out_types[i].shape)

    def error(self, message: str) -> IrcError:
        return IrcError(f"cuda backend: '{self.node.op}' {message}", self.node.loc)

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
        if name not in self.params:
            raise self.error(f"has no parameter '{name}'")
        return f"{self.node.weights}.{name}"

    def has_weight(self, name: str) -> bool:
        return name in self.params

    def weight(self, name: str, key: str | None = None) -> int:
        """The value index of one of this node's weights (or an explicit key, for tied weights)."""
        key = key if key is not None else self.weight_key(name)
        if key not in self.weight_keys:
            raise self.error(f"needs weight '{key}', which no node of the graph declares")
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
    def kernel(self, kernel: Kernel) -> str:
        return self.parts.kernel(kernel)

    def emit(self, text: str) -> None:
        self.parts.line(text)

    def launch(self, kernel: str, grid: str, block: str, args: list[str]) -> None:
        self.parts.launches += 1
        self.emit(f"{kernel}[{grid}, {block}]({', '.join(args)})")

    @staticmethod
    def i(value: int) -> str:
        return int_literal(int(value))

    @staticmethod
    def f32(value: float) -> str:
        return f32_literal(value)

    def describe(self) -> str:
        n = self.node
        lhs = ", ".join(f"%{v}" for v in n.outputs)
        rhs = ", ".join(f"%{v}" for v in n.inputs)
        where = f"  [{n.scope}]" if n.scope else ""
        return "# " + comment_text(f"{lhs} = {n.op} {rhs}{where}", 116)

    def flat_grid(self, n: int) -> tuple[str, str]:
        return dims(cdiv(max(n, 1), BLOCK)), dims(BLOCK)


def rows_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, last axis) of a shape."""
    return prod(shape[:-1]), (shape[-1] if shape else 1)
