"""The cpu backend's run time: one thread pool owns the cores, derived weights are computed
once per weights dict, the schedule's liveness, and the fast math functions' accuracy."""

from __future__ import annotations

import math
import weakref

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph
from irc.backends.cpu.schedule import Schedule
from irc.backends.cpu.threads import blas_libs, single_pool
from irc.pipeline import run_passes

_ = cpu_cache

QKV = """
model qkv(B, T) {
  input x: f32[B, T, 16]
  output y = attention(x, heads=2, causal=true, bias=false)
}
"""


def test_blas_is_single_threaded_while_a_graph_runs():
    libs = blas_libs()
    assert libs, "numba's BLAS (SciPy's OpenBLAS) is found"
    before = [lib.threads() for lib in libs]
    with single_pool():
        assert all(lib.threads() == 1 for lib in libs)
    assert [lib.threads() for lib in libs] == before, "the host program's setting comes back"


def test_derived_weights_are_computed_once_per_weights(cpu_cache):
    graph = run_passes(build(QKV, B=2, T=5), ["fuse"])
    assert any(n.op == "gemm_multi" for n in graph.nodes)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    assert compiled.module.DERIVED, "the stacked Q, K, V weight"
    weights, inputs = random_weights(graph), random_inputs(graph)
    first = compiled.run(weights, inputs)
    stacked = compiled._prepare(weights)[compiled.module.DERIVED[0]]
    assert compiled._prepare(weights)[compiled.module.DERIVED[0]] is stacked, "kept while the arrays are the same"
    other = {**weights, "y.wk": weights["y.wk"] * 2}  # a new array: derived again
    assert_matches(compiled.run(other, inputs), reference(graph, other, inputs))
    assert not np.array_equal(compiled.run(other, inputs)["y"], first["y"])
    weights["y.wq"][:] = 0  # changed in place: seen only after forget_weights()
    compiled.forget_weights()
    assert_matches(compiled.run(weights, inputs), reference(graph, weights, inputs))


def test_outputs_reuse_only_buffers_nothing_holds(cpu_cache):
    """An output the caller still holds (itself, or a view of it) is never written by a later run; once
    dropped, its memory takes the next run's output. NumPy's reference says every result is right."""
    graph = build(QKV, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights = random_weights(graph)
    runs = [random_inputs(graph, seed) for seed in range(4)]
    held = compiled.run(weights, runs[0])["y"]
    kept = held.copy()
    second = compiled.run(weights, runs[1])["y"]
    assert not np.shares_memory(held, second) and np.array_equal(held, kept), "a held output stays as it was"
    assert_matches({"y": second}, reference(graph, weights, runs[1]))
    buffer = weakref.ref(second)
    del second
    third = compiled.run(weights, runs[2])["y"]
    assert third is buffer(), "a dropped output's buffer is written again, not a fresh mapping"
    assert_matches({"y": third}, reference(graph, weights, runs[2]))
    view = third[0]
    del third
    fourth = compiled.run(weights, runs[3])["y"]
    assert not np.shares_memory(view, fourth), "a view keeps its base from reuse"
    assert_matches({"y": fourth}, reference(graph, weights, runs[3]))
    assert compiled._outputs, "the last run's buffers are kept for the next"
    compiled.forget_outputs()
    assert not compiled._outputs


def test_threads_running_one_graph_never_share_an_output(cpu_cache):
    """Two threads calling run() on one compiled graph at once: each gets its own buffers (the spare ones
    are taken out under a lock), so each result matches its own inputs."""
    import threading

    graph = build(QKV, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights = random_weights(graph)
    runs = [random_inputs(graph, seed) for seed in range(2)]
    want = [reference(graph, weights, x)["y"] for x in runs]
    bad: list[str] = []

    def worker(k: int) -> None:
        for _ in range(30):
            got = compiled.run(weights, runs[k])["y"]
            if not np.allclose(got, want[k], rtol=1e-4, atol=1e-5):
                bad.append(f"thread {k}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_the_module_derives_by_itself_without_the_cache(cpu_cache):
    graph = run_passes(build(QKV, B=1, T=3), ["fuse"])
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    with single_pool():
        got = compiled.module.run(compiled._weights(weights), compiled._inputs(inputs))
    assert_matches(got, reference(graph, weights, inputs))


def test_schedule_follows_liveness():
    graph = build("""
model chain(B) {
  input x: f32[B, 64]
  a = relu(x)
  b = tanh(a)
  c = reshape(b, [B, 8, 8])
  d = sigmoid(c)
  output y = d + reshape(a, [B, 8, 8])
}
""", B=4)
    s = Schedule(graph)
    index = {n.outputs[0]: i for i, n in enumerate(graph.nodes)}
    assert s.root["c"] == "b", "a reshape is a view of its operand's buffer"
    assert s.last["b"] == index["d"], "b's buffer lives while its view c is read"
    assert s.last["a"] == index["y"]
    assert s.root["y"] in s.pinned and "x" not in s.owned


LOOP = """
@njit(error_model="numpy")
def loop(x, out):
    for i in range(x.size):
        out[i] = {name}(x[i])
"""


@pytest.mark.parametrize("name", ["fexp", "ftanh", "ferf"])
def test_fast_math_functions(name):
    """The vectorising exp/tanh/erf against math's, over the float32 range, with inf and NaN."""
    from irc.backends.common.kernel import ModuleParts
    from irc.backends.cpu.emit import HEAD
    from irc.backends.cpu.render import mathfns

    parts = ModuleParts()
    mathfns.use(parts, name)
    namespace: dict = {}
    source = HEAD.format(version=0, name="t") + "\n".join(parts.devices.values()) + LOOP.format(name=name)
    source = source.replace("cache=True", "cache=False")  # source without a file cannot be cached
    exec(compile(source, f"<{name}>", "exec"), namespace)
    x = np.concatenate([np.linspace(-100, 100, 20001), [0.0, 1e-8, -1e-8, np.inf, -np.inf, np.nan]]).astype(np.float32)
    out = np.empty_like(x)
    namespace["loop"](x, out)
    ref = {"fexp": np.exp, "ftanh": np.tanh, "ferf": np.vectorize(math.erf)}[name](x.astype(np.float64))
    assert np.isnan(out[-1]), "NaN in, NaN out"
    x, out, ref = x[:-1], out[:-1], ref[:-1]
    if name == "fexp":
        normal = (x > -87) & (ref < 1e38)  # exp(-87) = 1.6e-38, about float32's smallest normal
        assert (np.abs(out[normal] - ref[normal]) / ref[normal]).max() < 2e-7
        assert not out[x <= -87].any(), "from -87 down (and -inf): exactly zero, as masked scores need"
    else:
        assert np.abs(out - ref).max() < 1e-6
        assert out[x == np.inf] == 1 and out[x == -np.inf] == -1
