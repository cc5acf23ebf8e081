"""Many concurrent `await run()` calls on one executor: own outputs, `out=`,
the context pool's bounds (count and memory), out-of-memory recovery, the
stateful API's misuse errors, and failures injected into random nodes."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import (
    ArgumentError,
    BusyError,
    InputError,
    NodeFailedError,
    NodeOutOfMemoryError,
    OutOfMemoryError,
)
from asyncrt.graph import Graph, GraphBuilder
from devices import get_api, sim

from .test_executor import PARAMS, C, N, W, make, mlp_graph, reference

try:
    import uvloop  # noqa: F401

    HAVE_UVLOOP = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_UVLOOP = False

#: asyncio, trio, and asyncio on uvloop (skipped cleanly without uvloop).
ALL_LOOPS = pytest.mark.parametrize(
    "anyio_backend",
    [
        "asyncio",
        "trio",
        pytest.param(
            ("asyncio", {"use_uvloop": True}),
            id="uvloop",
            marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop not installed"),
        ),
    ],
)


def slow(kernel: Callable[..., None], seconds: float) -> Callable[..., None]:
    def run(*args: Any) -> None:
        time.sleep(seconds)
        kernel(*args)

    return run


def relu(a: np.ndarray, out: np.ndarray) -> None:
    np.maximum(a, 0, out=out)


# -- many callers ------------------------------------------------------------


@pytest.mark.anyio
@ALL_LOOPS
async def test_a_thousand_concurrent_runs_get_their_own_outputs() -> None:
    rng = np.random.default_rng(1000)
    xs = rng.standard_normal((1000, N)).astype(np.float32)
    results: list[list[np.ndarray] | None] = [None] * len(xs)
    async with make("cpu", max_contexts=4) as ex:

        async def one(i: int) -> None:
            outs = await ex.run(x=xs[i])
            assert outs is not None
            results[i] = [o.numpy() for o in outs]

        async with anyio.create_task_group() as tg:
            for i in range(len(xs)):
                tg.start_soon(one, i)
        assert ex.pool.size <= 4
        assert ex.pool.idle == ex.pool.size and not ex.pool.lent
    for x, got in zip(xs, results, strict=True):
        assert got is not None
        for g, want in zip(got, reference(x, C, W), strict=True):
            np.testing.assert_allclose(g, want, rtol=1e-6)


@pytest.mark.anyio
@pytest.mark.parametrize("device", ["cpu", "sim:0"])
async def test_out_arrays_are_filled_instead_of_new_ones(device: str) -> None:
    async with make(device) as ex:
        x = np.linspace(-1, 1, N, dtype=np.float32)
        host = [np.empty(N, np.float32), np.empty(N, np.float32)]
        got = await ex.run(out=host, x=x)
        assert got == host and got[0] is host[0]
        for array, want in zip(host, reference(x, C, W), strict=True):
            np.testing.assert_allclose(array, want, rtol=1e-6)
        targets = [asyncrt.nd.empty((N,), "float32", "sim:1") for _ in range(2)]
        again = await ex.run(out=targets, x=x + 1)
        assert again[1] is targets[1]
        for array, want in zip(targets, reference(x + 1, C, W), strict=True):
            np.testing.assert_allclose(array.numpy(), want, rtol=1e-6)
        # the stateful API fills `out` the same way
        ex.set_input("x", x)
        stateful = await ex.run(out=[np.empty(N, np.float32) for _ in range(2)])
        np.testing.assert_allclose(stateful[0], reference(x, C, W)[0], rtol=1e-6)


@pytest.mark.anyio
async def test_bad_out_arrays_are_input_errors() -> None:
    async with make() as ex:
        x = np.zeros(N, np.float32)
        one = np.empty(N, np.float32)
        with pytest.raises(InputError, match="needs 2 arrays"):
            await ex.run(out=[one], x=x)
        with pytest.raises(InputError, match=r"out\[1\] must have shape \(8,\)"):
            await ex.run(out=[one, np.empty(3, np.float32)], x=x)
        with pytest.raises(InputError, match=r"dtype float32, got .* float64"):
            await ex.run(out=[one, np.empty(N)], x=x)
        frozen = np.empty(N, np.float32)
        frozen.flags.writeable = False
        with pytest.raises(InputError, match="writable, C-contiguous"):
            await ex.run(out=[one, frozen], x=x)
        with pytest.raises(InputError, match="writable, C-contiguous"):
            await ex.run(out=[one, np.empty(2 * N, np.float32)[::2]], x=x)
        with pytest.raises(InputError, match="NDArray or a numpy array"):
            await ex.run(out=[one, [0.0] * N], x=x)
        assert ex.pool.size == 0  # checked before a context was taken


# -- the pool's bounds -------------------------------------------------------


def test_context_cost_counts_arenas_and_inputs() -> None:
    with make() as ex:
        arenas = sum(a.size for a in ex.plan.arenas.values())
        assert ex.context_nbytes == arenas + N * 4  # x; c and w are params


@pytest.mark.anyio
@pytest.mark.parametrize(("budget_in_contexts", "expected"), [(2.5, 2), (0.5, 1)])
async def test_memory_budget_bounds_the_pool(
    budget_in_contexts: float, expected: int
) -> None:
    lib = asyncrt.Module({"relu": slow(relu, 0.002)})
    with make() as probe:
        cost = probe.context_nbytes  # with c and w loaded as parameters
    budget = int(budget_in_contexts * cost)
    ex = graph_executor.create(mlp_graph(), lib, max_contexts=8, memory_budget=budget)
    async with ex:
        ex.load_params(PARAMS)
        xs = [np.full(N, i, np.float32) for i in range(24)]
        peak = 0

        async def one(x: np.ndarray) -> None:
            nonlocal peak
            outs = await ex.run(x=x)
            peak = max(peak, ex.pool.size)
            assert outs is not None
            np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0])

        async with anyio.create_task_group() as tg:
            for x in xs:
                tg.start_soon(one, x)
        assert peak == ex.pool.size == expected
        assert ex.pool.nbytes == expected * cost
        assert expected == 1 or ex.pool.nbytes <= budget


def test_bad_pool_settings() -> None:
    with pytest.raises(ArgumentError, match="max_contexts must be an int >= 1"):
        make(max_contexts=0)
    with pytest.raises(ArgumentError, match="memory_budget must be an int >= 0"):
        make(memory_budget=-1)


# -- out of memory -----------------------------------------------------------


def sim_with_room(nbytes: int) -> None:
    """Make sim:0 have ``nbytes`` free beyond what is allocated now."""
    gc.collect()  # buffers of earlier tests would otherwise free room later
    used = get_api("sim").used_bytes(asyncrt.sim(0))
    sim.configure(2, sim.SimConfig(memory=used + nbytes))


@pytest.mark.anyio
async def test_no_room_for_a_context_is_a_clear_error_and_recoverable() -> None:
    async with make("sim:0") as ex:
        sim_with_room(ex.context_nbytes // 2)
        out = [np.empty(N, np.float32) for _ in range(2)]
        with pytest.raises(OutOfMemoryError) as info:
            await ex.run(out=out, x=np.ones(N, np.float32))
        assert info.value.device == "sim:0"
        assert 0 < info.value.requested <= ex.context_nbytes
        assert "out of memory on sim:0: requested" in str(info.value)
        assert ex.pool.size == 0 and ex.pool.nbytes == 0  # nothing leaked
        sim_with_room(4 * ex.context_nbytes)
        x = np.ones(N, np.float32)
        await ex.run(out=out, x=x)
        np.testing.assert_allclose(out[0], reference(x, C, W)[0], rtol=1e-6)
        assert ex.pool.size == 1


@pytest.mark.anyio
async def test_no_room_to_grow_waits_for_a_context_instead() -> None:
    lib = asyncrt.Module({"relu": slow(relu, 0.002)}, kinds=("sim",))
    with graph_executor.create(mlp_graph(), lib, "sim:0", max_contexts=4) as ex:
        ex.load_params(PARAMS)
        sim_with_room(ex.context_nbytes * 3 // 2)  # one context fits, two don't
        xs = [np.full(N, i / 10, np.float32) for i in range(12)]
        outs = [[np.empty(N, np.float32) for _ in range(2)] for _ in xs]
        async with anyio.create_task_group() as tg:
            for x, out in zip(xs, outs, strict=True):
                tg.start_soon(lambda x=x, out=out: ex.run(out=out, x=x))
        for x, out in zip(xs, outs, strict=True):
            np.testing.assert_allclose(out[1], reference(x, C, W)[1], rtol=1e-6)
        assert ex.pool.size == 1 and not ex.pool.lent


@pytest.mark.anyio
async def test_kernel_out_of_workspace_names_node_device_and_request() -> None:
    greedy = threading.Event()
    huge = 8 << 30  # more than the sim device's 4 GiB

    def hungry_relu(a: np.ndarray, out: np.ndarray) -> None:
        if greedy.is_set():
            api = get_api("sim")
            api.free_workspace(api.alloc_workspace(asyncrt.sim(0), huge))
        np.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": hungry_relu}, kinds=("sim",))
    async with graph_executor.create(mlp_graph(), lib, "sim:0") as ex:
        ex.load_params(PARAMS)
        x = np.ones(N, np.float32)
        greedy.set()
        with pytest.raises(NodeOutOfMemoryError) as info:
            await ex.run(x=x)
        err = info.value
        assert isinstance(err, NodeFailedError) and isinstance(err, MemoryError)
        assert isinstance(err, OutOfMemoryError)
        assert (err.node, err.op, err.device) == ("relu0", "relu", "sim:0")
        assert err.requested == huge and err.memory_device == "sim:0"
        assert "'relu0'" in str(err) and f"requested {huge} bytes" in str(err)
        assert isinstance(err.__cause__, OutOfMemoryError)
        greedy.clear()
        outs = await ex.run(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


# -- the stateful API under concurrency ----------------------------------------


@pytest.mark.anyio
async def test_parameters_cannot_change_under_runs_in_flight() -> None:
    started, release = threading.Event(), threading.Event()

    def held_relu(a: np.ndarray, out: np.ndarray) -> None:
        started.set()
        release.wait(5)
        np.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": held_relu})
    async with graph_executor.create(mlp_graph(), lib) as ex:
        ex.load_params(PARAMS)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ex.run(x=np.ones(N, np.float32)))
            while not started.is_set():
                await anyio.sleep(0.001)
            with pytest.raises(BusyError, match="while runs are in flight"):
                ex.load_params(PARAMS)
            with pytest.raises(BusyError):
                ex.set_input("w", W)
            ex.set_input("x", np.ones(N, np.float32))  # its own input: fine
            release.set()
        ex.load_params({"w": W * 2})  # and fine again once the run is done
        outs = await ex.run(x=np.ones(N, np.float32))
        assert outs is not None
        want = reference(np.ones(N, np.float32), C, W * 2)[0]
        np.testing.assert_allclose(outs[0].numpy(), want, rtol=1e-6)


@pytest.mark.anyio
async def test_stateful_and_pooled_runs_do_not_mix() -> None:
    async with make() as ex:
        x0 = np.full(N, 0.25, np.float32)
        ex.set_input("x", x0)

        async def pooled(i: int) -> None:
            x = np.full(N, i, np.float32)
            outs = await ex.run(x=x)
            assert outs is not None
            np.testing.assert_allclose(outs[1].numpy(), reference(x, C, W)[1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            for i in range(20):
                tg.start_soon(pooled, i)
        np.testing.assert_allclose(ex.get_output(1).numpy(), reference(x0, C, W)[1])


# -- failures in random nodes --------------------------------------------------


def chain_graph(
    shape: list[int], fail_at: int, rng: np.random.Generator
) -> tuple[Graph, asyncrt.Module, Callable[[np.ndarray], list[np.ndarray]]]:
    """A random DAG over x: node k reads one or two earlier tensors; node
    ``fail_at`` raises when its input holds a NaN (a poisoned run)."""
    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    handles = [x]
    reads: list[tuple[int, ...]] = []
    kernels: dict[str, Callable[..., None]] = {}
    for k, arity in enumerate(shape):
        picks = tuple(int(i) for i in rng.integers(0, len(handles), size=arity))
        reads.append(picks)
        bias = np.float32(k / 16)

        def kernel(*args: np.ndarray, k: int = k, bias: np.float32 = bias) -> None:
            *ins, out = args
            if k == fail_at and np.isnan(ins[0]).any():
                raise ValueError(f"poisoned input reached node n{k}")
            np.multiply(ins[0], np.float32(0.5), out=out)
            for extra in ins[1:]:
                np.add(out, extra * np.float32(0.25), out=out)
            np.add(out, bias, out=out)

        kernels[f"op{k}"] = kernel
        handles.append(
            b.op(
                f"op{k}",
                *[handles[i] for i in picks],
                shape=(N,),
                dtype="float32",
                name=f"n{k}",
            )
        )
    heads = sorted({len(shape), int(rng.integers(1, len(shape) + 1))})
    b.output(*[handles[h] for h in heads])

    def ref(xv: np.ndarray) -> list[np.ndarray]:
        values = [xv]
        for k, picks in enumerate(reads):
            out = values[picks[0]] * np.float32(0.5)
            for i in picks[1:]:
                out = out + values[i] * np.float32(0.25)
            values.append(out + np.float32(k / 16))
        return [values[h] for h in heads]

    return b.build(), asyncrt.Module(kernels, kinds=("cpu", "sim")), ref


@pytest.mark.anyio
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    shape=st.lists(st.integers(1, 2), min_size=2, max_size=12),
    data=st.data(),
    device=st.sampled_from(["cpu:0", "sim:0"]),
)
async def test_failure_in_a_random_node_fails_only_its_runs(
    shape: list[int], data: st.DataObject, device: str
) -> None:
    fail_at = data.draw(st.integers(0, len(shape) - 1), label="fail_at")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    graph, lib, ref = chain_graph(shape, fail_at, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    async with graph_executor.create(
        graph, lib, device, max_contexts=3, max_streams=2
    ) as ex:
        poison = np.full(N, np.nan, np.float32)
        clean = [rng.standard_normal(N).astype(np.float32) for _ in range(12)]
        failures: list[NodeFailedError] = []

        async def good(x: np.ndarray) -> None:
            outs = await ex.run(x=x)
            assert outs is not None
            for got, want in zip(outs, ref(x), strict=True):
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)

        async def bad() -> None:
            with pytest.raises(NodeFailedError) as info:
                await ex.run(x=poison)
            failures.append(info.value)

        async with anyio.create_task_group() as tg:
            for i, x in enumerate(clean):
                tg.start_soon(good, x)
                if i % 3 == 0:
                    tg.start_soon(bad)
        assert len(failures) == 4
        for err in failures:
            # (the cause in the message: a wrong node once, in a cold full
            # run, and never again in 150 repetitions of its example)
            assert (err.node, err.op, err.device) == (
                f"n{fail_at}",
                f"op{fail_at}",
                device,
            ), f"{err!r} from {err.__cause__!r}"
            assert err.stream.startswith(device)
            assert isinstance(err.__cause__, ValueError)
        assert ex.pool.idle == ex.pool.size <= 3
        await good(clean[0])  # and the executor is still fine


@pytest.mark.anyio
async def test_a_failure_stops_the_other_streams_of_its_run() -> None:
    calls = 0

    def busy(a: np.ndarray, out: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.0005)
        np.copyto(out, a)

    def broken(a: np.ndarray, out: np.ndarray) -> None:
        raise RuntimeError("broken kernel")

    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    bad = b.op("broken", x, shape=(N,), dtype="float32", name="bad")
    h = x
    for k in range(300):
        h = b.op("busy", h, shape=(N,), dtype="float32", name=f"b{k}")
    b.output(bad, h)
    lib = asyncrt.Module({"busy": busy, "broken": broken})
    async with graph_executor.create(b.build(), lib, max_streams=2) as ex:
        assert len(ex.plan.streams) == 2
        with pytest.raises(NodeFailedError, match="'bad'") as info:
            await ex.run(x=np.ones(N, np.float32))
        assert isinstance(info.value.__cause__, RuntimeError)
        assert calls < 300  # the busy stream stopped at a check
