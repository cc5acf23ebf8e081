"""The dispatcher: copies are steps of their own, a failing node says why,
and each run owns its cancel scope (nothing of one run stops the next)."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

from devices import Device, empty
from devices.errors import ClosedResourceError
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.dispatch import Bindable, Program, copy_now
from scheduler.errors import NodeFailedError
from scheduler.plan import Copy, Plan
from scheduler.planner import plan_graph

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
N = 64
T = (TensorSpec((N,), "float32"),)


def branches(device: Device | None = None) -> Any:
    """x -> a, x -> b (independent) -> c = a + b."""
    specs = [
        NodeSpec("x", "null", "", (), T),
        NodeSpec("a", "tvm_op", "left", (Entry(0, 0),), T, device=device),
        NodeSpec("b", "tvm_op", "right", (Entry(0, 0),), T),
        NodeSpec("c", "tvm_op", "add", (Entry(1, 0), Entry(2, 0)), T),
    ]
    return make_dag(specs, GraphSpec((0,), (), (Entry(3, 0),)))


def two_streams() -> Plan:
    plan = plan_graph(branches(), [CPU], max_streams=2)
    assert len(plan.streams) == 2
    return plan


def copy_kernel(x: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, x)


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def mismatched(x: np.ndarray, out: np.ndarray) -> None:
    np.matmul(x.reshape(8, 8), np.ones((3, 8), np.float32), out=out.reshape(8, 8))


def program(plan: Plan, kernels: dict[int, Any]) -> Program:
    x = empty((N,), "float32", CPU)
    x.copyfrom(np.ones(N, dtype=np.float32))
    return Program(plan, kernels, {Entry(0, 0): x})


# -- errors that say why ----------------------------------------------------------


def test_a_failing_node_names_the_kernels_own_error_inline() -> None:
    plan = plan_graph(branches(), [CPU])
    prog = program(plan, {1: mismatched, 2: copy_kernel, 3: add})
    try:
        with pytest.raises(NodeFailedError) as failed:
            prog.run_sync()
    finally:
        prog.close()
    error = failed.value
    assert str(error).startswith("node 'a' (op 'left') failed on cpu:0, stream ")
    assert ": ValueError: matmul: " in str(error)
    assert isinstance(error.__cause__, ValueError)
    assert error.reason == f"ValueError: {error.__cause__}"


@pytest.mark.parametrize("on_sim", [False, True])
def test_a_failing_node_names_the_kernels_own_error_on_streams(on_sim: bool) -> None:
    plan = plan_graph(branches(S0 if on_sim else None), [CPU, S0], max_streams=2)
    prog = program(plan, {1: mismatched, 2: copy_kernel, 3: add})
    try:
        with pytest.raises(NodeFailedError, match=r"'a' .*: ValueError: matmul: "):
            prog.run_sync()
    finally:
        prog.close()


def test_a_kernel_that_fails_to_bind_says_why() -> None:
    def refuse(*arrays: Any) -> Any:
        raise TypeError("no layout for these arrays")

    kernel = Bindable(copy_kernel, refuse)
    with pytest.raises(NodeFailedError, match="TypeError: no layout for these"):
        program(two_streams(), {1: kernel, 2: copy_kernel, 3: add})


@pytest.mark.anyio
async def test_a_failing_coroutine_kernel_says_why() -> None:
    async def fails(x: Any, out: Any) -> None:
        raise KeyError("missing")

    prog = program(two_streams(), {1: fails, 2: copy_kernel, 3: add})
    try:
        with pytest.raises(NodeFailedError, match="KeyError: 'missing'"):
            await prog.run()
    finally:
        prog.close()


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    error = NodeFailedError("n", "op", "cpu:0", "s", RuntimeError())
    assert str(error).endswith("stream s: RuntimeError")
    plain = NodeFailedError("n", "op", "cpu:0", "s")
    assert str(plain) == "node 'n' (op 'op') failed on cpu:0, stream s"


# -- copies are steps -------------------------------------------------------------


def test_copies_run_without_kernels_and_parameter_copies_run_once() -> None:
    plan = plan_graph(branches(S0), [CPU, S0], max_streams=2)
    assert plan.copies() and all(isinstance(c, Copy) for c in plan.copies())
    kernels = {k.nid: k for k in plan.kernel_launches()}
    assert sorted(kernels) == [1, 2, 3]
    prog = program(plan, {1: copy_kernel, 2: copy_kernel, 3: add})
    try:
        prog.run_sync()
        np.testing.assert_array_equal(prog.arrays[Entry(3, 0)].numpy(), 2.0)
    finally:
        prog.close()
    # a parameter copy step, run now
    source, target = empty((N,), "float32", CPU), empty((N,), "float32", S0)
    source.copyfrom(np.arange(N, dtype=np.float32))
    step = Copy(9, "param_copy_0_0", (Entry(0, 0), Entry(9, 0)))
    copy_now(step, {Entry(0, 0): source, Entry(9, 0): target})
    np.testing.assert_array_equal(target.numpy(), np.arange(N))


# -- a cancel scope per run -------------------------------------------------------


@pytest.fixture
def crowded_interpreter() -> Iterator[None]:
    """Threads switch as often as the interpreter can, and eight busy ones
    compete for it: a stream's thread then often waits a long while between
    two of its own steps. That is what once let a failed run's late
    callback land in the next run (about one run in a hundred here)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            pass

    crowd = [threading.Thread(target=busy, name=f"busy-{i}") for i in range(8)]
    for thread in crowd:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in crowd:
            thread.join()
        sys.setswitchinterval(before)


@pytest.mark.timeout(180)
def test_a_failed_run_never_stops_the_next(crowded_interpreter: None) -> None:
    """Runs that fail on one stream, at random, alternate with runs that
    must succeed. Once one stop flag served every run: the failing stream
    set it from a callback that could run after the host had seen the run
    end and started the next, which then failed for no reason
    (``StreamError: run failed: BatchError('call 0 of a batch failed')``,
    its first check). Now a run's callbacks only reach its own scope."""
    rng = random.Random(20)
    fail = [False, False]

    def kernel(side: int) -> Any:
        def run(x: np.ndarray, out: np.ndarray) -> None:
            if fail[side]:
                raise ValueError(f"side {side} fails")
            np.copyto(out, x)

        return run

    prog = program(two_streams(), {1: kernel(0), 2: kernel(1), 3: add})
    try:
        for _ in range(400):
            side = rng.randrange(2)
            fail[side] = True
            with pytest.raises(NodeFailedError, match=f"side {side} fails"):
                prog.run_sync()
            fail[side] = False
            prog.run_sync()  # must not be stopped by the failed run
        np.testing.assert_array_equal(prog.arrays[Entry(3, 0)].numpy(), 2.0)
    finally:
        prog.close()


class Gate:
    """A kernel that holds its stream until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        self.entered.set()
        assert self.release.wait(10)
        np.copyto(out, x)


def test_stop_stops_the_run_in_flight_and_only_it() -> None:
    gate = Gate()
    prog = program(two_streams(), {1: gate, 2: copy_kernel, 3: add})
    try:
        prog.stop()  # between runs: no effect on the next
        gate.release.set()
        prog.run_sync()
        gate.release.clear()
        failures: list[BaseException] = []

        def run() -> None:
            try:
                prog.run_sync()
            except BaseException as exc:  # handed to the test
                failures.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert gate.entered.wait(10)
        prog.stop()
        gate.release.set()
        thread.join(10)
        assert len(failures) == 1
        assert isinstance(failures[0], ClosedResourceError)
        prog.run_sync()  # the next run has a scope of its own
        np.testing.assert_array_equal(prog.arrays[Entry(3, 0)].numpy(), 2.0)
    finally:
        prog.close()


@pytest.mark.anyio
async def test_a_cancelled_run_never_stops_the_next() -> None:
    gate = Gate()
    prog = program(two_streams(), {1: gate, 2: copy_kernel, 3: add})
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(prog.run)
            await anyio.to_thread.run_sync(gate.entered.wait)
            group.cancel_scope.cancel()
            gate.release.set()  # the cancelled run drains before it returns
        await prog.run()
        np.testing.assert_array_equal(prog.arrays[Entry(3, 0)].numpy(), 2.0)
    finally:
        gate.release.set()
        prog.close()
