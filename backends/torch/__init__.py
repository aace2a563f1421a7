"""A PyTorch nn.Module source file for an irc graph (``irc compile --emit torch -o model.py``).

The file needs only ``torch``. Its ``state_dict`` keys are exactly irc's weight keys (scopes
become nested modules, ``pre_ln_decoder.0.attn.wq``), so weights move both ways with
``load_state_dict`` and ``irc run --weights``; ``forward`` takes the model's inputs in
declaration order and returns its outputs (a tuple when there are several, in ``OUTPUTS``'
order). Dropout and BatchNorm follow ``self.training``, so the module trains as written.
One renderer per op, in ``ops_basic.py`` and ``ops_layers.py``.
"""

from __future__ import annotations

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
from irc.backends.torch import ops_basic, ops_experts, ops_layers, ops_more
from irc.backends.torch.helpers import HELPERS, closure
from irc.backends.torch.render import Renderer, literal
from irc.diagnostics import IrcError
from irc.graph import Graph
from irc.ops import canonical_name
from irc.ops.registry import ops_with

# op name -> fn(renderer, node, operand expressions) -> expression
RENDERERS = {**ops_basic.OPS, **ops_layers.OPS, **ops_more.OPS, **ops_experts.OPS}
# op name -> why no torch code can compute it (the emitter stops with this reason)
NO_EMIT: dict[str, str] = {
    "input": "is a graph input, not an op",
    **{op: BACKWARD_REASON for op in ops_with("backward")},
    **{op: LOSS_REASON for op in ops_with("loss")},
    **{op: DECODE_REASON for op in ops_with("decode")},
    "conv2d_bn": FOLDED_BN_REASON,
    "dropout_mask": DROPOUT_MASK_REASON,
}

_PRELUDE = '''
class Scope(nn.ModuleDict):
    """A scope of the irc model: its weights and sub-scopes (a dotted path of scopes is a weight key)."""


def add_weight(root: nn.ModuleDict, key: str, shape: tuple[int, ...], buffer: bool = False) -> None:
    """Create the parameter (or buffer) ``key`` under ``root``, making the scopes on its path."""
    *path, name = key.split(".")
    module = root
    for part in path:
        if part not in module._modules:
            module._modules[part] = Scope()  # not add_module: a scope may be called `forward` or `keys`
        module = module._modules[part]
    if buffer:
        module.register_buffer(name, torch.zeros(shape))
    else:
        module.register_parameter(name, nn.Parameter(torch.zeros(shape)))
'''


def _weight_lines(graph: Graph) -> list[str]:
    """``add_weight`` calls for every parameter and buffer, in irc's order."""
    from irc.analysis.params import weight_table
    from irc.runtime.weights import node_weight_keys

    params, buffers = weight_table(graph)
    lines = []
    types = graph.value_types()
    for table, buffer in ((params, False), (buffers, True)):
        for key, shape in table.items():
            if not all(isinstance(d, int) for d in shape):
                owner = next(n for n in graph.nodes if key in node_weight_keys(n, types).values())
                free = ", ".join(sorted({str(d) for d in shape if not isinstance(d, int)}))
                raise IrcError(f"torch export: weight '{key}' has symbolic shape [{', '.join(map(str, shape))}]; "
                               f"bind {free} with -D", owner.loc)
            extra = ", buffer=True" if buffer else ""
            lines.append(f"        add_weight(self, {key!r}, {literal(tuple(shape))}{extra})")
    return lines


def emit_source(graph: Graph, **_: object) -> str:
    r = Renderer(graph)
    weight_lines = _weight_lines(graph)  # first: a symbolic weight shape is the error to report
    inputs = [n.outputs[0] for n in graph.inputs()]
    arg_names = [r.name(v) for v in inputs]
    body: list[str] = []
    for node in graph.nodes:
        if node.op == "input":
            continue
        name = canonical_name(node.op)
        fn = RENDERERS.get(name)
        if fn is None:
            why = NO_EMIT.get(name, "has no renderer (add one to a table in backends/torch/ops_*.py)")
            raise IrcError(f"torch export: '{node.op}' {why}", node.loc)
        if training_mode(node):
            raise IrcError(f"torch export: '{node.op}' {TRAINING_MODE_REASON}", node.loc)
        expr = fn(r, node, [r.name(v) for v in node.inputs])
        targets = ", ".join(r.name(v) for v in node.outputs)
        shared = node.weights and node.weights != node.scope and r.has_any(node)
        comment = f"  # {node.op}" + (f", weights of {node.weights}" if shared else "")
        body.append(f"        {targets} = {expr}{comment}")
    bind = []
    for sym, user in sorted(r.symbols_used.items()):
        where = next(((r.name(n.outputs[0]), i) for n in graph.inputs() for i, d in enumerate(n.types[0].shape)
                      if str(d) == sym), None)
        if where is None:
            raise IrcError(f"torch export: '{user.op}' needs the size {sym}, which is no axis of an input; "
                           f"bind it with -D {sym}=N", user.loc)
        bind.append(f"        {sym} = {where[0]}.shape[{where[1]}]")
    outs = [r.name(v) for _, v in graph.outputs]
    labels = [label for label, _ in graph.outputs]

    lines = [f'"""PyTorch module for the irc model {graph.name!r}, written by irc {__version__} '
             "(irc compile --emit torch).",
             "",
             "state_dict keys are irc's weight keys: load irc weights with",
             "    model.load_state_dict({k: torch.from_numpy(v) for k, v in numpy.load('w.npz').items()})",
             "and save trained ones for `irc run --weights` with",
             "    numpy.savez('w.npz', **{k: v.detach().numpy() for k, v in model.state_dict().items()})",
             f"Inputs: {', '.join(f'{v}: {t}' for v, t in ((v, r.type_of(v)) for v in inputs))}.",
             f"Outputs: {', '.join(f'{lab}: {r.type_of(v)}' for lab, v in graph.outputs)}.",
             '"""', "", "from __future__ import annotations", "", "import math", "", "import torch",
             "import torch.nn.functional as F", "from torch import nn", ""]
    for helper in closure(r.helpers):
        lines += ["", HELPERS[helper]]
    lines += [_PRELUDE.rstrip("\n"), "", "",
              "class Model(nn.ModuleDict):",
              f'    """irc model {graph.name!r}: forward({", ".join(arg_names)}) -> {", ".join(labels)}."""',
              "",
              f"    INPUTS = {literal(inputs)}",
              f"    OUTPUTS = {literal(labels)}",
              "",
              "    def __init__(self) -> None:",
              "        super().__init__()"]
    lines += weight_lines
    lines += ["", f"    def forward(self, {', '.join(arg_names)}):", *bind, *body,
              f"        return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}", ""]
    return "\n".join(lines)
