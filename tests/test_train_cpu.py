"""``irc train --backend cpu``: the step graph compiled once by the CPU backend (forward, backward, flash-style
attention) trains as the NumPy reference does. 20 steps of models/mlp.arch, models/digits_cnn.arch and
models/byte_lm.arch (and a dropout LSTM language model, whose masks the step input draws) from the same weights
and batches: every step's loss within 1e-5 relative of the reference's, run in float64 (the CPU backend
computes in float32, the reference in float64 is the oracle); with SGD the final weights too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_cpu_backend_helpers import cpu_cache

from irc.pipeline import load_graph
from irc.runtime.init import init_weights
from irc.runtime.optim import OptimConfig
from irc.runtime.train import TrainConfig, build_step, fresh_state, train_steps
from irc.runtime.train_data import ArrayData
from irc.runtime.train_engine import Engine

_ = cpu_cache  # a fixture, used by name below
ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
TOL = 1e-5


def _data(name: str, rng: np.random.Generator) -> ArrayData:
    if name == "mlp":
        return ArrayData("random", {"image": rng.normal(size=(96, 784)).astype(np.float32),
                                    "targets": rng.integers(0, 10, 96)})
    if name == "digits_cnn":
        return ArrayData("random", {"image": rng.uniform(0, 1, (96, 1, 8, 8)).astype(np.float32),
                                    "targets": rng.integers(0, 10, 96)})
    vocab = 256 if name == "byte_lm" else 50
    text = rng.integers(0, vocab, (64, 17 if name == "byte_lm" else 9))  # windows of T + 1 tokens
    return ArrayData("random", {"tokens": text[:, :-1], "targets": text[:, 1:]})


SIZES = {"mlp": {"B": 16}, "digits_cnn": {"B": 16}, "byte_lm": {"B": 8, "T": 16},
         "lstm_lm": {"B": 8, "T": 8, "vocab": 50, "hidden": 24}}


def _run(name: str, engine: Engine, cfg: TrainConfig) -> tuple[list[float], dict[str, np.ndarray], dict]:
    graph = load_graph(ROOT / "models" / f"{name}.arch", SIZES[name])
    graphs = build_step(graph, seed=cfg.seed, engine=engine)
    weights = init_weights(graph, seed=1)
    state = fresh_state(weights, cfg)
    assert train_steps(graphs, state, _data(name, np.random.default_rng(4)), cfg)
    return [row[2] for row in state.history], state.params, weights


def _cfg(name: str, kind: str, dtype, schedule: bool = False) -> TrainConfig:
    lr = {"sgd": 0.1, "momentum": 0.05, "adam": 3e-3}[kind]
    return TrainConfig(steps=STEPS, batch=SIZES[name]["B"], seed=3, lr=lr, optim=OptimConfig(kind), dtype=dtype,
                       warmup=4 if schedule else 0, schedule="cosine" if schedule else "constant",
                       clip=1.0 if schedule else None)


@pytest.mark.parametrize(("name", "kind"), [("mlp", "sgd"), ("mlp", "momentum"), ("digits_cnn", "sgd"),
                                            ("digits_cnn", "adam"), ("byte_lm", "sgd"), ("byte_lm", "adam"),
                                            ("lstm_lm", "adam")])
def test_twenty_cpu_steps_equal_the_reference(cpu_cache, name: str, kind: str) -> None:
    schedule = kind == "adam"
    ref, ref_params, start = _run(name, Engine("numpy"), _cfg(name, kind, np.float64, schedule))
    cpu, cpu_params, _ = _run(name, Engine("cpu", cache_dir=cpu_cache), _cfg(name, kind, np.float32, schedule))
    rel = np.abs(np.array(cpu) - np.array(ref)) / np.abs(np.array(ref))
    assert rel.max() <= TOL, (rel.max(), cpu, ref)
    assert ref[-1] < ref[0]  # it trained: two runs that do nothing would agree trivially
    if kind == "sgd":
        for key, want in ref_params.items():
            scale = max(float(np.abs(want).max()), 1e-3)
            assert np.abs(cpu_params[key] - want).max() <= TOL * scale, key
        assert max(float(np.abs(ref_params[k] - start[k]).max()) for k in start) > 1e-2


def test_the_dropout_step_input_reaches_the_compiled_step(cpu_cache) -> None:
    graph = load_graph(ROOT / "models" / "lstm_lm.arch", SIZES["lstm_lm"])
    graphs = build_step(graph, engine=Engine("cpu", cache_dir=cpu_cache))
    assert graphs.step_input is not None and sum(n.op == "dropout_mask" for n in graphs.step.nodes) == 3


def test_irc_train_backend_cpu(irc_cli: Callable, tmp_path: Path, cpu_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRC_CACHE_DIR", str(cpu_cache.parent / "cli-cache"))
    args = ["train", str(ROOT / "models" / "digits_cnn.arch"), "--data", "digits", "--batch", "32", "--steps", "30",
            "--lr", "2e-3", "--seed", "2"]
    cpu = irc_cli([*args, "--backend", "cpu", "--save", str(tmp_path / "cpu.safetensors")])
    assert cpu.rc == 0, cpu.err
    assert "compiled the training step and the adam update with the cpu backend" in cpu.err
    ref = irc_cli([*args, "--save", str(tmp_path / "ref.safetensors")])
    assert ref.rc == 0, ref.err

    def losses(path: Path) -> np.ndarray:
        rows = path.read_text().splitlines()[1:]
        return np.array([float(r.split(",")[2]) for r in rows])

    a, b = losses(tmp_path / "cpu.loss.csv"), losses(tmp_path / "ref.loss.csv")
    assert len(a) == 30 and np.abs(a - b).max() <= 1e-4 * np.abs(b).max()  # float32 both, different sums
    assert a[-1] < a[0] / 2


def test_the_cpu_backend_is_float32(irc_cli: Callable) -> None:
    r = irc_cli(["train", str(ROOT / "models" / "digits_cnn.arch"), "--data", "digits", "--backend", "cpu",
                 "--dtype", "f64"])
    assert r.rc == 2 and "--backend cpu computes in float32" in r.err
