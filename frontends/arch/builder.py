"""Build an irc :class:`~irc.graph.Graph` from a parsed ``.arch`` file.

The builder evaluates the program: constants are folded exactly, blocks are inlined
(each call gets its own scope, so ``repeat(12) decoder(x)`` yields ``decoder.0`` …
``decoder.11``), and every layer call becomes a node carrying its source location.
Types are left to the ``shape-infer`` pass. Reading files (``build_files``), expressions
(``build_exprs``) and calls (``build_calls``) are the builder's other three parts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

from lark import Tree

from irc.diagnostics import IrcError, Loc, UsageError, did_you_mean, plural, suggest, where
from irc.dims import Sym, never_positive
from irc.frontends.arch.build_calls import Calls
from irc.frontends.arch.build_exprs import Expressions
from irc.frontends.arch.build_files import FileLoading, FileUnit
from irc.frontends.arch.locs import tree_loc
from irc.frontends.arch.values import BUILTINS, BlockDef, EnumName, Env, Tensor, describe, is_number, simplify
from irc.graph import Graph, Node
from irc.ops import AttrError, get_op, normalize_attrs
from irc.ops.registry import MAX_INT, op_names
from irc.types import INPUT_DTYPES, TensorType

MAX_NODES = 50_000  # real models have hundreds to a few thousand; 50,000 build in about a second
RECURSION_LIMIT = 20_000


class Builder(FileLoading, Expressions, Calls):
    def __init__(self, bindings: dict[str, int] | None = None):
        self.bindings = dict(bindings or {})
        self.used_bindings: set[str] = set()
        self.model_consts: set[str] = set()
        self.output_locs: dict[str, Loc] = {}
        self.graph: Graph | None = None
        self.file = "<input>"
        self.counters: dict[str, int] = {}
        self.value_names: set[str] = set()
        self.block_stack: list[str] = []
        self.loading: list[tuple[str, str, Loc | None]] = []  # (identity, display name, the 'use' of it)
        self.units: dict[str, FileUnit] = {}  # by identity: the resolved path

    # -- models ------------------------------------------------------------------

    def build_model(self, unit: FileUnit, model: str | None) -> Graph:
        if not unit.models:
            raise IrcError(f"'{unit.path}' defines no model", Loc(unit.path, 1, 1))
        if model is None:
            if len(unit.models) > 1:
                names = ", ".join(unit.models)
                raise IrcError(f"'{unit.path}' defines several models ({names}); choose one with --model",
                               Loc(unit.path, 1, 1))
            model = next(iter(unit.models))
        if model not in unit.models:
            hint = did_you_mean(model, unit.models)
            raise UsageError(f"--model {model}: '{unit.path}' has no model '{model}'{hint} "
                             f"(it has: {', '.join(unit.models)})")
        tree = unit.models[model]
        self.file = unit.path
        name_tok, symbols_tree, body = tree.children
        symbols = [str(t) for t in symbols_tree.children] if symbols_tree is not None else []
        seen: dict[str, Loc] = {}
        env = Env(unit.env)
        for tok in symbols_tree.children if symbols_tree is not None else []:
            if str(tok) in seen:
                raise IrcError(f"symbol '{tok}' is declared twice", tree_loc(self.file, tok),
                               notes=[f"first declared at {where(seen[str(tok)], self.file)}"])
            seen[str(tok)] = tree_loc(self.file, tok)
            value = self.bindings[str(tok)] if str(tok) in self.bindings else Sym.var(str(tok))
            if str(tok) in self.bindings:
                self.used_bindings.add(str(tok))
            env.define(str(tok), value, tree_loc(self.file, tok))
        self.graph = Graph(str(name_tok), symbols=symbols)
        self.graph.loc = tree_loc(self.file, name_tok)
        self.graph.bindings = {k: v for k, v in self.bindings.items() if k in seen}
        self._body(body, env, scope="", in_model=True)
        unused = sorted(set(self.bindings) - self.used_bindings)
        if unused:
            name = unused[0]
            known = ", ".join(symbols) or "none"
            hint = did_you_mean(name, [*symbols, *self.model_consts])
            raise IrcError(f"-D {name}: model '{model}' has no symbol or constant '{name}'{hint} "
                           f"(symbols: {known})", tree_loc(self.file, name_tok))
        if not self.graph.outputs:
            raise IrcError(f"model '{model}' has no 'output' statement", tree_loc(self.file, name_tok))
        self._check_tied_heads()
        return self.graph

    def _check_tied_heads(self) -> None:
        """A tied head reads the table of an embedding some node calls; an instance never called has none."""
        tables = {n.weights for n in self.graph.nodes if n.op == "embedding"}
        for node in self.graph.nodes:
            tied = node.attrs.get("tied") if node.op == "unembed" else None
            if tied is not None and tied not in tables:
                raise IrcError(f"unembed is tied to '{tied}', which is never called, so no node holds its table; "
                               f"call it on the tokens ({tied}(tokens)) or drop tied= to give the head its own "
                               "weights", node.loc)

    # -- statements -------------------------------------------------------------

    def _body(self, body: Tree, env: Env, scope: str, in_model: bool) -> list[Any] | None:
        for stmt in body.children:
            kind = stmt.data
            if kind == "const_stmt":
                self._const_stmt(stmt, env, top_level=in_model)
            elif kind == "block_def":
                self._define_block(stmt, env)
            elif kind == "input_stmt":
                if not in_model:
                    raise IrcError("'input' is only allowed in a model body", tree_loc(self.file, stmt))
                self._input_stmt(stmt, env)
            elif kind == "assign_stmt":
                self._assign(stmt, env, scope)
            elif kind == "output_stmt":
                if not in_model:
                    raise IrcError("'output' is only allowed in a model body; blocks 'return'",
                                   tree_loc(self.file, stmt))
                self._output(stmt, env, scope)
            elif kind == "return_stmt":
                if in_model:
                    raise IrcError("'return' is only allowed in a block; models use 'output'",
                                   tree_loc(self.file, stmt))
                return [self._expr(e, env, scope) for e in stmt.children]
        return None

    def _redefined(self, name: str, env: Env, loc: Loc) -> IrcError:
        first = env.locs.get(name)
        notes = [f"first defined at {where(first, loc.file)}"] if first is not None else []
        return IrcError(f"'{name}' is already defined in this scope", loc, notes=notes)

    def _const_stmt(self, stmt: Tree, env: Env, top_level: bool) -> None:
        for item in stmt.children:
            name_tok, expr = item.children
            name = str(name_tok)
            loc = tree_loc(self.file, name_tok)
            if name in env.names:
                raise self._redefined(name, env, loc)
            if top_level:
                self.model_consts.add(name)
            if top_level and name in self.bindings:
                env.define(name, self.bindings[name], loc)
                self.used_bindings.add(name)
                continue
            value = self._value(self._expr(expr, env, ""))
            if not is_number(value) and not isinstance(value, (bool, float)):
                raise IrcError(f"constant '{name}' must be a number, got {describe(value)}", tree_loc(self.file, expr))
            env.define(name, simplify(value), loc)

    def _define_block(self, tree: Tree, env: Env) -> None:
        name_tok, params_tree, body = tree.children
        params: list[tuple[str, Tree | None]] = []
        seen: dict[str, Loc] = {}
        for p in params_tree.children if params_tree is not None else []:
            pname = str(p.children[0])
            ploc = tree_loc(self.file, p)
            if pname in seen:
                raise IrcError(f"block '{name_tok}' has two parameters named '{pname}'", ploc,
                               notes=[f"the first is at {where(seen[pname], self.file)}"])
            seen[pname] = ploc
            params.append((pname, p.children[1] if len(p.children) > 1 else None))
        loc = tree_loc(self.file, name_tok)
        if str(name_tok) in env.names:
            raise self._redefined(str(name_tok), env, loc)
        env.define(str(name_tok), BlockDef(str(name_tok), params, body, env, loc), loc)

    def _input_stmt(self, stmt: Tree, env: Env) -> None:
        name_tok, ttype = stmt.children
        dtype_tok = ttype.children[0]
        if str(dtype_tok) not in INPUT_DTYPES:
            raise IrcError(f"unknown dtype '{dtype_tok}'", tree_loc(self.file, dtype_tok))
        dims = []
        for d in ttype.children[1:]:
            if d is None:
                continue
            v = self._expr(d, env, "")
            if isinstance(v, EnumName):
                raise IrcError(self._undefined_in_shape(v, env), v.loc)
            v = self._value(v)
            if isinstance(v, Fraction) and v.denominator == 1:
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, (int, Sym)):
                raise IrcError(f"a dimension must be an integer or a symbol, got {describe(v)}", tree_loc(self.file, d))
            if never_positive(v):
                every = f", which is below 1 for every value of {' and '.join(sorted(v.symbols()))}" \
                    if isinstance(v, Sym) else ""
                raise IrcError(f"a dimension must be positive, got {v}{every}", tree_loc(self.file, d))
            if (isinstance(v, int) and v >= MAX_INT) or (isinstance(v, Sym) and any(
                    abs(c) >= MAX_INT for _, c in v.terms)):
                raise IrcError(f"a dimension must be below 2**62, got {v}", tree_loc(self.file, d))
            dims.append(v)
        name = str(name_tok)
        loc = tree_loc(self.file, name_tok)
        if name in env.names:
            raise self._redefined(name, env, loc)
        value = self._fresh(name)
        node = Node("input", [], [value], {}, scope="", loc=loc, types=[TensorType(str(dtype_tok), tuple(dims))])
        self._add(node)
        env.define(name, Tensor(value), loc)

    def _undefined_in_shape(self, v: EnumName, env: Env) -> str:
        close = suggest(v.name, env.all_names())
        if close is not None or self.graph is None:
            return self._undefined(v.name, env)
        header = ", ".join([*self.graph.symbols, v.name])
        return (f"undefined name '{v.name}'; to make it a symbolic size, declare it in the header: "
                f"model {self.graph.name}({header})")

    def _assign(self, stmt: Tree, env: Env, scope: str) -> None:
        targets_tree, expr = stmt.children
        targets = [str(t) for t in targets_tree.children]
        hint: str | tuple[str, ...] = targets[0] if len(targets) == 1 else tuple(targets)
        value = self._expr(expr, env, scope, name_hint=hint)
        locs = [tree_loc(self.file, t) for t in targets_tree.children]
        if len(targets) == 1:
            if isinstance(value, tuple):
                value = self._first_result(value, expr)
            env.define(targets[0], value, locs[0])
            return
        if not isinstance(value, tuple):
            raise IrcError(f"cannot unpack {describe(value)} into {len(targets)} names", tree_loc(self.file, expr))
        if len(value) != len(targets):
            raise IrcError(f"the right side has {plural(len(value), 'result')} but {len(targets)} names are assigned",
                           tree_loc(self.file, expr))
        for t, v, loc in zip(targets, value, locs):
            env.define(t, v, loc)

    def _first_result(self, value: tuple, where_: Tree) -> Any:
        first = value[0]
        if isinstance(first, Tensor):
            producer = self.graph.producers()[first.value] if self.graph else None
            if producer is not None and producer.op == "split":
                raise IrcError(f"split returns {len(value)} results; assign them to {len(value)} names",
                               tree_loc(self.file, where_))
        return first

    def _output(self, stmt: Tree, env: Env, scope: str) -> None:
        name_tok = stmt.children[0]
        label = str(name_tok)
        expr = stmt.children[1] if len(stmt.children) > 1 else None
        if expr is None:
            try:
                value = env.lookup(label)
            except KeyError:
                raise IrcError(self._undefined(label, env), tree_loc(self.file, name_tok)) from None
        else:
            value = self._expr(expr, env, scope, name_hint=label)
            env.define(label, value, tree_loc(self.file, name_tok))
        if isinstance(value, tuple):
            value = self._first_result(value, expr if expr is not None else stmt)
        if isinstance(value, EnumName):
            raise IrcError(self._undefined(value.name, env), value.loc)
        if not isinstance(value, Tensor):
            raise IrcError(f"output '{label}' must be a tensor, got {describe(value)}", tree_loc(self.file, name_tok))
        assert self.graph is not None
        loc = tree_loc(self.file, name_tok)
        if label in self.output_locs:
            raise IrcError(f"output '{label}' is declared twice", loc,
                           notes=[f"first declared at {where(self.output_locs[label], self.file)}"])
        self.output_locs[label] = loc
        self.graph.outputs.append((label, value.value))

    # -- emission ---------------------------------------------------------------

    def _emit(self, op: str, tensors: list[Tensor], attrs: dict[str, Any], loc: Loc, scope: str,
              hint: str | tuple[str, ...] | None, checked: bool = False, weights: str | None = None) -> Any:
        opdef = get_op(op)
        assert opdef is not None
        if not checked:
            try:
                attrs = normalize_attrs(opdef, attrs)
            except AttrError as e:
                raise IrcError(str(e), loc, origin=e.origin) from None
        assert self.graph is not None
        if len(self.graph.nodes) >= MAX_NODES:
            raise IrcError(f"the model expands to more than {MAX_NODES:,} nodes (repeats inside repeats multiply)",
                           loc)
        results = opdef.result_names(attrs)
        # `q, k, v = split(...)` names the results %q, %k, %v; the weights keep the op's name
        targets = hint if isinstance(hint, tuple) and len(hint) == len(results) else None
        base = hint if isinstance(hint, str) else op
        node_scope = self._scope_name(scope, base) if opdef.params or opdef.buffers else scope.rstrip(".")
        if weights is None and (opdef.params or opdef.buffers):
            weights = node_scope
        if targets is not None:
            outputs = [self._fresh(scope + t) for t in targets]
        else:
            first = self._fresh(scope + base)
            outputs = [first, *(self._fresh(f"{first}.{r}") for r in results[1:])]
        self._add(Node(op, [t.value for t in tensors], outputs, attrs, node_scope, weights, loc))
        values = tuple(Tensor(v) for v in outputs)
        return values[0] if len(values) == 1 else values

    def _add(self, node: Node) -> None:
        assert self.graph is not None
        self.graph.nodes.append(node)

    def _fresh(self, base: str) -> str:
        if base not in self.value_names:
            self.value_names.add(base)
            return base
        n = self.counters.get("v:" + base, 1)
        while f"{base}.{n}" in self.value_names:
            n += 1
        self.counters["v:" + base] = n + 1
        name = f"{base}.{n}"
        self.value_names.add(name)
        return name

    def _scope_name(self, scope: str, base: str) -> str:
        """A unique dotted scope for a layer or block call: ``decoder.0.layernorm_1``."""
        key = "s:" + scope + base
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return f"{scope}{base}" if n == 0 else f"{scope}{base}_{n}"

    # -- messages ---------------------------------------------------------------

    @staticmethod
    def _undefined(name: str, env: Env | None) -> str:
        return f"undefined name '{name}'" + did_you_mean(name, env.all_names() if env is not None else ())

    @staticmethod
    def _unknown_callee(name: str, env: Env) -> str:
        pool = op_names() | set(BUILTINS) | env.all_names()
        return f"unknown layer or block '{name}'" + did_you_mean(name, pool)


@contextmanager
def _deep_enough() -> Iterator[None]:
    """Room for the builder's recursion: blocks nest 64 deep, each with expressions 100 deep.

    Python 3.11 calls between Python functions use no C stack, so a higher limit is safe.
    """
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def build_source(text: str, file: str = "<input>", bindings: dict[str, int] | None = None,
                 model: str | None = None) -> Graph:
    """Build the graph of the model in ``text`` (types not yet inferred)."""
    with _deep_enough():
        b = Builder(bindings)
        unit = b.load_file(Path(file), text)
        return b.build_model(unit, model)


def build_file(path: str | Path, bindings: dict[str, int] | None = None, model: str | None = None) -> Graph:
    with _deep_enough():
        b = Builder(bindings)
        unit = b.load_file(Path(path))
        return b.build_model(unit, model)
