"""The ``grad`` pass: reverse-mode autodiff from a graph with a scalar loss to a backward graph that is
itself ordinary IR (printable, parseable, analysable, run by the NumPy reference).

The pass lowers the dense layers first (the ``decompose`` rules: linear, FFN, SwiGLU, unembedding and
attention become ``param``, ``gemm``, ``matmul``, ``softmax``…), so their weight gradients are plain
matrix products the analysis counts exactly. It then walks the nodes in reverse and asks each op's
record for its vector-Jacobian product (``OpDef.vjp``, irc/ops/vjps.py), which emits the nodes of the
backward through a :class:`Builder`. Gradients reaching one value from several uses are summed (a tied
embedding, a residual stream), so every weight key gets one accumulated gradient.

Outputs: the loss, then ``grad_<key>`` for each weight key (dots as ``_``; its value is named
``%grad.<key>``) in the order the weights are first used, then ``grad_<input>`` for each float input.
docs/autodiff.md describes the design and each formula.
"""

from __future__ import annotations

from typing import Any

from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ops import ShapeError, get_op, normalize_attrs
from irc.ops.registry import AttrError
from irc.passes import grad_flash  # noqa: F401  (registers flash-grad, which fuses a differentiated attention)
from irc.passes.decompose import GRAD_RULES
from irc.passes.names import dotted_name, fresh_name, name_part
from irc.passes.registry import register_pass
from irc.passes.rewrite import apply_rules, eliminate_dead
from irc.passes.shape_infer import shape_infer
from irc.runtime.weights import node_weight_keys
from irc.types import TensorType


class Builder:
    """Appends typed backward nodes at a forward node's scope and location (what a vjp calls)."""

    def __init__(self, graph: Graph):
        self.types: dict[str, TensorType] = graph.value_types()
        self.names: set[str] = {v for n in graph.nodes for v in n.outputs}
        self.nodes: list[Node] = []
        self.at: Node | None = None  # the forward node whose vjp is running

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.names)

    def type(self, value: str) -> TensorType:
        return self.types[value]

    def op(self, op: str, inputs: list[str], attrs: dict[str, Any] | None = None, weights: str | None = None,
           results: int = 1, name: str | None = None) -> Any:
        """A new node; its result name (or list of names when ``results`` > 1)."""
        at = self.at
        assert at is not None
        opdef = get_op(op)
        assert opdef is not None, op
        try:
            clean = normalize_attrs(opdef, {k: v for k, v in (attrs or {}).items() if v is not None
                                            and opdef.attr(k) is not None})
            types = opdef.infer(clean, [self.types[v] for v in inputs])
        except (ShapeError, AttrError) as e:
            raise IrcError(f"grad of '{at.op}': '{op}': {e}", at.loc, origin=e.origin) from None
        base = name or f"d.{at.outputs[0]}"
        outs = [self.fresh(base) for _ in range(len(types))]
        assert len(outs) == results, (op, len(outs), results)
        self.nodes.append(Node(op, list(inputs), outs, clean, at.scope, weights, at.loc, list(types)))
        for v, t in zip(outs, types):
            self.types[v] = t
        return outs if results > 1 else outs[0]

    def sum_to(self, dy: str, like: str) -> str:
        """``dy`` summed back to the shape of ``like`` (undoing broadcasting), or ``dy`` when it already is."""
        want = self.types[like].shape
        if self.types[dy].shape == want:
            return dy
        return self.op("sum_to", [dy], {"shape": list(want)})

    def refuse(self, node: Node, what: str) -> None:
        raise IrcError(f"grad: cannot differentiate {what}", node.loc)


def _requires_grad(graph: Graph, types: dict[str, TensorType]) -> set[str]:
    """Values that depend on a float input or on a weight (the only ones a gradient can reach)."""
    out: set[str] = set()
    for node in graph.nodes:
        if node.op == "input":
            if types[node.outputs[0]].is_float:
                out.add(node.outputs[0])
            continue
        if node_weight_keys(node, types) or any(v in out for v in node.inputs):
            out.update(v for v in node.outputs if types[v].is_float)
    return out


def _loss_node(graph: Graph) -> Node:
    producers = graph.producers()
    losses = [(label, producers[v]) for label, v in graph.outputs if get_op(producers[v].op).has("loss")]
    if len(losses) != 1:
        found = "none" if not losses else ", ".join(label for label, _ in losses)
        raise IrcError(f"the grad pass needs exactly one output computed by a loss (cross_entropy or mse); "
                       f"model '{graph.name}' has {found}", graph.loc)
    return losses[0][1]


def grad_label(key: str, taken: set[str]) -> str:
    """An output label for the gradient of ``key`` (labels are plain names: dots become ``_``)."""
    return fresh_name("grad_" + name_part(key), taken, sep="_")


def _value_name(key: str) -> str:
    return dotted_name(key, prefix="grad.")


@register_pass("grad", "reverse-mode autodiff of a scalar loss: outputs the loss and grad_<weight key> per weight")
def grad(graph: Graph) -> Graph:
    fwd = apply_rules(graph, GRAD_RULES, max_rounds=2)
    loss = _loss_node(fwd)
    types = fwd.value_types()
    needs = _requires_grad(fwd, types)
    b = Builder(fwd)
    adjoints: dict[str, list[str]] = {}
    weight_grads: dict[str, list[str]] = {}

    def total(parts: list[str], node: Node, name: str | None = None) -> str:
        b.at = node
        acc = parts[0]
        for i, p in enumerate(parts[1:]):
            acc = b.op("add", [acc, p], name=name if i == len(parts) - 2 else None)
        return acc

    for node in reversed(fwd.nodes):
        if node.op == "input":
            continue
        is_root = node is loss
        if not is_root and not any(v in adjoints for v in node.outputs):
            continue
        keys = node_weight_keys(node, types)
        if not keys and not any(v in needs for v in node.inputs):
            continue
        opdef = get_op(node.op)
        if opdef.vjp is None:
            why = opdef.na.get("grad", "its record declares no vector-Jacobian product")
            raise IrcError(f"grad: '{node.op}' cannot be differentiated yet: {why}", node.loc)
        dys = [None if is_root else (total(adjoints[v], node) if v in adjoints else None) for v in node.outputs]
        b.at = node
        for k, g in opdef.vjp(b, node, dys).items():
            if g is None:
                continue
            if isinstance(k, int):
                v = node.inputs[k]
                if v in needs:
                    adjoints.setdefault(v, []).append(g)
            else:
                weight_grads.setdefault(keys[k], []).append(g)

    named: list[tuple[str, str]] = []  # (label, value) of each gradient output
    taken = {label for label, _ in fwd.outputs}
    for key in _weight_order(fwd, types):
        if key in weight_grads:
            named.append((grad_label(key, taken), total(weight_grads[key], loss)))
    for node in fwd.inputs():
        if node.outputs[0] in adjoints:
            named.append((grad_label(node.outputs[0], taken), total(adjoints[node.outputs[0]], node)))
    keys_of = {label: key for label, key in zip((lb for lb, _ in named), _named_keys(fwd, types, weight_grads,
                                                                                     adjoints))}
    used = [v for n in b.nodes for v in n.inputs] + [v for _, v in named]
    outputs = list(fwd.outputs)
    for label, value in named:
        b.at = loss
        outputs.append((label, _rename(b, value, _value_name(keys_of[label]), used.count(value) > 1)))
    out = Graph(fwd.name, list(fwd.symbols), list(fwd.nodes) + b.nodes, outputs, dict(fwd.bindings), fwd.loc)
    return shape_infer(eliminate_dead(out))


def _named_keys(graph: Graph, types: dict[str, TensorType], weight_grads: dict[str, list[str]],
                adjoints: dict[str, list[str]]) -> list[str]:
    """The weight keys and input names that get a gradient output, in output order."""
    return [k for k in _weight_order(graph, types) if k in weight_grads] + \
        [n.outputs[0] for n in graph.inputs() if n.outputs[0] in adjoints]


def _weight_order(graph: Graph, types: dict[str, TensorType]) -> list[str]:
    seen: dict[str, None] = {}
    for node in graph.nodes:
        for key in node_weight_keys(node, types).values():
            seen.setdefault(key, None)
    return list(seen)


def _rename(b: Builder, value: str, name: str, shared: bool) -> str:
    """Give a gradient the readable name ``grad.<key>``: its node's result takes the name, or, when the
    value is read elsewhere too, a free ``identity`` copy does."""
    node = next((n for n in b.nodes if value in n.outputs), None)
    if node is None or shared:
        return b.op("identity", [value], name=name)
    new = b.fresh(name)
    node.outputs = [new if v == value else v for v in node.outputs]
    b.types[new] = b.types[value]
    return new


def attach_loss(graph: Graph, loss: str = "cross_entropy", output: str | None = None, target: str = "targets",
                **attrs: Any) -> Graph:
    """A copy of ``graph`` whose one output is ``loss`` of output ``output`` (the first by default)
    against a new input named ``target`` (made unique): class ids (the output's shape without its
    last axis) for cross_entropy, values of the output's type for mse. What a training driver feeds
    the grad pass; a programming interface, so a wrong output label is an assertion."""
    labels = dict(graph.outputs)
    label = output or graph.outputs[0][0]
    assert label in labels, f"model '{graph.name}' has no output '{label}' (outputs: {', '.join(labels)})"
    value = labels[label]
    out = graph.copy()
    t = out.value_types()[value]
    ttype = TensorType("i64", t.shape[:-1]) if loss == "cross_entropy" else t
    taken = {v for n in out.nodes for v in n.outputs}

    def fresh(base: str) -> str:
        return fresh_name(base, taken, sep="_")

    name = fresh(target)
    inputs = [i for i, n in enumerate(out.nodes) if n.op == "input"]
    at = inputs[-1] + 1 if inputs else 0
    out.nodes.insert(at, Node("input", [], [name], {}, "", None, graph.loc, [ttype]))
    opdef = get_op(loss)
    out.nodes.append(Node(loss, [value, name], [fresh(f"{label}_loss")], normalize_attrs(opdef, attrs), "", None,
                          graph.loc))
    out.outputs = [("loss", out.nodes[-1].outputs[0])]
    return shape_infer(out)
