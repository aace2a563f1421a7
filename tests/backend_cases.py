"""What the cpu and cuda backend tests share (this module holds no tests): random weights and
inputs, the float64 reference, the small model and the hostile names of the code-generation
tests, and the elementwise ops both backends run.

Expected values come from the NumPy reference interpreter run in float64, or from NumPy
formulas written out in the tests — never from a backend itself.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from irc.analysis.params import weight_table
from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.runtime.graphs import graph_from_source

# -- weights, inputs, the reference ------------------------------------------------------


def shared_temp(factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folder that every pytest-xdist worker of this run shares (each worker's own
    base folder is one level below it), so a graph that two workers compile is compiled once: the cache
    serialises the two with a lock on the entry."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build(source: str, **bindings: int) -> Graph:
    return graph_from_source(source, bindings or None)


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay near unit size (1/sqrt(fan-in) for matrices)."""
    rng = np.random.default_rng(seed)
    params, buffers = weight_table(graph)
    out: dict[str, np.ndarray] = {}
    for key, shape in sorted({**params, **buffers}.items()):
        shape = tuple(int(d) for d in shape)
        if key.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            a = rng.standard_normal(shape) / np.sqrt(prod(shape[1:]))
        else:
            a = rng.standard_normal(shape) * 0.5
        out[key] = a.astype(np.float32)
    return out


def random_inputs(graph: Graph, seed: int = 1, id_bound: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for node in graph.inputs():
        shape = tuple(int(d) for d in node.type.shape)
        if node.type.is_float:
            out[node.outputs[0]] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[node.outputs[0]] = rng.integers(0, id_bound, shape).astype(np.int32)
    return out


def reference(graph: Graph, weights: dict, inputs: dict) -> dict[str, np.ndarray]:
    from irc.backends.numpy_ref import run_graph

    return run_graph(graph, weights, inputs, np.float64)


def assert_run_checks_its_arguments(compiled: Any, w: dict[str, np.ndarray], x: dict[str, np.ndarray]) -> None:
    """``compiled`` (SMALL at B=2, T=5) refuses a missing weight, an input of the wrong shape and
    float token ids, each with a message naming it; ``w`` and ``x`` are good arguments."""
    with pytest.raises(IrcError, match=r"missing weight 'emb.weight' \(expected shape \[13, 8\]\)"):
        compiled.run({k: v for k, v in w.items() if k != "emb.weight"}, x)
    with pytest.raises(IrcError, match=r"input 'tokens' has shape \[2, 4\], the model expects \[2, 5\]"):
        compiled.run(w, {"tokens": x["tokens"][:, :4]})
    with pytest.raises(IrcError, match=r"input 'tokens' must hold integers"):
        compiled.run(w, {"tokens": x["tokens"].astype(np.float32)})


# -- the generated module: one small model, deterministic text ---------------------------

SMALL = """
model small(B, T) {
  input tokens: i32[B, T]
  emb = embedding(13, 8)
  x = emb(tokens)
  h = x + attention(layernorm(x), heads=2, causal=true)
  output logits = unembed(layernorm(h), tied=emb)
}
"""


def emitted_elsewhere(backend: str, hash_seed: str, env: dict[str, str] | None = None) -> str:
    """The module ``irc.backends.<backend>.emit_source`` writes for SMALL (B=2, T=5) in a fresh
    Python process with PYTHONHASHSEED=``hash_seed`` (and ``env``, default this process's)."""
    code = ("import sys; from irc.runtime.graphs import graph_from_source; "
            f"from irc.backends.{backend} import emit_source; "
            "sys.stdout.write(emit_source(graph_from_source(sys.stdin.read(), {'B': 2, 'T': 5})))")
    env = {**(os.environ if env is None else env), "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-c", code], input=SMALL, capture_output=True, text=True, env=env,
                          check=True).stdout


def mystery_op_graph() -> Graph:
    """relu at line 2, renamed to an op no backend has a kernel for."""
    graph = build("model m() { input x: f32[2, 4]\n output y = relu(x) }")
    graph.nodes[1].op = "fused_mystery"
    return graph


# -- names from the model are data --------------------------------------------------------

# IR text may carry any string in scope(...) and weights(...); value names may be Python
# builtins. None of it may become code.
HOSTILE_IR = "\n".join([
    "// irc IR v1",
    "graph @__import__(B) bind(B=2) {",
    "  %__import__ = input : f32[2,4]",
    r"""  %os.system = linear %__import__ {out=3, bias=true} : f32[2,3] scope("x\")\u2028import os #")"""
    r""" weights("w'];__import__('os').system('touch CANARY');x=['")""",
    r"""  %eval = layernorm %os.system {eps=1e-05, affine=true, bias=true} : f32[2,3]"""
    r""" scope("\"\"\"; open('CANARY','w') #")""",
    r"""  %exec = relu %eval : f32[2,3] scope("\\'; raise SystemExit #")""",
    "  output exec = %exec",
    "  output breakpoint = %__import__",
    "}",
    "",
])

# names a graph from another frontend may hold: newlines, quotes, backslashes, NUL, non-ASCII
EVIL = ["\n__import__('os').system('touch CANARY')\n#", "'''", '"""', "\\", "\x00", "é\u2028\r"]


def hostile_graph() -> Graph:
    return PASSES["shape-infer"](parse_ir(HOSTILE_IR))


def evil(name: str) -> str:
    """``name`` behind one of EVIL (which one depends on its length)."""
    return f"{EVIL[len(name) % len(EVIL)]}{name}"


def evil_key(key: str) -> str:
    """A weight key of a graph renamed by ``evil``: its scope is renamed, its parameter is not."""
    scope, _, param = key.rpartition(".")
    return f"{evil(scope)}.{param}"


def rename(graph: Graph, name: Callable[[str], str]) -> Graph:
    """The same graph with every name from the model passed through ``name``."""
    out = graph.copy()
    out.name = name(graph.name)
    out.nodes = [Node(n.op, [name(v) for v in n.inputs], [name(v) for v in n.outputs],
                      {k: name(v) if k == "tied" and v is not None else v for k, v in n.attrs.items()},
                      name(n.scope), None if n.weights is None else name(n.weights), n.loc, list(n.types))
                 for n in graph.nodes]
    out.outputs = [(name(label), name(v)) for label, v in graph.outputs]
    return out


def shape_of_code(text: str) -> str:
    """The module's AST with every string constant blanked: what the code does, not what it names."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = "S"
    return ast.dump(tree)


def names_only_in_strings_and_comments(emit_source: Callable[[Graph], str], comment: str) -> list[str]:
    """Emit the hostile graph and a copy of it with plain names: the code must be the same but
    for string constants, and every comment line naming a node (returned), like the first
    line, must match ``comment`` (a regex of the characters a comment may keep)."""
    hostile = hostile_graph()
    names = sorted({v for n in hostile.nodes for v in n.outputs} | {n.scope for n in hostile.nodes}
                   | {n.weights for n in hostile.nodes if n.weights} | {label for label, _ in hostile.outputs})
    plain = {s: f"name{i}" for i, s in enumerate(names)}
    plain[hostile.name] = "g"
    benign = rename(hostile, lambda s: plain.get(s, s))
    text = emit_source(hostile)
    assert shape_of_code(text) == shape_of_code(emit_source(benign))
    described = [line for line in text.splitlines() if line.lstrip().startswith("# %")]
    for line in described + [text.splitlines()[0]]:
        assert re.fullmatch(comment, line.replace("irc's", "irc")), line
    return described


def run_under_evil_names(emit_source: Callable[[Graph], str], compile_graph: Callable[[Graph], Any],
                         base: Graph) -> tuple[np.ndarray, np.ndarray]:
    """``base`` (SMALL) renamed by ``evil`` emits code of the same shape as under plain names;
    compiled and run on the renamed weights and inputs: (its logits, the reference's)."""
    hostile = rename(base, evil)
    assert shape_of_code(emit_source(hostile)) == shape_of_code(emit_source(rename(base, lambda s: f"n_{s}")))
    compiled = compile_graph(hostile)
    w, x = random_weights(base), random_inputs(base)
    got = compiled.run({evil_key(k): v for k, v in w.items()}, {evil("tokens"): x["tokens"]})
    return got[evil("logits")], reference(base, w, x)["logits"]


# -- op families both backends run ------------------------------------------------------

ELEMENTWISE_INPUTS = """\
  input x: f32[B, 3, 8]
  input v: f32[8]
  input r: f32[B, 1, 8]
  input s: f32[1, 3, 1]
"""

UNARY_OUTPUTS = """\
  output y_relu = relu(x)
  output y_leaky = leaky_relu(x, slope=0.2)
  output y_gelu = gelu(x)
  output y_gelu_tanh = gelu(x, approx=tanh)
  output y_silu = silu(x)
  output y_tanh = tanh(x)
  output y_sigmoid = sigmoid(x)
  output y_abs = abs(x)
  output y_identity = identity(x)
  output y_dropout = dropout(x, 0.5)
"""

BINARY_OUTPUTS = """\
  output y_add = x + x
  output y_add_rows = x + v
  output y_sub_rows_first = v - x
  output y_mul_broadcast = r * s
  output y_div_scalar = x / 4
  output y_rsub_scalar = 2 - x
  output y_rdiv_scalar = 1 / (abs(x) + 1)
"""
