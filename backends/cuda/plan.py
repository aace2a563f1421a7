"""Where every value of a graph lives on the device, decided once at code-generation time.

A value is one of: a view into a *slot* (a flat device buffer allocated once per compiled
graph and reused by values whose lifetimes do not overlap), a weight (a device array uploaded
once), or a view of another value (reshape, flatten, identity). Slots are assigned greedily
in graph order, so a forward pass allocates nothing while it runs: a kernel's results never
share memory with its operands or with values still to be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from irc.backends.literals import shape_literal, str_literal

DTYPES = {"f32": "np.float32", "i64": "np.int64"}


@dataclass
class Value:
    index: int
    shape: tuple[int, ...]
    dtype: str  # "f32" or "i64"
    root: int  # the value whose storage this one views (itself for storage owners)
    slot: int | None = None  # storage owners in a slot
    weight: str | None = None  # storage owners that are a weight: its key
    alive: int = 1  # values still alive that view this root (roots only)

    @property
    def size(self) -> int:
        return prod(self.shape)


@dataclass
class Slot:
    dtype: str
    size: int


@dataclass
class Plan:
    values: list[Value] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    _free: list[int] = field(default_factory=list)  # free slot indices
    _node_temps: list[int] = field(default_factory=list)

    # -- creating values --------------------------------------------------------------
    def _new(self, shape: tuple[int, ...], dtype: str, root: int | None = None) -> Value:
        if dtype not in DTYPES:
            raise ValueError(f"no device storage for dtype {dtype}")
        v = Value(len(self.values), tuple(int(d) for d in shape), dtype, root=-1)
        v.root = v.index if root is None else root
        self.values.append(v)
        return v

    def slot_value(self, shape: tuple[int, ...], dtype: str = "f32") -> int:
        """A value with storage of its own, in a free slot (the best fit; one grows if none fits)."""
        v = self._new(shape, dtype)
        v.slot = self._take(max(v.size, 1), dtype)
        return v.index

    def temp(self, shape: tuple[int, ...], dtype: str = "f32") -> int:
        """Scratch storage for the node being rendered, free again after it."""
        index = self.slot_value(shape, dtype)
        self._node_temps.append(index)
        return index

    def weight_value(self, key: str, shape: tuple[int, ...]) -> int:
        v = self._new(shape, "f32")
        v.weight = key
        return v.index

    def view(self, of: int, shape: tuple[int, ...]) -> int:
        """The same storage as value ``of``, seen with another shape (sizes must agree)."""
        src = self.values[of]
        if prod(shape) != src.size:
            raise ValueError(f"cannot view {src.shape} as {shape}")
        v = self._new(shape, src.dtype, root=src.root)
        self.values[src.root].alive += 1
        return v.index

    # -- lifetimes ----------------------------------------------------------------------
    def release(self, index: int) -> None:
        """Value ``index`` will not be read again; its slot is free once no view is alive."""
        root = self.values[self.values[index].root]
        root.alive -= 1
        if root.alive == 0 and root.slot is not None:
            self._free.append(root.slot)

    def end_node(self) -> None:
        for index in self._node_temps:
            self.release(index)
        self._node_temps = []

    def _take(self, size: int, dtype: str) -> int:
        fits = [s for s in self._free if self.slots[s].dtype == dtype and self.slots[s].size >= size]
        if fits:
            best = min(fits, key=lambda s: (self.slots[s].size, s))
        else:
            same = [s for s in self._free if self.slots[s].dtype == dtype]
            if not same:
                self.slots.append(Slot(dtype, size))
                return len(self.slots) - 1
            best = max(same, key=lambda s: (self.slots[s].size, -s))
            self.slots[best].size = size
        self._free.remove(best)
        return best

    # -- the generated code -----------------------------------------------------------
    def slot_bytes(self) -> int:
        return sum(s.size * (8 if s.dtype == "i64" else 4) for s in self.slots)

    def view_lines(self) -> list[str]:
        """Statements of ``views(bufs, w)``: ``V[i]`` shaped, ``F[i]`` flat, for every value."""
        lines = []
        for v in self.values:
            root = self.values[v.root]
            shape = shape_literal(v.shape)
            if root.slot is not None:
                flat = f"bufs[{root.slot}][:{v.size}]"
                lines.append(f"F[{v.index}] = {flat}")
                lines.append(f"V[{v.index}] = F[{v.index}].reshape({shape})")
            elif root.weight is not None:
                lines.append(f"V[{v.index}] = w[{str_literal(root.weight)}].reshape({shape})")
                lines.append(f"F[{v.index}] = w[{str_literal(root.weight)}].reshape({v.size})")
            else:  # pragma: no cover - every root has a slot or a weight
                raise AssertionError(f"value {v.index} has no storage")
        return lines

    def slot_literal(self) -> str:
        items = [f"({str_literal(s.dtype)}, {s.size})" for s in self.slots]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
