"""Planning is pure: it reads the graph, the devices' capabilities and the
cost model, and never times anything. So plans are compared with literal
expectations, and the same graph with the same figures gives the same plan
every time, however busy the machine is."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from devices import Device, DeviceSpeed, Link, sim
from devices._figures import CACHE_ENV, REMEASURE_ENV
from scheduler.cost import AnalyticCostModel, StartCost, TableCostModel, start_latency
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.plan import (
    Arena,
    Copy,
    Launch,
    Plan,
    RecordEvent,
    StreamPlan,
    TensorPlacement,
    WaitEvent,
)
from scheduler.planner import plan_graph

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
S1 = Device("sim", 1)
F4 = TensorSpec((4,), "float32")


def diamond() -> nx.DiGraph:
    """x (input) and w (parameter) -> a = k(x, w), b = k(x) -> c = k(a, b)."""
    specs = [
        NodeSpec("x", "null", "", (), (F4,)),
        NodeSpec("w", "null", "", (), (F4,)),
        NodeSpec("a", "tvm_op", "k", (Entry(0, 0), Entry(1, 0)), (F4,), flops=4e6),
        NodeSpec("b", "tvm_op", "k", (Entry(0, 0),), (F4,), flops=2e6),
        NodeSpec("c", "tvm_op", "k", (Entry(2, 0), Entry(3, 0)), (F4,), flops=1e3),
    ]
    return make_dag(specs, GraphSpec((0,), (1,), (Entry(4, 0),)))


def table() -> TableCostModel:
    seconds = {2: (4e-3, 1e-3, 2e-3), 3: (2e-3, 1e-3, 1e-3), 4: (1e-5, 1e-4, 1e-4)}
    compute = {
        (nid, device): value
        for nid, row in seconds.items()
        for device, value in zip((CPU, S0, S1), row, strict=True)
    }
    return TableCostModel(
        compute,
        default_link=Link(1e-5, 1e9),
        dag=diamond(),
        start=StartCost(per_step=2e-6, wake=5e-5),
    )


SPEEDS = {
    CPU: DeviceSpeed(1e9, sync_latency=3e-5, issue_overhead=2e-6),
    S0: DeviceSpeed(4e9, bandwidth=1e9, latency=1e-5),
    S1: DeviceSpeed(4e9, bandwidth=1e9, latency=1e-5),
}


def arena(device: Device, offset: int) -> TensorPlacement:
    return TensorPlacement(device, "arena", offset)


def external(device: Device) -> TensorPlacement:
    return TensorPlacement(device, "external")


E = Entry


def test_a_heterogeneous_plan_is_exactly_the_expected_one() -> None:
    """HEFT puts a on sim:0 and b on sim:1 (a sim does either in 1 ms, the
    cpu in 2-4 ms), c on the cpu; x is copied to both sims on their incoming
    copy streams, w (a parameter) once, when loaded; a and b come back on the
    sims' own outgoing copy streams. The makespan: x's copy (10.016 us), a
    (1 ms), a's copy back (10.016 us), c (10 us), plus the start of 19 steps
    and 7 final records at 2 us each and a 50 us wake-up."""
    plan = plan_graph(diamond(), [CPU, S0, S1], policy="heft", cost=table())
    expected = Plan(
        host=CPU,
        devices=(CPU, S0, S1),
        placement={0: CPU, 1: CPU, 2: S0, 3: S1, 4: CPU},
        streams=(
            StreamPlan(S0, (Copy(5, "copy_0_0_to_sim0", (E(0, 0), E(5, 0))),
                            RecordEvent(2))),
            StreamPlan(S0, (WaitEvent(2),
                            Launch(2, "a", "k", (E(5, 0), E(6, 0), E(2, 0)), 2, 4e6),
                            RecordEvent(0))),
            StreamPlan(S1, (Copy(7, "copy_0_0_to_sim1", (E(0, 0), E(7, 0))),
                            RecordEvent(3))),
            StreamPlan(S1, (WaitEvent(3),
                            Launch(3, "b", "k", (E(7, 0), E(3, 0)), 1, 2e6),
                            RecordEvent(1))),
            StreamPlan(S0, (WaitEvent(0),
                            Copy(8, "copy_2_0_to_cpu0", (E(2, 0), E(8, 0))),
                            RecordEvent(4))),
            StreamPlan(S1, (WaitEvent(1),
                            Copy(9, "copy_3_0_to_cpu0", (E(3, 0), E(9, 0))),
                            RecordEvent(5))),
            StreamPlan(CPU, (WaitEvent(4), WaitEvent(5),
                             Launch(4, "c", "k", (E(8, 0), E(9, 0), E(4, 0)), 2, 1e3))),
        ),
        order=((0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0),
               (3, 1), (3, 2), (4, 0), (4, 1), (4, 2), (5, 0), (5, 1), (5, 2),
               (6, 0), (6, 1), (6, 2)),
        num_events=6,
        tensors={E(n, 0): F4 for n in range(10)},
        storage={
            E(0, 0): external(CPU), E(1, 0): external(CPU), E(6, 0): external(S0),
            E(4, 0): arena(CPU, 0), E(8, 0): arena(CPU, 64), E(9, 0): arena(CPU, 128),
            E(2, 0): arena(S0, 0), E(5, 0): arena(S0, 64),
            E(3, 0): arena(S1, 0), E(7, 0): arena(S1, 64),
        },
        arenas={CPU: Arena(192, 192), S0: Arena(128, 128), S1: Arena(128, 128)},
        inputs=(0, 1),
        heads=(E(4, 0),),
        makespan=pytest.approx(10.016e-6 + 1e-3 + 10.016e-6 + 1e-5 + 26 * 2e-6 + 5e-5),
        policy="heft",
        constant_copies={E(6, 0): E(1, 0)},
        speeds={},
    )  # fmt: skip
    assert plan == expected
    assert plan.parameter_copies() == [Copy(6, "param_copy_1_0", (E(1, 0), E(6, 0)))]
    assert [c.name for c in plan.copies()] == [
        "copy_0_0_to_sim0",
        "copy_0_0_to_sim1",
        "copy_2_0_to_cpu0",
        "copy_3_0_to_cpu0",
    ]
    assert [k.name for k in plan.kernel_launches()] == ["a", "b", "c"]


def test_an_analytic_plan_keeps_the_figures_it_was_made_from() -> None:
    """From literal speeds: c joins a on sim:0 (b's result is copied there),
    the head comes back to the cpu, whose wake-up (30 us) the copy pays; the
    start is 17 steps and 5 final records at the cpu's 2 us, plus its wake."""
    cost = AnalyticCostModel(diamond(), SPEEDS)
    plan = plan_graph(diamond(), [CPU, S0, S1], policy="heft", cost=cost)
    assert plan.placement == {0: CPU, 1: CPU, 2: S0, 3: S1, 4: S0}
    assert plan.speeds == SPEEDS
    assert len(plan.order) + len(plan.streams) == 22
    assert start_latency(cost, plan) == pytest.approx(22 * 2e-6 + 3e-5)
    link = 1e-5 + 16 / 1e9  # one tensor over a sim's link
    assert plan.makespan == pytest.approx(
        link + 4e6 / 4e9 + 1e3 / 4e9 + (link + 3e-5) + 22 * 2e-6 + 3e-5
    )
    assert [(str(s.device), len(s.steps)) for s in plan.streams] == [
        ("sim:0", 5),
        ("sim:0", 5),
        ("sim:1", 2),
        ("sim:1", 3),
        ("sim:0", 2),
    ]


def test_the_planner_never_imports_the_dispatcher() -> None:
    script = (
        "import sys\n"
        "import scheduler.planner\n"
        "assert 'scheduler.dispatch' not in sys.modules, 'dispatch imported'\n"
    )
    root = Path(__file__).resolve().parents[2]  # this checkout's packages
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=root)


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """Another thread multiplying matrices for as long as the test runs."""
    stop = threading.Event()

    def load() -> None:
        a = np.ones((256, 256), dtype=np.float32)
        while not stop.is_set():
            a @ a

    thread = threading.Thread(target=load, name="busy-neighbour", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("model", ["table", "analytic", "devices"])
def test_the_same_figures_give_the_same_plan_ten_times_on_a_busy_machine(
    busy_cpu: None, model: str
) -> None:
    """Nothing in planning is measured while planning: a literal table, the
    same speeds, or the devices' own figures (the cpu's are measured once
    per machine and cached) give one plan, however loaded the machine."""
    sim.configure(2)
    devices_given = [CPU, S0, S1]

    def plan_once() -> Plan:
        dag = diamond()
        if model == "table":
            return plan_graph(dag, devices_given, max_streams=2, cost=table())
        if model == "analytic":
            cost = AnalyticCostModel(dag, SPEEDS)
            return plan_graph(dag, devices_given, max_streams=2, cost=cost)
        return plan_graph(dag, devices_given, max_streams=2)

    first = plan_once()
    for _ in range(9):
        assert plan_once() == first


_PLAN_SCRIPT = """
import threading
import numpy as np
from tests.scheduler.test_pure_planning import CPU, S0, S1, diamond, table
from scheduler.planner import plan_graph

stop = threading.Event()

def load():
    a = np.ones((256, 256), dtype=np.float32)
    while not stop.is_set():
        a @ a

threading.Thread(target=load, daemon=True).start()
print(repr(plan_graph(diamond(), [CPU, S0, S1], max_streams=2, cost=table())))
print(repr(plan_graph(diamond(), [CPU, S0, S1], max_streams=2)))
stop.set()
"""


def test_two_processes_on_one_machine_make_the_same_plans(tmp_path: Path) -> None:
    """Each process used to time its own streams and cpu while planning, so
    two processes made different plans (different makespans at least) of
    one graph; now the table is taken literally and the cpu's figures come
    from the machine's cache, measured once."""
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    env.pop(REMEASURE_ENV, None)
    root = Path(__file__).resolve().parents[2]
    outputs = [
        subprocess.run(
            [sys.executable, "-c", _PLAN_SCRIPT],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            cwd=root,
            env=env,
        ).stdout
        for _ in range(2)
    ]
    lines = outputs[0].splitlines()
    assert len(lines) == 2 and all(line.startswith("Plan(") for line in lines)
    assert outputs[0] == outputs[1]
