"""Shape inference: record a result type on every node, in program order (like torch.fx's ShapeProp)."""

from __future__ import annotations

from irc.diagnostics import IrcError, plural
from irc.graph import Graph
from irc.ops import ShapeError, get_op
from irc.passes.registry import register_pass


@register_pass("shape-infer", "infer the result type of every node; errors name the op, shapes and source line")
def shape_infer(graph: Graph) -> Graph:
    types = {}
    for node in graph.nodes:
        opdef = get_op(node.op)
        if opdef is None:
            raise IrcError(f"unknown op '{node.op}'", node.loc)
        if node.op == "input":
            types[node.outputs[0]] = node.types[0]
            continue
        operand_types = [types[v] for v in node.inputs]
        lo, hi = opdef.min_inputs, opdef.max_inputs
        if len(operand_types) < lo or (hi is not None and len(operand_types) > hi):
            raise IrcError(f"'{node.op}' takes {_operand_count(lo, hi)}, got {len(operand_types)}", node.loc,
                           notes=_operand_note(operand_types))
        try:
            result = opdef.infer(node.attrs, operand_types)
            opdef.param_shapes(node.attrs, operand_types)  # checks divisibility of parameter shapes too
        except ShapeError as e:
            raise IrcError(f"'{node.op}': {e}", node.loc, notes=_operand_note(operand_types), origin=e.origin) from None
        if len(result) != len(node.outputs):
            raise IrcError(f"'{node.op}' has {plural(len(result), 'result')} but "
                           f"{plural(len(node.outputs), 'name')}", node.loc)
        node.types = list(result)
        for v, t in zip(node.outputs, result):
            types[v] = t
    return graph


def _operand_count(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"at least {plural(lo, 'operand')}"
    if lo == hi:
        return plural(lo, "operand")
    return f"{lo} to {plural(hi, 'operand')}" if hi > lo + 1 else f"{lo} or {plural(hi, 'operand')}"


def _operand_note(types: list) -> list[str]:
    return [f"operand types: {', '.join(str(t) for t in types)}"] if types else []
