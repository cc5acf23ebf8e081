"""Vector clocks and the race checker.

Hand-built plans pin down what :class:`HappensBefore` orders (stream order,
record/wait chains, transitivity through a third stream, nothing without
events) and prove that :func:`check_plan` catches each kind of unsafe plan.
A property test then plans random DAGs and checks the clocks against plain
reachability in the step graph, and that overlapping any two tensors that
really may be live at once is caught.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence

import networkx as nx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from devices import Device
from scheduler.cost import CostModel
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.errors import PlanError
from scheduler.happens_before import HappensBefore, LaunchRef, check_plan
from scheduler.placement import Placement, Policy, evaluate
from scheduler.plan import (
    Arena,
    Launch,
    Plan,
    RecordEvent,
    Step,
    StreamPlan,
    TensorPlacement,
    WaitEvent,
)
from scheduler.planner import plan_graph

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
S1 = Device("sim", 1)
F4 = TensorSpec((4,), "float32")  # 16 bytes


def launch(nid: int, *inputs: int) -> Launch:
    """Node ``nid`` reading ``inputs`` (node ids), writing ``Entry(nid, 0)``."""
    args = (*(Entry(i, 0) for i in inputs), Entry(nid, 0))
    return Launch(nid, f"n{nid}", "k", args, len(inputs))


def hand_plan(
    streams: Sequence[Sequence[Step]],
    offsets: dict[int, int] | None = None,
    order: Sequence[tuple[int, int]] | None = None,
    heads: Sequence[int] = (),
    arena: int | None = None,
) -> Plan:
    """A one-device (cpu) plan: input node 0 is external, every other
    tensor is float32[4] at ``offsets[nid]`` (default: its own 16 bytes).
    ``order`` defaults to stream after stream."""
    nids = sorted({s.nid for steps in streams for s in steps if isinstance(s, Launch)})
    placed = offsets if offsets is not None else {n: 16 * i for i, n in enumerate(nids)}
    storage = {Entry(0, 0): TensorPlacement(CPU, "external")}
    storage |= {Entry(n, 0): TensorPlacement(CPU, "arena", placed[n]) for n in nids}
    size = arena if arena is not None else max(placed.values(), default=0) + 16
    events = {s.event for steps in streams for s in steps if isinstance(s, RecordEvent)}
    return Plan(
        host=CPU,
        devices=(CPU,),
        placement=dict.fromkeys((0, *nids), CPU),
        streams=tuple(StreamPlan(CPU, tuple(steps)) for steps in streams),
        order=tuple(
            order
            if order is not None
            else [(s, i) for s, steps in enumerate(streams) for i in range(len(steps))]
        ),
        num_events=len(events),
        tensors={e: F4 for e in storage},
        storage=storage,
        arenas={CPU: Arena(size, 16)},
        inputs=(0,),
        heads=tuple(Entry(h, 0) for h in heads),
    )


# -- vector clocks ---------------------------------------------------------------------


def test_launches_on_one_stream_are_ordered() -> None:
    order = HappensBefore(hand_plan([[launch(1, 0), launch(2, 1)]]))
    a, b = LaunchRef(0, 0), LaunchRef(0, 1)
    assert order.before(a, b)
    assert not order.before(b, a)
    assert not order.before(a, a)
    assert order.clocks == {a: (0,), b: (1,)}
    assert order.ref_of == {1: a, 2: b}


def test_a_record_wait_pair_orders_what_comes_before_the_record() -> None:
    plan = hand_plan(
        [
            [launch(1, 0), RecordEvent(0), launch(2, 0)],
            [WaitEvent(0), launch(3, 1)],
        ]
    )
    order = HappensBefore(plan)
    a, after_record, c = LaunchRef(0, 0), LaunchRef(0, 1), LaunchRef(1, 0)
    assert order.before(a, c)
    assert not order.before(after_record, c)  # recorded before it was issued
    assert not order.before(c, a)
    assert not order.before(c, after_record)
    assert order.clocks[c] == (1, 0)


def test_order_is_transitive_through_a_third_stream() -> None:
    plan = hand_plan(
        [
            [launch(1, 0), RecordEvent(0)],
            [WaitEvent(0), launch(2, 1), RecordEvent(1)],
            [WaitEvent(1), launch(3, 2)],
        ]
    )
    order = HappensBefore(plan)
    a, b, c = LaunchRef(0, 0), LaunchRef(1, 0), LaunchRef(2, 0)
    assert order.before(a, b)
    assert order.before(b, c)
    assert order.before(a, c)  # never waited for directly
    assert order.clocks[c] == (1, 1, 0)


def test_streams_without_events_are_unordered() -> None:
    plan = hand_plan([[launch(1, 0), launch(2, 0)], [launch(3, 0)]])
    order = HappensBefore(plan)
    for x, y in itertools.permutations(
        [LaunchRef(0, 0), LaunchRef(0, 1), LaunchRef(1, 0)], 2
    ):
        assert order.before(x, y) == (x.stream == y.stream and x < y)


def test_a_wait_sees_the_latest_record_issued_before_it() -> None:
    """An event recorded twice: a wait sees the record issued before it."""
    plan = hand_plan(
        [
            [launch(1, 0), RecordEvent(0), launch(2, 0), RecordEvent(0)],
            [WaitEvent(0), launch(3, 0)],
        ],
        order=[(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)],
    )
    order = HappensBefore(plan)
    assert order.before(LaunchRef(0, 0), LaunchRef(1, 0))
    assert not order.before(LaunchRef(0, 1), LaunchRef(1, 0))


# -- what check_plan rejects -----------------------------------------------------------


def test_a_valid_hand_plan_passes() -> None:
    plan = hand_plan(
        [
            [launch(1, 0), RecordEvent(0), launch(2, 1)],
            [WaitEvent(0), launch(3, 1)],
        ],
        heads=(2, 3),
    )
    check_plan(plan)


def test_a_read_without_a_wait_is_caught() -> None:
    """n3 reads n1's output on another stream with no event between."""
    plan = hand_plan([[launch(1, 0), launch(2, 1)], [launch(3, 1)]], heads=(2, 3))
    with pytest.raises(PlanError, match=r"'n3' reads .*nid=1.* before it is surely"):
        check_plan(plan)


def test_a_wait_for_the_wrong_point_is_caught() -> None:
    """The event is recorded before n1, so waiting for it orders nothing."""
    plan = hand_plan(
        [[RecordEvent(0), launch(1, 0)], [WaitEvent(0), launch(2, 1)]], heads=(2,)
    )
    with pytest.raises(PlanError, match="'n2' reads"):
        check_plan(plan)


def test_a_read_of_a_tensor_nobody_writes_is_caught() -> None:
    plan = hand_plan([[launch(2, 0)]], heads=(2,))
    ghost = Entry(1, 0)
    plan = dataclasses.replace(
        plan,
        streams=(StreamPlan(CPU, (launch(2, 1),)),),
        storage={**plan.storage, ghost: TensorPlacement(CPU, "arena", 16)},
        tensors={**plan.tensors, ghost: F4},
        arenas={CPU: Arena(32, 16)},
    )
    with pytest.raises(PlanError, match="'n2' reads"):
        check_plan(plan)


def test_a_wait_on_an_event_never_recorded_is_caught() -> None:
    plan = hand_plan([[launch(1, 0)], [WaitEvent(7), launch(2, 0)]], heads=(1, 2))
    with pytest.raises(PlanError, match="waits on event 7 before it is recorded"):
        HappensBefore(plan)
    with pytest.raises(PlanError, match="event 7"):
        check_plan(plan)


def test_a_wait_issued_before_its_record_is_caught() -> None:
    plan = hand_plan(
        [[launch(1, 0), RecordEvent(0)], [WaitEvent(0), launch(2, 1)]],
        order=[(1, 0), (0, 0), (0, 1), (1, 1)],
        heads=(2,),
    )
    with pytest.raises(PlanError, match="waits on event 0 before it is recorded"):
        check_plan(plan)


def _two_branches() -> Plan:
    """Two independent branches on two streams, joined: a valid plan."""
    plan = hand_plan(
        [
            [launch(3, 0), launch(4, 3), RecordEvent(0)],
            [launch(1, 0), launch(2, 1), WaitEvent(0), launch(5, 2, 4)],
        ],
        offsets={1: 0, 2: 16, 3: 32, 4: 48, 5: 0},  # n5 reuses n1's bytes
        heads=(5,),
        arena=64,
    )
    check_plan(plan)
    return plan


def test_reuse_after_every_access_is_accepted() -> None:
    _two_branches()


def test_tensors_sharing_bytes_while_both_live_are_caught() -> None:
    """n1 (stream 1) and n3 (stream 0) are unordered: they cannot share."""
    plan = _two_branches()
    storage = dict(plan.storage)
    storage[Entry(3, 0)] = dataclasses.replace(storage[Entry(1, 0)])
    with pytest.raises(PlanError, match=r"share bytes on cpu:0 but may be live"):
        check_plan(dataclasses.replace(plan, storage=storage))


def test_partly_overlapping_tensors_are_caught() -> None:
    plan = _two_branches()
    storage = dict(plan.storage)
    storage[Entry(4, 0)] = TensorPlacement(CPU, "arena", 8)  # overlaps n1, n2
    with pytest.raises(PlanError, match=r"\[0, 16\) and .*\[8, 24\) share bytes"):
        check_plan(dataclasses.replace(plan, storage=storage))


def test_a_head_is_live_until_the_end() -> None:
    """n5 reuses n1's bytes after n1's last read, unless n1 is an output."""
    plan = _two_branches()
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(dataclasses.replace(plan, heads=(Entry(5, 0), Entry(1, 0))))


def test_a_tensor_past_the_end_of_its_arena_is_caught() -> None:
    plan = _two_branches()
    with pytest.raises(PlanError, match=r"\[48, 64\) exceeds the cpu:0 arena"):
        check_plan(dataclasses.replace(plan, arenas={CPU: Arena(60, 16)}))
    storage = dict(plan.storage)
    storage[Entry(2, 0)] = TensorPlacement(CPU, "arena", -4)
    with pytest.raises(PlanError, match="exceeds"):
        check_plan(dataclasses.replace(plan, storage=storage))


# -- property: random planned DAGs -----------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> nx.DiGraph:
    """A random DAG: 1-2 inputs, 1-10 operator nodes reading 1-3 earlier
    outputs, some with two outputs, some ``__nop``; random tiny sizes."""
    sizes = st.sampled_from((0, 1, 3, 4, 16))
    specs = [
        NodeSpec(f"x{i}", "null", "", (), (TensorSpec((draw(sizes),), "float32"),))
        for i in range(draw(st.integers(1, 2)))
    ]
    inputs = len(specs)
    for nid in range(inputs, inputs + draw(st.integers(1, 10))):
        earlier = [
            Entry(n, k) for n in range(nid) for k in range(len(specs[n].outputs))
        ]
        reads = tuple(draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3)))
        if draw(st.integers(0, 5)) == 0:
            first = specs[reads[0].nid].outputs[reads[0].index]
            specs.append(NodeSpec(f"nop{nid}", "tvm_op", "__nop", reads[:1], (first,)))
            continue
        count = 2 if draw(st.integers(0, 4)) == 0 else 1
        outputs = tuple(TensorSpec((draw(sizes),), "float32") for _ in range(count))
        specs.append(
            NodeSpec(f"n{nid}", "tvm_op", "k", reads, outputs, flops=draw(sizes))
        )
    every = [
        Entry(n, k) for n in range(len(specs)) for k in range(len(specs[n].outputs))
    ]
    read = {e for s in specs for e in s.inputs}
    heads = [e for e in every if e not in read and e.nid >= inputs]
    heads += draw(st.lists(st.sampled_from(every), max_size=2))
    graph = GraphSpec(tuple(range(inputs)), (), tuple(dict.fromkeys(heads)))
    return make_dag(specs, graph)


def random_policy(seed: int) -> Policy:
    """A user policy placing every node on a device drawn from ``seed``."""

    def policy(
        graph: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        rng = random.Random(seed)
        return evaluate(graph, devices, cost, {n: rng.choice(devices) for n in graph})

    return policy


def step_graph(plan: Plan) -> nx.DiGraph:
    """Steps as nodes; an edge for stream order and for record -> wait (the
    record issued last before the wait): reachability is happens-before."""
    graph = nx.DiGraph()
    last_record: dict[int, tuple[int, int]] = {}
    for s, stream in enumerate(plan.streams):
        graph.add_nodes_from((s, i) for i in range(len(stream.steps)))
        graph.add_edges_from(((s, i), (s, i + 1)) for i in range(len(stream.steps) - 1))
    for s, i in plan.order:
        step = plan.streams[s].steps[i]
        if isinstance(step, RecordEvent):
            last_record[step.event] = (s, i)
        elif isinstance(step, WaitEvent):
            graph.add_edge(last_record[step.event], (s, i))
    return graph


def may_be_live_at_once(plan: Plan, graph: nx.DiGraph, a: Entry, b: Entry) -> bool:
    """Independent of the checker: unless every access of one reaches the
    write of the other in the step graph (and it is no head)."""
    where: dict[Entry, list[tuple[tuple[int, int], bool]]] = {}
    for s, stream in enumerate(plan.streams):
        for i, step in enumerate(stream.steps):
            if isinstance(step, Launch):
                for k, entry in enumerate(step.args):
                    owner = plan.resolve(entry)
                    where.setdefault(owner, []).append(((s, i), k >= step.num_inputs))
    heads = {plan.resolve(h) for h in plan.heads}

    def done_before(first: Entry, second: Entry) -> bool:
        if first in heads:
            return False
        write = next(at for at, writes in where[second] if writes)
        return all(nx.has_path(graph, at, write) for at, _ in where[first])

    return not (done_before(a, b) or done_before(b, a))


def overlap_is_caught(plan: Plan, steps: nx.DiGraph, data: st.DataObject) -> bool:
    """Put two arena tensors of ``plan`` that may be live at once (if any:
    drawn from ``data``) at the same offset, and check that
    :func:`check_plan` refuses the result.

    :return: whether there were two such tensors.
    """
    conflicting = [
        (a, b)
        for device in plan.arenas
        for a, b in itertools.combinations(
            sorted(
                e
                for e, p in plan.storage.items()
                if p.where == "arena"
                and p.device == device
                and plan.tensors[e].nbytes > 0
            ),
            2,
        )
        if may_be_live_at_once(plan, steps, a, b)
    ]
    if not conflicting:
        return False
    a, b = data.draw(st.sampled_from(conflicting))
    storage = dict(plan.storage)
    placed_a = storage[a]
    storage[b] = TensorPlacement(placed_a.device, "arena", placed_a.offset)
    end = placed_a.offset + plan.tensors[b].nbytes
    arena = plan.arenas[placed_a.device]
    arenas = {**plan.arenas, placed_a.device: Arena(max(arena.size, end), 0)}
    corrupt = dataclasses.replace(plan, storage=storage, arenas=arenas)
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(corrupt)
    return True


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(graph=dags(), data=st.data())
def test_planned_random_dags_are_race_free_and_corruption_is_caught(
    graph: nx.DiGraph, data: st.DataObject
) -> None:
    devices = data.draw(
        st.sampled_from([(CPU,), (CPU, S0), (S0, CPU, S1), (CPU, S0, S1), (S1, S0)])
    )
    policy: str | Policy = data.draw(
        st.sampled_from(["auto", "heft", "peft", "fastest", "single"])
        | st.integers(0, 2**16).map(random_policy)
    )
    plan = plan_graph(
        graph, devices, policy=policy, max_streams=data.draw(st.integers(1, 3))
    )
    check_plan(plan)

    # The clocks agree with reachability in the step graph, pair by pair.
    steps = step_graph(plan)
    order = HappensBefore(plan)
    refs = list(order.refs())
    at = {
        ref: (ref.stream, i)
        for ref in refs
        for i, step in enumerate(plan.streams[ref.stream].steps)
        if step is order.launch_at[ref]
    }
    for x, y in itertools.permutations(refs, 2):
        assert order.before(x, y) == nx.has_path(steps, at[x], at[y]), (x, y)

    # Overlap two tensors of one arena: caught exactly when both may be live.
    if overlap_is_caught(plan, steps, data):
        event("overlapped two tensors that may be live at once")
    else:
        event("no two tensors may be live at once")
