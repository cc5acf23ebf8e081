"""A device kind the scheduler has never heard of, defined in this file alone
(one DeviceAPI subclass), plans and runs beside the cpu: the scheduler reads
what a device can do, never its name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devices
from devices import Buffer, Device, DeviceAPI, empty
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.dispatch import Program
from scheduler.plan import Copy, Launch, Plan, RecordEvent, WaitEvent
from scheduler.planner import plan_graph
from scheduler.trace import TraceRecorder

KIND = "toyaccel"
TOY = Device(KIND, 0)
CPU = Device("cpu", 0)
N = 256
T = (TensorSpec((N,), "float32"),)


class ToyAPI(DeviceAPI):
    """A toy accelerator: memory of its own (the host reaches it only by
    copying), copy engines that also copy to the host, a slow link."""

    kind = KIND
    outgoing_copies = True

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []

    def _attributes(self, device: Device) -> dict[str, Any]:
        return {"flops": 5e9, "host_bandwidth": 1e9, "host_latency": 1e-5}

    def _alloc(self, device: Device, nbytes: int) -> Any:
        return np.zeros(nbytes, dtype=np.uint8)

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        self.copies.append("within")
        dst.raw[dst_offset : dst_offset + nbytes] = src.raw[
            src_offset : src_offset + nbytes
        ]

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        self.copies.append("to host")
        dst[...] = src.raw[src_offset : src_offset + dst.nbytes]

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        self.copies.append("from host")
        dst.raw[dst_offset : dst_offset + src.nbytes] = src


@pytest.fixture
def toy() -> Iterator[ToyAPI]:
    devices.register(KIND, ToyAPI)
    api = devices.get_api(KIND)
    assert isinstance(api, ToyAPI)
    try:
        yield api
    finally:
        devices.unregister(KIND)


def double(x: np.ndarray, out: np.ndarray) -> None:
    np.multiply(x, 2, out=out)


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def graph() -> Any:
    """x -> a = double(x) on the toy -> b = a + x on the cpu (the head)."""
    specs = [
        NodeSpec("x", "null", "", (), T),
        NodeSpec("a", "tvm_op", "double", (Entry(0, 0),), T, device=TOY, flops=N),
        NodeSpec("b", "tvm_op", "add", (Entry(1, 0), Entry(0, 0)), T, device=CPU),
    ]
    return make_dag(specs, GraphSpec((0,), (), (Entry(2, 0),)))


def planned() -> Plan:
    return plan_graph(graph(), [CPU, TOY])


def test_a_new_kind_is_planned_from_its_capabilities(toy: ToyAPI) -> None:
    plan = planned()
    # x goes to the toy on its incoming copy stream; a comes back on the
    # toy's own outgoing one (outgoing_copies), then b runs on the cpu.
    assert [(str(s.device), s.steps) for s in plan.streams] == [
        (KIND + ":0", (Copy(3, "copy_0_0_to_toyaccel0", (Entry(0, 0), Entry(3, 0))),
                       RecordEvent(1))),
        (KIND + ":0", (WaitEvent(1),
                       Launch(1, "a", "double", (Entry(3, 0), Entry(1, 0)), 1, N),
                       RecordEvent(0))),
        (KIND + ":0", (WaitEvent(0),
                       Copy(4, "copy_1_0_to_cpu0", (Entry(1, 0), Entry(4, 0))),
                       RecordEvent(2))),
        ("cpu:0", (WaitEvent(2),
                   Launch(2, "b", "add", (Entry(4, 0), Entry(0, 0), Entry(2, 0)), 2))),
    ]  # fmt: skip
    assert [c.name for c in plan.copies()] == [
        "copy_0_0_to_toyaccel0",
        "copy_1_0_to_cpu0",
    ]
    assert [k.name for k in plan.kernel_launches()] == ["a", "b"]
    # planned from the toy's own figures
    assert plan.speeds[TOY].flops == 5e9 and plan.speeds[TOY].latency == 1e-5


@pytest.mark.parametrize("traced", [False, True])
def test_a_new_kind_runs_beside_the_cpu(toy: ToyAPI, traced: bool) -> None:
    plan = planned()
    x = empty((N,), "float32", CPU)
    values = np.arange(N, dtype=np.float32)
    x.copyfrom(values)
    recorder = TraceRecorder() if traced else None
    program = Program(plan, {1: double, 2: add}, {Entry(0, 0): x}, tracer=recorder)
    try:
        for _ in range(3):
            program.run_sync()
            result = program.arrays[Entry(2, 0)].numpy()
            np.testing.assert_array_equal(result, 3 * values)
    finally:
        program.close()
    assert toy.copies.count("from host") >= 3 and toy.copies.count("to host") >= 3
    if recorder is not None:
        run = recorder.runs()[-1]
        kinds = [(span.launch.name, span.kind) for span in run.launches if span.launch]
        assert ("copy_1_0_to_cpu0", "copy") in kinds and ("a", "kernel") in kinds
        # measured by the wall clock: the toy models no time
        assert all(span.device_time == span.end - span.start for span in run.launches)


@pytest.mark.anyio
async def test_a_new_kind_runs_beside_the_cpu_on_the_event_loop(toy: ToyAPI) -> None:
    plan = planned()
    x = empty((N,), "float32", CPU)
    x.copyfrom(np.ones(N, dtype=np.float32))
    program = Program(plan, {1: double, 2: add}, {Entry(0, 0): x})
    try:
        await program.run()
        np.testing.assert_array_equal(program.arrays[Entry(2, 0)].numpy(), 3.0)
    finally:
        program.close()


def test_no_scheduler_module_names_a_device_kind() -> None:
    """The scheduler knows devices by their capabilities only: no kind name
    in its code, and the copy launch name in one place."""
    root = Path(__file__).resolve().parents[2] / "scheduler"
    kinds = re.compile(r"""["'](cpu|sim|cuda|remote)["']""")
    for module in sorted(root.glob("*.py")):
        text = module.read_text()
        assert not kinds.search(text), f"{module.name} names a device kind"
        if module.name != "dag.py":
            assert '"__copy"' not in text, f"{module.name} spells out __copy"
