"""Fused elementwise kernels against the unfused graph, and the thread policy.

Random graphs (hypothesis) mix fusible ops, broadcast inputs (scalars, bias
rows, column vectors) and a non-fusible op (``softmax``) that splits groups;
several heads keep some interior results visible. Each graph runs unfused
and fused; the comparisons:

* engine ``"numpy"`` (the members' own ufuncs, block by block): identical,
  bit for bit, with blocks made tiny so that every graph is cut into many
  blocks and split over two threads;
* engine ``"numpy"`` with numba (float32 groups compiled into one loop,
  :mod:`asyncrt.ops._jitfuse`): identical, bit for bit (the library's
  float32 ``tanh`` and ``exp`` are the compiled loops' functions);
* engine ``"numexpr"``: numexpr's float32 ``exp``/``tanh``/``log`` are its
  own, not numpy's SIMD loops, and interior results of an expression may be
  kept in registers, so results may differ in the last few ulps. Asserted:
  ``|fused - unfused| <= rtol * |unfused| + rtol * bound`` with
  ``rtol = 1e-5`` for float32 (about 80 ulps) and ``1e-12`` for float64,
  where ``bound`` is the largest magnitude any tensor of the graph can take
  (tracked by interval arithmetic while generating it; the generator keeps
  every op well conditioned: no ``log``/``sqrt``/division near 0, no
  ``exp`` of large values, magnitudes below 1e4).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import threadpoolctl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import ArgumentError, NodeFailedError
from asyncrt.graph import Graph, GraphBuilder, TensorHandle
from asyncrt.ops import _fusion as _fusion
from asyncrt.ops import _jit as _jit
from asyncrt.ops import _jitfuse as _jitfuse
from asyncrt.runtime import _threads as _threads
from scheduler.fusion import fuse_elementwise

Interval = tuple[float, float]


@dataclass
class Case:
    graph: Graph
    inputs: dict[str, np.ndarray[Any, Any]]
    dtype: str
    bound: float
    ops: list[str] = field(default_factory=list)


def _unary(f: Callable[[float], float]) -> Callable[[list[Interval]], Interval]:
    def apply(args: list[Interval]) -> Interval:
        lo, hi = args[0]
        a, b = f(lo), f(hi)
        return (min(a, b), max(a, b))

    return apply


def _product(args: list[Interval]) -> Interval:
    (a, b), (c, d) = args
    corners = [a * c, a * d, b * c, b * d]
    return (min(corners), max(corners))


def _quotient(args: list[Interval]) -> Interval:
    (a, b), (c, d) = args
    return _product([(a, b), (1 / d, 1 / c)])


# op -> (arity, may apply to these argument intervals?, result interval)
OPS: dict[str, tuple[int, Callable[[list[Interval]], bool], Any]] = {
    "add": (2, lambda a: True, lambda a: (a[0][0] + a[1][0], a[0][1] + a[1][1])),
    "subtract": (
        2,
        lambda a: True,
        lambda a: (a[0][0] - a[1][1], a[0][1] - a[1][0]),
    ),
    "multiply": (2, lambda a: True, _product),
    "divide": (2, lambda a: a[1][0] > 0.1 or a[1][1] < -0.1, _quotient),
    "negative": (1, lambda a: True, lambda a: (-a[0][1], -a[0][0])),
    "tanh": (1, lambda a: True, _unary(math.tanh)),
    "sigmoid": (1, lambda a: True, lambda a: (0.0, 1.0)),
    "relu": (1, lambda a: True, lambda a: (max(a[0][0], 0.0), max(a[0][1], 0.0))),
    "abs": (1, lambda a: True, lambda a: (0.0, max(abs(a[0][0]), abs(a[0][1])))),
    "exp": (1, lambda a: a[0][1] < 4.0, _unary(math.exp)),
    "sqrt": (1, lambda a: a[0][0] >= 0.0, _unary(math.sqrt)),
    "log": (1, lambda a: a[0][0] > 0.1, _unary(math.log)),
    "maximum": (
        2,
        lambda a: True,
        lambda a: (max(a[0][0], a[1][0]), max(a[0][1], a[1][1])),
    ),
    "sum": (3, lambda a: True, lambda a: (sum(x[0] for x in a), sum(x[1] for x in a))),
    "softmax": (1, lambda a: True, lambda a: (0.0, 1.0)),  # not elementwise
}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    dtype = draw(st.sampled_from(["float32", "float64"]))
    shape = draw(st.sampled_from([(37,), (3, 50), (2, 1, 45)]))
    broadcast = [shape, (1,), shape[-1:], (shape[0],) + (1,) * (len(shape) - 1)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = GraphBuilder()
    full: list[tuple[TensorHandle, Interval]] = []
    any_shape: list[tuple[TensorHandle, Interval]] = []
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    for k in range(draw(st.integers(1, 3))):
        in_shape = shape if k == 0 else draw(st.sampled_from(broadcast))
        value = rng.uniform(0.5, 1.5, in_shape).astype(dtype)
        inputs[f"x{k}"] = value
        handle = b.input(f"x{k}", shape=in_shape, dtype=dtype)
        entry = (handle, (0.5, 1.5))
        any_shape.append(entry)
        if in_shape == shape:
            full.append(entry)
    ops: list[str] = []
    heads: list[TensorHandle] = []
    for _ in range(draw(st.integers(2, 10))):
        name = draw(st.sampled_from(sorted(OPS)))
        arity, allowed, result = OPS[name]
        args = [draw(st.sampled_from(full))]
        args += [draw(st.sampled_from(any_shape)) for _ in range(arity - 1)]
        intervals = [interval for _, interval in args]
        if not allowed(intervals):
            continue
        lo, hi = result(intervals)
        if max(abs(lo), abs(hi)) > 1e4:
            continue
        handle = b.op(name, *[h for h, _ in args], shape=shape, dtype=dtype)
        ops.append(name)
        full.append((handle, (lo, hi)))
        any_shape.append((handle, (lo, hi)))
        if draw(st.booleans()) and draw(st.booleans()):
            heads.append(handle)
    last = full[-1][0]
    b.output(*dict.fromkeys([*heads, last]))
    bound = max(max(abs(lo), abs(hi)) for _, (lo, hi) in any_shape)
    return Case(b.build(), inputs, dtype, bound, ops)


def run(case: Case, **options: Any) -> list[np.ndarray[Any, Any]]:
    with graph_executor.create(case.graph, None, "cpu", **options) as ex:
        outputs = ex.run_sync(**case.inputs)
        assert outputs is not None
        return [o.numpy() for o in outputs]


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 16 elements, split over threads whatever the work: every
    test graph is cut into many. The numpy engine's own program runs (no
    compiled loops)."""
    monkeypatch.setattr(_fusion, "BLOCK_ELEMENTS", 16)
    monkeypatch.setattr(_fusion, "MIN_WORK_PER_THREAD", 0.0)
    monkeypatch.setattr(_threads.limits, "compiled_threads", 2)
    monkeypatch.setattr(_jit, "enabled", False)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=cases())
def test_numpy_engine_is_bit_identical(case: Case, tiny_blocks: None) -> None:
    expected = run(case)
    for threads in (1, 2):
        got = run(case, fuse=True, kernel_threads=threads)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=cases())
def test_compiled_loops_are_bit_identical(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("numba")
    monkeypatch.setattr(_jitfuse, "MIN_ELEMENTS_PER_THREAD", 0)  # rows split
    expected = run(case)
    for threads in (1, 2):
        got = run(case, fuse=True, kernel_threads=threads)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_numexpr_engine_agrees_within_ulps(case: Case) -> None:
    pytest.importorskip("numexpr")
    rtol = 1e-5 if case.dtype == "float32" else 1e-12
    expected = run(case)
    got = run(case, fuse="numexpr")
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * case.bound)


def chain_graph(
    n: int = 1000,
    dtype: str = "float32",
    funcs: tuple[str, ...] = ("tanh", "exp", "sqrt"),
) -> Graph:
    """x * c -> tanh -> exp -> sqrt, as in the bench's W2 branches (or
    through ``funcs``)."""
    b = GraphBuilder()
    x = b.input("x", shape=(n,), dtype=dtype)
    c = b.param("c", shape=(1,), dtype=dtype)
    h = b.op("multiply", x, c, shape=(n,), dtype=dtype, name="m")
    for func in funcs:
        h = b.op(func, h, shape=(n,), dtype=dtype, name=func[0])
    b.output(h)
    return b.build()


CHAIN_PARAMS = {"c": np.array([1.25], np.float32)}


def test_fused_node_names_its_members() -> None:
    with graph_executor.create(chain_graph(), fuse=True, params=CHAIN_PARAMS) as ex:
        (launch,) = ex.plan.launches()
        assert launch.name == "fused_mul_tanh_exp_sqrt"
        spec = ex.core.compiled.dag.nodes[launch.nid]["spec"]
        assert json.loads(spec.attrs["fused_nodes"]) == ["m", "t", "e", "s"]


def test_failure_names_the_original_node(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any) -> None:
        raise FloatingPointError("boom")

    real = _fusion.global_namespace_func
    monkeypatch.setattr(
        _fusion,
        "global_namespace_func",
        lambda name, namespace: boom if name == "exp" else real(name, namespace),
    )
    monkeypatch.setattr(_jit, "enabled", False)  # the members' kernels run
    x = np.ones(1000, np.float32)
    with graph_executor.create(chain_graph(), fuse=True, params=CHAIN_PARAMS) as ex:
        with pytest.raises(NodeFailedError) as failed:
            ex.run_sync(x=x)
        assert failed.value.node == "fused_mul_tanh_exp_sqrt"
        cause = failed.value.__cause__
        assert "node 'e' (op 'exp'), fused into 'fused_mul_tanh_exp_sqrt'" in str(cause)
        assert isinstance(cause.__cause__ if cause else None, FloatingPointError)


def test_without_numexpr_the_numpy_engine_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _fusion.importlib.util.find_spec
    monkeypatch.setattr(
        _fusion.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "numexpr" else real(name, *a),
    )
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    with graph_executor.create(chain_graph(), params=CHAIN_PARAMS) as plain:
        expected = plain.run_sync(x=x)
    with graph_executor.create(
        chain_graph(), fuse="numexpr", params=CHAIN_PARAMS
    ) as ex:
        (launch,) = ex.plan.launches()
        assert isinstance(ex.core.compiled.kernels[launch.nid], _fusion.ProgramKernel)
        got = ex.run_sync(x=x)
    assert expected is not None and got is not None
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())


def test_a_lib_kernel_of_a_builtin_name_is_not_fused() -> None:
    def my_tanh(a: Any, out: Any) -> None:
        np.multiply(a, 2, out)

    lib = asyncrt.Module({"tanh": my_tanh})
    with graph_executor.create(
        chain_graph(), lib, fuse=True, params=CHAIN_PARAMS
    ) as ex:
        names = [launch.name for launch in ex.plan.launches()]
    assert names == ["m", "t", "fused_exp_sqrt"]


def test_sim_sees_the_members_work() -> None:
    graph = chain_graph(dtype="float32")
    with graph_executor.create(graph, None, "sim:0", params=CHAIN_PARAMS) as plain:
        work = sum(launch.work for launch in plain.plan.launches())
        x = np.linspace(-2, 2, 1000, dtype=np.float32)
        expected = plain.run_sync(x=x)
    with graph_executor.create(
        graph, None, "sim:0", fuse=True, params=CHAIN_PARAMS
    ) as ex:
        (launch,) = ex.plan.launches()
        got = ex.run_sync(x=x)
    assert launch.work == work > 0
    assert expected is not None and got is not None
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())


def test_unknown_device_kind_or_engine() -> None:
    with pytest.raises(ArgumentError, match="fuse must be True, False or one of"):
        graph_executor.create(chain_graph(), fuse="numba")  # type: ignore[arg-type]


def test_cuda_kernel_source() -> None:
    """The CUDA path cannot run here (no GPU): check what it would compile."""
    dag = asyncrt.graph.to_dag(chain_graph())
    fusion = fuse_elementwise(
        dag, lambda spec: asyncrt.ops.fusion_template(spec.func_name) is not None
    )
    kernel = _fusion.CupyFusedKernel(fusion.groups[5])
    assert kernel.in_params == "T i0, T i1"
    assert kernel.operation == (
        "T m0 = (i0 * i1);\nT m1 = tanh(m0);\nT m2 = exp(m1);\ny = sqrt(m2);"
    )


# -- thread policy -------------------------------------------------------------


def test_policy_threads() -> None:
    assert [_threads.policy_threads(s, cores=2) for s in (1, 2, 3)] == [2, 1, 1]
    assert [_threads.policy_threads(s, cores=16) for s in (1, 2, 3, 4)] == [
        16,
        8,
        5,
        4,
    ]
    with pytest.raises(ValueError):
        _threads.policy_threads(0)


def blas_threads() -> int:
    info = threadpoolctl.threadpool_info()
    return min(lib["num_threads"] for lib in info) if info else 0


def test_limits_apply_once_and_restore() -> None:
    limits = _threads.ThreadLimits()
    before = blas_threads()
    one = limits.acquire(2)
    two = limits.acquire(1)  # the most parallel configuration decides
    assert limits.threads == 1
    if before:
        assert blas_threads() == 1
    two.release()
    two.release()  # idempotent
    assert limits.threads == 2
    one.release()
    assert limits.threads == 1  # no lease: fused kernels split nothing
    assert blas_threads() == before


def test_executor_takes_and_returns_a_lease() -> None:
    with graph_executor.create(chain_graph(), kernel_threads=1) as ex:
        assert _threads.limits.threads == 1
        assert ex.core.thread_lease is not None
    with graph_executor.create(chain_graph(), kernel_threads="keep") as ex:
        assert ex.core.thread_lease is None
    with pytest.raises(ValueError, match="kernel_threads"):
        graph_executor.create(chain_graph(), kernel_threads="many")


def test_lease_counts_the_cpu_streams_that_run_kernels() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(64,), dtype="float32")
    left = b.op("tanh", x, shape=(64,), dtype="float32")
    right = b.op("exp", x, shape=(64,), dtype="float32")
    b.output(left, right)
    graph = b.build()
    with graph_executor.create(graph, max_streams=2) as ex:
        assert _threads.cpu_streams(ex.plan) == 2
        assert ex.core.thread_lease is not None
        assert ex.core.thread_lease.threads == _threads.policy_threads(2)
    # fused into one node: one stream has work, so the pools keep every core
    with graph_executor.create(chain_graph(), max_streams=2, fuse=True) as ex:
        assert _threads.cpu_streams(ex.plan) == 1


def test_throughput_policy_counts_concurrent_runs() -> None:
    cores = _threads.available_cores()
    with graph_executor.create(
        chain_graph(), max_contexts=3, kernel_threads="throughput"
    ) as ex:
        assert ex.core.thread_lease is not None
        assert ex.core.thread_lease.threads == _threads.policy_threads(3)
        assert ex.core.thread_lease.threads == max(1, cores // 3)
    with graph_executor.create(chain_graph(), max_contexts=3) as ex:
        assert ex.core.thread_lease is not None
        assert ex.core.thread_lease.threads == cores  # "auto": one run's latency
    lease = _threads.lease_for(2, "throughput", concurrent_runs=2)
    assert lease is not None
    try:
        assert lease.threads == _threads.policy_threads(4)
    finally:
        lease.release()
    assert _threads.lease_for(0, "throughput", concurrent_runs=4) is None


def _exact_chain(n: int) -> Graph:
    """x * c -> relu -> + x -> abs: every member compiles bit for bit."""
    b = GraphBuilder()
    x = b.input("x", shape=(n,), dtype="float32")
    c = b.param("c", shape=(1,), dtype="float32")
    h = b.op("multiply", x, c, shape=(n,), dtype="float32", name="m")
    h = b.op("relu", h, shape=(n,), dtype="float32", name="r")
    h = b.op("add", h, x, shape=(n,), dtype="float32", name="a")
    b.output(b.op("abs", h, shape=(n,), dtype="float32", name="s"))
    return b.build()


@pytest.mark.parametrize("jit", [True, False])
def test_the_default_fuses_only_chains_compiled_bit_for_bit(
    jit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fuse="auto"`` (the default): an exact chain becomes one compiled
    node with the unfused results bit for bit; a small chain with log (no
    compiled counterpart) stays as built, a large one runs on the block
    engine, bit for bit too; without numba only large chains are fused."""
    if jit:
        pytest.importorskip("numba")
    monkeypatch.setattr(_jit, "enabled", jit)
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    with (
        graph_executor.create(_exact_chain(1000), params=CHAIN_PARAMS) as auto,
        graph_executor.create(
            _exact_chain(1000), params=CHAIN_PARAMS, fuse=False
        ) as plain,
    ):
        names = [launch.name for launch in auto.plan.launches()]
        assert names == (["fused_mul_relu_add_abs"] if jit else ["m", "r", "a", "s"])
        (got,) = auto.run_sync(x=x)
        (want,) = plain.run_sync(x=x)
        assert got.numpy().tobytes() == want.numpy().tobytes()
    logs = ("tanh", "exp", "log")
    with graph_executor.create(chain_graph(funcs=logs), params=CHAIN_PARAMS) as ex:
        assert [launch.name for launch in ex.plan.launches()] == ["m", "t", "e", "l"]
    n = _fusion.AUTO_BLOCK_MIN_ELEMENTS
    x = np.linspace(-2, 2, n, dtype=np.float32)
    with (
        graph_executor.create(chain_graph(n, funcs=logs), params=CHAIN_PARAMS) as auto,
        graph_executor.create(
            chain_graph(n, funcs=logs), params=CHAIN_PARAMS, fuse=False
        ) as plain,
    ):
        (launch,) = auto.plan.launches()
        assert launch.name == "fused_mul_tanh_exp_log"
        (got,) = auto.run_sync(x=x)
        (want,) = plain.run_sync(x=x)
        assert got.numpy().tobytes() == want.numpy().tobytes()
