"""What a renderer sees of one node: its operands and results as driver variables,
their concrete types, its weights as dictionary lookups, and the module being built."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, ClassVar

from irc.backends.cpu.schedule import new_buffer
from irc.backends.literals import str_literal
from irc.backends.node_view import NodeView
from irc.graph import Node
from irc.types import TensorType

if TYPE_CHECKING:
    from irc.backends.cpu.schedule import Schedule

NP_DTYPES = {"f64": "np.float32", "f32": "np.float32", "f16": "np.float32", "bf16": "np.float32",
             "i64": "np.int64", "i32": "np.int32", "i8": "np.int8", "int8": "np.int8", "bool": "np.bool_"}


def np_dtype(t: TensorType) -> str:
    """Every float tensor is float32 at run time (the reference's default precision)."""
    return NP_DTYPES[t.dtype]


@dataclass
class NodeCtx(NodeView):
    BACKEND: ClassVar[str] = "cpu"

    args: list[str]  # driver variables holding the operands
    outs: list[str]  # driver variables the results go into
    index: int = -1  # the node's position in the graph
    schedule: Schedule | None = None  # where results live (buffer reuse); None: always np.empty
    producers: dict[str, Node] = field(default_factory=dict)  # value -> the node that makes it
    # dense layers against a weight known at load may run on a packed copy of it (gemm_panels, gemm_stream):
    # False for a graph run once per weights dict (a decoder's prefill), where the copy costs memory and a pass
    # over the weights for one use
    pack_weights: bool = True

    # -- weights -------------------------------------------------------------------
    def weight_key(self, name: str) -> str:
        return f"{self.node.weights}.{name}"

    def weight(self, name: str, key: str | None = None) -> str:
        """``weights['<key>']`` for a parameter of this node (or an explicit key, for tied weights)."""
        if key is None:
            self.weight_shape(name)  # an error when the node has no such parameter
            key = self.weight_key(name)
        return f"weights[{str_literal(self.declared(key))}]"

    def weight_or_zeros(self, name: str, size: int) -> str:
        return self.weight(name) if self.has_weight(name) else f"np.zeros({int(size)}, np.float32)"

    # -- writing the driver ----------------------------------------------------------
    def alloc(self, i: int = 0, inplace: tuple[int, ...] = ()) -> str:
        """Give result ``i`` a buffer and return its variable: a dead buffer of its size when the
        schedule has one, or operand ``k`` in ``inplace`` when that operand dies here (the
        kernel must read each element before writing it), else a new ``np.empty``."""
        t = self.out_types[i]
        if self.schedule is None:
            self.emit(new_buffer(self.parts, self.outs[i], self.out_shape(i), np_dtype(t)))
        else:
            operands = list(zip(self.node.inputs, self.args))
            self.schedule.alloc(self.parts, self.index, self.node.outputs[i], self.outs[i], self.out_shape(i),
                                np_dtype(t), operands, inplace)
        return self.outs[i]

    def scratch(self, var: str, shape: tuple[int, ...]) -> str:
        """A float32 driver temporary ``var`` of ``shape`` (not the node's result, not scheduled); its name."""
        self.emit(new_buffer(self.parts, var, shape, "np.float32"))
        return var

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
        self.parts.derive(key, expression)
        return f"weights[{str_literal(key)}]"

    def rows(self, var: str, shape: tuple[int, ...]) -> str:
        """``var`` viewed as [rows, last axis] (every driver value is C-contiguous)."""
        return f"{var}.reshape({prod(shape[:-1])}, {shape[-1] if shape else 1})"

    def flat(self, var: str) -> str:
        return f"{var}.reshape(-1)"

    def helper(self, name: str, source: str) -> str:
        return self.parts.helper(name, source)
