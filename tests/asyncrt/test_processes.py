"""Process-backed executors (``create(..., processes=True)``): each pooled run
context lives in a worker process. Concurrent runs get their own correct
outputs; kernel failures, out-of-memory errors, cancellation, a killed
worker, a worker that cannot start and closing with runs in flight all end
in a clear error or a correct result, with no worker process left behind."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
import asyncrt.runtime._process
from asyncrt import graph_executor
from asyncrt.errors import (
    ArgumentError,
    ClosedResourceError,
    NodeFailedError,
    NodeOutOfMemoryError,
    WorkerError,
)
from asyncrt.graph import Graph, GraphBuilder
from asyncrt.runtime._process import ProcessContext

from ..process_kernels import NAP_SECONDS, NAP_STARTED, TRIGGER

N = 8
KERNELS = ("tests.process_kernels",)
TRIGGERED = np.full(N, TRIGGER + 100, dtype=np.float32)  # naps the longest
X = np.linspace(-1, 1, N, dtype=np.float32)  # an ordinary input


def graph(kernel: str) -> Graph:
    """x -> kernel (a ReLU unless triggered) -> y; tanh(y) * c -> z."""
    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    c = b.param("c", shape=(N,), dtype="float32")
    y = b.op(kernel, x, shape=(N,), dtype="float32", name="k0")
    t = b.op("tanh", y, shape=(N,), dtype="float32", name="tanh0")
    z = b.op("multiply", t, c, shape=(N,), dtype="float32", name="mul0")
    b.output(y, z)
    return b.build()


C = np.linspace(0.5, 2.0, N, dtype=np.float32)


def reference(x: np.ndarray) -> list[np.ndarray]:
    y = np.maximum(x, 0)
    return [y, np.tanh(y) * C]


def make(kernel: str = "relu", **kwargs: Any) -> graph_executor.GraphModule:
    options: dict[str, Any] = {
        "max_contexts": 2,
        "processes": True,
        "worker_imports": KERNELS,
        # No kernel-set timing before the first run (test_blas_choice.py
        # tests it): these tests are about the workers themselves.
        "worker_blas": "default",
    }
    options.update(kwargs)
    return graph_executor.create(
        graph(kernel), None, options.pop("devices", "cpu"), params={"c": C}, **options
    )


def check(outs: list[Any] | None, x: np.ndarray) -> None:
    assert outs is not None
    for got, want in zip(outs, reference(x), strict=True):
        np.testing.assert_allclose(
            got if isinstance(got, np.ndarray) else got.numpy(), want, rtol=1e-6
        )


def worker_pids() -> set[int]:
    """This process's children running the worker module (Linux /proc)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"asyncrt.runtime._process_worker" in cmdline:
            pids.add(int(entry.name))
    return pids


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    """Fail a test that leaves a worker process running."""
    if not Path("/proc/self/stat").exists():  # pragma: no cover - not Linux
        pytest.skip("needs /proc to find worker processes")
    before = worker_pids()
    yield
    assert worker_pids() - before == set()


async def started_worker(ex: graph_executor.GraphModule) -> int:
    """Run once, checked (so the executor's one worker is up); its pid."""
    check(await ex.run(x=X), X)
    (pid,) = worker_pids()
    return pid


async def closed_while_napping(
    ex: graph_executor.GraphModule, errors: list[ClosedResourceError]
) -> None:
    """Run a long nap, expecting the executor to close meanwhile: the
    :class:`ClosedResourceError` goes to ``errors``."""
    try:
        await ex.run(x=TRIGGERED)
    except ClosedResourceError as exc:
        errors.append(exc)


async def signal_when_lent(
    ex: graph_executor.GraphModule, pid: int, signum: signal.Signals
) -> None:
    """Send ``signum`` to worker ``pid`` once a run has borrowed a context."""
    while not ex.pool.lent:
        await anyio.sleep(0)
    os.kill(pid, signum)


@pytest.mark.anyio
@pytest.mark.parametrize("device", ["cpu", "sim:0"])
async def test_concurrent_runs_get_their_own_outputs(device: str) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(N).astype(np.float32) for _ in range(40)]
    results: list[Any] = [None] * len(xs)
    async with make(devices=device) as ex:

        async def one(i: int) -> None:
            if i % 4 == 0:  # some callers bring their own arrays
                out = [np.empty(N, np.float32), np.empty(N, np.float32)]
                results[i] = await ex.run(x=xs[i], out=out)
            else:
                results[i] = await ex.run(x=xs[i])

        async with anyio.create_task_group() as group:
            for i in range(len(xs)):
                group.start_soon(one, i)
        for x, outs in zip(xs, results, strict=True):
            check(outs, x)
        assert 1 <= ex.pool.size <= 2
        assert len(worker_pids()) == ex.pool.size
        assert results[1][0].device == asyncrt.device(device)  # the host side


@pytest.mark.anyio
async def test_kernel_failure_names_the_node_and_keeps_the_worker() -> None:
    async with make("test_boom_relu", max_contexts=1) as ex:
        with pytest.raises(NodeFailedError) as info:
            await ex.run(x=TRIGGERED)
        error = info.value
        assert (error.node, error.op, error.device) == ("k0", "test_boom_relu", "cpu:0")
        assert isinstance(error.__cause__, ValueError)
        assert "boom on purpose" in str(error.__cause__)
        assert "boom on purpose" in str(error)  # the reason in the message
        pids = worker_pids()
        x = np.linspace(-1, 1, N, dtype=np.float32)
        check(await ex.run(x=x), x)
        assert worker_pids() == pids  # the same worker served the next run


@pytest.mark.anyio
async def test_out_of_memory_in_a_worker_is_a_node_oom_error() -> None:
    async with make("test_oom_relu", max_contexts=1) as ex:
        with pytest.raises(NodeOutOfMemoryError) as info:
            await ex.run(x=TRIGGERED)
        assert info.value.node == "k0"
        assert info.value.requested == 1 << 40 and info.value.device == "cpu:0"
        x = np.ones(N, dtype=np.float32)
        check(await ex.run(x=x), x)


@pytest.mark.anyio
async def test_cancelled_runs_drain_and_the_next_run_is_correct() -> None:
    rng = np.random.default_rng(5)
    async with make("test_nap_relu", max_contexts=1) as ex:
        x = np.zeros(N, dtype=np.float32)
        check(await ex.run(x=x), x)  # the worker is up
        pids = worker_pids()
        for _ in range(3):
            with anyio.move_on_after(float(rng.uniform(0.0, 0.05))) as scope:
                await ex.run(x=TRIGGERED)
            assert scope.cancelled_caught
            assert not ex.pool.lent and ex.pool.idle == 1
            x = rng.standard_normal(N).astype(np.float32)
            check(await ex.run(x=x), x)
        assert worker_pids() == pids  # cancelling never cost a worker


@pytest.mark.anyio
async def test_random_cancellations_never_lose_a_context_or_a_worker() -> None:
    rng = np.random.default_rng(11)
    async with make("test_nap_relu", max_contexts=2) as ex:
        results: dict[int, Any] = {}

        async def one(i: int, x: np.ndarray, timeout: float | None) -> None:
            with anyio.move_on_after(timeout if timeout is not None else 60):
                results[i] = (x, await ex.run(x=x))

        for _ in range(12):
            results.clear()
            async with anyio.create_task_group() as group:
                for i in range(4):
                    x = rng.standard_normal(N).astype(np.float32)
                    if rng.random() < 0.5:  # a nap of 1 to 30 ms
                        x[0] = TRIGGER + rng.uniform(0.1, 3.0)
                    cancel = rng.random() < 0.5
                    timeout = rng.uniform(0, 0.02) if cancel else None
                    group.start_soon(one, i, x, timeout)
            for x, outs in results.values():
                check(outs, x)
            assert not ex.pool.lent and ex.pool.idle == ex.pool.size <= 2
            assert len(worker_pids()) == ex.pool.size
        x = np.linspace(-3, 3, N, dtype=np.float32)
        check(await ex.run(x=x), x)


@pytest.mark.anyio
async def test_a_killed_worker_fails_its_run_and_is_replaced() -> None:
    async with make("test_nap_relu", max_contexts=1) as ex:
        old = await started_worker(ex)
        async with anyio.create_task_group() as group:
            group.start_soon(signal_when_lent, ex, old, signal.SIGKILL)
            with pytest.raises(WorkerError, match="exited with code -9"):
                await ex.run(x=TRIGGERED)
        assert ex.pool.size == 0  # the dead worker's context was dropped
        check(await ex.run(x=X), X)
        assert worker_pids() - {old}


@pytest.mark.anyio
async def test_a_worker_that_cannot_start_says_why() -> None:
    async with make(worker_imports=("asyncrt_no_such_module",)) as ex:
        for _ in range(2):  # every attempt fails the same clear way
            with pytest.raises(WorkerError, match="could not start") as info:
                await ex.run(x=np.zeros(N, dtype=np.float32))
            assert "asyncrt_no_such_module" in str(info.value.__cause__)
            assert ex.pool.size == 0


@pytest.mark.anyio
async def test_a_worker_without_the_kernel_module_names_the_kernel() -> None:
    async with make("test_nap_relu", worker_imports=()) as ex:
        with pytest.raises(WorkerError) as info:
            await ex.run(x=np.zeros(N, dtype=np.float32))
        assert "test_nap_relu" in str(info.value.__cause__)


@pytest.mark.anyio
async def test_close_with_runs_in_flight_stops_them() -> None:
    ex = make("test_nap_relu", max_contexts=2)
    x = np.zeros(N, dtype=np.float32)
    check(await ex.run(x=x), x)
    errors: list[ClosedResourceError] = []

    with anyio.fail_after(NAP_SECONDS * 10):
        async with anyio.create_task_group() as group:
            group.start_soon(closed_while_napping, ex, errors)
            group.start_soon(closed_while_napping, ex, errors)
            while len(ex.pool.lent) < 2:
                await anyio.sleep(0)
            await ex.aclose()
    assert len(errors) == 2
    with pytest.raises(ClosedResourceError):
        await ex.run(x=x)


def test_arguments_are_checked() -> None:
    with pytest.raises(ArgumentError, match="lib must be None"):
        graph_executor.create(graph("relu"), asyncrt.Module(), processes=True)
    with pytest.raises(ArgumentError, match="worker_nice"):
        graph_executor.create(graph("relu"), None, processes=True, worker_nice=20)


@pytest.mark.anyio
async def test_parameters_loaded_later_reach_new_workers() -> None:
    async with make(max_contexts=1) as ex:
        x = np.linspace(-1, 1, N, dtype=np.float32)
        check(await ex.run(x=x), x)
        ex.load_params({"c": C * 2})
        outs = await ex.run(x=x)
        assert outs is not None
        np.testing.assert_allclose(
            outs[1].numpy(), np.tanh(np.maximum(x, 0)) * C * 2, rtol=1e-6
        )


@pytest.mark.anyio
@pytest.mark.parametrize(("model", "fuse"), [("small_cnn", False), ("encoder", True)])
async def test_onnx_models_run_in_workers_as_onnx_runtime_does(
    model: str, fuse: bool
) -> None:
    """The kernels an ONNX import configures (``conv.<digest>``, ...) are
    made again in each worker from the graph's own data."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from asyncrt.frontend import from_onnx

    from .frontend.models import encoder_block, small_cnn

    proto, shape = {
        "small_cnn": (small_cnn, (2, 3, 16, 16)),
        "encoder": (encoder_block, (2, 8, 32)),
    }[model]
    onnx_model = proto()
    graph, params = from_onnx(onnx_model)
    assert any("." in n.func_name for n in graph.nodes if not n.is_null)
    session = ort.InferenceSession(
        onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    with graph_executor.create(graph, None, "cpu", params=params, fuse=fuse) as ex:
        here = [(ex.run_sync(x=x) or [])[0].numpy() for x in xs]
    async with graph_executor.create(
        graph.to_json(),  # the workers get nothing else
        None,
        "cpu",
        params=params,
        fuse=fuse,
        processes=True,
        max_contexts=2,
        worker_blas="default",
    ) as ex:
        results: list[Any] = [None] * len(xs)

        async def one(i: int) -> None:
            results[i] = await ex.run(x=xs[i])

        async with anyio.create_task_group() as group:
            for i in range(len(xs)):
                group.start_soon(one, i)
    for x, outs, mine in zip(xs, results, here, strict=True):
        (y,) = outs
        np.testing.assert_allclose(y.numpy(), mine, rtol=1e-6, atol=1e-7)
        (expected,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_coroutine_kernels_run_on_the_workers_event_loop() -> None:
    async with make("test_async_relu", max_contexts=1) as ex:
        x = np.linspace(-1, 1, N, dtype=np.float32)
        check(await ex.run(x=x), x)
        pids = worker_pids()
        with anyio.move_on_after(0.05) as scope:
            await ex.run(x=TRIGGERED)  # naps 0.5 s on the worker's loop
        assert scope.cancelled_caught
        check(await ex.run(x=x), x)
        assert worker_pids() == pids


def thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of process ``pid`` (Linux /proc)."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        values.add(int(fields[16]))  # field 19 of stat, counted after comm
    return values


@pytest.mark.anyio
async def test_worker_nice_applies_to_every_worker_thread() -> None:
    async with make(max_contexts=1, worker_nice=5) as ex:
        pid = await started_worker(ex)
        assert thread_niceness(pid) == {os.getpriority(os.PRIO_PROCESS, 0) + 5}


class Interrupt(BaseException):
    """Stands for an interruption that is not a cancellation (as trio
    delivers ``KeyboardInterrupt`` at a checkpoint)."""


@pytest.mark.anyio
async def test_an_unread_answer_is_never_taken_for_a_later_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with make("test_nap_relu", max_contexts=1) as ex:
        x = np.zeros(N, dtype=np.float32)
        check(await ex.run(x=x), x)
        receive = ProcessContext.receive

        async def interrupted(self: ProcessContext) -> Any:
            monkeypatch.setattr(ProcessContext, "receive", receive)
            raise Interrupt

        monkeypatch.setattr(ProcessContext, "receive", interrupted)
        with pytest.raises(Interrupt):
            await ex.run(x=TRIGGERED)  # its answer is never read
        assert ex.pool.size == 0  # so its context was dropped
        for value in (3.0, -2.0, 5.0):
            x = np.full(N, value, dtype=np.float32)
            check(await ex.run(x=x), x)


@pytest.mark.anyio
async def test_sigint_to_a_worker_leaves_its_run_alone() -> None:
    async with make("test_nap_relu", max_contexts=1) as ex:
        pid = await started_worker(ex)
        x = TRIGGERED.copy()
        async with anyio.create_task_group() as group:
            group.start_soon(signal_when_lent, ex, pid, signal.SIGINT)
            check(await ex.run(x=x), x)
        assert worker_pids() == {pid}


async def nap_started(mark: Path) -> None:
    """Wait until a worker's nap kernel has created ``mark``."""
    with anyio.fail_after(10):
        while not mark.exists():
            await anyio.sleep(0.001)
    mark.unlink()


@pytest.mark.anyio
async def test_a_worker_that_does_not_drain_is_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(asyncrt.runtime._process, "EXIT_TIMEOUT", 0.1)
    mark = tmp_path / "napping"
    worker_env = {NAP_STARTED: str(mark)}
    async with make("test_nap_relu", max_contexts=1, worker_env=worker_env) as ex:
        old = await started_worker(ex)
        async with anyio.create_task_group() as group:
            group.start_soon(partial(ex.run, x=TRIGGERED))
            await nap_started(mark)  # 0.5 s to go: no drain within 0.1 s
            group.cancel_scope.cancel()
        assert ex.pool.size == 0  # killed, and dropped
        check(await ex.run(x=X), X)
        assert old not in worker_pids()
        # close() stops a run the same way, and kills what does not drain
        errors: list[ClosedResourceError] = []

        async with anyio.create_task_group() as group:
            group.start_soon(closed_while_napping, ex, errors)
            await nap_started(mark)
            await ex.aclose()
        assert len(errors) == 1 and "killed" in str(errors[0].__cause__)


@pytest.mark.anyio
async def test_setting_a_parameter_reaches_the_workers() -> None:
    async with make(max_contexts=1) as ex:
        x = np.linspace(-1, 1, N, dtype=np.float32)
        check(await ex.run(x=x), x)
        ex.set_input("c", C * 100)
        outs = await ex.run(x=x)
        assert outs is not None
        np.testing.assert_allclose(
            outs[1].numpy(), np.tanh(np.maximum(x, 0)) * C * 100, rtol=1e-6
        )


def test_the_spec_crosses_as_json_and_params_without_pickles() -> None:
    from asyncrt.runtime._process_wire import IoLayout, WorkerSpec
    from devices import process_state, sim

    sim.configure(2, [sim.SimConfig(), sim.SimConfig(flops=1e9, memory_bandwidth=2e9)])

    spec = WorkerSpec(
        graph=graph("relu").to_json(),
        params={"c": C},
        devices=("cpu:0", "sim:1"),
        placement={0: "cpu:0", 3: "sim:1"},
        options={"max_streams": 2, "fuse": "numpy", "kernel_threads": 1},
        imports=KERNELS,
        layout=IoLayout.of({"x": ((N,), "float32")}, [((N,), "float32")] * 2),
        nice=5,
        device_state=process_state(),
    )
    again = WorkerSpec.from_bytes(spec.to_bytes())
    np.testing.assert_array_equal(again.params["c"], C)
    assert dataclasses.replace(again, params=spec.params) == spec


def test_errors_cross_as_data() -> None:
    from asyncrt.errors import InputError, OutOfMemoryError, RemoteError
    from asyncrt.runtime._process_wire import decode, decode_error, encode, encode_error

    class Custom(Exception):
        pass

    def round_trip(exc: BaseException) -> BaseException:
        try:
            raise exc
        except BaseException as raised:
            return decode_error(decode(encode(encode_error(raised))), "worker 7")

    value = round_trip(ValueError("bad value"))
    assert type(value) is ValueError and str(value) == "bad value"
    assert isinstance(round_trip(InputError("no input 'y'")), InputError)
    oom = round_trip(OutOfMemoryError("sim:0", 1024, 16))
    assert isinstance(oom, OutOfMemoryError) and oom.requested == 1024
    custom = round_trip(Custom("mine"))
    assert isinstance(custom, RemoteError) and custom.type_name.endswith("Custom")
    assert "mine" in str(custom) and "raise exc" in custom.remote_traceback


def test_workers_share_the_cores_by_default() -> None:
    from asyncrt.runtime import _threads as _threads
    from asyncrt.runtime._backends import WorkerProcesses

    with make(max_contexts=2) as ex:  # kernel_threads="auto"
        backend = ex.core.backend
        assert isinstance(backend, WorkerProcesses)
        spec = backend.worker_spec(ex.core.compiled, ex.core.parameters)
        threads = max(1, _threads.available_cores() // 2)
        assert spec.options["kernel_threads"] == threads


@pytest.mark.anyio
async def test_workers_share_our_session_but_not_our_process_group() -> None:
    # Same session: under autogroup scheduling, worker_nice then counts
    # against this process. Own group: a terminal's Ctrl-C reaches us only.
    async with make(max_contexts=1) as ex:
        pid = await started_worker(ex)
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpgid(pid) == pid != os.getpgid(0)
