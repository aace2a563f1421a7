"""Grammar-aware fuzzing of the .arch frontend, the compile pipeline and the IR parser.

Strategies (all hypothesis): valid_models (generated correct programs over every op, with
their predicted types), grammar (random programs from arch.lark's rules), mutate and
ir_mutate (edits of every model, golden input and IR dump in the repository, from corpus,
with hostile values from vocab), structures (recursion, ``use`` cycles, deep nesting,
huge sizes). strategies names them with their CI sizes.

Running them: a Case is judged (judge) in a worker process (sandbox) bounded in CPU time
and memory; runner tallies a run; known lists the findings already reported and
regressions holds their minimal inputs. tests/test_fuzz.py runs the CI sizes;
benchmarks/fuzz_long.py runs any size.
"""
