"""Build an irc :class:`~irc.graph.Graph` from a parsed ``.arch`` file.

The builder evaluates the program: constants are folded exactly, blocks are inlined
(each call gets its own scope, so ``repeat(12) decoder(x)`` yields ``decoder.0`` …
``decoder.11``), and every layer call becomes a node carrying its source location.
Types are left to the ``shape-infer`` pass.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

from lark import Token, Tree

from irc.diagnostics import (
    SOURCES,
    IrcError,
    Loc,
    UsageError,
    did_you_mean,
    os_error_words,
    plural,
    read_source,
    suggest,
    where,
)
from irc.dims import Sym, never_positive
from irc.frontends.arch.arith import OP_TEXT, arith, checked, out_of_range
from irc.frontends.arch.limits import literal_fits
from irc.frontends.arch.parse import parse_text
from irc.frontends.arch.values import (
    BUILTINS,
    BlockDef,
    BuiltinError,
    EnumName,
    Env,
    Instance,
    Tensor,
    call_builtin,
    describe,
    is_number,
    simplify,
)
from irc.graph import Graph, Node
from irc.ops import AttrError, get_op, normalize_attrs
from irc.ops.registry import MAX_INT, OpDef, Quoted, op_names
from irc.types import INPUT_DTYPES, TensorType

MAX_REPEAT = 100_000
MAX_NODES = 50_000  # real models have hundreds to a few thousand; 50,000 build in about a second
MAX_BLOCK_DEPTH = 64
RECURSION_LIMIT = 20_000
ENUM_KINDS = ("enum", "int_or_enum", "pair_or_enum")


def _loc(file: str, item: Tree | Token) -> Loc:
    if isinstance(item, Token):
        return Loc(file, item.line or 1, item.column or 1)
    meta = item.meta
    return Loc(file, getattr(meta, "line", 1) or 1, getattr(meta, "column", 1) or 1)


def _position(text: str, pos: int) -> tuple[int, int]:
    """(line, column), both from 1, of the character at ``pos``."""
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


class FileUnit:
    """One parsed file: its top-level environment and its models."""

    def __init__(self, path: str, env: Env, models: dict[str, Tree]):
        self.path = path
        self.env = env
        self.models = models


class Builder:
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

    # -- files and models -------------------------------------------------------
    def load_file(self, path: Path, text: str | None = None, use_loc: Loc | None = None,
                  display: str | None = None, use_rel: str | None = None) -> FileUnit:
        # ``display`` names the file in locations: as given, or <lib>/NAME for the standard
        # library so that IR dumps do not depend on where irc is installed. Files are told
        # apart by their resolved path, so inc/../a.arch is a.arch.
        name = display or str(path)
        identity = str(path.resolve())
        if identity in (k for k, _, _ in self.loading):
            raise self._use_cycle(identity, use_loc)
        if identity in self.units:
            return self.units[identity]
        if text is None:
            text = read_source(path, name, "an .arch file", use_loc, hint=self._similar_file(path, use_rel))
        self.loading.append((identity, name, use_loc))
        tree = parse_text(text, name)
        env = Env()
        models: dict[str, Tree] = {}
        saved_file = self.file
        self.file = name
        for item in tree.children:
            if item.data == "use_stmt":
                target = item.children[0]
                rel = str(target)[1:-1]
                use_path, use_display = self._resolve_use(path, rel, _loc(name, target))
                other = self.load_file(use_path, use_loc=_loc(name, target), display=use_display, use_rel=rel)
                for n, value in other.env.names.items():
                    if n not in env.names:
                        env.define(n, value, other.env.locs.get(n))
            elif item.data == "model_def":
                name_tok = item.children[0]
                if str(name_tok) in models:
                    first = _loc(name, models[str(name_tok)].children[0])
                    raise IrcError(f"model '{name_tok}' is defined twice", _loc(name, name_tok),
                                   notes=[f"first defined at {where(first, name)}"])
                models[str(name_tok)] = item
            elif item.data == "block_def":
                self._define_block(item, env)
            elif item.data == "const_stmt":
                self._const_stmt(item, env, top_level=False)
        self.file = saved_file
        self.loading.pop()
        unit = FileUnit(name, env, models)
        self.units[identity] = unit
        return unit

    def _use_cycle(self, identity: str, use_loc: Loc | None) -> IrcError:
        first = next(i for i, (k, _, _) in enumerate(self.loading) if k == identity)
        chain = [n for _, n, _ in self.loading[first:]] + [self.loading[first][1]]
        notes = [f"'{n}' is used at {loc}" for _, n, loc in self.loading[first + 1:] if loc is not None]
        return IrcError(f"'use' cycle: {' → '.join(chain)}", use_loc, notes=notes)

    @staticmethod
    def _similar_file(path: Path, rel: str | None) -> str:
        """A did-you-mean for a ``use`` of a missing file: a file beside it, or in the library."""
        if rel is None or path.exists():
            return ""
        names = {p.name for p in path.parent.glob("*.arch")} if path.parent.is_dir() else set()
        if "/" not in rel:
            names |= {p.name for p in (Path(__file__).parent / "lib").glob("*.arch")}
        close = suggest(path.name, names)
        return f"; did you mean '{rel[:len(rel) - len(path.name)]}{close}'?" if close else ""

    @staticmethod
    def _resolve_use(path: Path, rel: str, at: Loc) -> tuple[Path, str]:
        """A path next to the using file wins; otherwise the standard library."""
        if "\0" in rel:
            raise IrcError("a 'use' path cannot contain a NUL character", at)
        candidate = path.parent / rel
        lib = Path(__file__).parent / "lib"
        stdlib = lib / rel
        try:
            if candidate.exists():
                return candidate, os.path.normpath(candidate)
            if stdlib.exists() and stdlib.resolve().is_relative_to(lib.resolve()):
                return stdlib, f"<lib>/{rel}"
        except OSError as e:  # a name too long for the file system, say
            raise IrcError(f"cannot use '{rel[:60]}{'...' if len(rel) > 60 else ''}': {os_error_words(e)}",
                           at) from None
        return candidate, os.path.normpath(candidate)

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
                raise IrcError(f"symbol '{tok}' is declared twice", _loc(self.file, tok),
                               notes=[f"first declared at {where(seen[str(tok)], self.file)}"])
            seen[str(tok)] = _loc(self.file, tok)
            value = self.bindings[str(tok)] if str(tok) in self.bindings else Sym.var(str(tok))
            if str(tok) in self.bindings:
                self.used_bindings.add(str(tok))
            env.define(str(tok), value, _loc(self.file, tok))
        self.graph = Graph(str(name_tok), symbols=symbols)
        self.graph.loc = _loc(self.file, name_tok)
        self.graph.bindings = {k: v for k, v in self.bindings.items() if k in seen}
        self._body(body, env, scope="", in_model=True)
        unused = sorted(set(self.bindings) - self.used_bindings)
        if unused:
            name = unused[0]
            known = ", ".join(symbols) or "none"
            hint = did_you_mean(name, [*symbols, *self.model_consts])
            raise IrcError(f"-D {name}: model '{model}' has no symbol or constant '{name}'{hint} "
                           f"(symbols: {known})", _loc(self.file, name_tok))
        if not self.graph.outputs:
            raise IrcError(f"model '{model}' has no 'output' statement", _loc(self.file, name_tok))
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
                    raise IrcError("'input' is only allowed in a model body", _loc(self.file, stmt))
                self._input_stmt(stmt, env)
            elif kind == "assign_stmt":
                self._assign(stmt, env, scope)
            elif kind == "output_stmt":
                if not in_model:
                    raise IrcError("'output' is only allowed in a model body; blocks 'return'",
                                   _loc(self.file, stmt))
                self._output(stmt, env, scope)
            elif kind == "return_stmt":
                if in_model:
                    raise IrcError("'return' is only allowed in a block; models use 'output'",
                                   _loc(self.file, stmt))
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
            loc = _loc(self.file, name_tok)
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
                raise IrcError(f"constant '{name}' must be a number, got {describe(value)}", _loc(self.file, expr))
            env.define(name, simplify(value), loc)

    def _define_block(self, tree: Tree, env: Env) -> None:
        name_tok, params_tree, body = tree.children
        params: list[tuple[str, Tree | None]] = []
        seen: dict[str, Loc] = {}
        for p in params_tree.children if params_tree is not None else []:
            pname = str(p.children[0])
            ploc = _loc(self.file, p)
            if pname in seen:
                raise IrcError(f"block '{name_tok}' has two parameters named '{pname}'", ploc,
                               notes=[f"the first is at {where(seen[pname], self.file)}"])
            seen[pname] = ploc
            params.append((pname, p.children[1] if len(p.children) > 1 else None))
        loc = _loc(self.file, name_tok)
        if str(name_tok) in env.names:
            raise self._redefined(str(name_tok), env, loc)
        env.define(str(name_tok), BlockDef(str(name_tok), params, body, env, loc), loc)

    def _input_stmt(self, stmt: Tree, env: Env) -> None:
        name_tok, ttype = stmt.children
        dtype_tok = ttype.children[0]
        if str(dtype_tok) not in INPUT_DTYPES:
            raise IrcError(f"unknown dtype '{dtype_tok}'", _loc(self.file, dtype_tok))
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
                raise IrcError(f"a dimension must be an integer or a symbol, got {describe(v)}", _loc(self.file, d))
            if never_positive(v):
                every = f", which is below 1 for every value of {' and '.join(sorted(v.symbols()))}" \
                    if isinstance(v, Sym) else ""
                raise IrcError(f"a dimension must be positive, got {v}{every}", _loc(self.file, d))
            if (isinstance(v, int) and v >= MAX_INT) or (isinstance(v, Sym) and any(
                    abs(c) >= MAX_INT for _, c in v.terms)):
                raise IrcError(f"a dimension must be below 2**62, got {v}", _loc(self.file, d))
            dims.append(v)
        name = str(name_tok)
        loc = _loc(self.file, name_tok)
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
        locs = [_loc(self.file, t) for t in targets_tree.children]
        if len(targets) == 1:
            if isinstance(value, tuple):
                value = self._first_result(value, expr)
            env.define(targets[0], value, locs[0])
            return
        if not isinstance(value, tuple):
            raise IrcError(f"cannot unpack {describe(value)} into {len(targets)} names", _loc(self.file, expr))
        if len(value) != len(targets):
            raise IrcError(f"the right side has {plural(len(value), 'result')} but {len(targets)} names are assigned",
                           _loc(self.file, expr))
        for t, v, loc in zip(targets, value, locs):
            env.define(t, v, loc)

    def _first_result(self, value: tuple, where_: Tree) -> Any:
        first = value[0]
        if isinstance(first, Tensor):
            producer = self.graph.producers()[first.value] if self.graph else None
            if producer is not None and producer.op == "split":
                raise IrcError(f"split returns {len(value)} results; assign them to {len(value)} names",
                               _loc(self.file, where_))
        return first

    def _output(self, stmt: Tree, env: Env, scope: str) -> None:
        name_tok = stmt.children[0]
        label = str(name_tok)
        expr = stmt.children[1] if len(stmt.children) > 1 else None
        if expr is None:
            try:
                value = env.lookup(label)
            except KeyError:
                raise IrcError(self._undefined(label, env), _loc(self.file, name_tok)) from None
        else:
            value = self._expr(expr, env, scope, name_hint=label)
            env.define(label, value, _loc(self.file, name_tok))
        if isinstance(value, tuple):
            value = self._first_result(value, expr if expr is not None else stmt)
        if isinstance(value, EnumName):
            raise IrcError(self._undefined(value.name, env), value.loc)
        if not isinstance(value, Tensor):
            raise IrcError(f"output '{label}' must be a tensor, got {describe(value)}", _loc(self.file, name_tok))
        assert self.graph is not None
        loc = _loc(self.file, name_tok)
        if label in self.output_locs:
            raise IrcError(f"output '{label}' is declared twice", loc,
                           notes=[f"first declared at {where(self.output_locs[label], self.file)}"])
        self.output_locs[label] = loc
        self.graph.outputs.append((label, value.value))

    # -- expressions ------------------------------------------------------------
    def _expr(self, tree: Tree | Token, env: Env, scope: str, name_hint: str | tuple[str, ...] | None = None) -> Any:
        if isinstance(tree, Token):  # bare tokens only appear through placeholders
            raise IrcError(f"unexpected '{tree}'", _loc(self.file, tree))
        kind = tree.data
        loc = _loc(self.file, tree)
        if kind == "number":
            return self._number(str(tree.children[0]), loc)
        if kind == "string":
            return Quoted(str(tree.children[0])[1:-1])
        if kind == "true":
            return True
        if kind == "false":
            return False
        if kind == "none":
            return None
        if kind == "name":
            tok = tree.children[0]
            try:
                return env.lookup(str(tok))
            except KeyError:
                return EnumName(str(tok), _loc(self.file, tok), env)
        if kind == "list":
            return [self._value(self._expr(c, env, scope)) for c in tree.children if c is not None]
        if kind in OP_TEXT:
            a = self._value(self._expr(tree.children[0], env, scope))
            b = self._value(self._expr(tree.children[1], env, scope))
            return self._binary(kind, a, b, self._operator_loc(tree, OP_TEXT[kind]), scope, name_hint)
        if kind == "neg":
            a = self._value(self._expr(tree.children[0], env, scope))
            if isinstance(a, Tensor):
                return self._emit("mul", [a], {"scalar": -1.0}, loc, scope, name_hint)
            if is_number(a) or isinstance(a, float):
                return -a
            raise IrcError(f"cannot negate {describe(a)}", loc)
        if kind == "call":
            return self._call(tree, env, scope, name_hint)
        if kind == "repeat_call":
            return self._repeat(tree, env, scope)
        raise AssertionError(kind)

    def _number(self, text: str, loc: Loc) -> Any:
        if not literal_fits(text):
            raise out_of_range(f"the number {text}", loc)
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise IrcError(f"bad number '{text}'", loc) from None
        return simplify(checked(value, f"the number {text}", loc))

    def _operator_loc(self, tree: Tree, op: str) -> Loc:
        """Where the operator of a binary expression is: between its operands, outside comments."""
        text = SOURCES.get(self.file)
        left, right = tree.children
        start = getattr(left.meta, "end_pos", None)
        end = getattr(right.meta, "start_pos", None)
        if text is None or start is None or end is None:
            return _loc(self.file, tree)
        pos = start
        while pos < end:
            if text[pos] == "#":
                pos = text.find("\n", pos, end) if "\n" in text[pos:end] else end
                continue
            if text.startswith(op, pos) and not (op == "*" and text.startswith("**", pos)) and not (
                    op == "/" and text.startswith("//", pos)):
                line, col = _position(text, pos)
                return Loc(self.file, line, col)
            pos += 1
        return _loc(self.file, tree)

    def _value(self, v: Any) -> Any:
        """Resolve a value used in arithmetic: unknown names are errors here."""
        if isinstance(v, EnumName):
            raise IrcError(self._undefined(v.name, v.env), v.loc)
        if isinstance(v, tuple) and v and isinstance(v[0], Tensor):
            return v[0]
        return v

    def _binary(self, kind: str, a: Any, b: Any, loc: Loc, scope: str, hint: str | tuple[str, ...] | None) -> Any:
        op = OP_TEXT[kind]
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if kind == "matmul":
                if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
                    other = b if isinstance(a, Tensor) else a
                    raise IrcError(f"'@' needs two tensors, got a tensor and {describe(other)}", loc)
                return self._emit("matmul", [a, b], {}, loc, scope, hint)
            if kind not in ("add", "sub", "mul", "div"):
                raise IrcError(f"'{op}' is not defined for tensors", loc)
            if isinstance(a, Tensor) and isinstance(b, Tensor):
                return self._emit(kind, [a, b], {}, loc, scope, hint)
            tensor, other, reverse = (a, b, False) if isinstance(a, Tensor) else (b, a, True)
            if not (is_number(other) or isinstance(other, float)) or isinstance(other, Sym):
                raise IrcError(f"cannot apply '{op}' to a tensor and {describe(other)}", loc)
            attrs: dict[str, Any] = {"scalar": float(other)}
            if reverse and kind in ("sub", "div"):
                attrs["reverse"] = True
            return self._emit(kind, [tensor], attrs, loc, scope, hint)
        return arith(kind, a, b, loc)

    # -- calls ------------------------------------------------------------------
    def _call(self, tree: Tree, env: Env, scope: str, hint: str | tuple[str, ...] | None) -> Any:
        callee_tree, args_tree = tree.children
        loc = _loc(self.file, tree)
        positional, keywords = self._args(args_tree, env, scope)
        if callee_tree.data == "name":
            name_tok = callee_tree.children[0]
            fname = str(name_tok)
            loc = _loc(self.file, name_tok)
            try:
                callee = env.lookup(fname)
            except KeyError:
                callee = None
            if callee is None:
                if fname in BUILTINS:
                    if keywords:
                        raise IrcError(f"{fname}() takes no keyword arguments", loc)
                    try:
                        result = call_builtin(fname, [self._value(v) for v, _ in positional])
                    except BuiltinError as e:
                        raise IrcError(str(e), loc) from None
                    except OverflowError:
                        raise out_of_range(f"the result of {fname}()", loc) from None
                    return simplify(checked(result, f"the result of {fname}()", loc))
                opdef = get_op(fname)
                if opdef is None or opdef.name == "input":
                    raise IrcError(self._unknown_callee(fname, env), loc)
                instance_name = hint if isinstance(hint, str) else None
                return self._layer_call(opdef, positional, keywords, loc, scope, hint, instance_name)
        else:
            callee = self._expr(callee_tree, env, scope)
        if isinstance(callee, BlockDef):
            return self._block_call(callee, positional, keywords, loc, scope)
        if isinstance(callee, Instance):
            return self._instance_call(callee, positional, keywords, loc, scope, hint)
        raise IrcError(f"{describe(callee)} cannot be called", loc)

    def _args(self, args_tree: Tree | None, env: Env, scope: str) -> tuple[list[tuple[Any, Loc]], dict]:
        positional: list[tuple[Any, Loc]] = []
        keywords: dict[str, tuple[Any, Loc]] = {}
        for arg in args_tree.children if args_tree is not None else []:
            if isinstance(arg, Tree) and arg.data == "kwarg":
                key_tok, expr = arg.children
                kloc = _loc(self.file, key_tok)
                if str(key_tok) in keywords:
                    first = keywords[str(key_tok)][1]
                    raise IrcError(f"argument '{key_tok}' is given twice", kloc,
                                   notes=[f"first given at {where(first, kloc.file)}"])
                keywords[str(key_tok)] = (self._expr(expr, env, scope), kloc)
            else:
                if keywords:
                    raise IrcError("a positional argument cannot follow keyword arguments", _loc(self.file, arg))
                positional.append((self._expr(arg, env, scope), _loc(self.file, arg)))
        return positional, keywords

    def _layer_call(self, opdef: OpDef, positional, keywords, loc: Loc, scope: str,
                    hint: str | tuple[str, ...] | None, instance_name: str | None) -> Any:
        input_names = [i.rstrip("?*") for i in opdef.inputs]
        variadic = opdef.max_inputs is None
        settable = [a for a in opdef.attrs if a.name != "tied_dim"]
        tensors: list[Tensor] = []
        attr_values: list[tuple[Any, Loc]] = []
        for value, aloc in positional:
            slot = settable[len(attr_values)] if len(attr_values) < len(settable) else None
            if isinstance(value, EnumName):
                if slot is None or slot.kind not in ENUM_KINDS:  # a misspelt tensor or constant, not a choice
                    raise IrcError(self._undefined(value.name, value.env), value.loc)
                attr_values.append((value, aloc))
                continue
            value = self._value(value)
            if isinstance(value, Tensor):
                if attr_values:
                    raise IrcError(f"tensor argument to '{opdef.name}' after its attribute arguments", aloc)
                if not variadic and len(tensors) >= len(input_names):
                    raise IrcError(f"'{opdef.name}' takes at most {plural(len(input_names), 'tensor input')}", aloc)
                tensors.append(value)
            elif slot is None and not attr_values and len(tensors) < opdef.min_inputs:
                raise IrcError(f"'{opdef.name}' needs a tensor input, got {describe(value)}", aloc)
            else:
                attr_values.append((value, aloc))
        attrs: dict[str, Any] = {}
        attr_locs: dict[str, Loc] = {}
        if len(attr_values) > len(settable):
            raise IrcError(f"'{opdef.name}' takes at most {plural(len(settable), 'attribute argument')}, "
                           f"got {len(attr_values)}", attr_values[len(settable)][1])
        for (value, aloc), attr in zip(attr_values, settable):
            attrs[attr.name] = value
            attr_locs[attr.name] = aloc
        for key, (value, kloc) in keywords.items():
            if key in input_names and not variadic:
                value = self._value(value)
                if not isinstance(value, Tensor):
                    raise IrcError(f"input '{key}' of '{opdef.name}' must be a tensor, got {describe(value)}", kloc)
                idx = input_names.index(key)
                while len(tensors) < idx and (src := opdef.omitted.get(input_names[len(tensors)])) is not None \
                        and input_names.index(src) < len(tensors):
                    tensors.append(tensors[input_names.index(src)])
                if idx != len(tensors):
                    raise IrcError(f"input '{key}' of '{opdef.name}' given out of order", kloc)
                tensors.append(value)
                continue
            if opdef.attr(key) is None or key == "tied_dim":
                known = [*(input_names if not variadic else []), *(a.name for a in settable)]
                hint = did_you_mean(key, known) or f" (it takes: {', '.join(known) or 'nothing'})"
                raise IrcError(f"'{opdef.name}' has no input or attribute '{key}'{hint}", kloc)
            if key in attrs:
                raise IrcError(f"attribute '{key}' of '{opdef.name}' is given twice", kloc,
                               notes=[f"first given at {where(attr_locs[key], kloc.file)}"])
            attrs[key] = value
            attr_locs[key] = kloc
        attrs = self._attr_values(opdef, attrs, attr_locs, loc)
        if not tensors and opdef.min_inputs > 0 and (opdef.params or opdef.buffers):
            # no inputs: a reusable layer instance, whose weights every call shares
            name = self._scope_name(scope, instance_name or opdef.name)
            return Instance(opdef.name, attrs, name, loc)
        if len(tensors) < opdef.min_inputs:
            raise IrcError(f"'{opdef.name}' needs {plural(opdef.min_inputs, 'tensor input')}, got {len(tensors)}",
                           loc)
        return self._emit(opdef.name, tensors, attrs, loc, scope, hint, checked=True)

    def _attr_values(self, opdef: OpDef, attrs: dict[str, Any], locs: dict[str, Loc], loc: Loc) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            aloc = locs.get(key, loc)
            attr = opdef.attr(key)
            if isinstance(value, Instance):
                if attr is None or attr.kind != "ref":
                    raise IrcError(f"attribute '{key}' of '{opdef.name}' cannot be a layer instance", aloc)
                if value.op != "embedding":
                    raise IrcError(f"{key}= must name an embedding instance, got a '{value.op}' instance", aloc)
                out[key] = value.scope
                out.setdefault("vocab", value.attrs["vocab"])
                out["tied_dim"] = value.attrs["dim"]
                continue
            if isinstance(value, EnumName):
                if attr is not None and attr.kind == "ref":
                    hint = did_you_mean(value.name, value.env.all_names() if value.env else ())
                    raise IrcError(f"undefined name '{value.name}'"
                                   + (hint or f"; {key}= needs an embedding instance (emb = embedding(V, d))"),
                                   value.loc)
                if attr is None or attr.kind not in ENUM_KINDS:
                    raise IrcError(self._undefined(value.name, value.env), value.loc)
                value = value.name
            if isinstance(value, (Tensor, BlockDef, tuple)):
                raise IrcError(f"attribute '{key}' of '{opdef.name}' cannot be {describe(value)}", aloc)
            out[key] = [simplify(v) for v in value] if isinstance(value, list) else simplify(value)
        try:
            return normalize_attrs(opdef, out)
        except AttrError as e:
            bad = next((k for k in out if f"'{k}'" in str(e)), None)
            raise IrcError(str(e), locs.get(bad, loc) if bad else loc, origin=e.origin) from None

    def _instance_call(self, inst: Instance, positional, keywords, loc: Loc, scope: str,
                       hint: str | tuple[str, ...] | None) -> Any:
        if keywords:
            raise IrcError(f"layer instance '{inst.scope}' is already configured; pass only tensors", loc)
        tensors = []
        for value, aloc in positional:
            value = self._value(value)
            if not isinstance(value, Tensor):
                raise IrcError(f"layer instance '{inst.scope}' takes tensors, got {describe(value)}", aloc)
            tensors.append(value)
        opdef = get_op(inst.op)
        assert opdef is not None
        if len(tensors) < opdef.min_inputs:
            raise IrcError(f"'{inst.op}' needs {plural(opdef.min_inputs, 'tensor input')}, got {len(tensors)}", loc)
        return self._emit(inst.op, tensors, dict(inst.attrs), loc, scope, hint, checked=True, weights=inst.scope)

    def _block_call(self, block: BlockDef, positional, keywords, loc: Loc, scope: str,
                    block_scope: str | None = None) -> Any:
        if block.name in self.block_stack:
            chain = " → ".join([*self.block_stack[self.block_stack.index(block.name):], block.name])
            raise IrcError(f"block '{block.name}' calls itself ({chain}); recursion is not allowed", loc)
        if len(self.block_stack) >= MAX_BLOCK_DEPTH:
            raise IrcError(f"blocks nest deeper than {MAX_BLOCK_DEPTH}", loc)
        names = [p for p, _ in block.params]
        if len(positional) > len(names):
            raise IrcError(f"block '{block.name}' takes {plural(len(names), 'argument')}, got {len(positional)}", loc)
        env = Env(block.env)
        for (value, aloc), pname in zip(positional, names):
            env.define(pname, value, aloc)
        for key, (value, kloc) in keywords.items():
            if key not in names:
                hint = did_you_mean(key, names) or f" (it takes: {', '.join(names) or 'no arguments'})"
                raise IrcError(f"block '{block.name}' has no parameter '{key}'{hint}", kloc)
            if key in env.names:
                raise IrcError(f"argument '{key}' of block '{block.name}' is given twice", kloc,
                               notes=[f"first given at {where(env.locs[key], kloc.file)}"])
            env.define(key, value, kloc)
        missing = [p for p, default in block.params if p not in env.names and default is None]
        if missing:
            raise IrcError(f"block '{block.name}' needs argument '{missing[0]}'", loc)
        inner_scope = block_scope or self._scope_name(scope, block.name)
        self.block_stack.append(block.name)
        saved = self.file
        self.file = block.loc.file  # defaults and body are read in the block's own file
        try:
            for pname, default in block.params:
                if pname not in env.names:
                    env.names[pname] = self._expr(default, Env(block.env, dict(env.names)), scope)
            result = self._body(block.body, env, inner_scope + ".", in_model=False)
        finally:
            self.file = saved
            self.block_stack.pop()
        if result is None:
            raise IrcError(f"block '{block.name}' does not return anything", block.loc)
        return result[0] if len(result) == 1 else tuple(result)

    def _repeat(self, tree: Tree, env: Env, scope: str) -> Any:
        count_tree, name_tok, args_tree = tree.children
        loc = _loc(self.file, tree)
        count = self._value(self._expr(count_tree, env, scope))
        if isinstance(count, Fraction) and count.denominator == 1:
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int):
            raise IrcError(f"repeat count must be an integer, got {describe(count)}", _loc(self.file, count_tree))
        if count < 1 or count > MAX_REPEAT:
            raise IrcError(f"repeat count must be between 1 and {MAX_REPEAT:,}, got {count}",
                           _loc(self.file, count_tree))
        name = str(name_tok)
        name_loc = _loc(self.file, name_tok)
        try:
            block = env.lookup(name)
        except KeyError:
            if get_op(name) is not None:
                raise IrcError(f"repeat needs a block, but '{name}' is a layer; wrap it in a block", name_loc) from None
            if name in BUILTINS:
                raise IrcError(f"repeat needs a block, but '{name}' is a built-in function", name_loc) from None
            blocks = [n for n in env.all_names() if isinstance(env.lookup(n), BlockDef)]
            raise IrcError(f"unknown block '{name}'{did_you_mean(name, blocks)}", name_loc) from None
        if not isinstance(block, BlockDef):
            raise IrcError(f"repeat needs a block, but '{name}' is {describe(block)}", name_loc)
        positional, keywords = self._args(args_tree, env, scope)
        if not positional:
            raise IrcError("repeat needs the value to thread through the blocks as the first argument", loc)
        base = self._scope_name(scope, name)
        value = positional[0][0]
        for i in range(count):
            args = [(value, positional[0][1]), *positional[1:]]
            value = self._block_call(block, args, keywords, loc, scope, block_scope=f"{base}.{i}")
            if isinstance(value, tuple):
                raise IrcError(f"repeat needs block '{block.name}' to return one value, it returns {len(value)}",
                               block.loc)
        return value

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
