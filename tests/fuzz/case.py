"""One fuzz input: the files it consists of, the -D flags, and what it claims to be."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """``files`` maps a relative file name to its text; ``main`` is the one compiled.

    ``kind`` is ``arch`` (compile an .arch model) or ``ir`` (parse IR text, then load it).
    ``valid`` marks inputs generated to be correct: they must compile, not merely fail well.
    ``origin`` says which strategy made the case, for the tallies; ``expect`` holds output
    types predicted independently of irc.
    """

    files: tuple[tuple[str, str], ...]
    main: str = "main.arch"
    defines: tuple[str, ...] = ()
    model: str | None = None
    kind: str = "arch"
    valid: bool = False
    origin: str = "?"
    expect: tuple[tuple[str, str], ...] = ()  # (output label, printed type) a valid case must produce
    notes: tuple[str, ...] = field(default=(), compare=False)

    @staticmethod
    def single(text: str, origin: str, *, kind: str = "arch", valid: bool = False,
               defines: tuple[str, ...] = (), model: str | None = None) -> Case:
        main = "main.ir" if kind == "ir" else "main.arch"
        return Case(((main, text),), main, defines, model, kind, valid, origin)

    @property
    def main_text(self) -> str:
        return dict(self.files)[self.main]

    def describe(self) -> str:
        """The case as text a person can paste into files to reproduce it."""
        parts = []
        for name, text in self.files:
            parts.append(f"--- {name} ---\n{visible(text)}")
        flags = " ".join(f"-D {d}" for d in self.defines) + (f" --model {self.model}" if self.model else "")
        if flags:
            parts.append(f"--- flags: {flags.strip()}")
        return "\n".join(parts)


def visible(text: str) -> str:
    """``text`` with invisible and unencodable characters as escapes, newlines kept."""
    out = []
    for ch in text:
        if ch in "\n\t" or (ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF):
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return "".join(out)
