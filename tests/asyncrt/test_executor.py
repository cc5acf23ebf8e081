"""The graph executor: TVM's GraphModule API, `await run()`, errors, failures,
cancellation and concurrent callers."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import (
    BusyError,
    ClosedResourceError,
    InputError,
    KernelNotFoundError,
    NodeFailedError,
)
from asyncrt.graph import Graph, GraphBuilder

from .library_reference import library_tanh

N = 8


def mlp_graph(device: str | None = None) -> Graph:
    """x -> add(c) -> relu -> multiply(w) -> tanh, plus a side output."""
    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    c = b.param("c", shape=(N,), dtype="float32")
    w = b.param("w", shape=(N,), dtype="float32")
    kw: dict[str, Any] = {} if device is None else {"device": device}
    h = b.op("add", x, c, shape=(N,), dtype="float32", name="add0", **kw)
    r = b.op("relu", h, shape=(N,), dtype="float32", name="relu0", **kw)
    m = b.op("multiply", r, w, shape=(N,), dtype="float32", name="mul0", **kw)
    t = b.op("tanh", m, shape=(N,), dtype="float32", name="tanh0", **kw)
    s = b.op("subtract", t, x, shape=(N,), dtype="float32", name="sub0", **kw)
    b.output(t, s)
    return b.build()


def reference(x: np.ndarray, c: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    t = library_tanh(np.maximum(x + c, 0) * w)
    return [t, t - x]


RNG = np.random.default_rng(7)
C = RNG.standard_normal(N).astype(np.float32)
W = RNG.standard_normal(N).astype(np.float32)
PARAMS = {"c": C, "w": W}


def make(device: str = "cpu", **kwargs: Any) -> graph_executor.GraphModule:
    ex = graph_executor.create(mlp_graph(), None, device, **kwargs)
    ex.load_params(asyncrt.save_param_dict(PARAMS))
    return ex


@pytest.mark.anyio
@pytest.mark.parametrize("device", ["cpu", "sim:0", "sim:1"])
async def test_run_with_inputs_returns_fresh_outputs(device: str) -> None:
    with make(device) as ex:
        x = RNG.standard_normal(N).astype(np.float32)
        outs = await ex.run(x=x)
        assert outs is not None and len(outs) == 2
        for got, want in zip(outs, reference(x, C, W), strict=True):
            assert got.device == asyncrt.device(device)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
        first = outs[0].numpy()
        await ex.run(x=x + 1)  # a later run does not touch our outputs
        np.testing.assert_array_equal(outs[0].numpy(), first)


@pytest.mark.anyio
async def test_stateful_api() -> None:
    with make() as ex:
        assert ex.get_num_inputs() == 3
        assert ex.get_num_outputs() == 2
        assert ex.get_input_index("x") == 0
        assert ex.get_input_index("w") == 2
        assert ex.get_input_index("nope") == -1
        shapes, dtypes = ex.get_input_info()
        assert shapes == {"x": (N,), "c": (N,), "w": (N,)}
        assert dtypes == {"x": "float32", "c": "float32", "w": "float32"}
        x = np.linspace(-1, 1, N, dtype=np.float32)
        ex.set_input("x", x)
        own = await ex.run()  # the executor's own output arrays, as get_output
        np.testing.assert_allclose(ex.get_output(0).numpy(), reference(x, C, W)[0])
        assert [o.numpy().tolist() for o in own] == [
            ex.get_output(i).numpy().tolist() for i in range(ex.get_num_outputs())
        ]
        out = asyncrt.nd.empty((N,), "float32")
        assert ex.get_output(1, out=out) is out
        np.testing.assert_allclose(out.numpy(), reference(x, C, W)[1], rtol=1e-6)
        np.testing.assert_array_equal(ex.get_input("x").numpy(), x)
        np.testing.assert_array_equal(ex.get_input(1).numpy(), C)
        ex.set_input(x=x * 2)  # keywords, TVM style
        got = ex.run_sync()  # stateful: the executor's own output arrays
        assert got[0] is ex.get_output(0) or np.array_equal(
            got[0].numpy(), ex.get_output(0).numpy()
        )
        np.testing.assert_allclose(ex.get_output(0).numpy(), reference(x * 2, C, W)[0])


def test_run_sync_with_inputs() -> None:
    with make("sim:0") as ex:
        x = np.ones(N, dtype=np.float32)
        outs = ex.run_sync(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


def test_run_sync_outputs_on_cpu_are_the_callers_own() -> None:
    """The cpu fast path (host views of the executor's own context) hands
    back fresh arrays: the next run does not overwrite them."""
    with make() as ex:
        x1, x2 = np.ones(N, dtype=np.float32), np.full(N, -3, dtype=np.float32)
        first = ex.run_sync(x=x1) or []
        second = ex.run_sync(x=x2) or []
        for got, want in zip(first, reference(x1, C, W), strict=True):
            assert (got.shape, got.dtype, str(got.device)) == ((N,), "float32", "cpu:0")
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
        for got, want in zip(second, reference(x2, C, W), strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
        own = ex.get_output(0).numpy()
        assert not np.shares_memory(first[0].numpy(), own)
        assert not np.shares_memory(second[0].numpy(), own)


@pytest.mark.anyio
async def test_input_checks() -> None:
    with make() as ex:
        with pytest.raises(InputError, match=r"'x' expects shape \(8,\), got \(3,\)"):
            await ex.run(x=np.zeros(3, dtype=np.float32))
        with pytest.raises(InputError, match="'x' expects dtype float32, got float64"):
            await ex.run(x=np.zeros(N))
        with pytest.raises(InputError, match="no input 'y'"):
            await ex.run(y=np.zeros(N, dtype=np.float32))
        with pytest.raises(InputError, match="index 9 out of range"):
            ex.set_input(9, np.zeros(N, dtype=np.float32))
        with pytest.raises(InputError, match="inputs never set: x"):
            await ex.run()
        with pytest.raises(InputError, match="output index 2 out of range"):
            ex.get_output(2)
        # nested lists and NDArrays on other devices are fine
        outs = await ex.run(x=[0.5] * N)
        assert outs is not None
        on_sim = asyncrt.nd.array(np.full(N, 0.5, dtype=np.float32), asyncrt.sim(1))
        again = await ex.run(x=on_sim)
        assert again is not None
        np.testing.assert_array_equal(outs[0].numpy(), again[0].numpy())


@pytest.mark.anyio
async def test_missing_inputs_and_params() -> None:
    with graph_executor.create(mlp_graph()) as ex:
        with pytest.raises(InputError, match="inputs not given: c, w"):
            await ex.run(x=np.zeros(N, dtype=np.float32))
        with pytest.raises(InputError, match="no input 'bogus'"):
            ex.load_params({"bogus": np.zeros(1)})


def test_missing_kernel_is_a_build_time_error() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(2,), dtype="float32")
    b.output(b.op("no_such_op", x, shape=(2,), dtype="float32", name="mystery"))
    with pytest.raises(
        KernelNotFoundError, match="not found on cpu:0: 'no_such_op' for node 'mystery'"
    ):
        graph_executor.create(b.build())


def test_lib_first_then_global_registry() -> None:
    calls: list[str] = []

    def my_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        calls.append("lib")
        np.add(a, b, out=out)

    lib = asyncrt.Module({"add": my_add})
    with graph_executor.create(mlp_graph(), lib) as ex:
        ex.load_params(PARAMS)
        ex.run_sync(x=np.zeros(N, dtype=np.float32))
    assert calls == ["lib"]


@pytest.mark.anyio
async def test_failing_kernel_names_the_node_and_executor_recovers() -> None:
    fail = threading.Event()

    def flaky_relu(a: np.ndarray, out: np.ndarray) -> None:
        if fail.is_set():
            raise ValueError("boom")
        np.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": flaky_relu})
    with graph_executor.create(mlp_graph(), lib, "sim:0") as ex:
        ex.load_params(PARAMS)
        x = np.ones(N, dtype=np.float32)
        fail.set()
        with pytest.raises(NodeFailedError) as info:
            await ex.run(x=x)
        err = info.value
        assert (err.node, err.op, err.device) == ("relu0", "relu", "sim:0")
        assert "sim:0" in err.stream
        assert isinstance(err.__cause__, ValueError)
        fail.clear()
        outs = await ex.run(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


@pytest.mark.anyio
async def test_cancelled_run_leaves_executor_ready() -> None:
    started, release = threading.Event(), threading.Event()

    def slow_tanh(a: np.ndarray, out: np.ndarray) -> None:
        started.set()
        release.wait(5)
        library_tanh(a, out)

    lib = asyncrt.Module({"tanh": slow_tanh})
    with graph_executor.create(mlp_graph(), lib, max_contexts=1) as ex:
        ex.load_params(PARAMS)
        x = np.ones(N, dtype=np.float32)
        # Cancelled inside its kernel (however loaded the machine), the run
        # drains that kernel before the cancellation lands.
        timer = threading.Timer(0.05, release.set)

        async def cancel_once_started(scope: anyio.CancelScope) -> None:
            while not started.is_set():
                await anyio.sleep(0.001)
            timer.start()
            scope.cancel()

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_started, scope)
                await ex.run(x=x)
        assert scope.cancelled_caught
        assert release.is_set()
        timer.join()
        outs = await ex.run(x=x)  # the only context came back, and works
        assert outs is not None
        np.testing.assert_allclose(outs[1].numpy(), reference(x, C, W)[1], rtol=1e-6)


@pytest.mark.anyio
async def test_many_concurrent_runs_get_their_own_outputs() -> None:
    with make("cpu", max_contexts=3) as ex:
        xs = [RNG.standard_normal(N).astype(np.float32) for _ in range(60)]
        results: dict[int, list[np.ndarray]] = {}

        async def one(i: int) -> None:
            outs = await ex.run(x=xs[i])
            assert outs is not None
            results[i] = [o.numpy() for o in outs]

        async with anyio.create_task_group() as tg:
            for i in range(len(xs)):
                tg.start_soon(one, i)
        for i, x in enumerate(xs):
            for got, want in zip(results[i], reference(x, C, W), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.anyio
async def test_stateful_run_in_flight_is_busy() -> None:
    release = threading.Event()

    def slow_relu(a: np.ndarray, out: np.ndarray) -> None:
        release.wait(5)
        np.maximum(a, 0, out=out)

    with graph_executor.create(mlp_graph(), asyncrt.Module({"relu": slow_relu})) as ex:
        ex.load_params(PARAMS)
        ex.set_input("x", np.zeros(N, dtype=np.float32))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await anyio.sleep(0.01)
            with pytest.raises(BusyError):
                ex.set_input("x", np.ones(N, dtype=np.float32))
            with pytest.raises(BusyError):
                await ex.run()
            release.set()


@pytest.mark.anyio
async def test_coroutine_kernel_runs_on_the_loop() -> None:
    seen: list[float] = []

    async def remote_tanh(a: np.ndarray, out: np.ndarray) -> None:
        await anyio.sleep(0)
        seen.append(float(a[0]))
        library_tanh(a, out)

    lib = asyncrt.Module({"tanh": remote_tanh})
    with graph_executor.create(mlp_graph(), lib, "sim:1") as ex:
        ex.load_params(PARAMS)
        x = np.full(N, 2.0, dtype=np.float32)
        outs = await ex.run(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[1].numpy(), reference(x, C, W)[1], rtol=1e-6)
        assert seen == [pytest.approx(float(np.maximum(2 + C[0], 0) * W[0]))]


@pytest.mark.anyio
async def test_closed_executor_raises() -> None:
    ex = make()
    ex.close()
    ex.close()
    with pytest.raises(ClosedResourceError):
        await ex.run(x=np.zeros(N, dtype=np.float32))
    with pytest.raises(ClosedResourceError):
        ex.set_input("x", np.zeros(N, dtype=np.float32))


def test_plan_prints_and_renders() -> None:
    with make() as ex:
        text = str(ex.plan)
        assert "arena cpu:0" in text and "sub0 = subtract(" in text
        assert ex.plan.to_dot().startswith("digraph plan {")


class DLPackOnly:
    """A tensor that offers nothing but the DLPack protocol."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()


@pytest.mark.anyio
async def test_dlpack_inputs_are_accepted() -> None:
    with make() as ex:
        x = np.arange(N, dtype=np.float32) / N
        outs = await ex.run(x=DLPackOnly(x))
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


def test_share_params_uses_the_same_memory() -> None:
    blob = asyncrt.save_param_dict(PARAMS)
    with make() as first, graph_executor.create(mlp_graph()) as second:
        second.share_params(first, blob)
        assert second.get_input("w").buffer is first.get_input("w").buffer
        x = np.ones(N, dtype=np.float32)
        got = second.run_sync(x=x)
        assert got is not None
        np.testing.assert_allclose(got[0].numpy(), reference(x, C, W)[0], rtol=1e-6)
        with pytest.raises(InputError, match="no parameter 'x' loaded"):
            second.share_params(first, asyncrt.save_param_dict({"x": x}))


def test_params_blob_round_trip_and_corruption() -> None:
    blob = asyncrt.save_param_dict({"w": asyncrt.nd.array(W, asyncrt.sim(0))})
    loaded = asyncrt.load_param_dict(blob)
    np.testing.assert_array_equal(loaded["w"].numpy(), W)
    with pytest.raises(asyncrt.errors.ParamsError, match="byte offset"):
        asyncrt.load_param_dict(blob[:-3])
