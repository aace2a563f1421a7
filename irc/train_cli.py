"""``irc train``: train a model's weights with the grad pass on the NumPy reference or the CPU backend
(docs/training.md).

stdout carries the result (the final losses, the held-out accuracy, the time, the files written);
stderr carries notes and the progress line (rewritten in place on a terminal, one line every
``--log-every`` steps otherwise). SIGINT and SIGTERM stop the run after the step in progress and save
it (exit 130 and 143); a second one during training stops at once, keeping the last checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import UsageError, quote
from irc.runtime.optim import OPTIMIZERS, SCHEDULES, SLOTS, OptimConfig
from irc.runtime.train import EvalResult, State, StepGraphs, StepInfo, TrainConfig
from irc.runtime.train_data import DIGITS, Dataset
from irc.runtime.train_engine import ENGINES

EXAMPLES = """\
examples:
  irc train models/digits_cnn.arch --data digits --steps 600 --save cnn.safetensors
  irc train models/byte_lm.arch --data README.md -D T=64 --batch 16 --steps 400 --lr 3e-3 --save lm.safetensors
  irc train model.arch --data xy.npz --loss mse --optimizer sgd --lr 0.1 --clip 1.0
  irc train models/digits_cnn.arch --data digits --steps 1200 --resume cnn.safetensors --save cnn.safetensors
"""


def add_train_parser(sub, common) -> None:
    """Register the subcommand (irc/cli.py calls this with its own ``_common`` arguments)."""
    p = sub.add_parser("train", help="train a model's weights (grad pass + an optimizer, NumPy or cpu backend)",
                       description="Train a model: forward and backward from the grad pass, run by the NumPy "
                                   "reference (or compiled by the cpu backend), and an optimizer step, batch after "
                                   "batch (docs/training.md).",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.add_argument("--data", required=True, metavar="FILE|digits",
                   help="an .npz with one array per model input and one for the target (samples on axis 0), "
                        "a text file for a byte-level language model, or 'digits' (scikit-learn's 8x8 digits)")
    p.add_argument("--output", dest="loss_output", metavar="LABEL", help="the model output the loss reads "
                   "(default: the first)")
    p.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy",
                   help="cross_entropy (class ids as targets; default) or mse")
    p.add_argument("--ignore-index", type=int, default=None, metavar="ID",
                   help="cross_entropy: targets equal to ID count for nothing (default -100)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="default adam")
    p.add_argument("--lr", type=float, default=1e-3, help="the base learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, default=0, metavar="N", help="linear warmup from 0 over N steps")
    p.add_argument("--schedule", choices=SCHEDULES, default="constant",
                   help="after the warmup: constant (default) or cosine decay to 0 at --steps")
    p.add_argument("--momentum", type=float, default=0.9, help="--optimizer momentum: the factor (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="L2 (sgd, momentum, adam) or decoupled (adamw)")
    p.add_argument("--beta1", type=float, default=0.9, help="adam, adamw (default 0.9)")
    p.add_argument("--beta2", type=float, default=0.999, help="adam, adamw (default 0.999)")
    p.add_argument("--eps", type=float, default=1e-8, help="adam, adamw (default 1e-8)")
    p.add_argument("--clip", type=float, default=None, metavar="NORM", help="clip the global gradient norm")
    p.add_argument("--batch", type=int, default=32, help="samples per step (binds the batch size; default 32)")
    p.add_argument("--steps", type=int, default=100, help="the total number of steps (default 100); a resumed "
                   "run continues up to it")
    p.add_argument("--seed", type=int, default=0, help="initial weights and batches (default 0)")
    p.add_argument("--holdout", type=float, default=None, metavar="FRACTION",
                   help="held out for evaluation (default 0.2 of the samples; 0.1 of a text's bytes)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="evaluate on the held-out part every N steps (default: a tenth of --steps) and at the end")
    p.add_argument("--save", metavar="W.safetensors", help="save the weights (and W.train.safetensors, the state "
                   "--resume reads; W.loss.csv; W.loss.png)")
    p.add_argument("--save-every", type=int, default=None, metavar="N",
                   help="also save every N steps (default: as --eval-every)")
    p.add_argument("--resume", metavar="W.safetensors", help="continue from a checkpoint: its weights, optimizer "
                   "state and step (or only the weights of a plain weights file)")
    p.add_argument("--log-every", type=int, default=None, metavar="N",
                   help="when stderr is not a terminal: a progress line every N steps (default: a twentieth)")
    p.add_argument("--dtype", choices=("f32", "f64"), default="f32", help="arithmetic of the run (default f32)")
    p.add_argument("--backend", choices=ENGINES, default="numpy",
                   help="numpy (the reference interpreter, default) or cpu (the step compiled once by the Numba CPU "
                        "backend: forward and backward as generated kernels; float32)")
    p.set_defaults(func=cmd_train)


def note(message: str) -> None:
    print(f"irc: note: {message}", file=sys.stderr)


def _check(args: argparse.Namespace) -> None:
    for flag, value, least in (("--batch", args.batch, 1), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                               ("--eval-every", args.eval_every, 1), ("--save-every", args.save_every, 1),
                               ("--log-every", args.log_every, 1)):
        if value is not None and value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    for flag, value in (("--lr", args.lr), ("--eps", args.eps)):
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be a positive number, got {value}")
    for flag, value in (("--weight-decay", args.weight_decay), ("--momentum", args.momentum)):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be 0 or more, got {value}")
    for flag, value in (("--beta1", args.beta1), ("--beta2", args.beta2)):
        if not 0 <= value < 1:
            raise UsageError(f"{flag} must be in [0, 1), got {value}")
    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        raise UsageError(f"--clip must be a positive norm, got {args.clip}")
    if args.holdout is not None and not 0 <= args.holdout < 1:
        raise UsageError(f"--holdout must be a fraction in [0, 1), got {args.holdout}")
    if args.ignore_index is not None and args.loss != "cross_entropy":
        raise UsageError("--ignore-index is for --loss cross_entropy")
    if args.backend == "cpu" and args.dtype == "f64":
        raise UsageError("--backend cpu computes in float32: use --dtype f32, or --backend numpy for float64")
    for flag in ("save", "resume"):
        path = getattr(args, flag)
        if path is not None and Path(path).suffix.lower() not in (".safetensors", ".npz"):
            raise UsageError(f"--{flag} '{quote(path)}': weights are .safetensors (or .npz) files")


def _check_files(args: argparse.Namespace) -> None:
    """Before any work: --save must not overwrite the model or the data, and its folder must take the files."""
    from irc.output_files import check_output_path, refuse_overwriting_input, write_atomically
    from irc.runtime.train_state import curve_paths, sidecar_path

    if args.resume is not None and not Path(args.resume).is_file() and not sidecar_path(args.resume).is_file():
        from irc.runtime.array_files import check_file

        check_file(Path(args.resume), "checkpoint to resume")
    if args.save is None:
        return
    check_output_path(args.save, "--save")
    inputs = {"model file": args.file, **({"data file": args.data} if args.data != DIGITS else {})}
    paths = [Path(args.save), sidecar_path(args.save), *curve_paths(args.save)]
    for path in paths:
        refuse_overwriting_input(str(path), inputs, "--save")
        write_atomically(str(path), lambda f: None, rehearse=True)


# -- progress, signals --------------------------------------------------------------


class Progress:
    """The progress line: running loss (mean of the last WINDOW steps), steps/s and samples or tokens/s."""

    WINDOW = 20
    REFRESH_S = 0.1

    def __init__(self, cfg: TrainConfig, data: Dataset, log_every: int | None):
        self.cfg, self.data = cfg, data
        self.tty = sys.stderr.isatty()
        self.every = log_every or max(1, cfg.steps // 20)
        self.recent: deque[tuple[float, float]] = deque(maxlen=self.WINDOW)
        self.last_draw = 0.0
        self.drawn = False
        self.total_s = 0.0
        self.steps = 0
        self.last_eval: tuple[int, EvalResult] | None = None
        self.info: StepInfo | None = None

    def running_loss(self) -> float:
        return sum(loss for loss, _ in self.recent) / max(1, len(self.recent))

    def rate(self) -> float:
        seconds = sum(s for _, s in self.recent)
        return len(self.recent) / seconds if seconds > 0 else 0.0

    def line(self, info: StepInfo) -> str:
        rate = self.rate()
        per = self.cfg.batch * self.data.per_sample()
        return (f"step {info.step}/{self.cfg.steps}  loss {self.running_loss():.4f}  lr {info.lr:.3g}  "
                f"|g| {info.grad_norm:.3g}  {rate:.1f} steps/s  {rate * per:,.0f} {self.data.unit}/s")

    def on_step(self, info: StepInfo) -> None:
        self.info = info
        self.recent.append((info.loss, info.seconds))
        self.total_s += info.seconds
        self.steps += 1
        if self.tty:
            now = time.perf_counter()
            if now - self.last_draw >= self.REFRESH_S or info.step == self.cfg.steps:
                sys.stderr.write("\r\x1b[K" + self.line(info))
                sys.stderr.flush()
                self.last_draw, self.drawn = now, True
        elif info.step % self.every == 0 or info.step == self.cfg.steps:
            print(f"irc: {self.line(info)}", file=sys.stderr, flush=True)

    def on_eval(self, step: int, result: EvalResult) -> None:
        self.last_eval = (step, result)
        if self.drawn and self.info is not None:  # the line shows this step before the evaluation's
            sys.stderr.write("\r\x1b[K" + self.line(self.info))
        self.end_line()
        print(f"irc: step {step}: {_eval_words(result)}", file=sys.stderr, flush=True)

    def end_line(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            self.drawn = False


def _eval_words(result: EvalResult) -> str:
    text = f"held-out loss {result.loss:.4f}"
    if result.accuracy is not None:
        text += f", accuracy {100 * result.accuracy:.2f}% ({result.correct}/{result.count})"
    return text


class StopFlag:
    """SIGINT / SIGTERM: the first asks the loop to save and stop after the step in progress; a second one
    during training stops at once (the last checkpoint stays); during a save it waits for the save."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.saving = False

    def __call__(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame: object) -> None:
        if self.signum is not None and not self.saving:
            from irc.cli import Terminated

            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()
        self.signum = self.signum or signum


@contextlib.contextmanager
def _signals(flag: StopFlag) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, flag.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# -- the command ----------------------------------------------------------------------


def _settings(args: argparse.Namespace, graphs: StepGraphs, cfg: TrainConfig) -> dict[str, Any]:
    """The run's settings, kept in the checkpoint: a resume that changes one is told so."""
    o = cfg.optim
    data = args.data if args.data == DIGITS else str(Path(args.data).resolve())
    return {"model": graphs.model.name, "data": data, "loss": args.loss, "optimizer": o.kind,
            "lr": cfg.lr, "warmup": cfg.warmup, "schedule": cfg.schedule, "steps": cfg.steps, "batch": cfg.batch,
            "seed": cfg.seed, "clip": cfg.clip, "weight_decay": o.weight_decay, "momentum": o.momentum,
            "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps, "dtype": args.dtype, "backend": args.backend}


def cmd_train(args: argparse.Namespace) -> int:
    from irc.runtime.init import init_weights
    from irc.runtime.train import fresh_state, train_steps
    from irc.runtime.train_setup import load_training
    from irc.runtime.train_state import load_resume, save_checkpoint, sidecar_path, write_curve

    _check(args)
    _check_files(args)
    graphs, data, bound = load_training(args, note)
    if graphs.updates:
        note("batchnorm trains with each batch's statistics and updates its running averages; evaluation and "
             "the saved weights use the running averages (docs/training.md)")
    held = data.n_held > 0
    eval_every = args.eval_every if args.eval_every is not None else (max(1, args.steps // 10) if held else 0)
    cfg = TrainConfig(
        steps=args.steps, batch=args.batch, seed=args.seed, lr=args.lr, warmup=args.warmup, schedule=args.schedule,
        clip=args.clip, optim=OptimConfig(args.optimizer, args.weight_decay, args.momentum, args.beta1, args.beta2,
                                          args.eps),
        eval_every=eval_every, save_every=args.save_every if args.save_every is not None else eval_every,
        dtype=np.float64 if args.dtype == "f64" else np.float32)
    if args.backend == "cpu":
        _compile(graphs, cfg.optim)
    settings = _settings(args, graphs, cfg)
    state: State | None = None
    if args.resume:
        state, before, weights = load_resume(args.resume, graphs.model, cfg.optim.kind, SLOTS[cfg.optim.kind],
                                             cfg.dtype, note)
        changed = [f"{k} {before[k]} -> {v}" for k, v in settings.items() if k in before and before[k] != v]
        if changed:
            note(f"resuming with other settings than the checkpoint's ({'; '.join(changed)}): the run differs "
                 "from an uninterrupted one")
        if state is None:
            assert weights is not None
            state = fresh_state(weights, cfg)
    else:
        state = fresh_state(init_weights(graphs.model, args.seed), cfg)
    sizes = ", ".join(f"{k}={v}" for k, v in bound.items())
    print(f"training {graphs.model.name}({sizes}) on {_data_words(args, data)}: {cfg.optim.describe()}, lr "
          f"{cfg.lr:g} ({cfg.schedule}" + (f", warmup {cfg.warmup}" if cfg.warmup else "") + ")"
          + (f", clip {cfg.clip:g}" if cfg.clip else "") + f", {args.loss} loss, seed {cfg.seed}", flush=True)
    start_step = state.step
    if start_step >= cfg.steps:
        note(f"the checkpoint is at step {start_step}, not before --steps {cfg.steps}: nothing to train")
    progress = Progress(cfg, data, args.log_every)
    flag = StopFlag()
    saved: list[str] = []

    def on_save(s: State, final: bool) -> None:
        if args.save is None:
            return
        flag.saving = True
        try:
            save_checkpoint(args.save, s, settings)
            why = write_curve(args.save, s.history, f"{graphs.model.name}: {args.loss} loss", plot=final)
        finally:
            flag.saving = False
        saved[:] = [args.save, str(sidecar_path(args.save)), why or ""]

    from irc.runtime.train_memory import MemoryProbe

    probe = MemoryProbe()
    started = time.perf_counter()
    try:
        with _signals(flag):
            finished = train_steps(graphs, state, data, cfg, progress.on_step, progress.on_eval, on_save, flag,
                                   probe)
    finally:
        probe.close()
    progress.end_line()
    wall = time.perf_counter() - started
    if not finished:
        where = (f"saved '{args.save}' (continue with --resume {args.save})" if args.save
                 else "nothing saved (no --save)")
        print(f"irc: {'interrupted' if flag.signum == signal.SIGINT else 'terminated'} at step {state.step} of "
              f"{cfg.steps}; {where}", file=sys.stderr)
        return 130 if flag.signum == signal.SIGINT else 143
    _summary(args, graphs, data, cfg, state, progress, wall, start_step, saved)
    _memory(probe, graphs, cfg, state)
    return 0


def _memory(probe: Any, graphs: StepGraphs, cfg: TrainConfig, state: State) -> None:
    """The measured peak memory against ``irc analyze --train``'s prediction (irc/runtime/train_memory.py)."""
    from irc.diagnostics import IrcError
    from irc.runtime.train_memory import memory_report

    try:
        report = memory_report(probe, graphs.model, cfg.optim.kind, cfg.dtype, state.params, state.optim)
    except IrcError as e:  # the analysis refuses this model: the run itself is fine
        note(f"no memory prediction for this model: {e.message}")
        return
    if report is not None:
        print(report.line())


def _compile(graphs: StepGraphs, optim: OptimConfig) -> None:
    """Compile the step and evaluation graphs and the optimizer's update now, so the first steps' throughput
    is the kernels'."""
    from irc.diagnostics import IrcError

    start = time.perf_counter()
    try:
        graphs.engine.prepare(graphs.step)
        graphs.engine.prepare(graphs.eval)
        graphs.engine.prepare_update(optim)
    except IrcError as e:  # an op of this model's step the cpu backend has no kernel for
        e.notes.append("irc train --backend cpu compiles the whole training step; --backend numpy (the "
                       "reference) runs every op")
        raise
    note(f"compiled the training step and the {optim.kind} update with the cpu backend in "
         f"{time.perf_counter() - start:.1f} s (cached for the next run)")


def _data_words(args: argparse.Namespace, data: Dataset) -> str:
    what = "scikit-learn's digits" if args.data == DIGITS else f"'{args.data}'"
    if data.unit == "tokens":
        return f"{what} ({data.n_train:,} training bytes, {data.n_held:,} held-out windows)"
    return f"{what} ({data.n_train:,} training samples, {data.n_held:,} held out)"


def _summary(args: argparse.Namespace, graphs: StepGraphs, data: Dataset, cfg: TrainConfig, state: State,
             progress: Progress, wall: float, start_step: int, saved: list[str]) -> None:
    from irc.runtime.train import evaluate

    done = state.step - start_step
    if state.history:
        first = state.history[0][2]
        recent = [row[2] for row in state.history[-Progress.WINDOW:]]
        print(f"loss: {first:.4f} at step 1, {sum(recent) / len(recent):.4f} (mean of the last {len(recent)} "
              f"steps) at step {state.step}")
    if data.n_held:
        last = progress.last_eval
        result = last[1] if last is not None and last[0] == state.step else evaluate(graphs, state.params, data,
                                                                                       cfg.dtype)
        print(_eval_words(result))
    if done:
        rate = progress.steps / progress.total_s if progress.total_s else 0.0
        per = cfg.batch * data.per_sample()
        print(f"time: {wall:.1f} s for {done} steps ({rate:.1f} steps/s, {rate * per:,.0f} {data.unit}/s in the "
              "steps; the rest is evaluation and saving)")
    if saved:
        print(f"saved: '{saved[0]}' (step {state.step}; irc run --weights reads it), '{saved[1]}' (the state "
              "--resume reads), the loss curve beside them")
        if saved[2]:
            note(saved[2])
    elif args.save is None and done:
        note("no --save: the trained weights are not kept")
