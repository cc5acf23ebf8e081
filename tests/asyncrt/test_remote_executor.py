"""The graph executor across cpu:0 and two remote devices (a local Dask
cluster of two worker processes, one per module).

The last test kills a worker mid-run; the tests before it use both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from asyncrt import Module, graph_executor
from asyncrt.errors import (
    DeviceLostError,
    KernelNotFoundError,
    NodeFailedError,
    RemoteError,
)
from asyncrt.graph import Graph, GraphBuilder
from devices import Device, remote
from tests import remote_kernels

from .library_reference import library_exp, library_tanh

distributed = pytest.importorskip("distributed")

CPU, R0, R1 = Device("cpu", 0), Device("remote", 0), Device("remote", 1)
N = 32
TIMEOUT = 30.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed.py"


@pytest.fixture(scope="module")
def conn() -> Iterator[remote.Connection]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # any free port: 8787 may be taken
    )
    try:
        with remote.connect(cluster.scheduler_address) as connection:
            yield connection
    finally:
        cluster.close()


def split_graph(
    middle: str = "tanh",
    *,
    branch_a: str = "remote:0",
    branch_b: str = "remote:1",
    middle_device: str | None = None,
) -> Graph:
    """Two branches (on the two workers by default), a join, then the cpu::

    x -> matmul(w) -> relu    (branch_a) -.
    x -> matmul(w) -> middle  (branch_b) -+-> add (branch_b) -> exp (cpu:0)
    x -> negative (cpu:0) ------------------------------------------^ add
    """
    b = GraphBuilder()
    x = b.input("x", shape=(N, N), dtype="float32")
    w = b.input("w", shape=(N, N), dtype="float32")
    spec: dict[str, Any] = {"shape": (N, N), "dtype": "float32"}
    a = b.op("matmul", x, w, name="mm_a", device=branch_a, **spec)
    a = b.op("relu", a, name="relu_a", device=branch_a, **spec)
    c = b.op("matmul", x, w, name="mm_b", device=branch_b, **spec)
    c = b.op(middle, c, name="mid_b", device=middle_device or branch_b, **spec)
    j = b.op("add", a, c, name="join", device=branch_b, **spec)
    j = b.op("exp", j, name="exp", device="cpu:0", **spec)
    n = b.op("negative", x, name="neg", device="cpu:0", **spec)
    b.output(b.op("add", j, n, name="out", device="cpu:0", **spec))
    return b.build()


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    h = x @ w
    return library_exp(np.maximum(h, 0) + library_tanh(h)) - x


def inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((N, N)).astype(np.float32) / 4,
        "w": rng.standard_normal((N, N)).astype(np.float32) / 4,
    }


@pytest.mark.anyio
async def test_split_graph_matches_a_local_run(conn: remote.Connection) -> None:
    given = inputs(0)
    with graph_executor.create(split_graph(), None, [CPU, R0, R1]) as ex:
        plan = str(ex.plan)
        assert "on remote:0" in plan and "on remote:1" in plan
        assert {ex.plan.placement[n] for n in ex.plan.placement} == {CPU, R0, R1}
        with anyio.fail_after(TIMEOUT):
            out = await ex.run(**given)
    local_graph = split_graph(branch_a="cpu:0", branch_b="cpu:0")
    with graph_executor.create(local_graph, None, CPU) as local:
        expected = await local.run(**given)
    assert expected is not None and out is not None
    np.testing.assert_allclose(out[0].numpy(), expected[0].numpy(), rtol=1e-5)
    np.testing.assert_allclose(out[0].numpy(), reference(**given), rtol=1e-5)


@pytest.mark.anyio
async def test_concurrent_runs(conn: remote.Connection) -> None:
    results: dict[int, np.ndarray] = {}
    with graph_executor.create(
        split_graph(), None, [CPU, R0, R1], max_contexts=3
    ) as ex:

        async def one(seed: int) -> None:
            out = await ex.run(**inputs(seed))
            assert out is not None
            results[seed] = out[0].numpy()

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for seed in range(6):
                    tg.start_soon(one, seed)
    for seed, got in results.items():
        np.testing.assert_allclose(got, reference(**inputs(seed)), rtol=1e-5)
    assert len(results) == 6


def test_stateful_run_sync(conn: remote.Connection) -> None:
    given = inputs(1)
    with graph_executor.create(split_graph(), None, [CPU, R0, R1]) as ex:
        ex.set_input(**given)
        ex.run_sync()
        got = ex.get_output(0).numpy()
    np.testing.assert_allclose(got, reference(**given), rtol=1e-5)


@pytest.mark.anyio
async def test_a_failing_remote_kernel_names_its_node(conn: remote.Connection) -> None:
    graph = split_graph(middle="boom")
    with graph_executor.create(graph, None, [CPU, R0, R1]) as ex:
        for _ in range(2):  # and the executor stays usable
            with anyio.fail_after(TIMEOUT), pytest.raises(NodeFailedError) as info:
                await ex.run(**inputs(2))
            error = info.value
            assert (error.node, error.op, error.device) == ("mid_b", "boom", "remote:1")
            assert error.stream.startswith("remote:1/")
            cause = error.__cause__
            assert isinstance(cause, RemoteError)
            assert cause.type_name == "ValueError"
            assert cause.worker == conn.workers[R1]
            assert "boom on purpose" in cause.remote_traceback


def test_kernels_only_a_lib_provides_stay_local(conn: remote.Connection) -> None:
    def private_tanh(x: Any, out: Any) -> None:
        np.tanh(x, out)

    lib = Module({"private_tanh": private_tanh}, kinds=("cpu",))
    with pytest.raises(
        KernelNotFoundError,
        match=r"'private_tanh' for node 'mid_b' \(pinned to remote:1\)",
    ):
        graph_executor.create(split_graph(middle="private_tanh"), lib, [CPU, R0, R1])
    graph = split_graph(middle="private_tanh", middle_device="cpu:0")
    with graph_executor.create(graph, lib, [CPU, R0, R1]) as ex:
        out = ex.run_sync(**inputs(3))
    assert out is not None
    np.testing.assert_allclose(out[0].numpy(), reference(**inputs(3)), rtol=1e-5)


def test_the_example_runs() -> None:
    """``examples/distributed.py``: its own cluster, plan printed, checked."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stream 1 on remote:" in done.stdout
    assert "max |error| over all runs" in done.stdout


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_worker_killed_mid_run(conn: remote.Connection) -> None:
    """Last: it leaves remote:1 dead for good."""
    given = inputs(4)
    on_r0 = split_graph(branch_b="remote:0")
    survivor = graph_executor.create(on_r0, None, [CPU, R0])
    doomed = graph_executor.create(split_graph(middle="hang"), None, [CPU, R0, R1])
    started = distributed.Event(remote_kernels.HANG_STARTED, client=conn.client)
    pid = conn.client.run(os.getpid, workers=[conn.workers[R1]])[conn.workers[R1]]
    failure: list[BaseException] = []
    survived: list[np.ndarray] = []

    async def run_doomed() -> None:
        with pytest.raises(NodeFailedError) as info:
            await doomed.run(**given)
        failure.append(info.value)

    async def run_survivor() -> None:  # in flight on remote:0 meanwhile
        out = await survivor.run(**given)
        assert out is not None
        survived.append(out[0].numpy())

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_doomed)
            assert await anyio.to_thread.run_sync(started.wait, TIMEOUT)
            tg.start_soon(run_survivor)
            os.kill(pid, signal.SIGKILL)
    np.testing.assert_allclose(survived[0], reference(**given), rtol=1e-5)
    error = failure[0]
    assert error.device == "remote:1"
    assert error.node in ("mm_b", "mid_b")  # the task in flight
    cause = error.__cause__
    assert isinstance(cause, DeviceLostError)
    assert cause.device == "remote:1" and cause.worker == conn.workers[R1]
    assert conn.workers[R1] in str(cause)
    assert R1 in conn.lost and conn.live_devices() == (R0,)

    with anyio.fail_after(TIMEOUT):
        # The same executor fails fast, never hangs...
        with pytest.raises(NodeFailedError) as again:
            await doomed.run(**given)
        assert isinstance(again.value.__cause__, DeviceLostError)
        doomed.close()
        # ... one that never used the dead worker goes on ...
        out = await survivor.run(**given)
        assert out is not None
        np.testing.assert_allclose(out[0].numpy(), reference(**given), rtol=1e-5)
        survivor.close()
        # ... and so does a new one on the remaining devices.
        live = [CPU, *conn.live_devices()]
        with graph_executor.create(on_r0, None, live) as ex:
            out = await ex.run(**given)
    assert out is not None
    np.testing.assert_allclose(out[0].numpy(), reference(**given), rtol=1e-5)
