"""What a renderer's context reads of its node the same way in every backend: attributes,
concrete operand and result shapes, its parameters, the errors it reports (named for the
backend), and the comment line that names the node in the generated driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from irc.backends.emit_common import concrete
from irc.backends.literals import comment_text
from irc.diagnostics import IrcError, raise_site
from irc.graph import Node
from irc.types import TensorType

if TYPE_CHECKING:
    from irc.backends.common.kernel import Kernel, ModuleParts


@dataclass
class NodeView:
    """The part of a backend's render context that both backends have; a backend's context
    adds where operands and results live, and how to write them."""

    BACKEND: ClassVar[str]  # the backend's name, as its messages start: "<BACKEND> backend: ..."
    node: Node
    parts: ModuleParts
    in_types: list[TensorType]
    out_types: list[TensorType]
    params: dict[str, tuple[int, ...]]  # this node's parameters and buffers by short name
    weight_keys: dict[str, tuple[int, ...]]  # every key the graph reads, with its shape

    # -- reading the node ----------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        value = self.node.attrs.get(name)
        return default if value is None else value

    def in_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.in_types[i].shape)

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return concrete(self.out_types[i].shape)

    def error(self, message: str) -> IrcError:
        """The error to raise, recorded as raised where ``raise ctx.error(...)`` stands."""
        return IrcError(f"{self.BACKEND} backend: '{self.node.op}' {message}", self.node.loc, origin=raise_site())

    # -- weights -------------------------------------------------------------------
    def has_weight(self, name: str) -> bool:
        return name in self.params

    def weight_shape(self, name: str) -> tuple[int, ...]:
        """The shape of this node's parameter ``name``; an error when the node has none."""
        if name not in self.params:
            raise self.error(f"has no parameter '{name}'")
        return self.params[name]

    def declared(self, key: str) -> str:
        """``key``, once checked to be a weight some node of the graph declares."""
        if key not in self.weight_keys:
            raise self.error(f"needs weight '{key}', which no node of the graph declares")
        return key

    # -- writing the driver ----------------------------------------------------------
    def kernel(self, kernel: Kernel) -> str:
        return self.parts.kernel(kernel)

    def emit(self, text: str) -> None:
        self.parts.line(text)

    def describe(self) -> str:
        """A one-line comment naming the node (its text sanitized)."""
        n = self.node
        lhs = ", ".join(f"%{v}" for v in n.outputs)
        rhs = ", ".join(f"%{v}" for v in n.inputs)
        where = f"  [{n.scope}]" if n.scope else ""
        return "# " + comment_text(f"{lhs} = {n.op} {rhs}{where}", 116)
