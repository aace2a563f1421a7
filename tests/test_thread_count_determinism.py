"""Outputs do not depend on the thread count: the CPU backend's matrix products split their rows or
columns over the threads, and every block sums each element in the same order, so GPT-2's logits are
bit-identical with IRC_NUM_THREADS=1 and 2 (issue 19, item 11). The oracle is the 1-thread run itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _run(threads: int, out: Path, cache: Path) -> np.ndarray:
    # NUMBA_NUM_THREADS caps IRC_NUM_THREADS: set both, so the 2-thread run has 2 threads on any machine
    env = {**os.environ, "IRC_NUM_THREADS": str(threads), "NUMBA_NUM_THREADS": "2", "IRC_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-m", "irc.cli", "run", str(ROOT / "models" / "gpt2_small.arch"), "-D", "T=48",
                    "-D", "B=2", "-D", "layers=2", "--backend", "cpu", "-o", str(out)],
                   check=True, capture_output=True, env=env, timeout=600)
    return np.load(out)["logits"]


def test_gpt2_logits_are_bit_identical_across_thread_counts(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    one = _run(1, tmp_path / "one.npz", cache)
    two = _run(2, tmp_path / "two.npz", cache)
    assert one.shape == (2, 48, 50257)
    assert np.array_equal(one, two)
