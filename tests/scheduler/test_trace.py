"""Tracing a program: spans per launch, derived records and waits, device
times (the sim's modelled durations, exactly), captured outputs, failures,
bounded memory, and that an untraced program records nothing."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from devices import Device, NDArray, empty, get_api, sim
from devices.sim import SimConfig
from scheduler.dag import COPY_FUNC, Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.dispatch import Program
from scheduler.errors import NodeFailedError
from scheduler.plan import Launch, Plan, RecordEvent, WaitEvent
from scheduler.planner import plan_graph
from scheduler.trace import TraceRecorder

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
S1 = Device("sim", 1)
N = 1024
T = (TensorSpec((N,), "float32"),)
CONFIG = SimConfig(flops=1e9, bandwidth=1e9, latency=5e-6, launch_overhead=1e-6)


def diamond_plan() -> Plan:
    """x -> a (sim:0) and b (sim:1) -> c (cpu:0): two branches on two
    devices, copies both ways, events between the streams."""
    specs = [
        NodeSpec("x", "null", "", (), T),
        NodeSpec("a", "tvm_op", "double", (Entry(0, 0),), T, device=S0, flops=4e5),
        NodeSpec("b", "tvm_op", "double", (Entry(0, 0),), T, device=S1, flops=2e5),
        NodeSpec("c", "tvm_op", "add", (Entry(1, 0), Entry(2, 0)), T, device=CPU),
    ]
    dag = make_dag(specs, GraphSpec((0,), (), (Entry(3, 0),)))
    return plan_graph(dag, [CPU, S0, S1])


def double(x: np.ndarray, out: np.ndarray) -> None:
    np.multiply(x, 2, out)


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out)


def fail(*args: Any) -> None:
    raise RuntimeError("boom")


@pytest.fixture
def sims() -> None:
    sim.configure(2, CONFIG)


@pytest.fixture
def program(sims: None) -> Iterator[tuple[Program, NDArray]]:
    plan = diamond_plan()
    x = empty((N,), "float32", plan.storage[Entry(0, 0)].device)
    x.copyfrom(np.arange(N, dtype=np.float32))
    prog = Program(plan, {1: double, 2: double, 3: add}, {Entry(0, 0): x})
    yield prog, x
    prog.close()


def launches(plan: Plan) -> list[tuple[int, Launch]]:
    return [
        (s, step)
        for s, stream in enumerate(plan.streams)
        for step in stream.steps
        if isinstance(step, Launch)
    ]


def test_untraced_program_records_nothing(program: tuple[Program, NDArray]) -> None:
    prog, _ = program
    recorder = TraceRecorder()
    prog.set_tracer(recorder)
    assert prog.set_tracer(None) is None
    prog.run_sync()
    assert recorder.runs() == []


def test_every_launch_has_one_span_in_stream_order(
    program: tuple[Program, NDArray],
) -> None:
    prog, _ = program
    recorder = TraceRecorder()
    hooks = prog.set_tracer(recorder)
    prog.run_sync()
    prog.run_sync()
    runs = recorder.runs()
    assert [r.run for r in runs] == [0, 1]
    assert hooks is not None and {r.context for r in runs} == {hooks.context}
    run = runs[-1]
    assert run.complete
    traced = [(s.stream, s.launch.nid) for s in run.launches if s.launch]
    planned = [(s, launch.nid) for s, launch in launches(prog.plan)]
    assert sorted(traced) == sorted(planned)
    for s, stream in enumerate(prog.plan.streams):
        mine = [span for span in run.spans if span.stream == s]
        expected = [
            "record" if isinstance(step, RecordEvent)
            else "wait" if isinstance(step, WaitEvent)
            else ("copy" if step.func_name == COPY_FUNC else "kernel")
            for step in stream.steps
        ]  # fmt: skip
        assert [span.kind for span in mine] == expected
        assert all(a.end <= b.start for a, b in itertools.pairwise(mine))
        assert all(span.device == stream.device for span in mine)
    assert run.start <= min(s.start for s in run.spans)
    assert run.end == max(s.end for s in run.spans)


def test_waits_end_when_their_record_happened(
    program: tuple[Program, NDArray],
) -> None:
    prog, _ = program
    recorder = TraceRecorder()
    prog.set_tracer(recorder)
    prog.run_sync()
    run = recorder.runs()[0]
    recorded = {s.event: s.start for s in run.spans if s.kind == "record"}
    waits = [s for s in run.spans if s.kind == "wait"]
    assert waits, "the diamond plan orders its streams with events"
    for wait in waits:
        # ... or when its stream's next launch started, if that was earlier:
        # a sim's clock may run ahead of its thread's wall spans.
        after = [
            s.start
            for s in run.launches
            if s.stream == wait.stream and s.start >= wait.start
        ]
        until = min([recorded[wait.event], *after[:1]])
        assert wait.end == max(wait.start, until)
        assert wait.device_time == wait.end - wait.start


def test_sim_device_time_is_the_modelled_duration(
    program: tuple[Program, NDArray],
) -> None:
    prog, _ = program
    recorder = TraceRecorder()
    prog.set_tracer(recorder)
    prog.run_sync()
    run = recorder.runs()[0]
    nbytes = N * 4
    for span in run.launches:
        assert span.launch is not None
        if span.kind == "copy":
            ends = {prog.arrays[e].device for e in span.launch.args}
            if ends & {S0, S1}:
                assert span.device_time == CONFIG.copy_seconds(nbytes)
        elif span.device.kind == "sim":
            assert span.device_time == CONFIG.compute_seconds(span.launch.work)
        else:  # cpu: the wall time on the stream's thread
            assert span.device_time == span.end - span.start


def test_capture_keeps_every_output(program: tuple[Program, NDArray]) -> None:
    prog, x = program
    recorder = TraceRecorder(capture=True)
    prog.set_tracer(recorder)
    prog.run_sync()
    run = recorder.runs()[0]
    values = x.numpy()
    np.testing.assert_array_equal(run.outputs[Entry(1, 0)], values * 2)
    np.testing.assert_array_equal(run.outputs[Entry(2, 0)], values * 2)
    np.testing.assert_array_equal(run.outputs[Entry(3, 0)], values * 4)


def test_failed_run_is_incomplete_and_stops_at_the_failure(sims: None) -> None:
    plan = diamond_plan()
    x = empty((N,), "float32", plan.storage[Entry(0, 0)].device)
    x.copyfrom(np.ones(N, np.float32))  # garbage could overflow
    prog = Program(plan, {1: fail, 2: double, 3: add}, {Entry(0, 0): x})
    try:
        recorder = TraceRecorder()
        prog.set_tracer(recorder)
        with pytest.raises(NodeFailedError):
            prog.run_sync()
        (run,) = recorder.runs()
        assert not run.complete
        names = {s.launch.name for s in run.launches if s.launch is not None}
        assert "a" in names  # its span is kept: it ran, and failed
        assert "c" not in names  # never ran
    finally:
        prog.close()


def test_recorder_keeps_only_the_latest_runs(program: tuple[Program, NDArray]) -> None:
    prog, _ = program
    recorder = TraceRecorder(max_runs=2)
    prog.set_tracer(recorder)
    for _ in range(4):
        prog.run_sync()
    assert [r.run for r in recorder.runs()] == [2, 3]
    recorder.clear()
    assert recorder.runs() == []
    with pytest.raises(ValueError):
        TraceRecorder(max_runs=0)


@pytest.mark.anyio
async def test_async_runs_and_coroutine_kernels_are_traced(sims: None) -> None:
    calls: list[str] = []

    async def remote_double(x: np.ndarray, out: np.ndarray) -> None:
        calls.append("remote")
        np.multiply(x, 2, out)

    specs = [
        NodeSpec("x", "null", "", (), T),
        NodeSpec("r", "tvm_op", "remote", (Entry(0, 0),), T),
        NodeSpec("d", "tvm_op", "double", (Entry(1, 0),), T),
    ]
    plan = plan_graph(make_dag(specs, GraphSpec((0,), (), (Entry(2, 0),))), [CPU])
    x = empty((N,), "float32", CPU)
    x.copyfrom(np.ones(N, np.float32))  # garbage could overflow
    prog = Program(plan, {1: remote_double, 2: double}, {Entry(0, 0): x})
    try:
        recorder = TraceRecorder()
        prog.set_tracer(recorder)
        await prog.run()
        (run,) = recorder.runs()
        assert run.complete and calls == ["remote"]
        assert [s.launch.name for s in run.launches if s.launch] == ["r", "d"]
    finally:
        prog.close()


def test_sim_config_is_read_per_device(sims: None) -> None:
    sim.configure(2, [CONFIG, SimConfig(flops=2e9)])
    api: Any = get_api("sim")
    assert api.config(S1).flops == 2e9
    plan = diamond_plan()
    x = empty((N,), "float32", plan.storage[Entry(0, 0)].device)
    x.copyfrom(np.ones(N, np.float32))  # garbage could overflow
    prog = Program(plan, {1: double, 2: double, 3: add}, {Entry(0, 0): x})
    try:
        recorder = TraceRecorder()
        prog.set_tracer(recorder)
        prog.run_sync()
        (run,) = recorder.runs()
        by_name = {s.launch.name: s for s in run.launches if s.launch}
        assert by_name["a"].device_time == CONFIG.compute_seconds(4e5)
        assert by_name["b"].device_time == SimConfig(flops=2e9).compute_seconds(2e5)
    finally:
        prog.close()
