"""``irc import CONFIG -o MODEL.arch``: a Hugging Face config to an .arch model and its weight map.

The weight map (``MODEL.weightmap.json``, next to the model) is what ``irc run MODEL.arch
--weights CHECKPOINT`` reads to load the checkpoint as it ships: HF names, sharded files.
The written model is compiled before this command reports success, so an import that
does not build is an error here, not at the first run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from irc.diagnostics import UsageError
from irc.output_files import write_atomically


def cmd_import(args: argparse.Namespace) -> int:
    from irc.frontends.hf.importer import import_hf
    from irc.runtime.weight_map import map_path_for

    if args.output is not None and Path(args.output).suffix != ".arch":
        raise UsageError(f"-o: the imported model is written as an .arch file, got '{args.output}'")
    name = args.name
    if name is not None and not name.isidentifier():
        raise UsageError(f"--name: '{name}' is not a valid model name (letters, digits and _, not first a digit)")
    if name is None and args.output is not None:
        name = Path(args.output).stem
    imported = import_hf(args.config, name)
    for line in imported.notes:
        print(f"irc: note: {line}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(imported.text)
        print("irc: note: the weight map is written only with -o (next to the model)", file=sys.stderr)
        return 0
    from irc.analysis.params import weight_table
    from irc.runtime.graphs import graph_from_source

    out = Path(args.output)
    wmap = map_path_for(out)
    graph = graph_from_source(imported.text, file=str(out))  # the model builds, or nothing is written
    params, _ = weight_table(graph)
    count = sum(_numel(shape) for shape in params.values())
    write_atomically(str(out), lambda f: f.write(imported.text.encode("utf-8")))
    write_atomically(str(wmap), lambda f: f.write(imported.weight_map.dumps().encode("utf-8")))
    print(f"wrote {out} (model {imported.name}, {imported.hf_class}: {count:,} parameters) and {wmap}")
    return 0


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
