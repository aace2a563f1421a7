"""``irc train`` end to end, in process: determinism, resume, the files it writes, the data kinds, and
every refusal with its exit code and a message that names the key or the flag (never a traceback)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from irc.pipeline import load_graph

ROOT = Path(__file__).resolve().parents[1]

TINY = """model tiny(B) {
  input x: f32[B, 6]
  h = tanh(linear(x, 8))
  output logits = linear(h, 3)
}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """A small classifier and an .npz whose labels it can learn (the sign pattern of two features)."""
    model = tmp_path / "tiny.arch"
    model.write_text(TINY)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (600, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    data = tmp_path / "xy.npz"
    np.savez(data, x=x, targets=y)
    return model, data


def _train(irc_cli: Callable, model: Path, data: Path | str, *args: str):
    return irc_cli(["train", str(model), "--data", str(data), "--batch", "8", *args])


def test_same_seed_same_bytes_other_seed_other_weights(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, data = tiny
    files = {}
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        r = _train(irc_cli, model, data, "--steps", "15", "--seed", seed, "--clip", "1", "--schedule", "cosine",
                   "--warmup", "3", "--save", str(tmp_path / f"{name}.safetensors"))
        assert r.rc == 0, r.err
        files[name] = [(tmp_path / f"{name}{suffix}").read_bytes()
                       for suffix in (".safetensors", ".train.safetensors", ".loss.csv")]
    assert files["a"] == files["b"]
    assert files["a"][0] != files["c"][0]


def test_resume_ten_plus_ten_is_twenty(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, data = tiny
    common = ("--optimizer", "adamw", "--weight-decay", "0.1", "--eval-every", "5")
    straight = _train(irc_cli, model, data, "--steps", "20", *common, "--save", str(tmp_path / "s.safetensors"))
    first = _train(irc_cli, model, data, "--steps", "10", *common, "--save", str(tmp_path / "r.safetensors"))
    second = _train(irc_cli, model, data, "--steps", "20", *common, "--resume", str(tmp_path / "r.safetensors"),
                    "--save", str(tmp_path / "r.safetensors"))
    assert straight.rc == first.rc == second.rc == 0, second.err
    assert "resuming with other settings" in second.err and "steps 10 -> 20" in second.err
    for suffix in (".safetensors", ".train.safetensors", ".loss.csv"):
        assert (tmp_path / f"s{suffix}").read_bytes() == (tmp_path / f"r{suffix}").read_bytes(), suffix
    state = load_file(tmp_path / "r.train.safetensors")
    assert {k.split("/")[1] for k in state if k.startswith("optim/")} == {"exp_avg", "exp_avg_sq"}
    assert state["history"].shape == (20, 6)


def test_resume_from_plain_weights_starts_a_fresh_optimizer(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, data = tiny
    w = tmp_path / "plain.safetensors"
    assert irc_cli(["weights", str(model), "--template", str(w), "--seed", "3"]).rc == 0
    r = _train(irc_cli, model, data, "--steps", "4", "--resume", str(w))
    assert r.rc == 0, r.err
    assert "no training state beside it" in r.err and "fresh optimizer at step 0" in r.err


def test_saved_weights_run_and_the_curve_files(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, data = tiny
    w = tmp_path / "w.safetensors"
    r = _train(irc_cli, model, data, "--steps", "12", "--eval-every", "4", "--log-every", "3", "--save", str(w))
    assert r.rc == 0, r.err
    assert "held-out loss" in r.out and "accuracy" in r.out and "samples/s" in r.out
    progress = [line for line in r.err.splitlines() if line.startswith("irc: step ") and "steps/s" in line]
    assert [line.split()[2] for line in progress] == ["3/12", "6/12", "9/12", "12/12"]
    assert all("loss " in line and "samples/s" in line for line in progress)
    rows = (tmp_path / "w.loss.csv").read_text().splitlines()
    assert rows[0] == "step,lr,loss,grad_norm,eval_loss,eval_accuracy" and len(rows) == 13
    evals = [row.split(",")[0] for row in rows[1:] if row.split(",")[4]]
    assert evals == ["4", "8", "12"]
    assert (tmp_path / "w.loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = irc_cli(["run", str(model), "--weights", str(w), "-D", "B=2"])
    assert run.rc == 0, run.err
    assert load_file(w).keys() == {"linear.weight", "linear.bias", "logits.weight", "logits.bias"}


def test_no_matplotlib_says_so(irc_cli: Callable, tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    model, data = tiny
    r = _train(irc_cli, model, data, "--steps", "3", "--save", str(tmp_path / "w.safetensors"))
    assert r.rc == 0, r.err
    assert "matplotlib is not installed" in r.err
    assert (tmp_path / "w.loss.csv").is_file() and not (tmp_path / "w.loss.png").exists()


def test_it_learns_a_learnable_task(irc_cli: Callable, tiny) -> None:
    model, data = tiny
    r = _train(irc_cli, model, data, "--steps", "150", "--lr", "0.02", "--batch", "32")
    assert r.rc == 0, r.err
    accuracy = float(r.out.split("accuracy ")[1].split("%")[0])
    assert accuracy >= 85.0, r.out


def test_digits(irc_cli: Callable, tmp_path: Path) -> None:
    r = irc_cli(["train", str(ROOT / "models" / "digits_cnn.arch"), "--data", "digits", "--batch", "32",
                 "--steps", "60", "--lr", "3e-3", "--eval-every", "60"])
    assert r.rc == 0, r.err
    assert "1,438 training samples, 359 held out" in r.out
    assert float(r.out.split("accuracy ")[1].split("%")[0]) >= 80.0, r.out


def test_digits_without_scikit_learn_names_the_extra(irc_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    r = irc_cli(["train", str(ROOT / "models" / "digits_cnn.arch"), "--data", "digits", "--steps", "1"])
    assert r.rc == 2 and "needs scikit-learn" in r.err and "irc[train]" in r.err


def test_byte_level_language_model_on_a_text(irc_cli: Callable, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 80)
    w = tmp_path / "lm.safetensors"
    r = irc_cli(["train", str(ROOT / "models" / "byte_lm.arch"), "--data", str(text), "-D", "T=16", "-D", "d=32",
                 "-D", "layers=1", "--batch", "8", "--steps", "40", "--lr", "1e-2", "--save", str(w)])
    assert r.rc == 0, r.err
    assert "tokens/s" in r.out and "held-out windows" in r.out
    losses = [float(row.split(",")[2]) for row in (tmp_path / "lm.loss.csv").read_text().splitlines()[1:]]
    assert losses[0] > 5.0 and np.mean(losses[-5:]) < losses[0] / 2


def _refused(r, code: int, *words: str) -> None:
    assert r.rc == code, (r.rc, r.err)
    assert "Traceback" not in r.err
    for word in words:
        assert word in r.err, (word, r.err)


def test_data_errors_name_the_key(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, _ = tiny
    rng = np.random.default_rng(0)
    cases = [
        ({"x": rng.normal(0, 1, (20, 6))}, ("no array 'targets'", "loss target")),
        ({"inputs": rng.normal(0, 1, (20, 6)), "targets": np.zeros(20, np.int64)}, ("no array 'x'", "'inputs'")),
        ({"x": rng.normal(0, 1, (20, 5)), "targets": np.zeros(20, np.int64)}, ("array 'x'", "[5]", "[6]")),
        ({"x": rng.normal(0, 1, (20, 6)), "targets": np.full(20, 3)}, ("class id 3", "[0, 3)")),
        ({"x": rng.normal(0, 1, (20, 6)), "targets": np.zeros(20)}, ("array 'targets' holds float64",)),
        ({"x": rng.normal(0, 1, (20, 6)), "targets": np.zeros(19, np.int64)}, ("different numbers of samples",)),
        ({"x": rng.normal(0, 1, (8, 6)), "targets": np.zeros(8, np.int64)}, ("7 samples, fewer than --batch 8",)),
    ]
    for i, (arrays, words) in enumerate(cases):
        path = tmp_path / f"bad{i}.npz"
        np.savez(path, **arrays)
        _refused(_train(irc_cli, model, path, "--steps", "2"), 1, *words)


def test_model_errors(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    _, data = tiny
    ints = tmp_path / "ints.arch"
    ints.write_text("model ints(B) {\n  input tokens: i32[B, 4]\n  emb = embedding(10, 8)\n  output ids = tokens\n"
                    "  output logits = linear(flatten(emb(tokens)), 3)\n}\n")
    _refused(_train(irc_cli, ints, data, "--steps", "1"), 1, "needs a float output", "'ids'", "--output")
    _refused(_train(irc_cli, ints, data, "--output", "nope"), 2, "no output 'nope'")
    text = tmp_path / "t.txt"
    text.write_text("hello " * 100)
    _refused(_train(irc_cli, tiny[0], text), 1, "byte-level language model", "x: f32[B,6]")
    _refused(irc_cli(["train", str(ROOT / "models" / "byte_lm.arch"), "--data", str(text), "-D", "vocab=100"]), 1,
             "256 classes")
    _refused(irc_cli(["train", str(ROOT / "models" / "byte_lm.arch"), "--data", str(tmp_path / "t.txt"),
                      "-D", "T=64", "--holdout", "0.05"]), 1, "too short")
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"ab\0cd" * 100)
    _refused(_train(irc_cli, tiny[0], binary), 1, "not text", "NUL byte at offset 2")


def test_usage_and_file_errors(irc_cli: Callable, tiny, tmp_path: Path) -> None:
    model, data = tiny
    _refused(_train(irc_cli, model, data, "--lr", "0"), 2, "--lr must be a positive number")
    _refused(_train(irc_cli, model, data, "--beta2", "1"), 2, "--beta2 must be in [0, 1)")
    _refused(_train(irc_cli, model, data, "--loss", "mse", "--ignore-index", "0"), 2, "--ignore-index")
    _refused(_train(irc_cli, model, data, "--save", str(tmp_path / "nodir" / "w.safetensors")), 2, "does not exist")
    _refused(_train(irc_cli, model, data, "--save", str(tmp_path / "w.pt")), 2, ".safetensors")
    _refused(_train(irc_cli, model, data, "--resume", str(tmp_path / "missing.safetensors")), 1, "no such checkpoint")
    _refused(_train(irc_cli, model, data, "--save", str(data.with_suffix(".npz"))), 2, "data file")
    w = tmp_path / "w.safetensors"
    assert _train(irc_cli, model, data, "--steps", "2", "--optimizer", "sgd", "--save", str(w)).rc == 0
    _refused(_train(irc_cli, model, data, "--steps", "4", "--resume", str(w)), 1, "optimizer 'sgd'",
             "--optimizer sgd")
    other = tmp_path / "other.arch"
    other.write_text(TINY.replace("linear(h, 3)", "linear(h, 3, bias=false)"))
    _refused(_train(irc_cli, other, data, "--steps", "4", "--optimizer", "sgd", "--resume", str(w)), 1,
             "logits.bias")


def test_a_diverging_run_stops_with_the_last_checkpoint_kept(irc_cli: Callable, tmp_path: Path) -> None:
    model = tmp_path / "reg.arch"
    model.write_text("model reg(B) {\n  input x: f32[B, 3]\n  output y = linear(x, 2)\n}\n")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "reg.npz", x=rng.normal(0, 10, (64, 3)), targets=rng.normal(0, 10, (64, 2)))
    w = tmp_path / "w.safetensors"
    r = irc_cli(["train", str(model), "--data", str(tmp_path / "reg.npz"), "--loss", "mse", "--optimizer", "sgd",
                 "--lr", "10", "--steps", "100", "--batch", "16", "--save-every", "1", "--save", str(w)])
    _refused(r, 1, "the loss is ", "--lr", "--clip", "last saved checkpoint is kept")
    assert all(np.isfinite(v).all() for v in load_file(w).values())


def test_mse(irc_cli: Callable, tmp_path: Path) -> None:
    model = tmp_path / "reg.arch"
    model.write_text("model reg(B) {\n  input x: f32[B, 3]\n  output y = linear(x, 2)\n}\n")
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (64, 3)).astype(np.float32)
    np.savez(tmp_path / "reg.npz", x=x, targets=x[:, :2] * 2 - x[:, 1:] + 0.5)
    r = irc_cli(["train", str(model), "--data", str(tmp_path / "reg.npz"), "--loss", "mse", "--optimizer",
                 "momentum", "--lr", "0.05", "--steps", "200", "--batch", "16"])
    assert r.rc == 0, r.err
    assert "accuracy" not in r.out
    assert float(r.out.split("held-out loss ")[1].split()[0].rstrip(",")) < 1e-3, r.out


def test_a_run_stopped_mid_schedule_resumes_exactly(tiny, tmp_path: Path) -> None:
    """Stopped at step 7 of 20 (warmup, cosine, clipping, momentum), saved, loaded, continued: the weights of
    an uninterrupted run, bit for bit."""
    from irc.runtime.init import init_weights
    from irc.runtime.optim import SLOTS, OptimConfig
    from irc.runtime.train import TrainConfig, build_step, fresh_state, train_steps
    from irc.runtime.train_data import split_arrays
    from irc.runtime.train_state import load_resume, save_checkpoint

    model, data = tiny
    graph = load_graph(model, {"B": 8})
    graphs = build_step(graph)
    arrays = dict(np.load(data))
    dataset = split_arrays("xy", {"x": arrays["x"], "targets": arrays["targets"]}, 0.2)
    cfg = TrainConfig(steps=20, batch=8, seed=4, lr=0.05, warmup=5, schedule="cosine", clip=0.5,
                      optim=OptimConfig("momentum"), eval_every=6)
    straight = fresh_state(init_weights(graph, 4), cfg)
    assert train_steps(graphs, straight, dataset, cfg)
    first = fresh_state(init_weights(graph, 4), cfg)
    w = tmp_path / "w.safetensors"
    assert not train_steps(graphs, first, dataset, cfg, on_save=lambda s, final: save_checkpoint(w, s, {
        "optimizer": "momentum"}), stop=lambda: first.step == 7)
    resumed, _, _ = load_resume(w, graph, "momentum", SLOTS["momentum"], np.float32, lambda m: None)
    assert resumed is not None and resumed.step == 7
    assert train_steps(graphs, resumed, dataset, cfg)
    for key, value in straight.params.items():
        assert np.array_equal(value, resumed.params[key]), key
    assert np.array_equal(np.array(straight.history), np.array(resumed.history), equal_nan=True)
