"""``run_sync``: a one-stream cpu plan runs on the calling thread, inputs and
outputs go through pre-bound views, and every error and fallback behaves as
the general path does."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import BusyError, ClosedResourceError, InputError, NodeFailedError

from .test_executor import PARAMS, C, N, W, mlp_graph, reference


def _make(lib: dict[str, Any], device: str = "cpu", **kw: Any) -> Any:
    ex = graph_executor.create(mlp_graph(), asyncrt.Module(lib), device, **kw)
    ex.load_params(PARAMS)
    return ex


def _relu_on(threads: list[int]) -> Any:
    def relu(a: np.ndarray, out: np.ndarray) -> None:
        threads.append(threading.get_ident())
        np.maximum(a, 0, out=out)

    return relu


def test_one_cpu_stream_runs_on_the_calling_thread() -> None:
    threads: list[int] = []
    with _make({"relu": _relu_on(threads)}) as ex:
        x = np.ones(N, dtype=np.float32)
        outs = ex.run_sync(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)
    assert threads == [threading.get_ident()]


def test_other_devices_still_use_their_streams() -> None:
    threads: list[int] = []
    with _make({"relu": _relu_on(threads)}, "sim:0") as ex:
        ex.run_sync(x=np.ones(N, dtype=np.float32))
    assert threads and threads[0] != threading.get_ident()


def test_outputs_are_the_callers_and_inputs_are_copied() -> None:
    with _make({}) as ex:
        x = np.linspace(-1, 1, N, dtype=np.float32)
        first = ex.run_sync(x=x)
        assert first is not None
        kept = [o.numpy() for o in first]
        x[:] = 5  # the caller's array is not bound to the executor
        second = ex.run_sync(x=-x)
        assert second is not None
        for got, want in zip(first, kept, strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_allclose(second[1].numpy(), reference(-x, C, W)[1], rtol=1e-6)
        assert first[0].device == asyncrt.device("cpu")


def test_other_values_take_the_checked_path() -> None:
    with _make({}) as ex:
        want = reference(np.full(N, 0.5, np.float32), C, W)[0]
        for value in ([0.5] * N, np.full(N, 0.5, np.float32)[::1].reshape(N)):
            outs = ex.run_sync(x=value)
            assert outs is not None
            np.testing.assert_allclose(outs[0].numpy(), want, rtol=1e-6)
        with pytest.raises(InputError, match="expects dtype float32, got float64"):
            ex.run_sync(x=np.zeros(N))
        with pytest.raises(InputError, match=r"expects shape \(8,\)"):
            ex.run_sync(x=np.zeros(3, np.float32))
        with pytest.raises(InputError, match="no input 'y'"):
            ex.run_sync(y=np.zeros(N, np.float32))
        # a parameter's name changes the parameter, as set_input does
        outs = ex.run_sync(x=np.zeros(N, np.float32), w=np.zeros(N, np.float32))
        assert outs is not None
        np.testing.assert_array_equal(outs[0].numpy(), np.zeros(N, np.float32))


def test_failing_kernel_names_the_node_and_executor_recovers() -> None:
    fail = threading.Event()

    def flaky_relu(a: np.ndarray, out: np.ndarray) -> None:
        if fail.is_set():
            raise ValueError("boom")
        np.maximum(a, 0, out=out)

    with _make({"relu": flaky_relu}) as ex:
        x = np.ones(N, dtype=np.float32)
        fail.set()
        with pytest.raises(NodeFailedError) as info:
            ex.run_sync(x=x)
        assert (info.value.node, info.value.device) == ("relu0", "cpu:0")
        assert isinstance(info.value.__cause__, ValueError)
        fail.clear()
        outs = ex.run_sync(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


def test_a_run_in_flight_is_busy_and_keeps_its_inputs() -> None:
    started, release = threading.Event(), threading.Event()

    def slow_relu(a: np.ndarray, out: np.ndarray) -> None:
        started.set()
        release.wait(5)
        np.maximum(a, 0, out=out)

    results: list[Any] = []
    with _make({"relu": slow_relu}) as ex:
        x = np.ones(N, dtype=np.float32)
        worker = threading.Thread(target=lambda: results.append(ex.run_sync(x=x)))
        worker.start()
        assert started.wait(5)
        with pytest.raises(BusyError):
            ex.run_sync(x=np.zeros(N, dtype=np.float32))
        release.set()
        worker.join(5)
        assert not worker.is_alive()
    assert len(results) == 1 and results[0] is not None
    np.testing.assert_allclose(results[0][0].numpy(), reference(x, C, W)[0], rtol=1e-6)
    with pytest.raises(ClosedResourceError):
        ex.run_sync(x=x)
