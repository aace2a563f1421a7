"""Checkpoints of ``irc train``: the weights file, its training-state sidecar, the loss curve.

``--save W.safetensors`` writes, in this order, each file atomically (a temporary file in the same
folder renamed over the target, irc.output_files), so a kill at any moment leaves every file either
the old one or the new one, never half of one:

1. ``W.train.safetensors``, the **sidecar**: everything a resume needs, self-contained: the weights in
   the training dtype under ``param/<key>``, the optimizer's state under ``optim/<slot>/<key>``
   (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``: PyTorch's names), the loss curve as ``history``
   (float64 [steps, 6]), and in ``__metadata__`` one JSON entry ``irc.train`` with the step, the
   optimizer and the run's settings;
2. ``W.safetensors``: the weights alone, float32, in irc's keys (what ``irc run --weights`` loads), with
   the step in its metadata (``irc.train.step``);
3. ``W.loss.csv`` (and ``W.loss.png`` when matplotlib is installed): the loss curve.

The sidecar is written first: a kill between the two leaves a sidecar one checkpoint ahead of the
weights, and ``--resume`` reads the sidecar, which holds its own weights. The sidecar lives beside the
weights rather than inside them because ``irc run --weights`` refuses keys the model does not have.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import IrcError, quote
from irc.graph import Graph
from irc.output_files import write_atomically
from irc.runtime.safetensors_files import check_header, read_safetensors
from irc.runtime.train import COLUMNS, State
from irc.runtime.weights import WEIGHT_DTYPE, check_weights, load_checked

FORMAT = "irc.train/1"
META_KEY = "irc.train"
STEP_KEY = "irc.train.step"
PARAM, OPTIM, HISTORY = "param/", "optim/", "history"


def _stem(path: Path) -> Path:
    return path.with_suffix("") if path.suffix.lower() in (".safetensors", ".npz") else path


def sidecar_path(weights: str | Path) -> Path:
    return _stem(Path(weights)).with_name(_stem(Path(weights)).name + ".train.safetensors")


def curve_paths(weights: str | Path) -> tuple[Path, Path]:
    stem = _stem(Path(weights))
    return stem.with_name(stem.name + ".loss.csv"), stem.with_name(stem.name + ".loss.png")


def _safetensors_bytes(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> bytes:
    from safetensors.numpy import save

    # one metadata entry: the library keeps metadata in a hash map, whose order (and so the file's bytes)
    # would change from run to run with several entries
    assert len(meta) == 1
    return save({k: np.ascontiguousarray(tensors[k]) for k in sorted(tensors)}, metadata=meta)


def save_checkpoint(path: str | Path, state: State, settings: dict[str, Any]) -> None:
    """The sidecar, then the weights file (``.safetensors`` or ``.npz``), each atomically."""
    path = Path(path)
    tensors: dict[str, np.ndarray] = {PARAM + k: v for k, v in state.params.items()}
    for slot, values in state.optim.items():
        tensors.update({f"{OPTIM}{slot}/{k}": v for k, v in values.items()})
    tensors[HISTORY] = np.array(state.history, np.float64).reshape(-1, len(COLUMNS))
    meta = {"format": FORMAT, "step": state.step, **settings}
    blob = _safetensors_bytes(tensors, {META_KEY: json.dumps(meta, sort_keys=True)})
    write_atomically(str(sidecar_path(path)), lambda f: f.write(blob))
    weights = {k: v.astype(WEIGHT_DTYPE) for k, v in state.params.items()}
    if path.suffix.lower() == ".npz":
        from irc.runtime.weights import save_weights

        save_weights(path, weights)
        return
    blob = _safetensors_bytes(weights, {STEP_KEY: str(state.step)})
    write_atomically(str(path), lambda f: f.write(blob))


def _metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a .safetensors file (after irc's own checks of the header)."""
    check_header(path)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n).decode("utf-8"))
    return header.get("__metadata__", {})


def load_sidecar(path: Path, graph: Graph, optimizer: str, slots: tuple[str, ...], dtype: Any) -> tuple[State, dict]:
    """The state a sidecar holds, checked against the model and the optimizer; and its settings."""
    try:
        meta = json.loads(_metadata(path).get(META_KEY, "null"))
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("step"), int):
        raise IrcError(f"'{quote(str(path))}' is not a training state written by irc train (its metadata has no "
                       f"'{META_KEY}' entry of format {FORMAT})")
    tensors = read_safetensors(path)
    params = {k[len(PARAM):]: v for k, v in tensors.items() if k.startswith(PARAM)}
    check_weights(graph, params, f"'{quote(str(path))}'", floats_converted=True)
    if meta.get("optimizer") != optimizer:
        raise IrcError(f"'{quote(str(path))}' holds the state of optimizer '{meta.get('optimizer')}', not of "
                       f"'{optimizer}': resume with --optimizer {meta.get('optimizer')}")
    optim: dict[str, dict[str, np.ndarray]] = {}
    for slot in slots:
        values = {k: tensors.get(f"{OPTIM}{slot}/{k}") for k in params}
        missing = [k for k, v in values.items() if v is None or v.shape != params[k].shape]
        if missing:
            raise IrcError(f"'{quote(str(path))}': the optimizer state '{slot}' of weight '{missing[0]}' is missing "
                           "or of the wrong shape")
        optim[slot] = {k: np.array(v, dtype=dtype) for k, v in values.items()}  # type: ignore[arg-type]
    history = tensors.get(HISTORY)
    rows = [] if history is None else [[float(x) for x in row] for row in np.asarray(history).reshape(-1, len(COLUMNS))]
    state = State(meta["step"], {k: np.array(v, dtype=dtype) for k, v in params.items()}, optim, rows[:meta["step"]])
    return state, meta


def weights_step(path: Path) -> int | None:
    """The step a weights file written by irc train records, or None."""
    if path.suffix.lower() != ".safetensors":
        return None
    value = _metadata(path).get(STEP_KEY)
    return int(value) if value is not None and value.isdigit() else None


def load_resume(path: str | Path, graph: Graph, optimizer: str, slots: tuple[str, ...], dtype: Any,
                note) -> tuple[State | None, dict, dict[str, np.ndarray] | None]:
    """``--resume W``: the sidecar's full state when there is one; else the weights alone (the optimizer and
    the step start afresh, said in a note). Returns (state or None, its settings, weights or None)."""
    path = Path(path)
    side = sidecar_path(path)
    if side.is_file():
        state, meta = load_sidecar(side, graph, optimizer, slots, dtype)
        if path.is_file():
            at = weights_step(path)
            if at is not None and at != state.step:
                note(f"'{path}' is at step {at}, its training state '{side.name}' at step {state.step} (a save "
                     f"was cut short between the two files): resuming from the training state")
        return state, meta, None
    weights = load_checked(path, graph, note)
    note(f"'{path}' has no training state beside it ('{side.name}'): starting from its weights with a fresh "
         "optimizer at step 0")
    return None, {}, weights


def curve_csv(history: list[list[float]]) -> str:
    """The loss curve, one row per step; empty cells where a column has no value (evaluation steps only)."""
    def cell(i: int, x: float) -> str:
        if math.isnan(x):
            return ""
        return str(int(x)) if i == 0 else f"{x:.9g}"
    lines = [",".join(COLUMNS)] + [",".join(cell(i, x) for i, x in enumerate(row)) for row in history]
    return "\n".join(lines) + "\n"


def write_curve(weights: str | Path, history: list[list[float]], title: str, plot: bool = True) -> str | None:
    """Write the CSV and, with ``plot`` and matplotlib, the PNG next to the weights; the reason there is no
    PNG, or None. (Drawing takes a tenth of a second: the loop plots at the end, not at every save.)"""
    csv_path, png_path = curve_paths(weights)
    text = curve_csv(history)
    write_atomically(str(csv_path), lambda f: f.write(text.encode("utf-8")))
    if not plot:
        return None
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed, so there is no loss-curve PNG (pip install matplotlib)"
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = np.array(history, np.float64).reshape(-1, len(COLUMNS))
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        ax.plot(rows[:, 0], rows[:, 2], lw=0.8, label="training loss")
        held = ~np.isnan(rows[:, 4])
        if held.any():
            ax.plot(rows[held, 0], rows[held, 4], "o-", ms=3, label="held-out loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        write_atomically(str(png_path), lambda f: fig.savefig(f, format="png", metadata={"Software": None}))
    finally:
        plt.close(fig)
    return None
