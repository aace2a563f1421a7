"""The package installs as irc, irc.frontends and irc.backends — no generic top-level names."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, Path]:
    """Every Python package in the source tree, under its installed name."""
    roots = {"irc": ROOT / "irc", "irc.frontends": ROOT / "frontends", "irc.backends": ROOT / "backends"}
    found: dict[str, Path] = {}
    for name, root in roots.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root).parts
            found[".".join((name, *rel))] = init.parent
    return found


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert set(_package_dirs()) == listed


def test_wheel_has_no_generic_top_level_names(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("irc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"irc"}
    assert "irc/frontends/arch/arch.lark" in names
    assert "irc/backends/__init__.py" in names


def test_installed_names_import() -> None:
    import irc.backends
    import irc.frontends.arch

    assert Path(irc.frontends.arch.__file__).is_relative_to(ROOT / "frontends")
    assert Path(irc.backends.__file__).is_relative_to(ROOT / "backends")


def test_ruff_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
