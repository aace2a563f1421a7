"""Activation buffers by liveness: free a buffer after its last reader, reuse it for a later
result of the same size, and let element-wise kernels write over an operand that dies there.

The liveness model is the analysis pass's (:mod:`irc.analysis.memory`): a value lives from
the node that makes it to its last reader; a view keeps the buffer it views alive. Here the
views are the ops this backend renders as NumPy views (reshape, flatten, identity,
dropout); every other result is a buffer the driver allocated (``np.empty``; float32 ones through
``empty64``, on a cache line, :mod:`irc.backends.cpu.aligned`) and owns.
Inputs and weights belong to the caller and graph outputs to the result: never reused within a run.
A graph output's own buffer comes from ``output_buffer``: the caller may offer the buffer an earlier run
returned, once nothing else holds it (CompiledGraph does), so a large output (GPT-2's logits, 51 MB at
T = 256) is not a fresh mapping whose every page the kernel zeroes on first touch, run after run.

The driver stays plain Python: a reused buffer is ``v12 = v7.reshape(...)`` followed by
``del v7``, and a dead buffer that no later result can use is ``del``-eted at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from irc.analysis.memory import ALIASES
from irc.backends.common.kernel import ModuleParts
from irc.backends.cpu.aligned import EMPTY64
from irc.backends.literals import shape_literal, str_literal
from irc.graph import Graph

# ops the driver renders as views of their operand (a subset of the analysis' ALIASES:
# transpose, select, slice and split copy into buffers of their own here)
VIEWS = frozenset({"flatten", "reshape", "identity", "dropout"})
assert VIEWS <= ALIASES
EXTERNAL = frozenset({"input", "param"})  # results the caller owns

OUTPUT_BUFFER = '''\
def output_buffer(buffers, key, shape, dtype):
    """A graph output's buffer: the one ``buffers`` offers under ``key`` (an earlier run's, which the caller
    checked nothing else holds) when it fits, else a new one; either way left in ``buffers`` for the caller."""
    if buffers is None:
        return np.empty(shape, dtype)
    a = buffers.get(key)
    if a is None or a.shape != shape or a.dtype != dtype:
        a = np.empty(shape, dtype)
        buffers[key] = a
    return a
'''


def new_buffer(parts: ModuleParts, var: str, shape: tuple[int, ...], dtype: str) -> str:
    """The driver line giving ``var`` a fresh buffer: float32 ones on a 64-byte boundary (the register blocks
    stream whole vectors through them; :mod:`irc.backends.cpu.aligned`), others a plain ``np.empty``."""
    if dtype == "np.float32":
        parts.helper("empty64", EMPTY64)
        return f"{var} = empty64({shape_literal(shape)})"
    return f"{var} = np.empty({shape_literal(shape)}, {dtype})"


def _nbytes(t) -> int:
    from irc.types import DTYPE_BYTES

    n = 1
    for d in t.shape:
        n *= int(d)
    per = 4 if t.is_float else int(DTYPE_BYTES.get(t.dtype, 8))
    return n * per


@dataclass
class Schedule:
    """Decides, node by node while the driver is written, where each result lives."""

    graph: Graph
    root: dict[str, str] = field(default_factory=dict)  # value -> the value that owns its buffer
    last: dict[str, int] = field(default_factory=dict)  # root -> index of its buffer's last reader
    pinned: set[str] = field(default_factory=set)  # roots that must outlive the run (outputs)
    owned: set[str] = field(default_factory=set)  # roots the driver allocated
    consumed: set[str] = field(default_factory=set)  # roots whose buffer a result took over
    pool: dict[tuple[int, str], list[str]] = field(default_factory=dict)  # dead buffers by (bytes, dtype)
    demand: Counter = field(default_factory=Counter)  # (bytes, dtype) of results not yet written
    reused: int = 0  # results that took a dead buffer (for tests and reports)
    in_place: int = 0  # results written over a dying operand

    def __post_init__(self) -> None:
        types = self.graph.value_types()
        self.types = types
        for i, node in enumerate(self.graph.nodes):
            for v in node.inputs:
                self.last[self.root[v]] = i
            for v in node.outputs:
                self.root[v] = self.root[node.inputs[0]] if node.op in VIEWS and node.inputs else v
                self.last.setdefault(self.root[v], i)
                if node.op not in VIEWS and node.op not in EXTERNAL:
                    self.demand[self._key(v)] += 1
        for _, v in self.graph.outputs:
            self.pinned.add(self.root[v])

    def _key(self, value: str) -> tuple[int, str]:
        t = self.types[value]
        return _nbytes(t), "f32" if t.is_float else t.dtype

    def begin(self, node_outputs: list[str], op: str) -> None:
        if op in VIEWS or op in EXTERNAL:
            return
        for v in node_outputs:
            self.demand[self._key(v)] -= 1

    def alloc(self, parts: ModuleParts, index: int, value: str, var: str, shape: tuple[int, ...], dtype: str,
              operands: list[tuple[str, str]], inplace: tuple[int, ...]) -> None:
        """Write the line that gives ``var`` (result ``value`` of node ``index``) its buffer.

        ``operands`` are the node's (value, driver variable) pairs; ``inplace`` the operand
        positions the kernel may overwrite (element-wise: it reads each element before it
        writes that element).
        """
        key = self._key(value)
        for k in inplace:
            v, arg = operands[k]
            r = self.root[v]
            others = [self.root[o] for j, (o, _) in enumerate(operands) if j != k]
            if (r in self.owned and r not in self.pinned and r not in self.consumed and self.last[r] == index
                    and self._key(v) == key and r not in others):
                self.consumed.add(r)
                self.owned.add(value)
                self.in_place += 1
                parts.line(f"{var} = {arg}.reshape({shape_literal(shape)})  # in place: {arg} dies here")
                return
        free = self.pool.get(key)
        self.owned.add(value)
        if free:
            old = free.pop()
            self.reused += 1
            parts.line(f"{var} = {old}.reshape({shape_literal(shape)})  # reuses a dead buffer")
            parts.line(f"del {old}")
            return
        if self.root[value] in self.pinned:
            parts.helper("output_buffer", OUTPUT_BUFFER)
            parts.line(f"{var} = output_buffer(buffers, {str_literal(var)}, {shape_literal(shape)}, {dtype})")
            return
        parts.line(new_buffer(parts, var, shape, dtype))

    def release(self, index: int, dying: list[str], var: dict[str, str]) -> list[str]:
        """After node ``index``: pool the dead buffers a later result can use; return the
        variables to ``del``."""
        out: list[str] = []
        pooled: set[str] = set()
        for v in dying:
            r = self.root[v]
            key = self._key(v)
            dead_buffer = (self.last[r] == index and r in self.owned and r not in self.pinned
                           and r not in self.consumed and r not in pooled)
            if dead_buffer and self._key(r) == key and len(self.pool.get(key, ())) < self.demand[key]:
                self.pool.setdefault(key, []).append(var[v])
                pooled.add(r)
                continue
            out.append(var[v])
        return out
