"""The planner charges a plan's streams their start (from the cost model,
never by timing streams), and a guarded policy's split must beat everything
on the host-facing cpu, start included."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import pytest

from devices import Device
from scheduler.cost import (
    CostModel,
    Link,
    StartCost,
    TableCostModel,
    runs_inline,
    start_latency,
)
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.placement import Placement, evaluate
from scheduler.planner import plan_graph

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
T4 = (TensorSpec((4,), "float32"),)
#: What a run on streams pays before its first work: 2 us per step the host
#: issues, then 50 us for a stream's thread to wake.
START = StartCost(per_step=2e-6, wake=50e-6)


def branches() -> nx.DiGraph:
    """x -> a, x -> b, c = a + b (the head)."""
    specs = [
        NodeSpec("x", "null", "", (), T4),
        NodeSpec("a", "tvm_op", "k", (Entry(0, 0),), T4),
        NodeSpec("b", "tvm_op", "k", (Entry(0, 0),), T4),
        NodeSpec("c", "tvm_op", "k", (Entry(1, 0), Entry(2, 0)), T4),
    ]
    return make_dag(specs, GraphSpec((0,), (), (Entry(3, 0),)))


def costs(a_seconds: float, b_seconds: float) -> TableCostModel:
    """a and b take these anywhere, c 1 ms; links are free."""
    table = {}
    for device in (CPU, S0):
        table[1, device] = a_seconds
        table[2, device] = b_seconds
        table[3, device] = 1e-3
    free = Link(0.0, float("inf"))
    return TableCostModel(table, default_link=free, dag=branches(), start=START)


def split_b(dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel) -> Placement:
    """A user policy: b on the sim, the rest on the host."""
    return evaluate(dag, devices, cost, {1: CPU, 2: S0, 3: CPU})


def test_a_plan_on_one_cpu_stream_starts_at_once() -> None:
    cost = costs(1e-3, 1e-3)
    plan = plan_graph(branches(), [CPU, S0], policy="single", cost=cost)
    assert runs_inline(plan)
    assert start_latency(cost, plan) == 0.0
    assert plan.makespan == pytest.approx(3e-3)


def test_a_split_is_charged_its_streams_start() -> None:
    """a and b take a second each: running them side by side saves one,
    far more than the streams' start, so the split stays; its predicted
    makespan is the placement's (a branch, then c) plus that start."""
    dag = branches()
    cost = costs(1.0, 1.0)
    plan = plan_graph(dag, [CPU, S0], policy="auto", cost=cost)
    assert set(plan.placement.values()) == {CPU, S0}
    assert not runs_inline(plan)
    steps = len(plan.order) + len(plan.streams)  # each stream's final record
    assert start_latency(cost, plan) == START.seconds(steps) > 0
    assert plan.makespan == pytest.approx(1.001 + START.seconds(steps))


def test_a_split_that_saves_less_than_its_start_is_not_taken() -> None:
    """b takes 1 us: running it beside a saves 1 us, less than waking the
    streams costs, so a guarded policy keeps everything on the host (one
    stream, run on the caller's thread); a user's policy is left alone."""
    dag = branches()
    for policy in ("auto", "heft", "peft", "lookahead"):
        plan = plan_graph(dag, [CPU, S0], policy=policy, cost=costs(1e-3, 1e-6))
        assert set(plan.placement.values()) == {CPU}, policy
        assert runs_inline(plan)
        assert plan.makespan == pytest.approx(2e-3 + 1e-6)
    cost = costs(1e-3, 1e-6)
    given = plan_graph(dag, [CPU, S0], policy=split_b, cost=cost)
    assert given.placement[2] == S0
    assert given.makespan == pytest.approx(2e-3 + start_latency(cost, given))
