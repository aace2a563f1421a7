"""Reading .arch files for the builder: parsing, ``use`` resolution (next to the using file, else the
standard library), cycles, and each file's top-level names and models."""

from __future__ import annotations

import os
from pathlib import Path

from lark import Tree

from irc.diagnostics import IrcError, Loc, os_error_words, read_source, suggest, where
from irc.frontends.arch.locs import tree_loc
from irc.frontends.arch.parse import parse_text
from irc.frontends.arch.values import Env

LIB = Path(__file__).parent / "lib"  # the standard library of blocks


class FileUnit:
    """One parsed file: its top-level environment and its models."""

    def __init__(self, path: str, env: Env, models: dict[str, Tree]):
        self.path = path
        self.env = env
        self.models = models


class FileLoading:
    """The builder's file half (mixed into Builder): ``self.loading`` is the chain of files being read,
    ``self.units`` the files read so far by resolved path."""

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
                use_path, use_display = self._resolve_use(path, rel, tree_loc(name, target))
                other = self.load_file(use_path, use_loc=tree_loc(name, target), display=use_display, use_rel=rel)
                for n, value in other.env.names.items():
                    if n not in env.names:
                        env.define(n, value, other.env.locs.get(n))
            elif item.data == "model_def":
                name_tok = item.children[0]
                if str(name_tok) in models:
                    first = tree_loc(name, models[str(name_tok)].children[0])
                    raise IrcError(f"model '{name_tok}' is defined twice", tree_loc(name, name_tok),
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
            names |= {p.name for p in (LIB).glob("*.arch")}
        close = suggest(path.name, names)
        return f"; did you mean '{rel[:len(rel) - len(path.name)]}{close}'?" if close else ""

    @staticmethod
    def _resolve_use(path: Path, rel: str, at: Loc) -> tuple[Path, str]:
        """A path next to the using file wins; otherwise the standard library."""
        if "\0" in rel:
            raise IrcError("a 'use' path cannot contain a NUL character", at)
        candidate = path.parent / rel
        lib = LIB
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
