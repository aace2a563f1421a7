"""Expressions for the builder: literals, names, arithmetic on exact rationals, and tensor
arithmetic (``x + y``, ``x @ w``, ``2 * x``) that becomes nodes."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from lark import Token, Tree

from irc.diagnostics import SOURCES, IrcError, Loc
from irc.dims import Sym
from irc.frontends.arch.arith import OP_TEXT, arith, checked, out_of_range
from irc.frontends.arch.limits import literal_fits
from irc.frontends.arch.locs import between, text_position, tree_loc
from irc.frontends.arch.values import EnumName, Env, Tensor, describe, is_number, simplify
from irc.ops.registry import Quoted


class Expressions:
    """The builder's expression half (mixed into Builder)."""

    def _expr(self, tree: Tree | Token, env: Env, scope: str, name_hint: str | tuple[str, ...] | None = None) -> Any:
        if isinstance(tree, Token):  # bare tokens only appear through placeholders
            raise IrcError(f"unexpected '{tree}'", tree_loc(self.file, tree))
        kind = tree.data
        loc = tree_loc(self.file, tree)
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
                return EnumName(str(tok), tree_loc(self.file, tok), env)
        if kind == "list":
            return [self._value(self._expr(c, env, scope)) for c in tree.children if c is not None]
        if kind in OP_TEXT:
            a = self._value(self._expr(tree.children[0], env, scope))
            b = self._value(self._expr(tree.children[1], env, scope))
            return self._binary(kind, a, b, self._operatortree_loc(tree, OP_TEXT[kind]), scope, name_hint)
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

    def _operatortree_loc(self, tree: Tree, op: str) -> Loc:
        """Where the operator of a binary expression is: between its operands, outside comments."""
        text = SOURCES.get(self.file)
        left, right = tree.children
        start = getattr(left.meta, "end_pos", None)
        end = getattr(right.meta, "start_pos", None)
        if text is None or start is None or end is None:
            return tree_loc(self.file, tree)
        pos = start
        while pos < end:
            if text[pos] == "#":
                pos = text.find("\n", pos, end) if "\n" in text[pos:end] else end
                continue
            if text.startswith(op, pos) and not (op == "*" and text.startswith("**", pos)) and not (
                    op == "/" and text.startswith("//", pos)):
                line, col = text_position(text, pos)
                return between(self.file, (line, col), (line, col + len(op)), left, right)
            pos += 1
        return tree_loc(self.file, tree)

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
