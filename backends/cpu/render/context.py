"""What a renderer sees of one node: its operands and results as driver variables,
their concrete types, its weights as dictionary lookups, and the module being built."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Any

from irc.backends.cpu.literals import comment_text, shape_literal, str_literal
from irc.backends.cpu.module import Kernel, ModuleParts
from irc.diagnostics import IrcError
from irc.graph import Node
from irc.types import TensorType

if TYPE_CHECKING:
    from irc.backends.cpu.schedule import Schedule

NP_DTYPES = {"f64": "np.float32", "f32": "np.float32", "f16": "np.float32", "bf16": "np.float32",
             "i64": "np.int64", "i32": "np.int32", "i8": "np.int8", "int8": "np.int8", "bool": "np.bool_"}


def np_dtype(t: TensorType) -> str:
    """Every float tensor is float32 at run time (the reference's default precision)."""
    return NP_DTYPES[t.dtype]


def concrete(shape: tuple) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


@dataclass
class NodeCtx:
    node: Node
    parts: ModuleParts
    args: list[str]  # driver variables holding the operands
    outs: list[str]  # driver variables the results go into
    in_types: list[TensorType]
    out_types: list[TensorType]
    params: dict[str, tuple[int, ...]]  # this node's parameters and buffers by short name
    weight_keys: dict[str, tuple[int, ...]]  # every key the module may read, with its shape
    index: int = -1  # the node's position in the graph
    schedule: Schedule | None = None  # where results live (buffer reuse); None: always np.empty
    producers: dict[str, Node] = field(default_factory=dict)  # value -> the node that makes it

    # -- reading the node ----------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        value = self.node.attrs.get(name)
        return default if value is None else value

    def in_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.in_types[i].shape)

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.out_types[i].shape)

    def error(self, message: str) -> IrcError:
        return IrcError(f"cpu backend: '{self.node.op}' {message}", self.node.loc)

    # -- weights -------------------------------------------------------------------
    def weight_key(self, name: str) -> str:
        return f"{self.node.weights}.{name}"

    def weight(self, name: str, key: str | None = None) -> str:
        """``weights['<key>']`` for a parameter of this node (or an explicit key, for tied weights)."""
        if key is None:
            if name not in self.params:
                raise self.error(f"has no parameter '{name}'")
            key = self.weight_key(name)
        if key not in self.weight_keys:
            raise self.error(f"needs weight '{key}', which no node of the graph declares")
        return f"weights[{str_literal(key)}]"

    def weight_shape(self, name: str) -> tuple[int, ...]:
        if name not in self.params:
            raise self.error(f"has no parameter '{name}'")
        return self.params[name]

    def has_weight(self, name: str) -> bool:
        return name in self.params

    def weight_or_zeros(self, name: str, size: int) -> str:
        return self.weight(name) if self.has_weight(name) else f"np.zeros({int(size)}, np.float32)"

    # -- writing the driver ----------------------------------------------------------
    def kernel(self, kernel: Kernel) -> str:
        return self.parts.kernel(kernel)

    def emit(self, text: str) -> None:
        self.parts.line(text)

    def alloc(self, i: int = 0, inplace: tuple[int, ...] = ()) -> str:
        """Give result ``i`` a buffer and return its variable: a dead buffer of its size when the
        schedule has one, or operand ``k`` in ``inplace`` when that operand dies here (the
        kernel must read each element before writing it), else a new ``np.empty``."""
        t = self.out_types[i]
        if self.schedule is None:
            self.emit(f"{self.outs[i]} = np.empty({shape_literal(self.out_shape(i))}, {np_dtype(t)})")
        else:
            operands = list(zip(self.node.inputs, self.args))
            self.schedule.alloc(self.parts, self.index, self.node.outputs[i], self.outs[i], self.out_shape(i),
                                np_dtype(t), operands, inplace)
        return self.outs[i]

    def param_key(self, i: int) -> str | None:
        """The weight key behind operand ``i`` when a ``param`` node makes it, else None."""
        p = self.producers.get(self.node.inputs[i])
        if p is None or p.op != "param":
            return None
        return f"{p.weights}.{p.attrs['name']}"

    def device(self, name: str) -> str:
        from irc.backends.cpu.render import mathfns

        return mathfns.use(self.parts, name)

    def derive(self, key: str, expression: str) -> str:
        """``weights[key]``, computed once per weights dict by ``expression``."""
        from irc.backends.cpu.literals import str_literal

        self.parts.derive(key, expression)
        return f"weights[{str_literal(key)}]"

    def rows(self, var: str, shape: tuple[int, ...]) -> str:
        """``var`` viewed as [rows, last axis] (every driver value is C-contiguous)."""
        return f"{var}.reshape({prod(shape[:-1])}, {shape[-1] if shape else 1})"

    def flat(self, var: str) -> str:
        return f"{var}.reshape(-1)"

    def helper(self, name: str, source: str) -> str:
        return self.parts.helper(name, source)

    def describe(self) -> str:
        """A one-line comment naming the node (its text sanitized)."""
        n = self.node
        lhs = ", ".join(f"%{v}" for v in n.outputs)
        rhs = ", ".join(f"%{v}" for v in n.inputs)
        where = f"  [{n.scope}]" if n.scope else ""
        return "# " + comment_text(f"{lhs} = {n.op} {rhs}{where}", 116)
