"""Error paths the golden cases in tests/golden/errors cannot stage from a command line.

Each STAGED case raises one user-facing error through the Python API, sometimes with the
environment changed (a package that is not installed), and states the exact text irc
prints for it. tests/test_diagnostics.py counts their origins toward the catalogue, so
every ``raise`` of a user-facing error has a case here or there.

Also here: the fixture files the run_* golden cases read are exactly what
tests/golden/errors/inc/make_fixtures.py builds.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from irc.diagnostics import IrcError, UsageError, render

INC = Path(__file__).resolve().parent / "golden" / "errors" / "inc"
UNBOUND = "model m(B, D) {\n  input x: f32[B, D]\n  output y = linear(x, 3)\n}\n"
BOUND = "model m() {\n  input x: f32[2, 4]\n  output y = linear(x, 3)\n}\n"


def printed_text(err: IrcError | UsageError) -> str:
    """What ``irc`` prints for ``err`` (irc.cli.main)."""
    return render(err) if isinstance(err, IrcError) else f"irc: error: {err}"


def _graph(text: str, bindings: dict[str, int] | None = None):
    from irc.runtime.graphs import graph_from_source

    return graph_from_source(text, bindings)


def _no_numba(mp: pytest.MonkeyPatch) -> None:
    """``import irc.backends.cpu`` fails as it does where Numba is not installed."""
    real = importlib.import_module

    def import_module(name: str, package: str | None = None):
        if name == "irc.backends.cpu":
            raise ModuleNotFoundError("No module named 'numba'", name="numba")
        return real(name, package)

    mp.setattr(importlib, "import_module", import_module)


def _backend_without_numba(mp: pytest.MonkeyPatch) -> None:
    from irc.backends import get_backend

    graph = _graph(BOUND)
    _no_numba(mp)
    get_backend("cpu").compile(graph)


def _weights_header_unreadable(mp: pytest.MonkeyPatch) -> None:
    """The header check of ``irc run --weights`` meets a file the user may not read."""
    from irc.runtime import safetensors_files
    from irc.runtime.weight_headers import read_weights_header

    mp.chdir(INC)
    mp.setattr(safetensors_files, "open", _denied("w_good.safetensors"), raising=False)
    read_weights_header("w_good.safetensors")


def _denied(name: str):
    def fake_open(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", name)
    return fake_open


def _weights_unreadable(mp: pytest.MonkeyPatch) -> None:
    """A file the user may not read (staged: tests run as root, where chmod does not stop a read)."""
    from irc.runtime import safetensors_files
    from irc.runtime.weights import load_weights

    mp.chdir(INC)
    mp.setattr(safetensors_files, "open", _denied("w_good.safetensors"), raising=False)
    load_weights("w_good.safetensors")


def _input_unreadable(mp: pytest.MonkeyPatch) -> None:
    from irc.runtime import array_files
    from irc.runtime.inputs import load_input_files

    graph = _graph(BOUND)
    mp.chdir(INC)
    mp.setattr(array_files, "open", _denied("x_good.npy"), raising=False)
    load_input_files(graph, ["x=x_good.npy"])


def _random_inputs_unbound(mp: pytest.MonkeyPatch) -> None:
    from irc.runtime.inputs import random_inputs

    random_inputs(_graph(UNBOUND, {"D": 4}), seed=0)


def _init_weights_unbound(mp: pytest.MonkeyPatch) -> None:
    from irc.runtime.init import init_weights

    init_weights(_graph(UNBOUND, {"B": 2}), seed=0)


def _analyze_unbound(mp: pytest.MonkeyPatch) -> None:
    from irc.analysis.analyze import Options, analyze_graph

    analyze_graph(_graph(UNBOUND, {"D": 4}), [], Options())


def _optimizer_unknown_kind(mp: pytest.MonkeyPatch) -> None:
    """``irc train --optimizer`` offers only known kinds; the Python API still says it."""
    from irc.backends.cpu.optim import optimizer_parts
    from irc.runtime.optim import OptimConfig

    optimizer_parts(OptimConfig("lion"))


def _optimizer_float64_weight(mp: pytest.MonkeyPatch) -> None:
    import numpy as np

    from irc.backends.cpu.optim import flat

    flat(np.zeros(3), "weight 'fc.weight'")


def _emit_unknown_kind(mp: pytest.MonkeyPatch) -> None:
    from irc.backends import emit_source

    emit_source(_graph(BOUND), "verilog")


def _unknown_backend_by_api(mp: pytest.MonkeyPatch) -> None:
    """``irc run --backend`` refuses an unknown name as bad usage first; the Python API still says it."""
    from irc.backends import get_backend

    get_backend("tpu")


def _emit_numba_unbound_by_api(mp: pytest.MonkeyPatch) -> None:
    """``irc compile --emit numba`` binds defaults first; the backend's own check still guards the API."""
    from irc.backends import emit_source

    emit_source(_graph(UNBOUND, {"D": 4}), "numba")


# -- commands run as irc runs them, in a scratch folder -----------------------------------------------

@contextmanager
def _scratch(mp: pytest.MonkeyPatch, files: dict[str, str]) -> Iterator[None]:
    """A fresh working directory holding ``files``, so the messages name short relative paths."""
    with tempfile.TemporaryDirectory() as d:
        mp.chdir(d)
        for name, text in files.items():
            Path(d, name).write_text(text, encoding="utf-8")
        yield


def _cli(argv: list[str]) -> None:
    """A command as ``irc`` runs it (irc.cli.main, less its handling of the error)."""
    from irc.cli import build_parser

    args = build_parser().parse_args(argv)
    args.func(args)


@dataclass(frozen=True)
class Commands:
    """A stage that writes ``files`` into a fresh folder and runs ``argvs`` there, in order; the last fails
    with exit status ``rc`` (test_command_cases_through_main runs them through irc.cli.main too)."""

    files: dict[str, str]
    argvs: tuple[tuple[str, ...], ...]
    rc: int = 1

    def __call__(self, mp: pytest.MonkeyPatch) -> None:
        with _scratch(mp, self.files):
            for argv in self.argvs:
                _cli(list(argv))


# -- irc generate on an encoder-decoder: its sources' padding mask (irc/passes/decode.py, source_mask) --

def _encoder_decoder(encoder: str, cross: str = "  h = h + attention(h, memory, heads=2)\n") -> str:
    """A model whose decoder (causal self-attention over ``tokens``) cross-attends to an encoder of ``source``."""
    return ("model m(B, T, S) {\n  input tokens: i32[B, T]\n  input source: i32[B, S]\n" + encoder +
            "  x = embedding(tokens, 50, 16)\n  h = x + attention(x, heads=2, causal=true)\n" + cross +
            "  output logits = unembed(h, 50)\n}\n")


# a GRU encoder: a padded source position changes the states of the real ones after it
RNN_ENCODER = _encoder_decoder("  memory = gru(embedding(source, 50, 16), 16)\n")
# the decoder reads the whole source and, in a second layer, its first two positions
TWO_MEMORIES = _encoder_decoder("  memory = embedding(source, 50, 16)\n",
                                "  h = h + attention(h, memory, heads=2)\n"
                                "  h = h + attention(h, slice(memory, axis=1, start=0, end=2), heads=2)\n")
# the encoder attends over the whole source, the decoder reads only its first two outputs
SHORT_MEMORY = _encoder_decoder("  e = embedding(source, 50, 16)\n  e = e + attention(e, heads=2)\n"
                                "  memory = slice(e, axis=1, start=0, end=2)\n")
# two sources of different lengths: right-padded, so the decode graphs take a padding mask
GENERATE = ("generate", "m.arch", "--prompt-tokens", "1,2", "--prompt-tokens", "1", "--encoder-tokens", "3,4,5",
            "--encoder-tokens", "3", "--max-new", "2")


def _generate(text: str) -> Commands:
    return Commands({"m.arch": text}, (GENERATE,))


# -- irc analyze --gradients (irc/analysis/gradients.py) --------------------------------------------------

OWN_LOSS = "model m() {\n  input x: f32[2, 4]\n  input t: i32[2]\n  output loss = cross_entropy(linear(x, 3), t)\n}\n"
SCALAR = "model m() {\n  input x: f32[4]\n  output score = reshape(linear(x, 1), [])\n}\n"

# the IR the grad pass writes (forward and backward) given back to analyze --gradients
TRAINING_STEP = Commands({"m.arch": OWN_LOSS}, (("compile", "m.arch", "--passes", "grad", "-o", "step.ir"),
                                               ("analyze", "step.ir", "--gradients")))


NO_WEIGHTS = "model m() {\n  input x: f32[2, 4]\n  output y = relu(x) * 2\n}\n"


def _plot_without_matplotlib(mp: pytest.MonkeyPatch) -> None:
    """``--gradients-plot`` where matplotlib is not installed (an optional extra): refused before measuring."""
    mp.setitem(sys.modules, "matplotlib", None)
    with _scratch(mp, {"m.arch": SCALAR}):
        _cli(["analyze", "m.arch", "--gradients", "--gradients-plot", "g.png"])


def _analyze(text: str, *flags: str, rc: int = 1) -> Commands:
    return Commands({"m.arch": text}, (("analyze", "m.arch", "--gradients", *flags),), rc)


def _gradients_no_batches_by_api(mp: pytest.MonkeyPatch) -> None:
    """irc analyze refuses --batches 0 as bad usage first; the Python API still says it."""
    from irc.analysis.gradients import measure_gradients

    measure_gradients(_graph(BOUND), batches=0)


def _gradients_unknown_probe(mp: pytest.MonkeyPatch) -> None:
    """Probes are named through the Python API only (irc analyze has no flag for them)."""
    from irc.analysis.gradients import measure_gradients

    measure_gradients(_graph(BOUND), probes=["h"])


@dataclass(frozen=True)
class Staged:
    name: str
    stage: Callable[[pytest.MonkeyPatch], None]  # raises the error
    text: str  # exactly what irc prints


STAGED = [
    Staged("backend_without_numba", _backend_without_numba,
           "irc: error: the cpu (Numba) backend is not available: it needs the Python package 'numba', "
           "which is not installed"),
    Staged("weights_header_unreadable", _weights_header_unreadable,
           "irc: error: cannot read 'w_good.safetensors': permission denied"),
    Staged("weights_unreadable", _weights_unreadable,
           "irc: error: cannot read 'w_good.safetensors': permission denied"),
    Staged("input_unreadable", _input_unreadable, "irc: error: cannot read 'x_good.npy': permission denied"),
    Staged("random_inputs_unbound", _random_inputs_unbound,
           "<input>:2:9: error: input 'x' has symbolic shape f32[B,4]; bind B with -D\n"
           "     2 |   input x: f32[B, D]\n"
           "       |         ^"),
    Staged("init_weights_unbound", _init_weights_unbound,
           "irc: error: weight 'y.weight' has symbolic shape [3, D]; bind D with -D"),
    Staged("analyze_unbound", _analyze_unbound,
           "<input>:2:9: error: 'input' result f32[B,4] still has a symbolic size; bind B first (-D NAME=VALUE)\n"
           "     2 |   input x: f32[B, D]\n"
           "       |         ^"),
    Staged("unknown_backend_by_api", _unknown_backend_by_api,
           "irc: error: unknown backend 'tpu' (known: numpy, cpu, cuda); did you mean 'cpu'?"),
    Staged("emit_numba_unbound_by_api", _emit_numba_unbound_by_api,
           "<input>:2:9: error: cpu backend: 'input' result f32[B,4] has unbound sizes (B); bind them with -D "
           "NAME=VALUE\n"
           "     2 |   input x: f32[B, D]\n"
           "       |         ^"),
    Staged("emit_unknown_kind", _emit_unknown_kind,
           "irc: error: cannot emit 'verilog' (known: numba, cuda, torch, dot)"),
    Staged("generate_source_mask_rnn_encoder", _generate(RNN_ENCODER),
           "m.arch:4:12: error: decode: a source padding mask covers attention only; 'gru' in the encoder of 'm' "
           "mixes positions, so padded sources would change real ones\n"
           "     4 |   memory = gru(embedding(source, 50, 16), 16)\n"
           "       |            ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~"),
    Staged("generate_source_mask_two_memories", _generate(TWO_MEMORIES),
           "m.arch:1:7: error: decode: the cross-attentions of 'm' read memories of different lengths (2, 3): one "
           "padding mask cannot cover them\n"
           "     1 | model m(B, T, S) {\n"
           "       |       ^"),
    Staged("generate_source_mask_short_memory", _generate(SHORT_MEMORY),
           "m.arch:5:11: error: decode: this encoder attention's keys have length 3, not the source's 2: the padding "
           "mask does not fit it\n"
           "     5 |   e = e + attention(e, heads=2)\n"
           "       |           ^~~~~~~~~~~~~~~~~~~~~"),
    Staged("gradients_of_a_training_step", TRAINING_STEP,
           "step.ir:2:7: error: --gradients: 'm' is already a training step (it has backward ops); give the forward "
           "model\n"
           "     2 | graph @m() {\n"
           "       |       ^~"),
    Staged("gradients_plot_nothing_to_draw", _analyze(NO_WEIGHTS, "--gradients-plot", "g.png"),
           "irc: error: --gradients-plot: model 'm' has no repeated blocks, weight-owning layers or recurrent inputs, "
           "so there is no gradient norm against depth to plot"),
    Staged("gradients_plot_without_matplotlib", _plot_without_matplotlib,
           "irc: error: --gradients-plot draws with matplotlib, which is not installed: pip install 'irc[train]' "
           "(or pip install matplotlib)"),
    Staged("gradients_cross_entropy_scalar_output", _analyze(SCALAR, "--loss", "cross_entropy"),
           "m.arch:1:7: error: --loss cross_entropy needs float logits [..., classes]; output 'score' is f32[]\n"
           "     1 | model m() {\n"
           "       |       ^"),
    Staged("gradients_loss_of_a_model_with_its_own", _analyze(OWN_LOSS, "--loss", "mse", rc=2),
           "irc: error: --loss mse: model 'm' computes its own loss (cross_entropy); drop --loss"),
    Staged("gradients_no_batches_by_api", _gradients_no_batches_by_api,
           "irc: error: --batches must be at least 1, got 0"),
    Staged("gradients_unknown_probe", _gradients_unknown_probe,
           "<input>:1:7: error: model 'm' has no value 'h' to probe\n"
           "     1 | model m() {\n"
           "       |       ^"),
    Staged("optimizer_unknown_kind", _optimizer_unknown_kind,
           "irc: error: the cpu backend has no update for optimizer 'lion' (it has sgd, momentum, adam, adamw)"),
    Staged("optimizer_float64_weight", _optimizer_float64_weight,
           "irc: error: the cpu backend's optimizer updates float32 C-contiguous arrays in place; weight 'fc.weight' "
           "is float64"),
]


def raise_staged(case: Staged) -> IrcError | UsageError:
    with pytest.MonkeyPatch.context() as mp:
        try:
            case.stage(mp)
        except (IrcError, UsageError) as e:
            return e
    raise AssertionError(f"staged case {case.name} raised no error")


def staged_origins() -> set[str]:
    """``path:line`` of the raise each staged case reaches (for the catalogue in test_diagnostics)."""
    return {raise_staged(case).origin for case in STAGED}


@pytest.mark.parametrize("case", STAGED, ids=lambda c: c.name)
def test_staged_error_text(case: Staged) -> None:
    assert printed_text(raise_staged(case)) == case.text


def test_missing_backend_package_through_the_cli(tmp_path: Path, irc_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.arch").write_text(BOUND)
    _no_numba(monkeypatch)
    result = irc_cli(["run", "m.arch", "--backend", "cpu"], cwd=tmp_path)
    assert (result.rc, result.out) == (1, "")
    assert result.err == STAGED[0].text + "\n"


def _fixture_builder():
    spec = importlib.util.spec_from_file_location("make_fixtures", INC / "make_fixtures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def test_fixture_files_are_what_the_script_makes() -> None:
    built = _fixture_builder()()
    on_disk = {p.name for p in INC.iterdir() if p.suffix in (".npz", ".npy", ".safetensors")}
    assert on_disk == set(built), "rerun tests/golden/errors/inc/make_fixtures.py"
    stale = sorted(name for name, data in built.items() if (INC / name).read_bytes() != data)
    assert not stale, f"rerun tests/golden/errors/inc/make_fixtures.py: {stale}"


def test_fixtures_hold_what_their_names_say() -> None:
    """The good parts of the fixtures read back, with NumPy's own reader, as the values written."""
    import numpy as np

    weights = np.load(INC / "w_extra.npz")
    assert sorted(weights.files) == ["y.bias", "y.scale", "y.weight"]
    np.testing.assert_array_equal(weights["y.weight"], np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    assert weights["y.weight"].dtype == np.float32
    assert np.load(INC / "w_dtype.npz")["y.weight"].dtype == np.float64
    assert np.load(INC / "x_good.npy").shape == (2, 3, 4)
    assert np.load(INC / "ids_range.npy").max() == 12  # past the vocabulary of 10


def test_safetensors_read_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """irc reads .safetensors itself (one copy, no Rust panic out of memory): the package is not needed."""
    import numpy as np

    from irc.runtime.weights import load_weights

    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)  # import fails as if not installed
    weights = load_weights(INC / "w_good.safetensors")
    np.testing.assert_array_equal(weights["y.weight"], np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    np.testing.assert_array_equal(weights["y.bias"], np.array([0.0, 0.5, 1.0], np.float32))


@pytest.mark.parametrize("case", [c for c in STAGED if isinstance(c.stage, Commands)], ids=lambda c: c.name)
def test_command_cases_through_main(case: Staged, tmp_path: Path, irc_cli) -> None:
    """The staged commands exit as irc does: the earlier ones succeed, the last prints the text and its status."""
    assert isinstance(case.stage, Commands)
    for name, text in case.stage.files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    *first, last = case.stage.argvs
    for argv in first:
        assert irc_cli(list(argv), cwd=tmp_path).rc == 0
    result = irc_cli(list(last), cwd=tmp_path)
    assert (result.rc, result.out, result.err) == (case.stage.rc, "", case.text + "\n")


def test_one_source_needs_no_mask_whatever_the_encoder(tmp_path: Path) -> None:
    """The padding mask is refused only for a GRU encoder whose sources differ in length: with one source (or
    sources of one length) nothing is padded, and the model generates."""
    import contextlib
    import io

    from irc.cli import build_parser

    (tmp_path / "m.arch").write_text(RNN_ENCODER)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.chdir(tmp_path)
        args = build_parser().parse_args(["generate", "m.arch", "--prompt-tokens", "1,2", "--encoder-tokens", "3,4,5",
                                          "--max-new", "2"])
        assert args.func(args) in (0, None)
    tokens = [int(t) for t in out.getvalue().split()]
    assert len(tokens) == 2 and all(0 <= t < 50 for t in tokens)
