"""Shape inference: record a result type on every node, in program order (like torch.fx's ShapeProp)."""

from __future__ import annotations

from irc.diagnostics import IrcError
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
        try:
            if len(operand_types) < opdef.min_inputs or (
                opdef.max_inputs is not None and len(operand_types) > opdef.max_inputs
            ):
                raise ShapeError(f"takes {opdef.min_inputs}..{opdef.max_inputs} operands, got {len(operand_types)}")
            result = opdef.infer(node.attrs, operand_types)
            opdef.param_shapes(node.attrs, operand_types)  # checks divisibility of parameter shapes too
        except ShapeError as e:
            operands = ", ".join(str(t) for t in operand_types)
            notes = [f"operand types: {operands}"] if operands else []
            raise IrcError(f"'{node.op}': {e}", node.loc, notes=notes, origin=e.origin) from None
        if len(result) != len(node.outputs):
            raise IrcError(f"'{node.op}' yields {len(result)} results but {len(node.outputs)} are named", node.loc)
        node.types = list(result)
        for v, t in zip(node.outputs, result):
            types[v] = t
    return graph
