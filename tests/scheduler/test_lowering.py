"""Lowering a placement to copies, streams and events, against literal
expected plans (dask-style: the whole state, written out).

Steps are shown compactly: a launch by its name, ``"record N"`` and
``"wait N"`` for events; each stream as ``(device, [steps])``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import networkx as nx

from devices import Device
from scheduler.cost import CostModel
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.happens_before import check_plan
from scheduler.lowering import Lowered, lower
from scheduler.placement import Placement, Policy, evaluate
from scheduler.plan import Launch, Plan, RecordEvent, StreamPlan, WaitEvent
from scheduler.planner import plan_graph

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
S1 = Device("sim", 1)
T4 = (TensorSpec((4,), "float32"),)

Shown = list[tuple[str, list[str]]]


def dag(nodes: Sequence[tuple[str, Sequence[int]]], heads: Sequence[int]) -> nx.DiGraph:
    """Node 0 is the graph input ``x``; then ``(name, input node ids)``, each
    with one float32[4] output; ``heads`` are node ids."""
    specs = [NodeSpec("x", "null", "", (), T4)]
    for name, inputs in nodes:
        specs.append(
            NodeSpec(name, "tvm_op", "k", tuple(Entry(i, 0) for i in inputs), T4)
        )
    return make_dag(specs, GraphSpec((0,), (), tuple(Entry(h, 0) for h in heads)))


def show(streams: Sequence[StreamPlan]) -> Shown:
    shown: Shown = []
    for stream in streams:
        steps = []
        for step in stream.steps:
            if isinstance(step, Launch):
                steps.append(step.name)
            elif isinstance(step, RecordEvent):
                steps.append(f"record {step.event}")
            else:
                steps.append(f"wait {step.event}")
        shown.append((str(stream.device), steps))
    return shown


def assert_topological(lowered: Lowered) -> None:
    """The issue order produces every tensor before any launch reads it."""
    produced: set[Entry] = set()
    for s, i in lowered.order:
        step = lowered.streams[s].steps[i]
        if isinstance(step, Launch):
            for entry in step.args[: step.num_inputs]:
                owner = lowered.aliases.get(entry, entry)
                assert owner.nid == 0 or owner in produced, (step.name, entry)
            produced.update(step.args[step.num_inputs :])


def given(device_of: Mapping[int, Device]) -> Policy:
    """A user policy: exactly this assignment."""

    def policy(
        graph: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        return evaluate(graph, devices, cost, device_of, name="given")

    return policy


# -- copies -----------------------------------------------------------------------


def test_one_copy_per_consumer_device() -> None:
    """a and b on sim:1 both read x (on the host): one copy to sim:1; c on
    sim:0 gets its own. Each head comes back to the host."""
    graph = dag([("a", [0]), ("b", [0]), ("c", [0])], [1, 2, 3])
    lowered = lower(
        graph, [CPU, S0, S1], {1: S1, 2: S1, 3: S0}, {1: 0.0, 2: 1.0, 3: 2.0}, 1
    )
    assert show(lowered.streams) == [
        ("sim:1", ["copy_0_0_to_sim1", "record 3"]),
        ("sim:1", ["wait 3", "a", "record 0", "b", "record 1"]),
        ("sim:0", ["copy_0_0_to_sim0", "record 4"]),
        ("sim:0", ["wait 4", "c", "record 2"]),
        # copies to the host: on each device's outgoing copy stream
        ("sim:1", ["wait 0", "copy_1_0_to_cpu0", "wait 1", "copy_2_0_to_cpu0"]),
        ("sim:0", ["wait 2", "copy_3_0_to_cpu0"]),
    ]
    a, b = (
        next(s for s in lowered.streams[1].steps if getattr(s, "name", "") == n)
        for n in ("a", "b")
    )
    assert isinstance(a, Launch) and isinstance(b, Launch)
    assert a.args[0] == b.args[0] == Entry(4, 0)  # both read the one copy
    assert lowered.location[Entry(4, 0)] == S1
    assert lowered.heads == (Entry(6, 0), Entry(7, 0), Entry(8, 0))
    assert {lowered.location[h] for h in lowered.heads} == {CPU}
    assert_topological(lowered)


def test_a_shared_copy_is_issued_before_its_earliest_consumer() -> None:
    """Regression: b (after a in topological order) is predicted to start
    first; the copy both read must be issued before b, not just before a."""
    graph = dag([("a", [0]), ("b", [0])], [1, 2])
    lowered = lower(graph, [CPU, S0], {1: S0, 2: S0}, {1: 5.0, 2: 1.0}, 1)
    assert show(lowered.streams) == [
        ("sim:0", ["copy_0_0_to_sim0", "record 1"]),
        ("sim:0", ["wait 1", "b", "a", "record 0"]),
        ("sim:0", ["wait 0", "copy_1_0_to_cpu0", "copy_2_0_to_cpu0"]),
    ]
    assert_topological(lowered)


def test_copies_run_on_the_device_side_copy_streams() -> None:
    """A copy runs on its destination's copy stream, except one to the host,
    which runs on its source's outgoing copy stream (the device's copy
    engine), so the host's streams only compute."""
    graph = dag([("a", [0]), ("b", [1]), ("c", [2])], [3])
    plan = plan_graph(graph, [CPU, S0, S1], policy=given({1: S0, 2: S1, 3: S0}))
    check_plan(plan)
    copies = 0
    for stream in plan.streams:
        launches = [s for s in stream.steps if isinstance(s, Launch)]
        kinds = {launch.func_name == "__copy" for launch in launches}
        assert len(kinds) == 1, f"copies and compute share a stream: {stream}"
        for launch in launches:
            if launch.func_name == "__copy":
                copies += 1
                source, target = launch.args
                to, of = plan.storage[target].device, plan.storage[source].device
                assert stream.device == (of if to == CPU else to)
    # x -> sim:0, a -> sim:1, b -> sim:0, c -> cpu:0
    assert copies == 4
    assert [str(s.device) for s in plan.streams if _only_copies(s)] == [
        "sim:0",
        "sim:1",
        "sim:0",
    ]


def _only_copies(stream: StreamPlan) -> bool:
    return all(s.func_name == "__copy" for s in stream.steps if isinstance(s, Launch))


def test_heads_on_a_sim_device_are_copied_back_to_the_host() -> None:
    graph = dag([("a", [0]), ("b", [1])], [1, 2])
    plan = plan_graph(graph, [CPU, S0], policy=given({1: S0, 2: S0}))
    check_plan(plan)
    # x=0, a=1, b=2, copy x->sim:0 = 3, a->cpu = 4, b->cpu = 5
    assert plan.heads == (Entry(4, 0), Entry(5, 0))
    sources = {
        launch.args[1]: launch.args[0]
        for launch in plan.launches()
        if launch.func_name == "__copy"
    }
    assert sources[Entry(4, 0)] == Entry(1, 0)
    assert sources[Entry(5, 0)] == Entry(2, 0)
    for head in plan.heads:
        assert plan.storage[head].device == CPU
        assert plan.tensors[head] == T4[0]


def test_heads_on_the_host_are_not_copied() -> None:
    graph = dag([("a", [0])], [1, 0])
    plan = plan_graph(graph, [CPU, S0], policy=given({1: CPU}), max_streams=2)
    assert plan.heads == (Entry(1, 0), Entry(0, 0))
    assert [launch.name for launch in plan.launches()] == ["a"]


# -- streams and events -------------------------------------------------------------


def test_a_chain_stays_on_one_stream() -> None:
    graph = dag([("a", [0]), ("b", [1]), ("c", [2])], [3])
    lowered = lower(graph, [CPU], dict.fromkeys((1, 2, 3), CPU), {}, 3)
    assert show(lowered.streams) == [("cpu:0", ["a", "b", "c"])]
    assert lowered.num_events == 0


def test_independent_branches_take_different_streams() -> None:
    """a and b both read x only; with two streams they run side by side and
    the join waits for exactly one event."""
    graph = dag([("a", [0]), ("b", [0]), ("c", [1, 2])], [3])
    lowered = lower(
        graph, [CPU], dict.fromkeys((1, 2, 3), CPU), {1: 0.0, 2: 0.0, 3: 1.0}, 2
    )
    assert show(lowered.streams) == [
        ("cpu:0", ["a", "wait 0", "c"]),
        ("cpu:0", ["b", "record 0"]),
    ]
    assert lowered.num_events == 1
    assert lowered.order == ((0, 0), (1, 0), (1, 1), (0, 1), (0, 2))


def test_one_stream_needs_no_events() -> None:
    graph = dag([("a", [0]), ("b", [0]), ("c", [1, 2])], [3])
    lowered = lower(
        graph, [CPU], dict.fromkeys((1, 2, 3), CPU), {1: 0.0, 2: 0.0, 3: 1.0}, 1
    )
    assert show(lowered.streams) == [("cpu:0", ["a", "b", "c"])]
    assert lowered.num_events == 0


def test_a_dependency_across_streams_is_one_record_and_one_wait() -> None:
    """d reads b twice and c, on another stream: d continues b's stream and
    waits once for c, however many arguments cross."""
    graph = dag([("a", [0]), ("b", [0]), ("c", [1]), ("d", [2, 3, 2])], [4])
    lowered = lower(
        graph,
        [CPU],
        dict.fromkeys((1, 2, 3, 4), CPU),
        {1: 0.0, 2: 0.0, 3: 1.0, 4: 2.0},
        2,
    )
    assert show(lowered.streams) == [
        ("cpu:0", ["a", "c", "record 0"]),
        ("cpu:0", ["b", "wait 0", "d"]),
    ]
    assert lowered.num_events == 1


def test_no_wait_when_the_stream_already_waited_for_a_later_point() -> None:
    """Stream B waits for a2 before b1; b2 then reads a1 (earlier on A):
    already ordered, no second wait."""
    graph = dag(
        [("a1", [0]), ("a2", [1]), ("b0", [0]), ("b1", [3, 2]), ("b2", [4, 1])],
        [5],
    )
    lowered = lower(
        graph,
        [CPU],
        dict.fromkeys(range(1, 6), CPU),
        {1: 0.0, 2: 1.0, 3: 0.5, 4: 2.0, 5: 3.0},
        2,
    )
    assert show(lowered.streams) == [
        ("cpu:0", ["a1", "a2", "record 0"]),
        ("cpu:0", ["b0", "wait 0", "b1", "b2"]),
    ]


def test_no_wait_when_ordered_through_a_third_stream() -> None:
    """c1 reads b1 and a1; b1's stream waited for a1 before it, so waiting
    for b1 orders a1 too: one wait on c1's stream, not two."""
    graph = dag(
        [("a1", [0]), ("a2", [1]), ("b1", [1]), ("b2", [3]), ("c1", [3, 1])],
        [2, 4, 5],
    )
    lowered = lower(
        graph,
        [CPU],
        dict.fromkeys(range(1, 6), CPU),
        {1: 0.0, 2: 1.0, 3: 2.0, 4: 3.0, 5: 4.0},
        3,
    )
    assert show(lowered.streams) == [
        ("cpu:0", ["a1", "record 0", "a2"]),
        ("cpu:0", ["wait 0", "b1", "record 1", "b2"]),
        ("cpu:0", ["wait 1", "c1"]),
    ]


def test_the_issue_order_records_before_it_waits() -> None:
    graph = dag([("a", [0]), ("b", [0]), ("c", [1, 2]), ("d", [3])], [4, 1])
    plan = plan_graph(
        graph,
        [CPU, S0, S1],
        policy=given({1: S0, 2: S1, 3: CPU, 4: S1}),
        max_streams=2,
    )
    check_plan(plan)
    recorded: set[int] = set()
    for s, i in plan.order:
        step = plan.streams[s].steps[i]
        if isinstance(step, RecordEvent):
            recorded.add(step.event)
        elif isinstance(step, WaitEvent):
            assert step.event in recorded
    assert sorted(recorded) == list(range(plan.num_events))
    assert sorted(plan.order) == sorted(
        (s, i)
        for s, stream in enumerate(plan.streams)
        for i in range(len(stream.steps))
    )


# -- showing a plan -------------------------------------------------------------------


def _multi_device_plan() -> Plan:
    graph = dag([("a", [0]), ("b", [0]), ("c", [1, 2])], [3, 1])
    plan = plan_graph(
        graph, [CPU, S0, S1], policy=given({1: S0, 2: S1, 3: S1}), max_streams=2
    )
    check_plan(plan)
    return plan


def test_print_names_devices_streams_waits_copies_and_arenas() -> None:
    plan = _multi_device_plan()
    text = str(plan)
    assert text.startswith("Plan on cpu:0, sim:0, sim:1 (host cpu:0)")
    for index, stream in enumerate(plan.streams):
        assert f"stream {index} on {stream.device}:" in text
    for device, arena in plan.arenas.items():
        assert f"arena {device}: {arena.size} bytes" in text
    assert set(plan.arenas) == {CPU, S0, S1}
    assert "wait event 0" in text
    assert "record event 0" in text
    assert "__copy(0.0(ext))" in text  # x copied to a sim device
    assert re.search(r"copy_1_0_to_cpu0 = __copy\(1\.0@\d+\) -> \d+\.0@\d+", text)


def test_to_dot_draws_streams_data_edges_and_dashed_event_waits() -> None:
    plan = _multi_device_plan()
    dot = plan.to_dot()
    lines = dot.splitlines()
    assert lines[0] == "digraph plan {"
    assert lines[-1] == "}"
    assert dot.count("{") == dot.count("}")
    declared = set(re.findall(r"^\s+(n\d+) \[label=", dot, re.MULTILINE))
    assert declared == {f"n{launch.nid}" for launch in plan.launches()}
    for index, stream in enumerate(plan.streams):
        assert (
            f'subgraph cluster_s{index} {{ label="stream {index} ({stream.device})";'
            in dot
        )
    edges = re.findall(
        r"^  (n\d+) -> (n\d+)( \[style=dashed.*\])?;$", dot, re.MULTILINE
    )
    assert {a for a, _, _ in edges} | {b for _, b, _ in edges} <= declared
    dashed = [(a, b) for a, b, style in edges if style]
    # One dashed edge per wait: from the launch the event follows to the
    # launch the wait precedes.
    expected = []
    after_event: dict[int, str] = {}
    for stream in plan.streams:
        last = None
        for step in stream.steps:
            if isinstance(step, Launch):
                last = f"n{step.nid}"
            elif isinstance(step, RecordEvent) and last is not None:
                after_event[step.event] = last
    for stream in plan.streams:
        pending: list[int] = []
        for step in stream.steps:
            if isinstance(step, WaitEvent):
                pending.append(step.event)
            elif isinstance(step, Launch):
                expected += [(after_event[e], f"n{step.nid}") for e in pending]
                pending = []
    assert sorted(dashed) == sorted(expected)
    assert len(dashed) == sum(
        isinstance(step, WaitEvent) for s in plan.streams for step in s.steps
    )
    solid = {(a, b) for a, b, style in edges if not style}
    for launch in plan.launches():
        for entry in launch.args[: launch.num_inputs]:
            if entry.nid != 0:
                assert (f"n{plan.resolve(entry).nid}", f"n{launch.nid}") in solid


def test_zero_byte_tensors_still_get_an_arena_on_their_device() -> None:
    """Regression: a device whose tensors are all empty had no arena, so
    the dispatcher found no arena to view them in (KeyError)."""
    empty = (TensorSpec((0,), "float32"),)
    specs = [
        NodeSpec("x", "null", "", (), empty),
        NodeSpec("a", "tvm_op", "k", (Entry(0, 0),), empty),
        NodeSpec("b", "tvm_op", "k", (Entry(1, 0), Entry(0, 0)), empty),
    ]
    graph = make_dag(specs, GraphSpec((0,), (), (Entry(1, 0), Entry(2, 0))))
    plan = plan_graph(graph, [CPU, S0, S1], policy=given({1: S0, 2: S1}))
    check_plan(plan)
    for entry, placement in plan.storage.items():
        if placement.where == "arena":
            assert placement.device in plan.arenas, entry
    assert {d: a.size for d, a in plan.arenas.items()} == {CPU: 0, S0: 0, S1: 0}
