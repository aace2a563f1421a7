"""ONNX export: an irc graph as an ONNX model (``irc compile --emit onnx -o model.onnx``).

The graph is exported as built, layer by layer (attention, lstm, layernorm... as the user wrote
them), through one exporter per op in the ``ops_*.py`` tables. Initializers are named by irc's
weight keys, ONNX nodes and values by irc's scope paths, symbolic sizes become named
``dim_param``s, and every value carries its type (irc's for layer outputs, ONNX shape inference's
for the values inside a layer), so Netron shows a shape on every edge. The model is checked with
``onnx.checker`` (full check, with shape inference) before it is returned.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from irc import __version__
from irc.backends.export_reasons import (
    BACKWARD_REASON,
    DECODE_REASON,
    DROPOUT_MASK_REASON,
    FOLDED_BN_REASON,
    LOSS_REASON,
    TRAINING_MODE_REASON,
    training_mode,
)
from irc.backends.onnx import (
    ops_attention,
    ops_conv,
    ops_dense,
    ops_elementwise,
    ops_experts,
    ops_more,
    ops_norm,
    ops_recurrent,
    ops_shape,
)
from irc.backends.onnx.context import DTYPES, OPSET, Context
from irc.diagnostics import IrcError
from irc.graph import Graph
from irc.ops import canonical_name
from irc.ops.registry import ops_with

# op name -> fn(ctx, node, onnx operand names) -> onnx result names
EXPORTERS: dict[str, Any] = {
    **ops_dense.OPS, **ops_conv.OPS, **ops_recurrent.OPS, **ops_attention.OPS, **ops_norm.OPS,
    **ops_elementwise.OPS, **ops_shape.OPS, **ops_more.OPS, **ops_experts.OPS,
}
# op name -> why ONNX cannot express it (the export stops with this reason rather than guess)
NO_EXPORT: dict[str, str] = {
    "input": "is a graph input, not an op",
    **{op: BACKWARD_REASON for op in ops_with("backward")},
    **{op: LOSS_REASON for op in ops_with("loss")},
    **{op: DECODE_REASON for op in ops_with("decode")},
    "conv2d_bn": FOLDED_BN_REASON,
    "dropout_mask": DROPOUT_MASK_REASON,
}
# above this many bytes of weights a model no longer fits one protobuf (2 GiB): weights go to a .data file
EXTERNAL_DATA_BYTES = 1_800_000_000


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise IrcError("--emit onnx needs the Python package 'onnx', which is not installed "
                       "(pip install 'irc[onnx]')") from None
    return onnx


def _value_info(ctx: Context, name: str, value: str) -> Any:
    t = ctx.types[value]
    dims = [d if isinstance(d, int) else str(d) for d in t.shape]
    return ctx.helper.make_tensor_value_info(name, getattr(ctx.onnx.TensorProto, DTYPES[t.dtype]), dims)


def irc_line(node: Any) -> str:
    """``attention {heads=12, causal=true} : f32[B,T,768]`` and the source location."""
    from irc.printer import format_attrs

    text = f"irc: {node.op} {format_attrs(node)}".rstrip() + " : " + ", ".join(str(t) for t in node.types)
    return text + (f" at {node.loc.file}:{node.loc.line}" if node.loc else "")


def _claim(ctx: Context, start: int, produced: str, value: str) -> None:
    """Give the ONNX value ``produced`` (made by the nodes from ``start`` on) the irc value's name."""
    for n in ctx.nodes[start:]:
        for field in (n.output, n.input):
            for i, name in enumerate(field):
                if name == produced:
                    field[i] = value


def to_model(graph: Graph, weights: dict[str, np.ndarray]) -> Any:
    """The ONNX ModelProto of ``graph`` with ``weights`` as initializers, checked."""
    _onnx()  # the clear error first, when onnx is missing
    ctx = Context(graph, weights)
    env: dict[str, str] = {}  # irc value -> its ONNX name (the same name, once claimed)
    named: set[str] = set()
    inputs = []
    for node in graph.nodes:
        if node.op == "input":
            env[node.outputs[0]] = node.outputs[0]
            named.add(node.outputs[0])
            inputs.append(_value_info(ctx, node.outputs[0], node.outputs[0]))
            continue
        name = canonical_name(node.op)
        fn = EXPORTERS.get(name)
        if fn is None:
            why = NO_EXPORT.get(name, "has no exporter (add one to a table in backends/onnx/ops_*.py)")
            raise IrcError(f"onnx export: '{node.op}' {why}", node.loc)
        if training_mode(node):
            raise IrcError(f"onnx export: '{node.op}' {TRAINING_MODE_REASON}", node.loc)
        ctx.node = node
        start = len(ctx.nodes)
        results = fn(ctx, node, [env[v] for v in node.inputs])
        made = {o for n in ctx.nodes[start:] for o in n.output}
        for n in ctx.nodes[start:]:  # Netron shows it: the irc line each ONNX node comes from
            n.doc_string = irc_line(node)
        for value, produced in zip(node.outputs, results):
            if produced == value:  # a param node's value is the initializer of that name
                pass
            elif produced in made and produced not in named:
                _claim(ctx, start, produced, value)
            else:  # an operand or a weight passed through: name it anyway
                ctx.op("Identity", [produced], [value])
            env[value] = value
            named.add(value)
    ctx.node = None
    outputs = []
    for label, value in graph.outputs:
        if label != value and label not in ctx.types and label not in ctx.initializers:
            ctx.op("Identity", [env[value]], [label])
            outputs.append(_value_info(ctx, label, value))
        else:
            outputs.append(_value_info(ctx, env[value], value))
    output_names = {o.name for o in outputs}
    value_info = [_value_info(ctx, v, v) for v in ctx.types if v in env and v not in output_names
                  and v not in {i.name for i in inputs}]
    used = {i for n in ctx.nodes for i in n.input} | {o.name for o in outputs}
    initializers = [t for name, t in ctx.initializers.items() if name in used]  # a constant an op made but not used
    g = ctx.helper.make_graph(ctx.nodes, graph.name, inputs, outputs, initializers,
                              value_info=value_info)
    model = ctx.helper.make_model(g, opset_imports=[ctx.helper.make_opsetid("", OPSET)], producer_name="irc",
                                  producer_version=__version__, doc_string=f"irc model {graph.name}")
    model.ir_version = 8  # the IR version of opset 17's release, so older runtimes read it too
    if graph.bindings:
        ctx.helper.set_model_props(model, {"irc.bindings": ", ".join(f"{k}={v}" for k, v in graph.bindings.items())})
    return checked(model, set(weights))


def checked(model: Any, weight_names: set[str]) -> Any:
    """``model`` with the types of the values inside each layer filled in by ONNX shape inference,
    after ``onnx.checker`` (full check, strict shape inference) passed on it.

    Both run on a copy whose weights are graph inputs of the same type: the same nodes and the
    same shapes, without serializing gigabytes of weights twice (the weights' own tensors come
    from numpy_helper.from_array, well-formed by construction).
    """
    onnx = _onnx()
    from onnx import helper

    g = model.graph
    skeleton = helper.make_model(
        helper.make_graph(list(g.node), g.name,
                          list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                           for t in g.initializer if t.name in weight_names],
                          list(g.output), [t for t in g.initializer if t.name not in weight_names],
                          value_info=list(g.value_info)),
        opset_imports=list(model.opset_import))
    skeleton.ir_version = model.ir_version
    inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    onnx.checker.check_model(inferred, full_check=True)
    del g.value_info[:]
    g.value_info.extend(inferred.graph.value_info)
    return model


def graph_weights(graph: Graph, weights_path: str | None = None, model_file: str | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """The weights an export embeds: those ``irc run --weights`` would read (a file, a checkpoint folder
    or index, through the model's weight map), checked against the graph; else irc's initial ones."""
    from irc.runtime.init import init_weights
    from irc.runtime.weights import load_for_model

    if not weights_path:
        return init_weights(graph, seed)
    return load_for_model(weights_path, graph, model_file, lambda m: print(f"irc: note: {m}", file=sys.stderr))


def write_file(graph: Graph, path: str, weights_path: str | None = None, model_file: str | None = None,
               **_: Any) -> None:
    """``irc compile --emit onnx -o path``: the model, its weights beside it in ``path.data`` past 2 GiB."""
    from irc.output_files import write_atomically

    onnx = _onnx()
    weights = graph_weights(graph, weights_path, model_file)
    model = to_model(graph, weights)
    if sum(np.asarray(w).nbytes for w in weights.values()) <= EXTERNAL_DATA_BYTES:
        data = model.SerializeToString()
        write_atomically(path, lambda f: f.write(data))
        return
    location = Path(path).name + ".data"
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True, location=location)
    write_atomically(path, lambda f: f.write(b""), rehearse=True)  # a bad path fails here, before gigabytes
    onnx.save_model(model, path)
