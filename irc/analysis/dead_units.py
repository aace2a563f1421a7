"""Dead rectifier units at initialisation, for ``irc analyze --gradients`` (irc/analysis/gradients.py).

A rectifier (an op whose record carries the ``rectifier`` class: relu, leaky_relu, relu6 — read from
the records, never a list of names here) passes no gradient, or only its small slope, where its
pre-activation is ≤ 0. A *unit* is one element of one sample's pre-activation (every axis but the
first, the batch axis), and it is *dead* when its pre-activation is ≤ 0 for every sample of every
measured batch: then no sample trains the weights that feed it. The count is exact for the samples
measured; with few samples (B × batches) a live unit can read as dead by chance (2^-samples for a
symmetric pre-activation), which is why the sample count is reported with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from irc.analysis.groups import group_of
from irc.graph import Graph, Node


@dataclass
class RectifierUnits:
    layer: str  # the rectifier node's result
    op: str
    block: str  # its block (irc.analysis.groups.group_of), "" at the top level
    value: str  # its pre-activation
    units: int  # elements of one sample's pre-activation
    samples: int  # samples seen: the batch axis summed over the batches
    dead: int  # units ≤ 0 for every sample
    nonpositive_fraction: float  # of every pre-activation element seen, the fraction ≤ 0

    @property
    def dead_fraction(self) -> float | None:
        return self.dead / self.units if self.units else None


def rectifier_nodes(graph: Graph) -> list[Node]:
    """The nodes of rectifier ops whose pre-activation (first operand) is a float of rank ≥ 1."""
    from irc.ops.registry import ops_with

    rectifiers = ops_with("rectifier")
    types = graph.value_types()
    return [n for n in graph.nodes if n.op in rectifiers and types[n.inputs[0]].is_float
            and types[n.inputs[0]].rank >= 1]


class DeadUnitCounter:
    """Accumulates, over batches, which units of each rectifier were ever positive."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self._alive: dict[str, np.ndarray] = {}
        self._samples: dict[str, int] = {}
        self._nonpositive: dict[str, int] = {}
        self._elements: dict[str, int] = {}

    def add(self, node: Node, pre: np.ndarray) -> None:
        key = node.outputs[0]
        pre = np.asarray(pre)
        positive = pre > 0
        alive = positive.any(axis=0)
        self._alive[key] = alive | self._alive[key] if key in self._alive else alive
        self._samples[key] = self._samples.get(key, 0) + int(pre.shape[0])
        self._nonpositive[key] = self._nonpositive.get(key, 0) + int(positive.size - np.count_nonzero(positive))
        self._elements[key] = self._elements.get(key, 0) + int(positive.size)

    def rows(self) -> list[RectifierUnits]:
        out = []
        for node in self.nodes:
            key = node.outputs[0]
            if key not in self._alive:
                continue
            alive = self._alive[key]
            elements = self._elements[key]
            out.append(RectifierUnits(key, node.op, group_of(node), node.inputs[0], int(alive.size),
                                      self._samples[key], int(alive.size - np.count_nonzero(alive)),
                                      self._nonpositive[key] / elements if elements else 0.0))
        return out
