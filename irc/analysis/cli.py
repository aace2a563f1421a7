"""``irc analyze``: parameters, FLOPs, memory, KV cache and receptive field of a model."""

from __future__ import annotations

import argparse
import json

from irc.analysis.analyze import Options, analyze_graph, load_for_analysis
from irc.diagnostics import UsageError


def cmd_analyze(args: argparse.Namespace) -> int:
    from irc.cli import write_output
    from irc.pipeline import parse_defines

    if args.context is not None and not 0 < args.context < 2**62:
        raise UsageError(f"--context must be a positive number of tokens below 2**62, got {args.context}")
    given = parse_defines(args.defines)
    options = Options(args.dtype, args.kv_dtype, args.act_dtype, args.context)
    graph, bindings = load_for_analysis(args.file, given, args.model, args.context)
    from irc.cli import emit_lints

    if emit_lints(graph, args.warnings, args.context):
        return 1
    analysis = analyze_graph(graph, bindings, options)
    if args.json:
        from irc.analysis.report_json import analysis_to_json

        text = json.dumps(analysis_to_json(analysis, args.file), indent=2) + "\n"
    else:
        from irc.analysis.report_text import analysis_to_text

        text = analysis_to_text(analysis, args.file)
    write_output(args.output, text)
    return 0
