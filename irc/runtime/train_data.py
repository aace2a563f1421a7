"""Training data for ``irc train``: arrays (an ``.npz``, scikit-learn's digits) or the bytes of a text file.

Every dataset has a training part and a held-out part, and hands out batches as a pure function of
``(seed, step)``: no iterator state, so a resumed run sees exactly the batches the uninterrupted one
would have, and one seed gives one run on any machine.

- **Arrays**: samples on axis 0, one array per model input plus the loss target. The held-out part is a
  fixed fraction taken after a fixed shuffle (seed 0, whatever ``--seed`` is, so runs with different
  seeds are scored on the same samples). An epoch is a permutation of the training samples drawn from
  ``(seed, epoch)``; batch ``i`` of the epoch is its slice ``[i·B, (i+1)·B)``; the last partial batch is
  dropped (the step graph has a fixed batch).
- **Text**: the file's bytes; the last ``holdout`` fraction is held out. Step ``s`` draws ``B`` window starts
  from ``(seed, s)``; a window of ``T + 1`` bytes gives inputs ``w[:-1]`` and targets ``w[1:]``. The held-out
  part is cut into non-overlapping windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError, quote
from irc.runtime.array_files import check_file, read_npz

SPLIT_SEED = 0  # the held-out split does not move with --seed
MAX_EVAL_WINDOWS = 4096  # held-out windows of a text, at most (evaluation stays a fraction of training)
DIGITS = "digits"


@dataclass
class ArrayData:
    """Arrays with samples on axis 0: ``train`` and ``held`` map each input (and the target) to an array."""

    name: str
    train: dict[str, np.ndarray]
    held: dict[str, np.ndarray] = field(default_factory=dict)
    unit: str = "samples"

    @property
    def n_train(self) -> int:
        return len(next(iter(self.train.values())))

    @property
    def n_held(self) -> int:
        return len(next(iter(self.held.values()))) if self.held else 0

    def per_sample(self) -> int:
        return 1

    def batches_per_epoch(self, size: int) -> int:
        return self.n_train // size

    def batch(self, step: int, seed: int, size: int) -> dict[str, np.ndarray]:
        per_epoch = self.batches_per_epoch(size)
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng([seed & 0xFFFFFFFF, epoch]).permutation(self.n_train)
        idx = order[i * size:(i + 1) * size]
        return {k: v[idx] for k, v in self.train.items()}

    def held_out(self, size: int) -> Iterator[dict[str, np.ndarray]]:
        """The held-out samples in order, in chunks of at most ``size``."""
        for start in range(0, self.n_held, size):
            yield {k: v[start:start + size] for k, v in self.held.items()}


@dataclass
class TextData:
    """The bytes of a text for a byte-level language model with context ``context``."""

    name: str
    train_bytes: np.ndarray
    held_bytes: np.ndarray
    context: int
    input_name: str
    target_name: str
    unit: str = "tokens"

    @property
    def n_train(self) -> int:
        return len(self.train_bytes)

    @property
    def n_held(self) -> int:
        return min((len(self.held_bytes) - 1) // self.context, MAX_EVAL_WINDOWS)

    def per_sample(self) -> int:
        return self.context

    def batches_per_epoch(self, size: int) -> int:
        return max(1, (len(self.train_bytes) - 1) // (self.context * size))

    def _windows(self, data: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
        w = data[starts[:, None] + np.arange(self.context + 1)[None, :]].astype(np.int64)
        return {self.input_name: w[:, :-1], self.target_name: w[:, 1:]}

    def batch(self, step: int, seed: int, size: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed & 0xFFFFFFFF, step])
        return self._windows(self.train_bytes, rng.integers(0, len(self.train_bytes) - self.context, size))

    def held_out(self, size: int) -> Iterator[dict[str, np.ndarray]]:
        starts = np.arange(self.n_held) * self.context
        for at in range(0, len(starts), size):
            yield self._windows(self.held_bytes, starts[at:at + size])


Dataset = ArrayData | TextData


def split_arrays(name: str, arrays: dict[str, np.ndarray], holdout: float) -> ArrayData:
    """A fixed shuffle (SPLIT_SEED), then the last ``holdout`` fraction held out."""
    n = len(next(iter(arrays.values())))
    held = int(n * holdout)
    if holdout > 0 and held == 0 and n > 1:
        held = 1
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    train_idx, held_idx = order[:n - held], order[n - held:]
    return ArrayData(name, {k: v[train_idx] for k, v in arrays.items()},
                     {k: v[held_idx] for k, v in arrays.items()} if held else {})


def read_npz_data(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (read without unpickling), each with samples on axis 0 and one count."""
    check_file(path, "data file")
    try:
        arrays = read_npz(path)
    except OSError as e:
        raise IrcError(f"cannot read data file '{quote(str(path))}': {e.strerror or e}") from None
    if not arrays:
        raise IrcError(f"data file '{quote(str(path))}' holds no arrays")
    for key, arr in arrays.items():
        if arr.ndim == 0:
            raise IrcError(f"data file '{quote(str(path))}': array '{quote(key)}' is a scalar; every array needs "
                           "the samples on axis 0")
        if arr.dtype.kind not in "fiub":
            raise IrcError(f"data file '{quote(str(path))}': array '{quote(key)}' holds {arr.dtype}, not numbers")
    counts = {key: len(arr) for key, arr in arrays.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"'{quote(k)}' {n}" for k, n in counts.items())
        raise IrcError(f"data file '{quote(str(path))}': the arrays hold different numbers of samples ({listed}); "
                       "axis 0 must count the samples in every array")
    return arrays


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8×8 digits (1,797 images, UCI's optical recognition set): pixels scaled to [0, 1]
    as float32 [N, 64], classes int64 [N]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UsageError("--data digits needs scikit-learn, which ships the data set: pip install 'irc[train]' "
                         "(or pip install scikit-learn)") from None
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def read_text(path: Path) -> np.ndarray:
    """The bytes of a text file as uint8; a file with NUL bytes is refused (it is binary, not text)."""
    check_file(path, "data file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise IrcError(f"cannot read data file '{quote(str(path))}': {e.strerror or e}") from None
    nul = raw.find(b"\0")
    if nul >= 0:
        raise IrcError(f"data file '{quote(str(path))}' is not text (a NUL byte at offset {nul:,}); give arrays as an "
                       ".npz, or a text file for a byte-level language model")
    return np.frombuffer(raw, np.uint8)


def text_data(path: Path, data: np.ndarray, context: int, holdout: float, input_name: str,
              target_name: str) -> TextData:
    held = int(len(data) * holdout)
    need = context + 1
    if len(data) - held < need + 1 or (holdout > 0 and held < need):
        raise IrcError(f"data file '{quote(str(path))}' has {len(data):,} bytes: too short for windows of "
                       f"{need} bytes (context {context} + 1) in both the training part and the held-out "
                       f"{holdout:g} (bind a shorter context with -D, or use a longer text)")
    return TextData(str(path), data[:len(data) - held], data[len(data) - held:], context, input_name, target_name)
