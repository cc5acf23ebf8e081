"""Cancelling runs at any point, and closing an executor with runs in flight:
contexts come back, threads go away, the next run is correct."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import ClosedResourceError
from asyncrt.graph import GraphBuilder

from .library_reference import library_tanh
from .test_executor import PARAMS, C, N, W, mlp_graph, reference

ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def asyncrt_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("asyncrt-"))


def gated(
    op: Callable[..., None],
) -> tuple[Callable[..., None], threading.Event, threading.Event]:
    """A kernel that signals ``started`` and then waits for ``release``."""
    started, release = threading.Event(), threading.Event()

    def kernel(*args: Any) -> None:
        started.set()
        release.wait(5)
        op(*args)

    return kernel, started, release


def relu(a: np.ndarray, out: np.ndarray) -> None:
    np.maximum(a, 0, out=out)


def tanh(a: np.ndarray, out: np.ndarray) -> None:
    library_tanh(a, out)


async def until(event: threading.Event) -> None:
    """Wait for a thread's event without blocking the loop."""
    deadline = time.monotonic() + 5
    while not event.is_set():
        assert time.monotonic() < deadline, "timed out waiting for a kernel"
        await anyio.sleep(0.001)


def assert_all_back(ex: graph_executor.GraphModule, limit: int) -> None:
    pool = ex.pool
    # 0 when every run was cancelled before its context was made (contexts
    # are made off the loop, so a cancellation can come first)
    assert 0 <= pool.size <= limit
    assert not pool.lent and pool.waiting == 0 and pool.idle == pool.size


async def assert_next_run_correct(ex: graph_executor.GraphModule) -> None:
    x = np.linspace(-2, 2, N, dtype=np.float32)
    outs = await ex.run(x=x)
    assert outs is not None
    for got, want in zip(outs, reference(x, C, W), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


# -- cancellation at random points --------------------------------------------

#: How one caller is cancelled: ("none", _, _), ("checkpoints", n, _) — after
#: n loop checkpoints — or ("timeout", _, seconds).
Cancel = tuple[str, int, float]
cancels = st.tuples(
    st.sampled_from(["none", "checkpoints", "timeout"]),
    st.integers(0, 40),
    st.floats(0.0, 0.004),
)


@pytest.mark.anyio
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    plan=st.lists(cancels, min_size=1, max_size=10),
    device=st.sampled_from(["cpu", "sim:0"]),
    limit=st.integers(1, 3),
)
async def test_cancel_at_random_points(
    plan: list[Cancel], device: str, limit: int
) -> None:
    def sleepy_relu(a: np.ndarray, out: np.ndarray) -> None:
        if a[0] > 0:  # some runs take a while
            time.sleep(0.001)
        np.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": sleepy_relu})
    before = asyncrt_threads()
    ex = graph_executor.create(mlp_graph(), lib, device, max_contexts=limit)
    async with ex:
        ex.load_params(PARAMS)
        rng = np.random.default_rng(len(plan))

        async def one(how: Cancel, x: np.ndarray) -> None:
            mode, checkpoints, seconds = how
            with anyio.CancelScope() as scope:
                if mode == "timeout":
                    scope.deadline = anyio.current_time() + seconds
                elif mode == "checkpoints":
                    tg.start_soon(cancel_after, scope, checkpoints)
                outs = await ex.run(x=x)
                assert outs is not None  # not cancelled in time: must be right
                for got, want in zip(outs, reference(x, C, W), strict=True):
                    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
            assert ex.pool.size <= limit

        async def cancel_after(scope: anyio.CancelScope, checkpoints: int) -> None:
            for _ in range(checkpoints):
                await anyio.lowlevel.checkpoint()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            for how in plan:
                tg.start_soon(one, how, rng.standard_normal(N).astype(np.float32))
        assert_all_back(ex, limit)
        assert asyncrt_threads() - before == ex.pool.size * len(ex.plan.streams)
        await assert_next_run_correct(ex)
    assert asyncrt_threads() == before


# -- each way of cancelling ----------------------------------------------------


@pytest.mark.anyio
async def test_fail_after_drains_the_kernel_and_returns_the_context() -> None:
    slow_tanh, started, release = gated(tanh)
    lib = asyncrt.Module({"tanh": slow_tanh})
    async with graph_executor.create(mlp_graph(), lib, max_contexts=1) as ex:
        ex.load_params(PARAMS)
        timer = threading.Timer(0.05, release.set)

        async def expire_once_started(scope: anyio.CancelScope) -> None:
            await until(started)  # the kernel runs: the deadline passes now
            timer.start()
            scope.deadline = anyio.current_time()

        with pytest.raises(TimeoutError), anyio.fail_after(30) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(expire_once_started, scope)
                await ex.run(x=np.ones(N, np.float32))
        assert started.is_set() and release.is_set()  # it waited for the kernel
        timer.join()
        assert_all_back(ex, 1)
        await assert_next_run_correct(ex)


@pytest.mark.anyio
async def test_cancelling_queued_callers_loses_no_context() -> None:
    slow_relu, started, release = gated(relu)
    lib = asyncrt.Module({"relu": slow_relu})
    async with graph_executor.create(mlp_graph(), lib, max_contexts=1) as ex:
        ex.load_params(PARAMS)
        x = np.ones(N, np.float32)
        results: list[str] = []

        async def holder() -> None:
            await ex.run(x=x)
            results.append("holder")

        async def queued(i: int, scope: anyio.CancelScope) -> None:
            with scope:
                await ex.run(x=x)
                results.append(f"queued{i}")

        scopes = [anyio.CancelScope() for _ in range(4)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await until(started)
            for i, scope in enumerate(scopes):  # queue them in this order
                tg.start_soon(queued, i, scope)
                while ex.pool.waiting < i + 1:
                    await anyio.lowlevel.checkpoint()
            scopes[0].cancel()
            scopes[2].cancel()
            await anyio.lowlevel.checkpoint()
            release.set()
        assert results == ["holder", "queued1", "queued3"]  # FIFO, none lost
        assert_all_back(ex, 1)


@pytest.mark.anyio
async def test_a_failing_sibling_cancels_runs_in_its_task_group() -> None:
    slow_relu, started, release = gated(relu)
    lib = asyncrt.Module({"relu": slow_relu})
    async with graph_executor.create(mlp_graph(), lib, max_contexts=2) as ex:
        ex.load_params(PARAMS)

        async def sibling() -> None:
            await until(started)
            threading.Timer(0.02, release.set).start()
            raise LookupError("sibling failed")

        with pytest.raises(BaseException) as info:
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(lambda: ex.run(x=np.ones(N, np.float32)))
                tg.start_soon(sibling)
        assert info.group_contains(LookupError)  # type: ignore[attr-defined]
        assert_all_back(ex, 2)
        await assert_next_run_correct(ex)


@pytest.mark.anyio
@ASYNCIO_ONLY
async def test_asyncio_wait_for_timeout() -> None:
    slow_tanh, started, release = gated(tanh)
    lib = asyncrt.Module({"tanh": slow_tanh})
    async with graph_executor.create(mlp_graph(), lib, max_contexts=1) as ex:
        ex.load_params(PARAMS)
        # The timeout must find the run inside its kernel, however loaded
        # the machine: it starts once the kernel has.
        running = asyncio.ensure_future(ex.run(x=np.ones(N, np.float32)))
        await until(started)
        timer = threading.Timer(0.05, release.set)
        timer.start()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(running, timeout=0.01)
        timer.join()
        assert running.cancelled()
        assert_all_back(ex, 1)
        await assert_next_run_correct(ex)


@pytest.mark.anyio
@ASYNCIO_ONLY
async def test_asyncio_task_cancel() -> None:
    slow_relu, started, release = gated(relu)
    lib = asyncrt.Module({"relu": slow_relu})
    async with graph_executor.create(mlp_graph(), lib, max_contexts=2) as ex:
        ex.load_params(PARAMS)
        running = asyncio.ensure_future(ex.run(x=np.ones(N, np.float32)))
        await until(started)
        waiting = [asyncio.ensure_future(ex.run(x=np.ones(N, np.float32)))]
        await asyncio.sleep(0)
        running.cancel()
        waiting[0].cancel()
        threading.Timer(0.02, release.set).start()
        for task in (running, *waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert_all_back(ex, 2)
        await assert_next_run_correct(ex)


# -- closing with runs in flight -------------------------------------------------


@pytest.mark.anyio
async def test_close_from_another_task_stops_runs_in_flight() -> None:
    calls = 0
    streams: set[str] = set()
    started = threading.Event()  # both runs' streams are at work

    def busy(a: np.ndarray, out: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        streams.add(threading.current_thread().name)
        if len(streams) == 2:
            started.set()
        time.sleep(0.001)
        np.copyto(out, a)

    b = GraphBuilder()
    h = b.input("x", shape=(N,), dtype="float32")
    for k in range(400):
        h = b.op("busy", h, shape=(N,), dtype="float32", name=f"b{k}")
    b.output(h)
    before = asyncrt_threads()
    ex = graph_executor.create(
        b.build(), asyncrt.Module({"busy": busy}), max_contexts=2
    )
    outcomes: list[str] = []

    async def one() -> None:
        try:
            await ex.run(x=np.ones(N, np.float32))
            outcomes.append("done")
        except ClosedResourceError as exc:
            outcomes.append(str(exc))

    async with anyio.create_task_group() as tg:
        for _ in range(5):  # two run, three wait for a context
            tg.start_soon(one)
        await until(started)
        ex.close()
    assert sorted(outcomes) == sorted(
        ["the executor was closed while this run was in flight"] * 2
        + ["the executor was closed while waiting"] * 3
    )
    assert calls < 2 * 400  # the runs stopped launching
    assert ex.pool.size == 0 and asyncrt_threads() == before
    with pytest.raises(ClosedResourceError, match="executor is closed"):
        await ex.run(x=np.ones(N, np.float32))


@pytest.mark.anyio
async def test_leaving_async_with_waits_for_runs_in_flight() -> None:
    slow_relu, started, release = gated(relu)
    lib = asyncrt.Module({"relu": slow_relu})
    before = asyncrt_threads()
    errors: list[BaseException] = []

    async def one(ex: graph_executor.GraphModule) -> None:
        try:
            await ex.run(x=np.ones(N, np.float32))
        except ClosedResourceError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        async with graph_executor.create(mlp_graph(), lib, max_contexts=1) as ex:
            ex.load_params(PARAMS)
            tg.start_soon(one, ex)
            tg.start_soon(one, ex)
            await until(started)
            threading.Timer(0.02, release.set).start()
        # aclose() returned: both runs are over and every thread is gone
        assert len(errors) == 2 and ex.closed
        assert asyncrt_threads() == before


@pytest.mark.anyio
async def test_close_during_a_stateful_run() -> None:
    slow_relu, started, release = gated(relu)
    lib = asyncrt.Module({"relu": slow_relu})
    before = asyncrt_threads()
    ex = graph_executor.create(mlp_graph(), lib)
    ex.load_params(PARAMS)
    ex.set_input("x", np.ones(N, np.float32))
    failed: list[BaseException] = []

    async def stateful() -> None:
        try:
            await ex.run()
        except ClosedResourceError as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stateful)
        await until(started)
        threading.Timer(0.02, release.set).start()
        await ex.aclose()
        assert failed and asyncrt_threads() == before
