"""``irc train`` stopped from outside: SIGTERM and SIGINT save and exit (143, 130) with a checkpoint that
resumes to the very bytes of an uninterrupted run; SIGKILL at any moment, a save included, never leaves
a checkpoint that does not load (every file is a temporary renamed into place)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from irc.pipeline import load_graph
from irc.runtime.optim import OptimConfig
from irc.runtime.safetensors_files import read_safetensors
from irc.runtime.train import State
from irc.runtime.train_state import load_resume, save_checkpoint, sidecar_path

MODEL = """model wide(B) {
  input x: f32[B, 64]
  h = tanh(linear(x, WIDTH))
  output logits = linear(h, 4)
}
"""


def _setup(tmp_path: Path, width: int = 32) -> tuple[Path, Path]:
    model = tmp_path / "wide.arch"
    model.write_text(MODEL.replace("WIDTH", str(width)))
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (200, 64)).astype(np.float32)
    np.savez(tmp_path / "xy.npz", x=x, targets=(x[:, :2] > 0).sum(1).astype(np.int64))
    return model, tmp_path / "xy.npz"


def _child(model: Path, data: Path, save: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "irc.cli", "train", str(model), "--data", str(data), "--batch", "8",
            "--steps", "1000000", "--save", str(save), "--log-every", "1", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _step_of(path: Path) -> int:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    return int(meta["irc.train.step"]) if "irc.train.step" in meta else json.loads(meta["irc.train"])["step"]


def _wait_for_steps(child: subprocess.Popen, n: int) -> None:
    assert child.stderr is not None
    seen = 0
    deadline = time.monotonic() + 120
    while seen < n:
        line = child.stderr.readline()
        assert line and time.monotonic() < deadline, "the child stopped before training"
        seen += line.startswith("irc: step ") and "steps/s" in line


@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "terminated"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_signal_saves_and_the_run_resumes_to_the_same_bytes(irc_cli: Callable, tmp_path: Path, signum: int,
                                                              code: int, word: str) -> None:
    model, data = _setup(tmp_path)
    save = tmp_path / "w.safetensors"
    child = _child(model, data, save, "--save-every", "1000", "--eval-every", "7")
    try:
        _wait_for_steps(child, 30)
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"irc: {word} at step ") and "saved" in last and "--resume" in last, last
    step = int(last.split(" at step ")[1].split()[0])
    assert step >= 30 and _step_of(save) == step == _step_of(sidecar_path(save))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".irc-tmp")]

    target = step + 5
    common = ["train", str(model), "--data", str(data), "--batch", "8", "--steps", str(target), "--eval-every", "7"]
    resumed = irc_cli([*common, "--resume", str(save), "--save", str(save)])
    straight = irc_cli([*common, "--save", str(tmp_path / "s.safetensors")])
    assert resumed.rc == straight.rc == 0, resumed.err
    for suffix in (".safetensors", ".train.safetensors", ".loss.csv"):
        assert (tmp_path / f"w{suffix}").read_bytes() == (tmp_path / f"s{suffix}").read_bytes(), suffix


def test_sigkill_at_any_moment_leaves_a_checkpoint_that_loads(irc_cli: Callable, tmp_path: Path) -> None:
    """Saves every step of a model whose checkpoint takes a moment to write: a kill lands in a save often."""
    model, data = _setup(tmp_path, width=2048)  # 140k weights: 0.5 MB, and a 1.7 MB training state
    save = tmp_path / "w.safetensors"
    rng = random.Random(0)
    steps = []
    for attempt in range(6):
        child = _child(model, data, save, "--save-every", "1", *(["--resume", str(save)] if attempt else []))
        try:
            _wait_for_steps(child, 3)
            time.sleep(rng.uniform(0.0, 0.3))
            child.kill()
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
        for path in (save, sidecar_path(save)):
            read_safetensors(path)  # irc's own checks: whole, consistent header, every tensor's bytes there
            assert load_file(path)
        steps.append(_step_of(sidecar_path(save)))
        assert _step_of(save) in (steps[-1], steps[-1] - 1)  # the sidecar is written first
    assert steps == sorted(steps) and steps[-1] > steps[0]
    r = irc_cli(["train", str(model), "--data", str(data), "--batch", "8", "--steps", str(steps[-1] + 1),
                 "--resume", str(save), "--save", str(save)])
    assert r.rc == 0, r.err
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".irc-tmp")]  # a killed writer's temps removed


def test_a_save_cut_between_its_two_files_resumes_from_the_state(tmp_path: Path) -> None:
    model, _ = _setup(tmp_path)
    graph = load_graph(model, {"B": 8})
    w = tmp_path / "w.safetensors"
    params = {"linear.weight": np.ones((32, 64), np.float32), "linear.bias": np.zeros(32, np.float32),
              "logits.weight": np.ones((4, 32), np.float32), "logits.bias": np.zeros(4, np.float32)}
    state = State(5, params, {}, [[float(i + 1), 0.1, 1.0, 1.0, np.nan, np.nan] for i in range(5)])
    save_checkpoint(w, state, {"optimizer": "sgd"})
    old = w.read_bytes()
    state.step = 6
    state.history.append([6.0, 0.1, 0.9, 1.0, np.nan, np.nan])
    save_checkpoint(w, state, {"optimizer": "sgd"})
    w.write_bytes(old)  # as if killed after the sidecar's rename, before the weights'
    notes: list[str] = []
    got, meta, _ = load_resume(w, graph, OptimConfig("sgd").kind, (), np.float32, notes.append)
    assert got is not None and got.step == 6 and len(got.history) == 6 and meta["optimizer"] == "sgd"
    assert "at step 5" in notes[0] and "at step 6" in notes[0] and "resuming from the training state" in notes[0]
    assert os.path.getsize(w) > 0
