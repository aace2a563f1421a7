"""Calls for the builder: built-in functions, layer calls (tensors first, then attributes positionally
or by keyword), layer instances that share weights, block calls with their own scope, and ``repeat``."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from lark import Tree

from irc.diagnostics import IrcError, Loc, did_you_mean, plural, where
from irc.frontends.arch.arith import checked, out_of_range
from irc.frontends.arch.locs import tree_loc
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
    simplify,
)
from irc.ops import AttrError, get_op, normalize_attrs
from irc.ops.registry import BARE_WORD_KINDS, OpDef

MAX_REPEAT = 100_000
MAX_BLOCK_DEPTH = 64
ENUM_KINDS = BARE_WORD_KINDS  # attribute kinds a bare word can fill, from the registry


class Calls:
    """The builder's call half (mixed into Builder)."""

    def _call(self, tree: Tree, env: Env, scope: str, hint: str | tuple[str, ...] | None) -> Any:
        callee_tree, args_tree = tree.children
        loc = tree_loc(self.file, tree)
        positional, keywords = self._args(args_tree, env, scope)
        if callee_tree.data == "name":
            name_tok = callee_tree.children[0]
            fname = str(name_tok)
            loc = tree_loc(self.file, name_tok, to=tree)  # the caret at the name, the span to its ')'
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
                kloc = tree_loc(self.file, arg)  # 'key=value', the caret at the key
                if str(key_tok) in keywords:
                    first = keywords[str(key_tok)][1]
                    raise IrcError(f"argument '{key_tok}' is given twice", kloc,
                                   notes=[f"first given at {where(first, kloc.file)}"])
                keywords[str(key_tok)] = (self._expr(expr, env, scope), kloc)
            else:
                if keywords:
                    raise IrcError("a positional argument cannot follow keyword arguments", tree_loc(self.file, arg))
                positional.append((self._expr(arg, env, scope), tree_loc(self.file, arg)))
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
                if attr is not None and attr.kind == "ref" and opdef.inputs:
                    hint = did_you_mean(value.name, value.env.all_names() if value.env else ())
                    raise IrcError(f"undefined name '{value.name}'"
                                   + (hint or f"; {key}= needs an embedding instance (emb = embedding(V, d))"),
                                   value.loc)
                if attr is not None and attr.kind == "bool":
                    hint = did_you_mean(value.name, value.env.all_names() if value.env else ())
                    raise IrcError(f"attribute '{key}' of '{opdef.name}' expects true or false, got '{value.name}'"
                                   + hint, value.loc)
                # an op with no tensor inputs (param) names a weight of its own: a bare word is its key
                if attr is None or (attr.kind not in ENUM_KINDS and not (attr.kind == "ref" and not opdef.inputs)):
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
        loc = tree_loc(self.file, tree)
        count = self._value(self._expr(count_tree, env, scope))
        if isinstance(count, Fraction) and count.denominator == 1:
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int):
            raise IrcError(f"repeat count must be an integer, got {describe(count)}", tree_loc(self.file, count_tree))
        if count < 1 or count > MAX_REPEAT:
            raise IrcError(f"repeat count must be between 1 and {MAX_REPEAT:,}, got {count}",
                           tree_loc(self.file, count_tree))
        name = str(name_tok)
        name_loc = tree_loc(self.file, name_tok)
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
