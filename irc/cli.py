"""The ``irc`` command line: compile, analyze, run, lint.

Exit codes: 0 success, 1 an error in the user's model or data, 2 bad usage,
70 an internal error (a bug in irc, reported without a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from irc import __version__
from irc.diagnostics import IrcError, UsageError, os_error_words, render, terminal_safe
from irc.output_files import write_atomically

EPILOG = """\
examples:
  irc compile models/gpt2_small.arch                 print the typed IR
  irc compile models/gpt2_small.arch -D T=1024 --emit json -o gpt2.json
  irc compile models/llama2_7b.arch -D T=16 --passes fuse --print-ir-after-all
  irc analyze models/resnet18.arch                   parameters, FLOPs, memory, receptive field
  irc run models/gpt2_small.arch -D T=64 --backend cpu --check
  irc lint models/vgg16.arch                         architecture lints (docs/lints.md)

-D NAME=VALUE binds a symbolic dimension from the model header (model gpt2(B, T)) or
overrides a model-level constant (-D layers=2 for a quick run, -D eps=1e-6 for a number).
Sizes are positive integers and may end in k (1024): -D T=4k. Files ending in .ir are
read as IR text, so a dump can be fed back in.

{rule}
"""


RUN_EXAMPLES = """\
examples:
  irc run models/gpt2_small.arch -D T=64                       random weights and tokens, NumPy reference
  irc run models/gpt2_small.arch -D T=64 --backend cpu --check  generated kernels, checked against NumPy
  irc run models/mlp.arch --weights w.safetensors --input image=x.npy -o out.npz
  irc run models/resnet18.arch -D B=8 --backend cpu --profile --repeat 10
"""
COMPILE_EXAMPLES = """\
examples:
  irc compile models/gpt2_small.arch                           the typed IR, sizes left symbolic
  irc compile models/gpt2_small.arch -D T=1024 --emit json -o gpt2.json
  irc compile models/mlp.arch --emit numba -o mlp_kernels.py   the generated CPU kernels
  irc compile models/llama2_7b.arch -D T=16 --passes fuse --print-ir-after-change
"""


def _epilog() -> str:
    import textwrap

    from irc.analysis.bindings import DEFAULTS_NOTE  # the rule's own words, where the rule lives

    rule = textwrap.fill(f"Unbound sizes: analyze, lint, run and compile --emit numba|cuda all use one rule: "
                         f"{DEFAULTS_NOTE}; any other symbol must be bound with -D. compile --emit "
                         "ir|json|onnx|torch|dot|svg|png keeps unbound sizes symbolic.", 88)
    return EPILOG.replace("{rule}", rule)


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (bad ones exit 2 with argparse's message)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {n}")
        return n
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2, our format
        self.print_usage(sys.stderr)
        print(f"irc: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _warnings(p: argparse.ArgumentParser) -> None:
    p.add_argument("-W", dest="warnings", action="append", default=[], metavar="CODE|error=CODE|no-CODE",
                   help="control architecture lints: no-W103 silences, error=W103 promotes, no-all (docs/lints.md)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="an .arch model (or an .ir dump)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a size (-D T=1024, -D T=4k) or override a constant (-D layers=2, -D eps=1e-6); "
                        "repeatable")
    p.add_argument("--model", help="which model, when the file defines several")


def write_output(path: str | None, text: str) -> None:
    """Write to stdout, or atomically to ``path`` (a half-written file is never left behind)."""
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        # a device or a pipe (-o /dev/null): write through it; replacing it would destroy it
        try:
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write '{path}': {os_error_words(e)}") from None
        return
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def emit_lints(graph, flags: list[str], context: int | None = None) -> bool:
    """Print the architecture lints to stderr; True when one was promoted to an error.

    A model the analysis cannot size (a symbol with no sensible default) gets no lints here:
    compiling it is still fine, and ``irc lint -D ...`` says what it needs.
    """
    from irc.lint.cli import print_lints

    try:
        return bool(print_lints(graph, flags, sys.stderr, context))
    except IrcError:
        return False


def cmd_compile(args: argparse.Namespace) -> int:
    from irc.pipeline import DEFAULT_PASSES, load_graph, parse_defines, run_passes
    from irc.printer import print_graph

    bindings = parse_defines(args.defines)
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else []
    if args.emit in ("ir", "json", "onnx", "torch", "dot", "svg", "png"):
        # the IR, the exports (ONNX dim_params, shapes read at run time) and pictures keep sizes symbolic
        graph = load_graph(args.file, bindings, args.model)
    else:  # generated code needs concrete sizes: the defaults analyze and run use
        from irc.pipeline import defaults_note, load_with_defaults

        graph, defaulted = load_with_defaults(args.file, bindings, args.model)
        if defaulted:
            print(f"irc: note: {defaults_note(defaulted)}", file=sys.stderr)
    if (args.lint or args.warnings) and emit_lints(graph, args.warnings):  # lints only when asked
        return 1
    if args.print_ir_after_all or args.print_ir_after_change:
        for name in DEFAULT_PASSES:
            sys.stderr.write(f"// ----- IR after {name} -----\n" + print_graph(graph, not args.no_loc))

    def dump(name: str, text: str) -> None:
        sys.stderr.write(f"// ----- IR after {name} -----\n{text}")

    graph = run_passes(graph, [p for p in passes if p not in DEFAULT_PASSES],
                       dump if (args.print_ir_after_all or args.print_ir_after_change) else None,
                       only_changed=args.print_ir_after_change)
    if args.emit == "ir":
        text = print_graph(graph, not args.no_loc)
    elif args.emit == "json":
        from irc.ir_json import graph_to_json

        text = json.dumps(graph_to_json(graph, not args.no_loc), indent=2) + "\n"
    elif args.emit in ("onnx", "svg", "png"):  # binary files: written by the backend, never to a terminal
        from irc.backends import emit_file

        if args.output in (None, "-"):
            raise UsageError(f"--emit {args.emit} writes a binary file: give its path with -o "
                             f"(e.g. -o model.{args.emit})")
        emit_file(graph, args.emit, args.output, weights_path=args.weights, model_file=args.file, depth=args.depth)
        return 0
    else:
        from irc.backends import emit_source

        text = emit_source(graph, args.emit, depth=args.depth)
    write_output(args.output, text)
    return 0


def _lazy(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module), func)(args)
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="irc",
        description="irc compiles neural-network architectures written in .arch files: a typed graph IR, "
                    "exact costs (parameters, FLOPs, memory, KV cache, receptive field), and generated kernels.",
        epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"irc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("compile", help="build the typed IR of a model and print or save it",
                       description="Build the typed IR of a model, run passes, and emit IR text, JSON or code.",
                       epilog=COMPILE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--emit", default="ir",
                   choices=["ir", "json", "numba", "cuda", "onnx", "torch", "dot", "svg", "png"],
                   help="what to write (default ir; onnx, torch, dot, svg, png: docs/export.md)")
    p.add_argument("--weights", help="--emit onnx: the weights to embed, an .npz or .safetensors file "
                                     "(default: irc's initial ones)")
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="--emit dot|svg|png: draw scopes nested deeper than N as one box each")
    p.add_argument("--passes", help="comma-separated passes to run after shape inference")
    p.add_argument("--print-ir-after-all", action="store_true", help="dump the IR to stderr after every pass")
    p.add_argument("--print-ir-after-change", action="store_true", help="dump only after passes that changed it")
    p.add_argument("--no-loc", action="store_true", help="leave source locations out of the IR")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    p.add_argument("--lint", action="store_true", help="also print the architecture lints (stderr)")
    _warnings(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("analyze", help="parameters, FLOPs, memory, KV cache, receptive field",
                       description="Report what a model costs, per layer and in total.")
    _common(p)
    from irc.analysis.cli import add_arguments as analyze_arguments  # the flags live with the command

    analyze_arguments(p)
    _warnings(p)
    p.set_defaults(func=_lazy("irc.analysis.cli", "cmd_analyze"))

    p = sub.add_parser("run", help="execute a model on random or given inputs",
                       description="Run a model with the NumPy reference or a generated backend.",
                       epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--backend", default="numpy", help="numpy, cpu or cuda (default numpy)")
    p.add_argument("--passes", help="comma-separated passes to run before the backend (cpu default: fuse)")
    p.add_argument("--no-fuse", action="store_true", help="run the graph as written on the cpu backend")
    p.add_argument("--weights", help="an .npz or .safetensors file keyed by scope path, or a checkpoint (file, "
                   "folder, *.safetensors.index.json) read through the model's weight map (docs/import.md)")
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy",
                   help="read the model input NAME from an .npy file (repeatable); other inputs are random")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights and inputs (default 0): one seed, one run, on any machine")
    p.add_argument("--check", action="store_true", help="compare with the NumPy reference; exit 1 if off")
    p.add_argument("--tolerance", type=float, default=None,
                   help="max normwise relative error for --check (default 1e-4)")
    p.add_argument("--profile", action="store_true",
                   help="print per-op time: the median of --repeat runs after --warmup untimed ones")
    p.add_argument("--warmup", type=_count(0), default=None, metavar="N",
                   help="untimed runs first (default 1 with --profile, else 0)")
    p.add_argument("--repeat", type=_count(1), default=None, metavar="N",
                   help="timed runs; the median is reported (default 3 with --profile, else 1)")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="refuse to run above this many bytes (e.g. 8G, 512MiB; default: the tightest of the "
                        "memory available, the container's limit and ulimit -v)")
    p.add_argument("-o", "--output", help="save the outputs to an .npz file (in a folder that exists)")
    p.set_defaults(func=_lazy("irc.runtime.cli", "cmd_run"))

    p = sub.add_parser("lint", help="warn about architectures that will not train well",
                       description="Architecture lints: warnings about models that will not train well "
                                   "(docs/lints.md).")
    p.add_argument("file", nargs="?", help="an .arch model (or an .ir dump); not needed with --list or --explain")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbol or override a constant (repeatable)")
    p.add_argument("--model", help="which model, when the file defines several")
    p.add_argument("--list", action="store_true", help="list every warning code with its name and summary")
    p.add_argument("--explain", metavar="CODE", help="what a warning means, why it matters and how to fix it")
    p.add_argument("--format", default="text", choices=["text", "json", "sarif"],
                   help="text diagnostics on stderr (default), or a JSON / SARIF 2.1.0 report on stdout")
    p.add_argument("-o", "--output", help="write the --format json|sarif report here instead of stdout")
    gr = p.add_argument_group("measure (docs/lints.md#--measure)")  # the flags and defaults of analyze --gradients
    gr.add_argument("--measure", action="store_true",
                    help="add to the gradient lints the figure irc analyze --gradients measures at initialisation")
    gr.add_argument("--seed", type=int, help="seed of the initial weights and random batches (default 0)")
    gr.add_argument("--batches", type=int, metavar="N", help="random batches to average over (default 3)")
    _warnings(p)
    p.set_defaults(func=_lazy("irc.lint.cli", "cmd_lint"))

    p = sub.add_parser("import", help="a Hugging Face config.json to an .arch model and its weight map",
                       description="Write the .arch model a Hugging Face config.json (or checkpoint folder) "
                                   "describes, and next to it the weight map irc run --weights reads (docs/import.md).")
    p.add_argument("config", help="a config.json, or a checkpoint folder holding one")
    p.add_argument("-o", "--output", help="the .arch file to write (MODEL.weightmap.json goes next to it)")
    p.add_argument("--name", help="the model's name (default: the output file's name)")
    p.set_defaults(func=_lazy("irc.import_cli", "cmd_import"))

    p = sub.add_parser("weights", help="every weight a model expects: key, shape, dtype, init rule, layer",
                       description="List the weights a model reads, or write a template file with those keys.")
    _common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--template", metavar="OUT.safetensors|OUT.npz",
                   help="write a weights file with every key, initialised from --seed")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_lazy("irc.weights_cli", "cmd_weights"))

    from irc.generate_cli import add_generate_parser  # irc generate: its arguments and logic live there

    add_generate_parser(sub, _common)
    from irc.train_cli import add_train_parser  # irc train: its arguments and logic live there

    add_train_parser(sub, _common)
    return parser


def check_own_files(args: argparse.Namespace) -> None:
    """Before any work: no empty file names, and no ``-o`` over one of the command's own inputs
    (``run --weights w.npz -o w.npz``, ``compile m.arch -o m.arch``), whichever command it is."""
    from irc.output_files import check_output_path, refuse_overwriting_input

    for flag, attr in (("--weights", "weights"), ("-o", "output"), ("the model file", "file")):
        value = getattr(args, attr, None)
        if isinstance(value, str):
            check_output_path(value, flag)
    output = getattr(args, "output", None)
    if not output or output == "-":
        return
    inputs: dict[str, str | Path] = {}
    if isinstance(getattr(args, "file", None), str):
        inputs["model file"] = args.file
    if isinstance(getattr(args, "weights", None), str):
        inputs["weights file"] = args.weights
    for spec in getattr(args, "inputs", None) or []:
        name, _, file = str(spec).partition("=")
        if file:
            inputs[f"input file of {name}"] = file
    refuse_overwriting_input(output, inputs)


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so ``finally`` blocks run (a half-written temp file is removed)."""


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _silence_stdout() -> None:
    """After stdout failed, point its descriptor at /dev/null so the interpreter's last flush is quiet."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class StdoutFailed(Exception):
    """Writing to standard output failed: the user's device (a full disk, /dev/full), not a bug."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class _GuardedStdout:
    """``sys.stdout`` for the length of a command: an OSError from writing it becomes StdoutFailed,
    so it is told apart from the OSErrors of files irc reads and writes."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(e) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    real_stdout = sys.stdout
    sys.stdout = _GuardedStdout(real_stdout)  # type: ignore[assignment]
    try:
        with terminate_as_exception():
            check_own_files(args)
            rc = args.func(args)
            sys.stdout.flush()  # inside the try: a full stdout is the user's device, not a bug
            return rc
    except IrcError as e:
        print(render(e), file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"irc: error: {terminal_safe(str(e))}", file=sys.stderr)
        return 2
    except RecursionError:
        print("irc: error: the input nests too deeply to process", file=sys.stderr)
        return 1
    except MemoryError:
        print("irc: error: out of memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("irc: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("irc: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:  # `irc ... | head`: the reader has all it wants
        _silence_stdout()
        return 0
    except StdoutFailed as e:
        _silence_stdout()
        print(f"irc: error: cannot write to standard output: {os_error_words(e.error)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug in irc: say so plainly, without a traceback
        return _internal_error(e)
    finally:
        sys.stdout = real_stdout


def _internal_error(e: Exception) -> int:
    if os.environ.get("IRC_TRACEBACK"):
        raise e
    print(f"irc: internal error: {type(e).__name__}: {terminal_safe(str(e))}\n"
          "This is a bug in irc; rerun with IRC_TRACEBACK=1 for details.", file=sys.stderr)
    return 70


if __name__ == "__main__":
    raise SystemExit(main())
