"""What ``irc train`` trains: the model's step graphs at the batch size, and the data checked against them.

The batch is the size on axis 0 of every input (a symbol, bound to ``--batch``); other free sizes are
read off an ``.npz``'s arrays or take irc's defaults (a language model's context). Each array must
match its input's per-sample shape and kind, and class ids must fall among the output's classes: an
error names the key, the model's type and what the data holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import IrcError, UsageError, quote
from irc.graph import Graph
from irc.runtime.train import StepGraphs
from irc.runtime.train_data import DIGITS, Dataset


def _sym_name(dim: Any) -> str | None:
    """The symbol's name when ``dim`` is one plain symbol (``B``, not ``2*T``)."""
    from irc.dims import Sym

    if isinstance(dim, Sym) and len(dim.terms) == 1:
        (mono, coeff), = dim.terms
        if coeff == 1 and len(mono) == 1:
            return mono[0]
    return None


def _output(graph: Graph, label: str | None) -> str:
    outputs = dict(graph.outputs)
    label = label or graph.outputs[0][0]
    if label not in outputs:
        raise UsageError(f"--output: model '{graph.name}' has no output '{quote(label)}' "
                         f"(outputs: {', '.join(outputs)})")
    t = graph.value_types()[outputs[label]]
    if not t.is_float:
        raise IrcError(f"the loss needs a float output, but output '{label}' of model '{graph.name}' is {t}; "
                       "choose another with --output", graph.loc)
    return label


def _batch_symbol(graph: Graph) -> str | int:
    """The batch: the symbol (or fixed size) on axis 0 of every input."""
    found: set = set()
    for node in graph.inputs():
        t = node.types[0]
        if t.rank == 0:
            raise IrcError(f"input '{node.outputs[0]}' is a scalar: irc train feeds batches on axis 0", node.loc)
        d = t.shape[0]
        found.add(d if isinstance(d, int) else (_sym_name(d) or str(d)))
    if len(found) != 1:
        raise IrcError(f"irc train feeds batches on axis 0 of every input; model '{graph.name}' has axes 0 of "
                       f"{', '.join(sorted(str(d) for d in found)) or 'no inputs'}", graph.loc)
    return found.pop()


def _bind_from_arrays(graph: Graph, arrays: dict[str, np.ndarray], where: str) -> dict[str, int]:
    """Sizes of the samples' axes (not the batch) read off the data, for symbols the model leaves free."""
    out: dict[str, int] = {}
    for node in graph.inputs():
        name, t = node.outputs[0], node.types[0]
        arr = arrays.get(name)
        if arr is None or arr.ndim != t.rank:
            continue  # reported once the sizes are bound
        for d, n in zip(t.shape[1:], arr.shape[1:]):
            sym = _sym_name(d)
            if sym is not None and sym not in graph.bindings:
                if out.setdefault(sym, n) != n:
                    raise IrcError(f"{where}: the arrays give size {sym} both {out[sym]} and {n}")
    return out


def _digits_arrays(graph: Graph, target: str) -> dict[str, np.ndarray]:
    from irc.runtime.train_data import load_digits_arrays

    floats = [n for n in graph.inputs() if n.types[0].is_float]
    if len(graph.inputs()) != 1 or not floats:
        raise IrcError(f"--data digits feeds one float input of 64 pixels per sample; model '{graph.name}' has "
                       f"inputs {', '.join(f'{n.outputs[0]}: {n.types[0]}' for n in graph.inputs())}", graph.loc)
    node = floats[0]
    sample = node.types[0].shape[1:]
    if not all(isinstance(d, int) for d in sample) or math.prod(sample) != 64:
        raise IrcError(f"--data digits has 8x8 = 64 pixels per sample, but input '{node.outputs[0]}' is "
                       f"{node.types[0]}; make one sample 64 values ([B, 64], [B, 1, 8, 8] ...)", node.loc)
    x, y = load_digits_arrays()
    return {node.outputs[0]: x.reshape((len(x), *sample)), target: y}


def _check_arrays(graphs: StepGraphs, arrays: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """Every input and the target present, of the model's per-sample shape and kind; class ids in range."""
    types = graphs.eval.value_types()
    needed = [n.outputs[0] for n in graphs.eval.inputs()]
    out: dict[str, np.ndarray] = {}
    for name in needed:
        t = types[name]
        role = "the loss target" if name == graphs.target else "the model input"
        if name not in arrays:
            raise IrcError(f"{where} has no array '{name}' for {role} '{name}' ({t} per batch); it holds: "
                           f"{', '.join(repr(k) for k in arrays)}")
        arr = arrays[name]
        want = tuple(t.shape[1:])
        if arr.ndim != t.rank or tuple(arr.shape[1:]) != want:
            raise IrcError(f"{where}: array '{name}' has samples of shape [{', '.join(map(str, arr.shape[1:]))}], "
                           f"but {role} '{name}' is {t}: samples of shape [{', '.join(map(str, want))}]")
        if t.is_float:
            out[name] = arr.astype(np.float32)
            continue
        if arr.dtype.kind not in "iub":
            raise IrcError(f"{where}: array '{name}' holds {arr.dtype}, but {role} '{name}' is {t} (integers)")
        out[name] = arr.astype(np.int64)
    target = out[graphs.target]
    if graphs.loss == "cross_entropy":
        classes = int(types[dict(graphs.eval.outputs)[graphs.output]].shape[-1])
        bad = (target != graphs.ignore_index) & ((target < 0) | (target >= classes))
        if bad.any():
            at = int(np.argwhere(bad)[0][0])
            raise IrcError(f"{where}: array '{graphs.target}' holds class id {int(target[bad][0])} (sample {at}), "
                           f"outside the {classes} classes [0, {classes}) of output '{graphs.output}'")
    return out


def _text_model(graph: Graph) -> tuple[str, str | None]:
    """The one integer input [B, T] of a byte-level language model, and T's symbol (None when fixed)."""
    ins = graph.inputs()
    t = ins[0].types[0] if len(ins) == 1 else None
    if t is None or t.is_float or t.rank != 2:
        listed = ", ".join(f"{n.outputs[0]}: {n.types[0]}" for n in ins)
        raise IrcError(f"a text file trains a byte-level language model: one input of token ids [B, T]; model "
                       f"'{graph.name}' has {listed or 'no inputs'}", graph.loc)
    return ins[0].outputs[0], _sym_name(t.shape[1])


def load_training(args: Any, note: Callable[[str], None]) -> tuple[StepGraphs, Dataset, dict[str, int]]:
    """The step graphs at the batch size, and the dataset checked against them; the sizes bound. ``args``
    is irc train's namespace (file, defines, model, data, loss, loss_output, ignore_index, batch, holdout);
    a model with a fixed batch sets ``args.batch`` to it."""
    from irc.pipeline import defaults_note, load_graph, load_with_defaults, parse_defines
    from irc.runtime.train import build_step, eval_graph
    from irc.runtime.train_data import read_npz_data, read_text, split_arrays, text_data

    defines = parse_defines(args.defines)
    base = load_graph(args.file, defines, args.model)
    output = _output(base, args.loss_output)
    batch = _batch_symbol(base)
    ignore = args.ignore_index if args.ignore_index is not None else -100
    binds: dict[str, int] = {}
    if isinstance(batch, str):
        if batch in defines:
            raise UsageError(f"-D {batch}: the batch size is --batch")
        binds[batch] = args.batch
    elif batch != args.batch:
        note(f"model '{base.name}' has a fixed batch of {batch}: --batch {args.batch} is ignored")
        args.batch = batch
    target = eval_graph(base, args.loss, output, ignore)[1]
    data_path = Path(args.data)
    arrays: dict[str, np.ndarray] | None = None
    text = None
    if args.data == DIGITS:
        if args.loss != "cross_entropy":
            raise UsageError("--data digits is a classification set: train it with --loss cross_entropy")
        arrays = _digits_arrays(base, target)
        where = "--data digits"
    elif data_path.suffix.lower() == ".npz":
        arrays = read_npz_data(data_path)
        where = f"data file '{quote(args.data)}'"
        binds.update(_bind_from_arrays(base, arrays, where))
    else:
        if args.loss != "cross_entropy":
            raise UsageError("a text file trains a byte-level language model: use --loss cross_entropy")
        text = read_text(data_path)
        where = f"data file '{quote(args.data)}'"
        _text_model(base)
    graph, defaulted = load_with_defaults(args.file, {**defines, **binds}, args.model)
    if defaulted:
        note(defaults_note(defaulted))
    bound = {**defines, **binds, **{b.name: b.value for b in defaulted}}

    def rebind(size: int) -> Graph:
        return load_graph(args.file, {**bound, batch: size}, args.model) if isinstance(batch, str) else graph

    from irc.runtime.train_engine import Engine

    graphs = build_step(graph, args.loss, output, ignore, rebind if isinstance(batch, str) else None, seed=args.seed,
                        engine=Engine(getattr(args, "backend", "numpy")))
    data: Dataset
    if text is not None:
        name, _ = _text_model(graph)
        t = graph.inputs()[0].types[0]
        classes = graph.value_types()[dict(graph.outputs)[output]].shape[-1]
        if classes < 256:
            raise IrcError(f"a byte-level language model needs 256 classes, one per byte value; output '{output}' "
                           f"of model '{graph.name}' has {classes}", graph.loc)
        holdout = args.holdout if args.holdout is not None else 0.1
        data = text_data(data_path, text, int(t.shape[1]), holdout, name, graphs.target)
    else:
        assert arrays is not None
        checked = _check_arrays(graphs, arrays, where)
        holdout = args.holdout if args.holdout is not None else 0.2
        data = split_arrays(args.data, checked, holdout)
    if data.batches_per_epoch(args.batch) < 1:
        raise IrcError(f"{where}: the training part has {data.n_train:,} samples, fewer than --batch {args.batch}")
    return graphs, data, {k: int(v) for k, v in bound.items() if isinstance(v, int)}
