"""The ``irc`` command line: compile, analyze, run, lint.

Exit codes: 0 success, 1 an error in the user's model or data, 2 bad usage,
70 an internal error (a bug in irc, reported without a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from irc import __version__
from irc.diagnostics import IrcError, UsageError, os_error_words, render
from irc.output_files import write_atomically

EPILOG = """\
examples:
  irc compile models/gpt2_small.arch                 print the typed IR
  irc compile models/gpt2_small.arch -D T=1024 --emit json -o gpt2.json
  irc compile models/llama2_7b.arch -D T=16 --passes fuse --print-ir-after-all
  irc analyze models/resnet18.arch                   parameters, FLOPs, memory, receptive field
  irc run models/gpt2_small.arch -D T=64 --backend cpu --check
  irc lint models/vgg16.arch                         warnings from the chapter's cheat sheet

-D NAME=VALUE binds a symbolic dimension from the model header (model gpt2(B, T)) or
overrides a model-level constant (-D layers=2 for a quick run). Files ending in .ir
are read as IR text, so a dump can be fed back in.
"""


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
                   help="bind a symbol or override a constant (repeatable)")
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
    graph = load_graph(args.file, bindings, args.model)
    if emit_lints(graph, args.warnings):
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
    else:
        from irc.backends import emit_source

        text = emit_source(graph, args.emit)
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
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"irc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("compile", help="build the typed IR of a model and print or save it",
                       description="Build the typed IR of a model, run passes, and emit IR text, JSON or code.")
    _common(p)
    p.add_argument("--emit", default="ir", choices=["ir", "json", "numba", "cuda"], help="what to write (default ir)")
    p.add_argument("--passes", help="comma-separated passes to run after shape inference")
    p.add_argument("--print-ir-after-all", action="store_true", help="dump the IR to stderr after every pass")
    p.add_argument("--print-ir-after-change", action="store_true", help="dump only after passes that changed it")
    p.add_argument("--no-loc", action="store_true", help="leave source locations out of the IR")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    _warnings(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("analyze", help="parameters, FLOPs, memory, KV cache, receptive field",
                       description="Report what a model costs, per layer and in total.")
    _common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in docs/analysis-json.md)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16", "int8"], help="weight dtype")
    p.add_argument("--kv-dtype", default="f16", choices=["f32", "bf16", "f16", "int8"], help="KV cache dtype")
    p.add_argument("--act-dtype", default="f32", choices=["f32", "bf16", "f16"], help="activation dtype")
    p.add_argument("--context", type=int, help="context length for KV cache and attention figures")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    _warnings(p)
    p.set_defaults(func=_lazy("irc.analysis.cli", "cmd_analyze"))

    p = sub.add_parser("run", help="execute a model on random or given inputs",
                       description="Run a model with the NumPy reference or a generated backend.")
    _common(p)
    p.add_argument("--backend", default="numpy", help="numpy, cpu or cuda (default numpy)")
    p.add_argument("--passes", help="comma-separated passes to run before the backend (cpu default: fuse)")
    p.add_argument("--no-fuse", action="store_true", help="run the graph as written on the cpu backend")
    p.add_argument("--weights", help="an .npz or .safetensors file keyed by scope path")
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="compare with the NumPy reference; exit 1 if off")
    p.add_argument("--tolerance", type=float, default=None, help="max relative error for --check")
    p.add_argument("--profile", action="store_true", help="print per-op time")
    p.add_argument("--max-memory", default=None, help="refuse to run above this many bytes (e.g. 8G)")
    p.add_argument("-o", "--output", help="save the outputs to an .npz file")
    p.set_defaults(func=_lazy("irc.runtime.cli", "cmd_run"))

    p = sub.add_parser("lint", help="warn about architectures that will not train well",
                       description="Architecture lints from the chapter's cheat sheet.")
    _common(p)
    _warnings(p)
    p.set_defaults(func=_lazy("irc.lint.cli", "cmd_lint"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except IrcError as e:
        print(render(e), file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"irc: error: {e}", file=sys.stderr)
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
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug in irc: say so plainly, without a traceback
        if os.environ.get("IRC_TRACEBACK"):
            raise
        print(f"irc: internal error: {type(e).__name__}: {e}\n"
              "This is a bug in irc; rerun with IRC_TRACEBACK=1 for details.", file=sys.stderr)
        return 70


if __name__ == "__main__":
    raise SystemExit(main())
