"""Every model in models/ runs on the cpu backend at small sizes and matches the reference
(`irc run --backend cpu --check`, the command the README shows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fusion import SMALL as _SMALL
from test_zoo_vision import SMALL as _VISION

ROOT = Path(__file__).resolve().parents[1]
# the vision zoo's small bindings live with its torch oracles (tests/test_zoo_vision.py): the same graphs
SMALL = {**_SMALL, **_VISION}
MODELS = sorted(p.stem for p in (ROOT / "models").glob("*.arch"))


def test_every_model_has_small_bindings() -> None:
    assert set(MODELS) == set(SMALL)


@pytest.mark.parametrize("model", MODELS)
def test_model_runs_on_cpu_and_matches_reference(model: str, irc_cli) -> None:
    defines = [f"-D{k}={v}" for k, v in SMALL[model].items()]
    result = irc_cli(["run", str(ROOT / "models" / f"{model}.arch"), *defines, "--backend", "cpu", "--check"])
    assert result.rc == 0, result.out + result.err
    assert " ok" in result.out
