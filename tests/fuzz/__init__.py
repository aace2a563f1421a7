"""Grammar-aware fuzzing of the .arch frontend, the compile pipeline, the IR parser, and the
commands a user runs on a model that compiles (irc analyze, irc lint, irc run).

Strategies (all hypothesis): valid_models (generated correct programs over every op, with
their predicted types), grammar (random programs from arch.lark's rules), mutate and
ir_mutate (edits of every model, golden input and IR dump in the repository, from corpus,
with hostile values from vocab), structures (recursion, ``use`` cycles, deep nesting,
huge sizes). strategies names them with their CI sizes.

Running them: a Case is judged (judge) in a worker process (sandbox) bounded in CPU time
per phase and in memory: compile; IR round trip and ``--passes fuse``; then, for a graph
that compiled, commands (``irc analyze`` as text, JSON and with ``--context`` and other
dtypes, ``irc lint``, and ``irc run`` on the NumPy reference for small concrete graphs, B
bound to 1), each a stage of the verdict whose crash is a finding named after it
("analyze: ..."). runner
tallies a run (outcomes, and how each command ended); known lists the findings already
reported and regressions holds their minimal inputs. tests/test_fuzz.py runs the CI
sizes; benchmarks/fuzz_long.py runs any size.
"""
