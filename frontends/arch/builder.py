"""Build an irc :class:`~irc.graph.Graph` from a parsed ``.arch`` file.

The builder evaluates the program: constants are folded exactly, blocks are inlined
(each call gets its own scope, so ``repeat(12) decoder(x)`` yields ``decoder.0`` …
``decoder.11``), and every layer call becomes a node carrying its source location.
Types are left to the ``shape-infer`` pass.
"""

from __future__ import annotations

import difflib
from fractions import Fraction
from pathlib import Path
from typing import Any

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
from lark import Token, Tree

from irc.diagnostics import IrcError, Loc
from irc.dims import Sym
from irc.graph import Graph, Node
from irc.ops import AttrError, get_op, normalize_attrs
from irc.ops.registry import OpDef
from irc.types import INPUT_DTYPES, TensorType

MAX_REPEAT = 100_000
MAX_NODES = 2_000_000
MAX_BLOCK_DEPTH = 64


def _loc(file: str, item: Tree | Token) -> Loc:
    if isinstance(item, Token):
        return Loc(file, item.line or 1, item.column or 1)
    meta = item.meta
    return Loc(file, getattr(meta, "line", 1) or 1, getattr(meta, "column", 1) or 1)


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
        self.graph: Graph | None = None
        self.file = "<input>"
        self.counters: dict[str, int] = {}
        self.value_names: set[str] = set()
        self.block_stack: list[str] = []
        self.loading: list[str] = []
        self.units: dict[str, FileUnit] = {}

    # -- files and models -------------------------------------------------------
    def load_file(self, path: Path, text: str | None = None, use_loc: Loc | None = None,
                  display: str | None = None) -> FileUnit:
        # files from the standard library are named <lib>/NAME so IR dumps do not depend
        # on where irc is installed
        key = display or str(path)
        if key in self.loading:
            chain = " → ".join(Path(p).name for p in [*self.loading, key])
            raise IrcError(f"'use' cycle: {chain}", use_loc)
        if key in self.units:
            return self.units[key]
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise IrcError(f"cannot find '{path}'", use_loc) from None
            except (OSError, UnicodeDecodeError) as e:
                raise IrcError(f"cannot read '{path}': {e}", use_loc) from None
        self.loading.append(key)
        tree = parse_text(text, key)
        env = Env()
        models: dict[str, Tree] = {}
        saved_file = self.file
        self.file = key
        for item in tree.children:
            if item.data == "use_stmt":
                target = item.children[0]
                rel = str(target)[1:-1]
                use_path, use_display = self._resolve_use(path, rel)
                other = self.load_file(use_path, use_loc=_loc(key, target), display=use_display)
                for name, value in other.env.names.items():
                    env.names.setdefault(name, value)
            elif item.data == "model_def":
                name_tok = item.children[0]
                if str(name_tok) in models:
                    raise IrcError(f"model '{name_tok}' is defined twice", _loc(key, name_tok))
                models[str(name_tok)] = item
            elif item.data == "block_def":
                self._define_block(item, env)
            elif item.data == "const_stmt":
                self._const_stmt(item, env, top_level=False)
        self.file = saved_file
        self.loading.pop()
        unit = FileUnit(key, env, models)
        self.units[key] = unit
        return unit

    @staticmethod
    def _resolve_use(path: Path, rel: str) -> tuple[Path, str | None]:
        """A path next to the using file wins; otherwise the standard library."""
        candidate = path.parent / rel
        if candidate.exists():
            return candidate, None
        stdlib = Path(__file__).parent / "lib" / rel
        if stdlib.exists() and stdlib.resolve().is_relative_to((Path(__file__).parent / "lib").resolve()):
            return stdlib, f"<lib>/{rel}"
        return candidate, None

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
            raise IrcError(f"no model '{model}' in '{unit.path}' (it has: {', '.join(unit.models)})")
        tree = unit.models[model]
        self.file = unit.path
        name_tok, symbols_tree, body = tree.children
        symbols = [str(t) for t in symbols_tree.children] if symbols_tree is not None else []
        seen: set[str] = set()
        env = Env(unit.env)
        for tok in symbols_tree.children if symbols_tree is not None else []:
            if str(tok) in seen:
                raise IrcError(f"symbol '{tok}' is declared twice", _loc(self.file, tok))
            seen.add(str(tok))
            if str(tok) in self.bindings:
                env.names[str(tok)] = self.bindings[str(tok)]
                self.used_bindings.add(str(tok))
            else:
                env.names[str(tok)] = Sym.var(str(tok))
        self.graph = Graph(str(name_tok), symbols=symbols)
        self.graph.bindings = {k: v for k, v in self.bindings.items() if k in seen}
        self._body(body, env, scope="", in_model=True)
        unused = sorted(set(self.bindings) - self.used_bindings)
        if unused:
            known = ", ".join(symbols) or "none"
            raise IrcError(f"-D {unused[0]}: model '{model}' has no symbol or constant '{unused[0]}' "
                           f"(symbols: {known})", _loc(self.file, name_tok))
        if not self.graph.outputs:
            raise IrcError(f"model '{model}' has no 'output' statement", _loc(self.file, name_tok))
        return self.graph

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

    def _const_stmt(self, stmt: Tree, env: Env, top_level: bool) -> None:
        for item in stmt.children:
            name_tok, expr = item.children
            name = str(name_tok)
            if name in env.names:
                raise IrcError(f"'{name}' is already defined in this scope", _loc(self.file, name_tok))
            if top_level and name in self.bindings:
                env.names[name] = self.bindings[name]
                self.used_bindings.add(name)
                continue
            value = self._expr(expr, env, "")
            if not is_number(value) and not isinstance(value, bool):
                raise IrcError(f"constant '{name}' must be a number, got {describe(value)}", _loc(self.file, expr))
            env.names[name] = simplify(value)

    def _define_block(self, tree: Tree, env: Env) -> None:
        name_tok, params_tree, body = tree.children
        params: list[tuple[str, Tree | None]] = []
        for p in params_tree.children if params_tree is not None else []:
            pname = str(p.children[0])
            if any(pname == q for q, _ in params):
                raise IrcError(f"block '{name_tok}' has two parameters named '{pname}'", _loc(self.file, p))
            params.append((pname, p.children[1] if len(p.children) > 1 else None))
        if str(name_tok) in env.names:
            raise IrcError(f"'{name_tok}' is already defined in this scope", _loc(self.file, name_tok))
        env.names[str(name_tok)] = BlockDef(str(name_tok), params, body, env, _loc(self.file, name_tok))

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
            if isinstance(v, Fraction) and v.denominator == 1:
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, (int, Sym)):
                raise IrcError(f"a dimension must be an integer or a symbol, got {describe(v)}", _loc(self.file, d))
            if isinstance(v, int) and v <= 0:
                raise IrcError(f"a dimension must be positive, got {v}", _loc(self.file, d))
            dims.append(v)
        name = str(name_tok)
        if env.has(name) and name in env.names:
            raise IrcError(f"'{name}' is already defined", _loc(self.file, name_tok))
        value = self._fresh(name)
        node = Node("input", [], [value], {}, scope="", loc=_loc(self.file, name_tok),
                    types=[TensorType(str(dtype_tok), tuple(dims))])
        self._add(node)
        env.names[name] = Tensor(value)

    def _assign(self, stmt: Tree, env: Env, scope: str) -> None:
        targets_tree, expr = stmt.children
        targets = [str(t) for t in targets_tree.children]
        hint = targets[0] if len(targets) == 1 else None
        value = self._expr(expr, env, scope, name_hint=hint)
        if len(targets) == 1:
            if isinstance(value, tuple):
                value = self._first_result(value, expr)
            env.names[targets[0]] = value
            return
        if not isinstance(value, tuple):
            raise IrcError(f"cannot unpack {describe(value)} into {len(targets)} names", _loc(self.file, expr))
        if len(value) != len(targets):
            raise IrcError(f"the right side has {len(value)} results but {len(targets)} names are assigned",
                           _loc(self.file, expr))
        for t, v in zip(targets, value):
            env.names[t] = v

    def _first_result(self, value: tuple, where: Tree) -> Any:
        first = value[0]
        if isinstance(first, Tensor):
            producer = self.graph.producers()[first.value] if self.graph else None
            if producer is not None and producer.op == "split":
                raise IrcError(f"split returns {len(value)} results; assign them to {len(value)} names",
                               _loc(self.file, where))
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
            env.names[label] = value
        if isinstance(value, tuple):
            value = self._first_result(value, stmt)
        if not isinstance(value, Tensor):
            raise IrcError(f"output '{label}' must be a tensor, got {describe(value)}", _loc(self.file, name_tok))
        assert self.graph is not None
        if any(lbl == label for lbl, _ in self.graph.outputs):
            raise IrcError(f"output '{label}' is declared twice", _loc(self.file, name_tok))
        self.graph.outputs.append((label, value.value))

    # -- expressions ------------------------------------------------------------
    def _expr(self, tree: Tree | Token, env: Env, scope: str, name_hint: str | None = None) -> Any:
        if isinstance(tree, Token):  # bare tokens only appear through placeholders
            raise IrcError(f"unexpected '{tree}'", _loc(self.file, tree))
        kind = tree.data
        loc = _loc(self.file, tree)
        if kind == "number":
            text = str(tree.children[0])
            try:
                return simplify(Fraction(text))
            except (ValueError, ZeroDivisionError):
                raise IrcError(f"bad number '{text}'", loc) from None
        if kind == "string":
            return str(tree.children[0])[1:-1]
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
                return EnumName(str(tok), _loc(self.file, tok))
        if kind == "list":
            return [self._value(self._expr(c, env, scope)) for c in tree.children if c is not None]
        if kind in ("add", "sub", "mul", "div", "floordiv", "mod", "matmul", "pow"):
            a = self._value(self._expr(tree.children[0], env, scope), tree.children[0])
            b = self._value(self._expr(tree.children[1], env, scope), tree.children[1])
            return self._binary(kind, a, b, loc, scope, name_hint)
        if kind == "neg":
            a = self._value(self._expr(tree.children[0], env, scope), tree.children[0])
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

    def _value(self, v: Any, where: Tree | None = None) -> Any:
        """Resolve a value used in arithmetic: unknown names are errors here."""
        if isinstance(v, EnumName):
            raise IrcError(f"undefined name '{v.name}'", v.loc)
        if isinstance(v, tuple) and v and isinstance(v[0], Tensor):
            return v[0]
        return v

    def _binary(self, kind: str, a: Any, b: Any, loc: Loc, scope: str, hint: str | None) -> Any:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if kind == "matmul":
                if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
                    raise IrcError("'@' needs two tensors", loc)
                return self._emit("matmul", [a, b], {}, loc, scope, hint)
            if kind not in ("add", "sub", "mul", "div"):
                raise IrcError(f"'{_OP_TEXT[kind]}' is not defined for tensors", loc)
            if isinstance(a, Tensor) and isinstance(b, Tensor):
                return self._emit(kind, [a, b], {}, loc, scope, hint)
            tensor, other, reverse = (a, b, False) if isinstance(a, Tensor) else (b, a, True)
            if not (is_number(other) or isinstance(other, float)) or isinstance(other, Sym):
                raise IrcError(f"cannot apply '{_OP_TEXT[kind]}' to a tensor and {describe(other)}", loc)
            attrs: dict[str, Any] = {"scalar": float(other)}
            if reverse and kind in ("sub", "div"):
                attrs["reverse"] = True
            return self._emit(kind, [tensor], attrs, loc, scope, hint)
        return self._arith(kind, a, b, loc)

    def _arith(self, kind: str, a: Any, b: Any, loc: Loc) -> Any:
        for v in (a, b):
            if not (is_number(v) or isinstance(v, float)):
                raise IrcError(f"cannot apply '{_OP_TEXT[kind]}' to {describe(v)}", loc)
        if isinstance(a, float) or isinstance(b, float):
            a, b = float(a), float(b)  # type: ignore[arg-type]
        sym = isinstance(a, Sym) or isinstance(b, Sym)
        try:
            if kind == "add":
                return simplify(a + b)
            if kind == "sub":
                return simplify(a - b)
            if kind == "mul":
                return simplify(a * b)
            if sym:
                return self._sym_div(kind, a, b, loc)
            if kind == "div":
                return simplify(Fraction(a) / Fraction(b)) if not isinstance(a, float) else a / b
            if kind == "floordiv":
                return simplify(a // b)
            if kind == "mod":
                return simplify(a % b)
            if kind == "pow":
                if isinstance(b, Fraction) and b.denominator != 1:
                    raise IrcError("'**' needs an integer exponent", loc)
                result = a ** int(b) if not isinstance(a, float) else a**b
                return simplify(result)
        except ZeroDivisionError:
            raise IrcError("division by zero", loc) from None
        except OverflowError:
            raise IrcError("number too large", loc) from None
        raise AssertionError(kind)

    @staticmethod
    def _sym_div(kind: str, a: Any, b: Any, loc: Loc) -> Any:
        if kind in ("div", "floordiv") and isinstance(b, int) and b != 0:
            q = a // b
            if kind == "floordiv" or (isinstance(q, Sym) and q * b == a):
                return q
            raise IrcError(f"{a} / {b} is not a whole number of elements; use '//' for floor division", loc)
        raise IrcError(f"'{_OP_TEXT[kind]}' with a symbolic size needs a constant integer divisor", loc)

    # -- calls ------------------------------------------------------------------
    def _call(self, tree: Tree, env: Env, scope: str, hint: str | None) -> Any:
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
                        return simplify(call_builtin(fname, [self._value(v) for v, _ in positional]))
                    except BuiltinError as e:
                        raise IrcError(str(e), loc) from None
                opdef = get_op(fname)
                if opdef is None or opdef.name == "input":
                    raise IrcError(self._unknown_callee(fname, env), loc)
                return self._layer_call(opdef, positional, keywords, loc, scope, hint, instance_name=hint)
        else:
            callee = self._expr(callee_tree, env, scope)
        if isinstance(callee, BlockDef):
            return self._block_call(callee, positional, keywords, loc, scope, hint)
        if isinstance(callee, Instance):
            return self._instance_call(callee, positional, keywords, loc, scope, hint)
        raise IrcError(f"{describe(callee)} cannot be called", loc)

    def _args(self, args_tree: Tree | None, env: Env, scope: str) -> tuple[list[tuple[Any, Loc]], dict]:
        positional: list[tuple[Any, Loc]] = []
        keywords: dict[str, tuple[Any, Loc]] = {}
        for arg in args_tree.children if args_tree is not None else []:
            if isinstance(arg, Tree) and arg.data == "kwarg":
                key_tok, expr = arg.children
                if str(key_tok) in keywords:
                    raise IrcError(f"argument '{key_tok}' is given twice", _loc(self.file, key_tok))
                keywords[str(key_tok)] = (self._expr(expr, env, scope), _loc(self.file, key_tok))
            else:
                if keywords:
                    raise IrcError("a positional argument cannot follow keyword arguments", _loc(self.file, arg))
                positional.append((self._expr(arg, env, scope), _loc(self.file, arg)))
        return positional, keywords

    def _layer_call(self, opdef: OpDef, positional, keywords, loc: Loc, scope: str, hint: str | None,
                    instance_name: str | None) -> Any:
        input_names = [i.rstrip("?*") for i in opdef.inputs]
        variadic = opdef.max_inputs is None
        tensors: list[Tensor] = []
        attr_values: list[tuple[Any, Loc]] = []
        for value, aloc in positional:
            value = self._value(value) if not isinstance(value, EnumName) else value
            if isinstance(value, Tensor):
                if attr_values:
                    raise IrcError(f"tensor argument to '{opdef.name}' after its attribute arguments", aloc)
                if not variadic and len(tensors) >= len(input_names):
                    raise IrcError(f"'{opdef.name}' takes at most {len(input_names)} tensor input(s)", aloc)
                tensors.append(value)
            else:
                attr_values.append((value, aloc))
        attrs: dict[str, Any] = {}
        attr_locs: dict[str, Loc] = {}
        settable = [a for a in opdef.attrs if a.name != "tied_dim"]
        if len(attr_values) > len(settable):
            raise IrcError(f"'{opdef.name}' takes at most {len(settable)} attribute argument(s), "
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
                if idx != len(tensors):
                    raise IrcError(f"input '{key}' of '{opdef.name}' given out of order", kloc)
                tensors.append(value)
                continue
            if key in attrs:
                raise IrcError(f"attribute '{key}' of '{opdef.name}' is given twice", kloc)
            attrs[key] = value
            attr_locs[key] = kloc
        attrs = self._attr_values(opdef, attrs, attr_locs, loc)
        if not tensors and opdef.min_inputs > 0:
            # no inputs: a reusable layer instance
            name = self._scope_name(scope, instance_name or opdef.name)
            return Instance(opdef.name, attrs, name, loc)
        if len(tensors) < opdef.min_inputs:
            raise IrcError(f"'{opdef.name}' needs {opdef.min_inputs} tensor input(s), got {len(tensors)}", loc)
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
                    raise IrcError(f"'{key}' must name an embedding instance, got a '{value.op}'", aloc)
                out[key] = value.scope
                out.setdefault("vocab", value.attrs["vocab"])
                out["tied_dim"] = value.attrs["dim"]
                continue
            if isinstance(value, EnumName):
                if attr is not None and attr.kind == "ref":
                    raise IrcError(f"undefined name '{value.name}' (expected a layer instance)", value.loc)
                if attr is None or attr.kind not in ("enum", "int_or_enum", "pair_or_enum"):
                    raise IrcError(f"undefined name '{value.name}'", value.loc)
                value = value.name
            if isinstance(value, list):
                value = [self._list_item(v, aloc) for v in value]
            if isinstance(value, (Tensor, BlockDef, tuple)):
                raise IrcError(f"attribute '{key}' of '{opdef.name}' cannot be {describe(value)}", aloc)
            out[key] = simplify(value)
        try:
            return normalize_attrs(opdef, out)
        except AttrError as e:
            bad = next((k for k in out if f"'{k}'" in str(e)), None)
            raise IrcError(str(e), locs.get(bad, loc) if bad else loc, origin=e.origin) from None

    @staticmethod
    def _list_item(v: Any, loc: Loc) -> Any:
        if isinstance(v, EnumName):
            raise IrcError(f"undefined name '{v.name}'", v.loc)
        return simplify(v)

    def _instance_call(self, inst: Instance, positional, keywords, loc: Loc, scope: str, hint: str | None) -> Any:
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
            raise IrcError(f"'{inst.op}' needs {opdef.min_inputs} tensor input(s), got {len(tensors)}", loc)
        return self._emit(inst.op, tensors, dict(inst.attrs), loc, scope, hint, checked=True, weights=inst.scope)

    def _block_call(self, block: BlockDef, positional, keywords, loc: Loc, scope: str, hint: str | None,
                    block_scope: str | None = None) -> Any:
        if block.name in self.block_stack:
            chain = " → ".join([*self.block_stack[self.block_stack.index(block.name):], block.name])
            raise IrcError(f"block '{block.name}' calls itself ({chain}); recursion is not allowed", loc)
        if len(self.block_stack) >= MAX_BLOCK_DEPTH:
            raise IrcError(f"blocks nest deeper than {MAX_BLOCK_DEPTH}", loc)
        names = [p for p, _ in block.params]
        if len(positional) > len(names):
            raise IrcError(f"block '{block.name}' takes {len(names)} argument(s), got {len(positional)}", loc)
        env = Env(block.env)
        for (value, _), pname in zip(positional, names):
            env.names[pname] = value
        for key, (value, kloc) in keywords.items():
            if key not in names:
                raise IrcError(f"block '{block.name}' has no parameter '{key}' (it takes: {', '.join(names)})", kloc)
            if key in env.names:
                raise IrcError(f"argument '{key}' of block '{block.name}' is given twice", kloc)
            env.names[key] = value
        for pname, default in block.params:
            if pname not in env.names:
                if default is None:
                    raise IrcError(f"block '{block.name}' needs argument '{pname}'", loc)
                env.names[pname] = self._expr(default, Env(block.env, dict(env.names)), scope)
        inner_scope = block_scope or self._scope_name(scope, block.name)
        self.block_stack.append(block.name)
        saved = self.file
        self.file = block.loc.file
        try:
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
        try:
            block = env.lookup(str(name_tok))
        except KeyError:
            raise IrcError(self._unknown_callee(str(name_tok), env), _loc(self.file, name_tok)) from None
        if not isinstance(block, BlockDef):
            raise IrcError(f"repeat needs a block, but '{name_tok}' is {describe(block)}", _loc(self.file, name_tok))
        positional, keywords = self._args(args_tree, env, scope)
        if not positional:
            raise IrcError("repeat needs the value to thread through the blocks as the first argument", loc)
        base = self._scope_name(scope, str(name_tok))
        value = positional[0][0]
        for i in range(count):
            args = [(value, positional[0][1]), *positional[1:]]
            value = self._block_call(block, args, keywords, loc, scope, None, block_scope=f"{base}.{i}")
            if isinstance(value, tuple):
                raise IrcError(f"repeat needs block '{block.name}' to return one value, it returns {len(value)}",
                               block.loc)
        return value

    # -- emission ---------------------------------------------------------------
    def _emit(self, op: str, tensors: list[Tensor], attrs: dict[str, Any], loc: Loc, scope: str,
              hint: str | None, checked: bool = False, weights: str | None = None) -> Any:
        opdef = get_op(op)
        assert opdef is not None
        if not checked:
            try:
                attrs = normalize_attrs(opdef, attrs)
            except AttrError as e:
                raise IrcError(str(e), loc, origin=e.origin) from None
        assert self.graph is not None
        if len(self.graph.nodes) >= MAX_NODES:
            raise IrcError(f"the model expands to more than {MAX_NODES:,} nodes", loc)
        base = hint or op
        node_scope = self._scope_name(scope, base) if opdef.params or opdef.buffers else scope.rstrip(".")
        if weights is None and (opdef.params or opdef.buffers):
            weights = node_scope
        results = opdef.result_names(attrs)
        outputs = [self._fresh(scope + (hint or op)) if i == 0 else self._fresh(f"{scope}{hint or op}.{r}")
                   for i, r in enumerate(results)]
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
    def _undefined(self, name: str, env: Env) -> str:
        close = difflib.get_close_matches(name, sorted(env.all_names()), n=1)
        return f"undefined name '{name}'" + (f"; did you mean '{close[0]}'?" if close else "")

    def _unknown_callee(self, name: str, env: Env) -> str:
        from irc.ops import OPS

        pool = sorted(set(OPS) | set(BUILTINS) | {n for n in env.all_names()})
        close = difflib.get_close_matches(name, pool, n=1)
        return f"unknown layer or block '{name}'" + (f"; did you mean '{close[0]}'?" if close else "")


_OP_TEXT = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "matmul": "@", "pow": "**"}


def build_source(text: str, file: str = "<input>", bindings: dict[str, int] | None = None,
                 model: str | None = None) -> Graph:
    """Build the graph of the model in ``text`` (types not yet inferred)."""
    b = Builder(bindings)
    unit = b.load_file(Path(file), text)
    return b.build_model(unit, model)


def build_file(path: str | Path, bindings: dict[str, int] | None = None, model: str | None = None) -> Graph:
    b = Builder(bindings)
    unit = b.load_file(Path(path))
    return b.build_model(unit, model)
