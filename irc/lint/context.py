"""What the rules look at: the graph bound to concrete sizes, and questions about its wiring.

Rules need numbers (T, H, W, the context length), so symbols left unbound are given the
analysis defaults (batch 1, sequence = the position table or 1,024, image side 224) and a
warning that used one says so. When a symbol has no default the graph stays symbolic and
the rules that need sizes stay quiet.
"""

from __future__ import annotations

from functools import cached_property

from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ops.registry import ops_with
from irc.types import TensorType

# op classes the rules ask about, from the op records (irc/ops/registry.py CLASSES)
NORMS = ops_with("norm")
RECURRENT = ops_with("recurrent")
PASS_THROUGH = ops_with("pass_through")  # keep a value's meaning: no weights, no mixing
ACTIVATIONS = ops_with("activation")


class LintContext:
    def __init__(self, graph: Graph, context: int | None = None):
        self.original = graph
        self.bindings: list = []  # irc.analysis.bindings.Binding
        self.graph = graph
        try:
            from irc.analysis.bindings import default_bindings
            from irc.passes.bind import bind_symbols
            from irc.passes.shape_infer import shape_infer

            self.bindings = default_bindings(graph, dict(graph.bindings), context)
            missing = {b.name: b.value for b in self.bindings
                       if b.name in graph.symbols and b.name not in graph.bindings}
            if missing:
                self.graph = shape_infer(bind_symbols(graph, missing))
        except IrcError:  # a symbol with no default size: lint the symbolic graph
            self.bindings = []
            self.graph = graph

    # -- lookups -----------------------------------------------------------------------
    @cached_property
    def types(self) -> dict[str, TensorType]:
        return self.graph.value_types()

    @cached_property
    def original_types(self) -> dict[str, TensorType]:
        return self.original.value_types()

    @cached_property
    def producers(self) -> dict[str, Node]:
        return self.graph.producers()

    @cached_property
    def users(self) -> dict[str, list[Node]]:
        return self.graph.users()

    @cached_property
    def index(self) -> dict[str, int]:
        return {v: i for i, n in enumerate(self.graph.nodes) for v in n.outputs}

    @cached_property
    def concrete(self) -> bool:
        return all(isinstance(t.numel(), int) for n in self.graph.nodes for t in n.types)

    @cached_property
    def owned(self) -> tuple[dict[str, int], int] | None:
        """Parameters each node owns (a shared or tied weight counts once) and the total."""
        from irc.analysis.params import owned_params

        if not self.concrete:
            return None
        own = {n.outputs[0]: int(p) for n, (p, _, _) in zip(self.graph.nodes, owned_params(self.graph))}
        return own, sum(own.values())

    @cached_property
    def analysis(self):  # -> irc.analysis.analyze.Analysis | None
        """FLOPs, KV cache and the attention crossover at the bound sizes (None if symbolic)."""
        from irc.analysis.analyze import Options, analyze_graph

        if not self.concrete:
            return None
        try:
            return analyze_graph(self.graph, self.bindings, Options())
        except IrcError:
            return None

    def nodes(self, *ops: str) -> list[Node]:
        return [n for n in self.graph.nodes if n.op in ops]

    def producer(self, value: str) -> Node | None:
        return self.producers.get(value)

    def output_values(self) -> list[str]:
        return [v for _, v in self.graph.outputs]

    def is_output_head(self, node: Node) -> bool:
        """Whether ``node``'s result is an output, directly or through one activation or dropout."""
        outputs = set(self.output_values())
        after = [node.outputs[0]] + [u.outputs[0] for u in self.users.get(node.outputs[0], [])
                                     if u.op in ACTIVATIONS | PASS_THROUGH]
        return bool(outputs & set(after))

    # -- wiring ----------------------------------------------------------------------------
    @cached_property
    def _reach(self) -> dict[str, int]:
        """Per value, a bit mask of the nodes it is computed from (bit i = graph.nodes[i]);
        ints keep this linear in memory where sets of names would be quadratic."""
        masks: dict[str, int] = {}
        for node in self.graph.nodes:
            m = 0
            for v in node.inputs:
                m |= masks[v] | (1 << self.index[v])
            for v in node.outputs:
                masks[v] = m
        return masks

    def feeds(self, a: str, b: str) -> bool:
        """Whether ``b`` is computed from ``a``."""
        return bool(self._reach[b] >> self.index[a] & 1)

    def upstream_nodes(self, value: str) -> list[Node]:
        """``value``'s producer and every node it is computed from, in program order."""
        mask = self._reach[value] | (1 << self.index[value])
        return [n for i, n in enumerate(self.graph.nodes) if mask >> i & 1]

    def upstream_ops(self, value: str) -> set[str]:
        return {n.op for n in self.upstream_nodes(value)}

    def residual(self, node: Node) -> tuple[str, str] | None:
        """(skip, branch) when ``node`` is x + F(x): an add whose one operand feeds the other."""
        if node.op != "add" or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        if self.feeds(a, b):
            return a, b
        if self.feeds(b, a):
            return b, a
        return None

    def between(self, start: str, end: str) -> list[Node]:
        """Nodes on some path from ``start`` to ``end`` (``end``'s producer included)."""
        return [n for n in self.upstream_nodes(end) if n.outputs[0] != start and self.feeds(start, n.outputs[0])]

    def back_through(self, value: str, ops: frozenset[str] = PASS_THROUGH, scalar_ops: bool = True) -> str:
        """Walk up from ``value`` through single-operand ops in ``ops`` (and x·c, x/c)."""
        while True:
            node = self.producers.get(value)
            if node is None or len(node.inputs) != 1:
                return value
            scalar = scalar_ops and node.op in ("mul", "div") and node.attrs.get("scalar") is not None
            if node.op not in ops and not scalar:
                return value
            value = node.inputs[0]

    # -- sizes the lints assumed -------------------------------------------------------------
    def defaulted(self, *values: str) -> str | None:
        """A note naming the defaulted symbols the types of ``values`` depend on, if any."""
        symbols: set[str] = set()
        for v in values:
            t = self.original_types.get(v)
            if t is not None:
                symbols |= t.symbols()
        used = [b for b in self.bindings if b.name in symbols and b.source not in ("-D", "batch")]
        if not used:
            return None
        sizes = ", ".join(b.describe() for b in used)
        names = " ".join(f"-D {b.name}=VALUE" for b in used)
        return f"sizes: {sizes}; bind others with {names}"
