"""``irc analyze``: parameters, FLOPs, memory, KV cache and receptive field of a model; with
``--train`` its training memory per device under a parallel plan, with ``--hardware`` its
roofline times (prefill latency, decode tokens/s). docs/analysis.md describes every flag."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from irc.diagnostics import IrcError, UsageError

FORMATS = ("table", "csv", "md", "json")
_DTYPES = ["f32", "bf16", "f16", "int8"]
_DTYPE_ALIASES = {"fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16", "half": "f16",
                  "bfloat16": "bf16", "i8": "int8"}


def _dtype(text: str) -> str:
    """A dtype as irc spells it, also from PyTorch's and the precision flags' names (fp16, bfloat16)."""
    return _DTYPE_ALIASES.get(text.lower(), text.lower())


def _tokens(text: str) -> int:
    """A token count, with the k = 1,024 or M = 1,024² suffix -D takes (--context 4k)."""
    m = re.fullmatch(r"([0-9][0-9_]*)([kKmM]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expects a number of tokens such as 4096 or 4k, got '{text}'")
    return int(m.group(1).replace("_", "")) * {"": 1, "k": 2**10, "m": 2**20}[m.group(2).lower()]
_INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``analyze`` flags (irc.cli builds the parser and adds the common ones)."""
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, help="table (default), csv, md or json (docs/analysis-json.md)")
    out.add_argument("--json", action="store_true", help="the same as --format json")
    out.add_argument("--depth", type=int, metavar="N",
                     help="fold rows by scope: N named levels, repeat(N) copies in one row with a count")
    out.add_argument("-o", "--output", help="write here instead of stdout")
    out.add_argument("--lint", action="store_true", help="also print the architecture lints (stderr)")
    num = p.add_argument_group("numbers")
    num.add_argument("--dtype", type=_dtype, choices=_DTYPES, help="weight dtype (default f32; fp16, bfloat16 … too)")
    num.add_argument("--kv-dtype", type=_dtype, choices=_DTYPES, help="KV cache dtype (default f16, or --precision's)")
    num.add_argument("--act-dtype", type=_dtype, choices=["f32", "bf16", "f16"], help="activation dtype (default f32)")
    num.add_argument("--precision", choices=["fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed"],
                     help="weights and activations together; the -mixed ones keep fp32 master weights (--train)")
    num.add_argument("--context", type=_tokens, metavar="N",
                     help="context length for KV cache, attention figures and decode (4096, 4k; default: the "
                          "model's declared context, else its position table, else 1,024)")
    tr = p.add_argument_group("training (docs/analysis.md#training-memory)")
    tr.add_argument("--train", choices=["adam", "adamw", "sgd", "momentum"], help="memory per device for training")
    tr.add_argument("--recompute", default="none", choices=["none", "selective", "full"],
                    help="activation recomputation (Korthikanti et al. 2022)")
    tr.add_argument("--attention-dropout", action="store_true",
                    help="training applies dropout to attention probabilities (GPT-2, Megatron)")
    tr.add_argument("--tp", type=int, default=1, help="tensor-parallel devices")
    tr.add_argument("--pp", type=int, default=1, help="pipeline stages")
    tr.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    tr.add_argument("--sp", action="store_true", help="sequence parallelism within the tensor-parallel group")
    tr.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage over the replicas")
    tr.add_argument("--micro-batch", type=int, metavar="M", help="sequences per micro-batch (binds the batch)")
    tr.add_argument("--global-batch", type=int, metavar="G", help="sequences per step over all replicas")
    hw = p.add_argument_group("hardware (docs/analysis.md#rooflines)")
    hw.add_argument("--hardware", metavar="NAME",
                    help="h100-sxm, h200, a100-sxm, mi300x, epyc-9654 (irc/analysis/hardware.toml)")
    hw.add_argument("--hardware-file", metavar="FILE", help="a TOML table of devices in hardware.toml's form")
    hw.add_argument("--compute-efficiency", type=float, metavar="F", help="fraction of the peak FLOP/s reached")
    hw.add_argument("--bandwidth-efficiency", type=float, metavar="F", help="fraction of the memory bandwidth reached")
    gr = p.add_argument_group("gradients (docs/analysis.md#gradients-at-initialisation)")
    gr.add_argument("--gradients", action="store_true",
                    help="measure gradient norms at initialisation per weight, block depth and time step")
    gr.add_argument("--loss", choices=["cross_entropy", "mse"],
                    help="the loss to attach (default: cross_entropy if the model reads integer ids, else mse)")
    gr.add_argument("--seed", type=int, help="seed of the initial weights and random batches (default 0)")
    gr.add_argument("--batches", type=int, metavar="N", help="random batches to average over (default 3)")
    gr.add_argument("--gradients-plot", metavar="FILE.png",
                    help="also draw gradient norm against depth (and time) as a PNG (needs matplotlib: irc[train])")


def _check_usage(args: argparse.Namespace) -> None:
    problems = []
    if args.context is not None and not 0 < args.context < 2**62:
        problems.append(f"--context must be a positive number of tokens below 2**62, got {args.context}")
    elif args.depth is not None and not 0 < args.depth < 1000:
        problems.append(f"--depth must be a positive number of scope levels, got {args.depth}")
    elif args.json and args.format not in (None, "json"):
        problems.append(f"--json and --format {args.format} disagree: give one")
    elif args.precision in ("bf16-mixed", "fp16-mixed") and not args.train:
        problems.append(f"--precision {args.precision} describes training (fp32 master weights): add --train adam "
                        "(or adamw, sgd, momentum), or use --precision bf16 for inference")
    elif args.precision and (args.dtype or args.act_dtype):
        problems.append("--precision sets the weight and activation dtypes: drop --dtype / --act-dtype, or it")
    elif not args.train and (args.tp != 1 or args.pp != 1 or args.dp != 1 or args.zero or args.sp
                             or args.global_batch is not None or args.recompute != "none" or args.attention_dropout):
        problems.append("--tp, --pp, --dp, --sp, --zero, --global-batch, --recompute and --attention-dropout "
                        "describe a training run: add --train adam (or adamw, sgd, momentum)")
    elif not args.gradients and (args.loss or args.seed is not None or args.batches is not None
                                 or args.gradients_plot is not None):
        problems.append("--loss, --seed, --batches and --gradients-plot describe the gradient measurement: "
                        "add --gradients")
    elif args.gradients and (args.format in ("csv", "md") or args.batches is not None and args.batches < 1):
        problems.append("--gradients prints a table or JSON (not --format csv or md), over --batches of at least 1")
    elif args.hardware_file and not args.hardware:
        problems.append("--hardware-file gives the table --hardware NAME chooses from: add --hardware")
    if problems:
        raise UsageError(problems[0])


def _dtypes(args: argparse.Namespace) -> tuple[str, str, str | None]:
    """(weight dtype, activation dtype, training precision)."""
    if args.train:
        from irc.analysis.training_memory import PRECISIONS

        precision = args.precision or "fp32"
        weights = {4: "f32", 2: PRECISIONS[precision].act_dtype}[PRECISIONS[precision].weights]
        return weights, PRECISIONS[precision].act_dtype, precision
    if args.precision:
        d = _INFERENCE_PRECISION[args.precision]
        return d, d, None
    return args.dtype or "f32", args.act_dtype or "f32", None


def cmd_analyze(args: argparse.Namespace) -> int:
    from irc.analysis.analyze import Options, analyze_graph, bind_for_analysis
    from irc.analysis.parallel import Plan, check_plan_numbers
    from irc.cli import emit_lints, write_output
    from irc.pipeline import load_graph, parse_defines

    _check_usage(args)
    plan = Plan(args.tp, args.pp, args.dp, args.sp, args.zero, args.micro_batch, args.global_batch)
    check_plan_numbers(plan)
    hardware = None
    if args.hardware:
        from irc.analysis.hardware import find_hardware

        hardware = find_hardware(args.hardware, args.hardware_file, args.compute_efficiency,
                                 args.bandwidth_efficiency)
    elif args.compute_efficiency is not None or args.bandwidth_efficiency is not None:
        raise UsageError("--compute-efficiency and --bandwidth-efficiency scale a --hardware entry: add --hardware")
    weights, acts, precision = _dtypes(args)
    given = parse_defines(args.defines)
    kv = args.kv_dtype or (acts if args.precision else "f16")
    options = Options(weights, kv, acts, args.context)
    source = load_graph(args.file, given, args.model)
    graph, bindings = bind_for_analysis(source, given, args.context, args.micro_batch)
    if (args.lint or args.warnings) and emit_lints(graph, args.warnings, args.context):
        return 1
    analysis = analyze_graph(graph, bindings, options)
    if args.train:
        from irc.analysis.training_memory import training_report

        analysis.training = training_report(graph, [r.group for r in analysis.rows], plan, args.train, precision,
                                            args.recompute, args.attention_dropout,
                                            hardware.interconnect if hardware else None,
                                            hardware.memory if hardware else None)
    if hardware is not None:
        _roofline(analysis, args, source, given, hardware)
    gradients = None
    if args.gradients:
        from irc.analysis.gradient_limits import ANALYZE, refusal
        from irc.analysis.gradients import measure_gradients

        if args.gradients_plot is not None:  # refuse a plot that cannot be drawn before measuring
            from irc.analysis.gradient_plot import FLAG, require_matplotlib
            from irc.output_files import check_output_path, refuse_overwriting_input

            check_output_path(args.gradients_plot, FLAG)
            refuse_overwriting_input(args.gradients_plot, {"model file": args.file}, FLAG)
            require_matplotlib()
        why = refusal(analysis.totals, ANALYZE)
        if why is not None:
            raise IrcError(f"--gradients: not measured: {why}", graph.loc)
        chosen = {k: v for k, v in (("seed", args.seed), ("batches", args.batches)) if v is not None}
        gradients = measure_gradients(graph, args.loss, **chosen)
        if args.gradients_plot is not None:
            from irc.analysis.gradient_plot import write_plot

            write_plot(gradients, args.gradients_plot)
    fmt = "json" if args.json else (args.format or "table")
    write_output(args.output, render(analysis, args.file, fmt, args.depth, gradients))
    return 0


def render(analysis: Any, file: str, fmt: str, depth: int | None, gradients: Any = None) -> str:
    if fmt == "json":
        from irc.analysis.report_json import analysis_to_json

        doc = analysis_to_json(analysis, file)
        if gradients is not None:  # --gradients (irc/analysis/gradient_report.py)
            from irc.analysis.gradient_report import to_json

            doc["gradients"] = to_json(gradients)
        return json.dumps(doc, indent=2) + "\n"
    from irc.analysis.report_text import analysis_to_csv, analysis_to_markdown, analysis_to_text

    if fmt == "csv":
        return analysis_to_csv(analysis, depth)
    if fmt == "md":
        return analysis_to_markdown(analysis, file, depth)
    text = analysis_to_text(analysis, file, depth)
    if gradients is not None:
        from irc.analysis.gradient_report import to_text

        text += "\n" + to_text(gradients)
    return text


def _roofline(analysis: Any, args: argparse.Namespace, source: Any, given: dict[str, int], hardware: Any) -> None:
    """Prefill: the analysed graph. Decode: the same model at T = 1 reading a KV cache of the context."""
    from irc.analysis.analyze import bind_for_analysis
    from irc.analysis.bindings import symbol_roles
    from irc.analysis.roofline import pass_time, performance_report

    o = analysis.options
    prefill = pass_time(analysis.graph, hardware, o.dtype, o.act_dtype, o.kv_dtype)
    analysis.times = prefill.ops
    header = {k: v for k, v in given.items() if k in source.bindings}  # -D values of the model's symbols
    if header:  # find the symbols' roles on the model as written
        from irc.pipeline import load_graph

        source = load_graph(args.file, {k: v for k, v in given.items() if k not in header}, args.model)
    roles = symbol_roles(source)
    seq = next((s for s in source.symbols if roles.get(s) == "sequence"), None)
    decode = None
    why = None
    context = analysis.context
    if not analysis.kv.cached_layers:
        why = "the model has no causal self-attention to decode with"
    elif seq is None:
        why = "the sequence length is fixed in the model, so there is no one-token step to size"
    else:
        step_given = {**{k: v for k, v in given.items() if k != seq}, seq: 1}
        step, _ = bind_for_analysis(source, step_given, None, args.micro_batch)
        decode = pass_time(step, hardware, o.dtype, o.act_dtype, o.kv_dtype, decode_context=context)
    analysis.performance = performance_report(prefill, decode, hardware, o.act_dtype, context, why)
