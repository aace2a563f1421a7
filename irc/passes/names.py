"""Value names the passes make: a weight key or label made into an IR name, and a name not yet taken."""

from __future__ import annotations


def name_part(text: str) -> str:
    """``text`` with every character outside [A-Za-z0-9_] made ``_`` (scopes read from IR text may hold any)."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text)


def dotted_name(key: str, prefix: str = "", empty: str = "weight") -> str:
    """A valid dotted IR value name from a weight key: each part cleaned, empty parts dropped."""
    name = ".".join(p for p in (name_part(p) for p in key.split(".")) if p) or empty
    return prefix + name


def fresh_name(base: str, taken: set[str], sep: str = ".") -> str:
    """``base``, or ``base<sep>1``, ``base<sep>2``… the first not in ``taken`` (which then holds it)."""
    name, i = base, 1
    while name in taken:
        name, i = f"{base}{sep}{i}", i + 1
    taken.add(name)
    return name
