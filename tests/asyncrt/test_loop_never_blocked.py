"""The event loop is never held: first runs, pool growth, new shape
signatures, cancellation and close do their heavy work (context builds,
planning, allocation, waits) off the loop's thread, and an executor over
remote devices works with Dask's scheduler in the application's own loop."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder

from ..loopwatch import loop_watch

N = 64


def chain(device: str | None = None) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape=(N, N), dtype="float32")
    w = b.param("w", shape=(N, N), dtype="float32")
    h = b.op("matmul", x, w, shape=(N, N), dtype="float32", name="mm")
    h = b.op("tanh", h, shape=(N, N), dtype="float32", name="t", device=device)
    b.output(b.op("relu", h, shape=(N, N), dtype="float32", name="r"))
    return b.build()


W = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32) / 8


def reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(np.tanh(x @ W), 0)


@pytest.mark.anyio
async def test_first_runs_and_pool_growth_do_not_hold_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ex = graph_executor.create(
        chain("sim:0"), None, ["cpu", "sim:0"], params={"w": W}, max_contexts=4
    )
    xs = [np.full((N, N), i / 10, np.float32) for i in range(8)]
    async with loop_watch(monkeypatch):
        async with anyio.create_task_group() as tg:
            for x in xs:  # eight callers at once: the pool grows to four
                tg.start_soon(_check_run, ex, x)
        assert ex.pool.size == 4
        await ex.aclose()


async def _check_run(ex: graph_executor.GraphModule, x: np.ndarray) -> None:
    (out,) = await ex.run(x=x)
    np.testing.assert_allclose(out.numpy(), reference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
async def test_cancelled_and_closed_runs_do_not_hold_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = threading.Event()

    def slow_relu(a: np.ndarray, out: np.ndarray) -> None:
        started.set()
        time.sleep(0.02)
        np.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": slow_relu})
    ex = graph_executor.create(chain(), lib, "cpu", params={"w": W}, max_contexts=2)
    x = np.ones((N, N), np.float32)
    async with loop_watch(monkeypatch):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_check_run, ex, x)
                while not started.is_set():
                    await anyio.sleep(0.001)
                scope.cancel()
        await _check_run(ex, x)  # the executor serves the next run

        async def doomed() -> None:
            with pytest.raises(asyncrt.errors.ClosedResourceError):
                await ex.run(x=x)

        started.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            while not started.is_set():
                await anyio.sleep(0.001)
            await ex.aclose()  # closed with a run in flight


@pytest.mark.anyio
async def test_new_shape_signatures_are_built_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("onnx")
    from asyncrt.frontend import from_onnx

    from .frontend.symbolic_models import bert_encoder, bert_feed

    graph, params = from_onnx(bert_encoder())
    ex = graph_executor.create(graph, params=params, max_contexts=2)
    async with loop_watch(monkeypatch):
        async with anyio.create_task_group() as tg:
            for batch, seq in [(1, 4), (2, 4), (1, 4), (3, 9)]:
                tg.start_soon(_run_feed, ex, bert_feed(batch, seq))
        await ex.aclose()
    stats = ex.plan_cache_stats()
    assert stats is not None and stats.builds == 3


async def _run_feed(ex: graph_executor.GraphModule, feed: dict[str, Any]) -> None:
    outputs = await ex.run(**feed)
    assert all(np.isfinite(o.numpy()).all() for o in outputs)


@pytest.fixture
def anyio_backend() -> str:
    """Dask's scheduler runs on asyncio only (this module's remote test)."""
    return "asyncio"


@pytest.mark.anyio
async def test_remote_devices_with_the_scheduler_in_our_own_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    distributed = pytest.importorskip("distributed")
    from devices import remote

    async with distributed.LocalCluster(
        n_workers=1,
        processes=False,  # the workers too run in this loop
        protocol="tcp",  # reachable by asyncrt's own (synchronous) client
        threads_per_worker=1,
        asynchronous=True,
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        # connect() blocks (it measures the links): off the loop, which the
        # scheduler needs.
        conn = await anyio.to_thread.run_sync(remote.connect, cluster.scheduler_address)
        try:
            (r0,) = conn.devices
            ex = graph_executor.create(
                chain(str(r0)), None, ["cpu", r0], params={"w": W}, max_contexts=2
            )
            async with loop_watch(monkeypatch, max_gap=2.0):
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for i in range(4):
                            x = np.full((N, N), i / 10, np.float32)
                            tg.start_soon(_check_run, ex, x)
                    await ex.aclose()
        finally:
            await anyio.to_thread.run_sync(conn.close)
