"""The benchmark runner's bookkeeping (benchmarks/run.py): rounds, the fastest round per peer, the peers'
environment. The timings themselves are not tested (speed goals live in benchmarks/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import run
from benchmarks.machine import cache_sizes, cpu_model, dropped_from_peers, peer_env


def _row(case: str, item: str, peer: str, seconds: float) -> dict:
    return {"case": case, "item": item, "peer": peer, "seconds": seconds, "value": seconds * 1e3, "unit": "ms"}


def test_fastest_keeps_each_peers_best_round_in_first_seen_order() -> None:
    rows = [_row("models", "resnet18", "irc", 0.0114), _row("models", "resnet18", "ort", 0.0106),
            _row("models", "resnet18", "irc", 0.0091), _row("models", "resnet18", "ort", 0.0089),
            _row("models", "resnet18", "irc", 0.0097), _row("gemms", "resnet18", "irc", 0.5)]
    best = run.fastest(rows)
    assert [(r["case"], r["peer"], r["seconds"]) for r in best] == [
        ("models", "irc", 0.0091), ("models", "ort", 0.0089), ("gemms", "irc", 0.5)]


def test_rounds_run_every_peer_once_and_reverse_every_other_round() -> None:
    order = run._in_rounds(3, ("numpy", "irc"))
    assert order == [(0, "numpy"), (0, "irc"), (1, "irc"), (1, "numpy"), (2, "numpy"), (2, "irc")]


def test_peers_run_without_the_hosts_openblas_pins(monkeypatch) -> None:
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.setenv("IRC_NUM_THREADS", "2")
    env = peer_env(OMP_NUM_THREADS="1")
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert env["IRC_NUM_THREADS"] == "2" and env["PYTHONWARNINGS"] == "ignore" and env["OMP_NUM_THREADS"] == "1"
    assert dropped_from_peers() == "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512"
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.delenv("OPENBLAS_L2_SIZE")
    assert dropped_from_peers().startswith("nothing")


def test_rounds_below_one_are_refused(capsys) -> None:
    try:
        run.main(["--rounds", "0", "--no-write"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--rounds 0 was accepted")
    assert "--rounds must be at least 1" in capsys.readouterr().err


def test_machine_rows_name_the_cpu_and_its_caches() -> None:
    assert cpu_model()
    sizes = cache_sizes()
    if Path("/sys/devices/system/cpu/cpu0/cache/index0").exists():  # Linux: the kernel says, so the row must
        assert sizes.startswith("L1 ") and "L2 " in sizes
    else:
        assert sizes == "?"
