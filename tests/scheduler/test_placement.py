"""Placement policies against literal published schedules, pins, kernels
available on some kinds only, the single-device guard, and determinism."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices import Device
from scheduler.cost import (
    AnalyticCostModel,
    CostModel,
    DeviceSpeed,
    TableCostModel,
    edge_nbytes,
)
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.errors import PlanError
from scheduler.placement import (
    Placement,
    best_of,
    evaluate,
    fastest_single,
    get_policy,
    guarded,
    heft,
    lookahead,
    optimistic_cost_table,
    peft,
    place,
    resolve_pins,
    single_device,
    upward_ranks,
)

CPU = Device("cpu", 0)
CUDA = Device("cuda", 0)
P = [Device("sim", i) for i in range(3)]


def _table_dag(
    costs: Sequence[tuple[int, ...]], edges: Mapping[tuple[int, int], int]
) -> tuple[nx.DiGraph, TableCostModel]:
    """A DAG whose edge ``(u, v)`` carries ``edges[u, v]`` bytes (one output
    of ``u`` per consumer) and a table model with a 1 byte/s default link,
    so an edge's cost between two devices is its byte count, as in the
    papers' figures."""
    outs: dict[int, list[TensorSpec]] = {n: [] for n in range(len(costs))}
    inputs: dict[int, list[Entry]] = {n: [] for n in range(len(costs))}
    for (u, v), nbytes in sorted(edges.items()):
        outs[u].append(TensorSpec((nbytes,), "uint8"))
        inputs[v].append(Entry(u, len(outs[u]) - 1))
    last = len(costs) - 1
    outs[last].append(TensorSpec((0,), "uint8"))
    nodes = [
        NodeSpec(f"n{i}", "tvm_op", "k", tuple(inputs[i]), tuple(outs[i]))
        for i in range(len(costs))
    ]
    dag = make_dag(nodes, GraphSpec((), (), (Entry(last, 0),)))
    table = {
        (n, P[p]): float(c) for n, row in enumerate(costs) for p, c in enumerate(row)
    }
    return dag, TableCostModel(table, dag=dag)


# Topcuoglu, Hariri and Wu 2002, Fig. 2 (tasks n1..n10 are ids 0..9).
HEFT_COSTS = [
    (14, 16, 9),
    (13, 19, 18),
    (11, 13, 19),
    (13, 8, 17),
    (12, 13, 10),
    (13, 16, 9),
    (7, 15, 11),
    (5, 11, 14),
    (18, 12, 20),
    (21, 7, 16),
]
HEFT_EDGES = {
    (0, 1): 18,
    (0, 2): 12,
    (0, 3): 9,
    (0, 4): 11,
    (0, 5): 14,
    (1, 7): 19,
    (1, 8): 16,
    (2, 6): 23,
    (3, 7): 27,
    (3, 8): 23,
    (4, 8): 13,
    (5, 7): 15,
    (6, 9): 17,
    (7, 9): 11,
    (8, 9): 13,
}

# Arabnejad and Barbosa 2014, Fig. 2 (tasks T1..T10 are ids 0..9).
PEFT_COSTS = [
    (22, 21, 36),
    (22, 18, 18),
    (32, 27, 43),
    (7, 10, 4),
    (29, 27, 35),
    (26, 17, 24),
    (14, 25, 30),
    (29, 23, 36),
    (15, 21, 8),
    (13, 16, 33),
]
PEFT_EDGES = {
    (0, 1): 17,
    (0, 2): 31,
    (0, 3): 29,
    (0, 4): 13,
    (0, 5): 7,
    (1, 7): 3,
    (1, 8): 30,
    (2, 6): 16,
    (3, 7): 11,
    (3, 8): 7,
    (4, 8): 57,
    (5, 7): 5,
    (6, 9): 9,
    (7, 9): 42,
    (8, 9): 7,
}


def _slots(plan: Placement) -> dict[Device, list[tuple[int, float, float]]]:
    return {
        dev: [(n, plan.start[n], plan.finish[n]) for n in nids]
        for dev, nids in plan.order.items()
        if nids
    }


def test_heft_paper_example_ranks_and_schedule() -> None:
    dag, cost = _table_dag(HEFT_COSTS, HEFT_EDGES)
    ranks = upward_ranks(dag, P, cost)
    assert [round(ranks[n], 3) for n in range(10)] == [
        108.0,
        77.0,
        80.0,
        80.0,
        69.0,
        63.333,
        42.667,
        35.667,
        44.333,
        14.667,
    ]
    plan = heft(dag, P, cost)
    assert plan.makespan == 80.0
    assert plan.policy == "heft"
    # Fig. 4(a) of the paper
    assert _slots(plan) == {
        P[0]: [(1, 27.0, 40.0), (7, 57.0, 62.0)],
        P[1]: [(3, 18.0, 26.0), (5, 26.0, 42.0), (8, 56.0, 68.0), (9, 73.0, 80.0)],
        P[2]: [(0, 0.0, 9.0), (2, 9.0, 28.0), (4, 28.0, 38.0), (6, 38.0, 49.0)],
    }


def test_peft_paper_example_oct_and_schedule() -> None:
    dag, cost = _table_dag(PEFT_COSTS, PEFT_EDGES)
    table = optimistic_cost_table(dag, P, cost)
    assert {n: [table[n][p] for p in P] for n in range(10)} == {
        0: [64, 68, 86],
        1: [42, 39, 42],
        2: [27, 41, 43],
        3: [42, 39, 50],
        4: [28, 37, 28],
        5: [42, 39, 44],
        6: [13, 16, 22],
        7: [13, 16, 33],
        8: [13, 16, 20],
        9: [0, 0, 0],
    }
    plan = peft(dag, P, cost)
    assert plan.makespan == 122.0  # the paper: PEFT 122, HEFT 133
    assert heft(dag, P, cost).makespan == 133.0
    assert _slots(plan) == {
        P[0]: [
            (0, 0.0, 22.0),
            (3, 22.0, 29.0),
            (1, 29.0, 51.0),
            (2, 51.0, 83.0),
            (6, 83.0, 97.0),
        ],
        P[1]: [(5, 29.0, 46.0), (7, 54.0, 77.0), (9, 106.0, 122.0)],
        P[2]: [(4, 35.0, 70.0), (8, 81.0, 89.0)],
    }


def test_lookahead_on_both_papers_examples() -> None:
    dag, cost = _table_dag(PEFT_COSTS, PEFT_EDGES)
    plan = lookahead(dag, P, cost)
    assert (plan.policy, plan.makespan) == ("lookahead", 127.0)  # HEFT: 133
    assert _slots(plan) == {
        P[0]: [(2, 52.0, 84.0), (6, 84.0, 98.0)],
        P[1]: [
            (0, 0.0, 21.0),
            (4, 21.0, 48.0),
            (1, 48.0, 66.0),
            (7, 67.0, 90.0),
            (8, 90.0, 111.0),
            (9, 111.0, 127.0),
        ],
        P[2]: [(5, 28.0, 52.0), (3, 52.0, 56.0)],
    }
    dag, cost = _table_dag(HEFT_COSTS, HEFT_EDGES)
    assert lookahead(dag, P, cost).makespan == 81.0  # HEFT: 80, PEFT: 85


def test_peft_on_the_heft_example_and_auto_takes_the_better() -> None:
    dag, cost = _table_dag(HEFT_COSTS, HEFT_EDGES)
    assert peft(dag, P, cost).makespan == 85.0
    auto = get_policy("auto")(dag, P, cost)
    assert (auto.policy, auto.makespan) == ("heft", 80.0)
    assert fastest_single(dag, P, cost).makespan == 127.0


def _model_graph() -> nx.DiGraph:
    """x, w (null) -> conv -> relu (nop-free) -> nop -> out; 4 MB tensors."""
    big = TensorSpec((1 << 20,), "float32")
    nodes = [
        NodeSpec("x", "null", "", (), (big,)),
        NodeSpec("w", "null", "", (), (big,)),
        NodeSpec(
            "conv", "tvm_op", "conv", (Entry(0, 0), Entry(1, 0)), (big,), flops=4e9
        ),
        NodeSpec("relu", "tvm_op", "relu", (Entry(2, 0),), (big,), flops=1e6),
        NodeSpec("view", "tvm_op", "__nop", (Entry(3, 0),), (big,)),
        NodeSpec("out", "tvm_op", "sum", (Entry(4, 0),), (big,), flops=1e6),
    ]
    return make_dag(nodes, GraphSpec((0,), (1,), (Entry(5, 0),)))


def _speeds() -> dict[Device, DeviceSpeed]:
    return {
        CPU: DeviceSpeed(flops=1e9),
        P[0]: DeviceSpeed(flops=100e9, bandwidth=8e9, latency=20e-6),
        P[1]: DeviceSpeed(flops=50e9, bandwidth=8e9, latency=20e-6),
    }


def test_null_nodes_on_host_nop_follows_input_and_heads_come_back() -> None:
    dag = _model_graph()
    devices = [CPU, P[0], P[1]]
    cost = AnalyticCostModel(dag, _speeds())
    plan = heft(dag, devices, cost)
    assert plan.device_of[0] == CPU and plan.device_of[1] == CPU
    assert plan.device_of[2] == P[0]  # 100x faster than the cpu
    assert plan.device_of[4] == plan.device_of[3]  # __nop stays with input 0
    last = plan.device_of[5]
    back = cost.transfer_time(4 << 20, last, CPU)
    assert plan.makespan == pytest.approx(plan.finish[5] + back)


def test_a_split_pays_only_beyond_the_hosts_sync_latency() -> None:
    """x -> a (the head): 1 ms on the cpu, 0.5 ms on a sim over a free link.
    Running a on the sim saves 0.5 ms, and bringing its output back costs
    the cpu stream's wake-up: the split pays while that is shorter."""
    f32 = TensorSpec((4,), "float32")
    dag = make_dag(
        [
            NodeSpec("x", "null", "", (), (f32,)),
            NodeSpec("a", "tvm_op", "f", (Entry(0, 0),), (f32,), flops=1e6),
        ],
        GraphSpec((0,), (), (Entry(1, 0),)),
    )
    devices = [CPU, P[0]]
    for wake, where, makespan in ((4e-4, P[0], 9e-4), (6e-4, CPU, 1e-3)):
        speeds = {
            CPU: DeviceSpeed(flops=1e9, sync_latency=wake),
            P[0]: DeviceSpeed(flops=2e9),
        }
        for policy in ("heft", "peft", "lookahead", "auto"):
            plan = place(dag, devices, AnalyticCostModel(dag, speeds), policy)
            assert plan.device_of[1] == where, (policy, wake)
            assert plan.makespan == pytest.approx(makespan)


def test_pins_are_respected() -> None:
    dag = _model_graph()
    nodes = [dag.nodes[n]["spec"] for n in sorted(dag.nodes)]
    pinned = list(nodes)
    pinned[3] = NodeSpec(**{**vars(nodes[3]), "device": P[1]})
    pinned[5] = NodeSpec(**{**vars(nodes[5]), "device_type": 1})  # cpu
    dag2 = make_dag(pinned, dag.graph["spec"])
    devices = [CPU, P[0], P[1]]
    cost = AnalyticCostModel(dag2, _speeds())
    for policy in ("single", "fastest", "heft", "peft", "auto"):
        plan = place(dag2, devices, cost, policy)
        assert plan.device_of[3] == P[1], policy
        assert plan.device_of[5] == CPU, policy
    single = single_device(P[0])(dag2, devices, cost)
    assert single.device_of[2] == P[0] and single.device_of[3] == P[1]


def test_device_type_pin_without_such_device_is_ignored() -> None:
    dag = _model_graph()
    nodes = [dag.nodes[n]["spec"] for n in sorted(dag.nodes)]
    tvm_style = [NodeSpec(**{**vars(s), "device_type": 1}) for s in nodes]
    dag2 = make_dag(tvm_style, dag.graph["spec"])
    assert resolve_pins(dag2, [P[0], P[1]]) == {0: P[0], 1: P[0]}
    assert resolve_pins(dag2, [CUDA, CPU]) == dict.fromkeys(range(6), CPU)


def test_pin_to_a_device_not_given_is_a_plan_error() -> None:
    dag = _model_graph()
    nodes = [dag.nodes[n]["spec"] for n in sorted(dag.nodes)]
    nodes[2] = NodeSpec(**{**vars(nodes[2]), "device": CUDA})
    dag2 = make_dag(nodes, dag.graph["spec"])
    with pytest.raises(PlanError, match=r"'conv'.*cuda:0"):
        heft(dag2, [CPU, P[0]], AnalyticCostModel(dag2, _speeds()))


def test_unsupported_kernels_are_avoided() -> None:
    dag = _model_graph()
    devices = [CPU, P[0], P[1]]

    def no_conv_on_sim0(nid: int, dev: Device) -> bool:
        return not (nid == 2 and dev == P[0])

    cost = AnalyticCostModel(dag, _speeds(), supported=no_conv_on_sim0)
    for policy in ("heft", "peft", "auto", "fastest"):
        plan = place(dag, devices, cost, policy)
        assert plan.device_of[2] != P[0], policy
        assert math.isfinite(plan.makespan)
    with pytest.raises(PlanError, match="cannot run"):
        single_device(P[0])(dag, devices, cost)

    cost_none = AnalyticCostModel(dag, _speeds(), supported=lambda n, d: n != 2)
    with pytest.raises(PlanError, match=r"'conv' \(id 2\) cannot run on any"):
        heft(dag, devices, cost_none)


def test_get_policy_names_and_callables() -> None:
    dag = _model_graph()
    devices = [CPU, P[0]]
    cost = AnalyticCostModel(dag, _speeds())
    assert get_policy("single")(dag, devices, cost).policy == "single(cpu:0)"
    assert get_policy("fastest")(dag, devices, cost).policy == "single(sim:0)"
    assert get_policy("heft", guard=False) is heft
    assert get_policy("peft", guard=False) is peft
    assert get_policy("lookahead", guard=False) is lookahead
    custom = single_device(P[0])
    assert get_policy(custom) is custom
    with pytest.raises(PlanError, match="unknown placement policy 'greedy'"):
        get_policy("greedy")
    with pytest.raises(PlanError):
        get_policy(42)  # type: ignore[arg-type]
    with pytest.raises(PlanError):
        best_of()


def test_place_rejects_a_policy_that_moves_a_pin() -> None:
    dag = _model_graph()
    devices = [CPU, P[0]]
    cost = AnalyticCostModel(dag, _speeds())

    def rogue(dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel) -> Placement:
        plan = heft(dag, devices, cost)
        moved = {**plan.device_of, 0: P[0]}
        return Placement(moved, plan.start, plan.finish, plan.order, 0.0, "rogue")

    with pytest.raises(PlanError, match=r"rogue.*'x'.*pinned to cpu:0"):
        place(dag, devices, cost, rogue)


def test_evaluate_reproduces_a_policy_schedule() -> None:
    dag, cost = _table_dag(HEFT_COSTS, HEFT_EDGES)
    plan = heft(dag, P, cost)
    again = evaluate(dag, P, cost, plan.device_of)
    assert again.device_of == plan.device_of
    assert again.makespan == 80.0
    with pytest.raises(PlanError, match="no listed device"):
        evaluate(dag, P, cost, {})


# -- random DAGs -------------------------------------------------------------


@st.composite
def _instances(draw: st.DrawFn) -> tuple[nx.DiGraph, list[Device], AnalyticCostModel]:
    n = draw(st.integers(1, 14))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(
                lambda e: e[0] < e[1]
            ),
            unique=True,
            max_size=3 * n,
        )
    )
    sizes = draw(st.lists(st.integers(0, 1 << 22), min_size=n, max_size=n))
    flops = draw(st.lists(st.floats(0, 1e10), min_size=n, max_size=n))
    preds: dict[int, list[int]] = {v: [] for v in range(n)}
    for u, v in edges:
        preds[v].append(u)
    nodes = [
        NodeSpec(
            f"n{v}",
            "tvm_op",
            "k",
            tuple(Entry(u, 0) for u in sorted(preds[v])),
            (TensorSpec((sizes[v],), "uint8"),),
            flops=flops[v],
        )
        for v in range(n)
    ]
    dag = make_dag(nodes, GraphSpec((), (), (Entry(n - 1, 0),)))
    k = draw(st.integers(1, 4))
    devices = [CPU] + [Device("sim", i) for i in range(k - 1)]
    speeds = {
        dev: DeviceSpeed(
            flops=draw(st.floats(1e8, 1e11)),
            bandwidth=math.inf if dev == CPU else draw(st.floats(1e8, 1e10)),
            latency=0.0 if dev == CPU else draw(st.floats(0, 1e-4)),
        )
        for dev in devices
    }
    kinds = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    # some kernels exist on the cpu only
    cost = AnalyticCostModel(
        dag, speeds, supported=lambda nid, dev: dev == CPU or kinds[nid]
    )
    return dag, devices, cost


def _check_schedule(dag: nx.DiGraph, cost: CostModel, plan: Placement) -> None:
    assert set(plan.device_of) == set(dag.nodes)
    eps = 1e-9
    for u, v in dag.edges:
        delay = 0.0
        if plan.device_of[u] != plan.device_of[v]:
            nbytes = edge_nbytes(dag, u, v)
            delay = cost.transfer_time(nbytes, plan.device_of[u], plan.device_of[v])
        assert plan.start[v] + eps * (1 + plan.start[v]) >= plan.finish[u] + delay
    for dev, nids in plan.order.items():
        assert all(plan.device_of[n] == dev for n in nids)
        # Zero-length nodes (inputs, __nop) never launch and occupy nothing.
        busy = sorted(
            (plan.start[n], plan.finish[n])
            for n in nids
            if plan.finish[n] > plan.start[n]
        )
        for (_, f0), (s1, _) in itertools.pairwise(busy):
            assert s1 + eps * (1 + s1) >= f0
        for n in nids:
            duration = cost.compute_time(n, dev)
            assert plan.finish[n] - plan.start[n] == pytest.approx(duration)
    assert plan.makespan >= max(plan.finish.values(), default=0.0)


@settings(max_examples=60, deadline=None)
@given(_instances())
def test_guard_is_never_worse_than_the_fastest_single_device(
    instance: tuple[nx.DiGraph, list[Device], AnalyticCostModel],
) -> None:
    dag, devices, cost = instance
    single = fastest_single(dag, devices, cost)  # the cpu can run everything
    for policy in (
        get_policy("auto"),
        guarded(heft),
        guarded(peft),
        get_policy("lookahead"),
    ):
        plan = policy(dag, devices, cost)
        assert plan.makespan <= single.makespan
    for raw in (heft, peft, lookahead, single_device(CPU)):
        _check_schedule(dag, cost, raw(dag, devices, cost))


@settings(max_examples=25, deadline=None)
@given(_instances())
def test_policies_are_deterministic(
    instance: tuple[nx.DiGraph, list[Device], AnalyticCostModel],
) -> None:
    dag, devices, cost = instance
    for name in ("heft", "peft", "lookahead", "auto"):
        first = place(dag, devices, cost, name)
        second = place(dag, devices, cost, name)
        assert first == second
