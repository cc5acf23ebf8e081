"""Lifetimes and arena plans of small DAGs, compared with literal plans."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.errors import PlanError
from scheduler.liveness import compute_liveness, default_order
from scheduler.storage import Lifetime, check_no_overlap

E = Entry


def _t(elements: int) -> TensorSpec:
    return TensorSpec((elements,), "float32")  # 4 bytes per element


def _input(name: str, elements: int = 100) -> NodeSpec:
    return NodeSpec(name, "null", "", (), (_t(elements),))


def _op(
    name: str, inputs: Sequence[tuple[int, int]], *outputs: int, func: str = "f"
) -> NodeSpec:
    return NodeSpec(
        name,
        "tvm_op",
        func,
        tuple(E(*i) for i in inputs),
        tuple(_t(n) for n in outputs),
    )


def _nop(name: str, source: tuple[int, int], elements: int = 100) -> NodeSpec:
    return _op(name, [source], elements, func="__nop")


def _dag(nodes: list[NodeSpec], heads: Sequence[tuple[int, int]]) -> nx.DiGraph:
    inputs = tuple(i for i, n in enumerate(nodes) if n.is_null)
    return make_dag(nodes, GraphSpec(inputs, (), tuple(E(*h) for h in heads)))


def _lifetimes(dag: nx.DiGraph) -> dict[Entry, tuple[int, int]]:
    lv = compute_liveness(dag, alignment=1)
    return {e: (lt.first, lt.last) for e, lt in lv.lifetimes.items()}


# ---------------------------------------------------------------- literal plans


def test_chain() -> None:
    # x -> a (400 B) -> b (800 B) -> c (400 B, head)
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _op("b", [(1, 0)], 200),
            _op("c", [(2, 0)], 100),
        ],
        heads=[(3, 0)],
    )
    lv = compute_liveness(dag, alignment=1)
    assert lv.order == (1, 2, 3)
    assert dict(lv.lifetimes) == {
        E(1, 0): Lifetime(0, 1),
        E(2, 0): Lifetime(1, 2),
        E(3, 0): Lifetime(2, 2),
    }
    plan = lv.plan()
    assert dict(plan.offsets) == {E(1, 0): 800, E(2, 0): 0, E(3, 0): 800}
    assert (plan.size, plan.lower_bound) == (1200, 1200)
    assert dict(lv.aliases) == {}
    check_no_overlap(plan, lv.requests, lv.conflicts)


def test_chain_default_alignment() -> None:
    # 40-byte tensors take 64-byte slots.
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 10),
            _op("b", [(1, 0)], 10),
            _op("c", [(2, 0)], 10),
        ],
        heads=[(3, 0)],
    )
    plan = compute_liveness(dag).plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(2, 0): 64, E(3, 0): 0}
    assert (plan.size, plan.lower_bound) == (128, 128)


def test_diamond() -> None:
    # a feeds b and c; d reads b and c. a is live until c has run.
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _op("b", [(1, 0)], 100),
            _op("c", [(1, 0)], 100),
            _op("d", [(2, 0), (3, 0)], 100),
        ],
        heads=[(4, 0)],
    )
    assert _lifetimes(dag) == {
        E(1, 0): (0, 2),
        E(2, 0): (1, 3),
        E(3, 0): (2, 3),
        E(4, 0): (3, 3),
    }
    plan = compute_liveness(dag, alignment=1).plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(2, 0): 400, E(3, 0): 800, E(4, 0): 0}
    assert (plan.size, plan.lower_bound) == (1200, 1200)


def test_nop_aliases_its_input() -> None:
    # a -> n = nop(a) -> b; m = nop(x) aliases the graph input; c reads m.
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _nop("n", (1, 0)),
            _op("b", [(2, 0)], 100),
            _nop("m", (0, 0)),
            _op("c", [(4, 0), (3, 0)], 100),
        ],
        heads=[(5, 0)],
    )
    lv = compute_liveness(dag, alignment=1)
    assert dict(lv.aliases) == {E(2, 0): E(1, 0), E(4, 0): E(0, 0)}
    assert [r.key for r in lv.requests] == [E(1, 0), E(3, 0), E(5, 0)]
    # a lives until b (step 2) reads it through n.
    assert _lifetimes(dag) == {E(1, 0): (0, 2), E(3, 0): (2, 4), E(5, 0): (4, 4)}
    plan = lv.plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(3, 0): 400, E(5, 0): 0}
    assert (plan.size, plan.lower_bound) == (800, 800)


def test_nop_head_keeps_its_storage_to_the_end() -> None:
    # b's storage is the graph output (through the nop): c must not reuse it.
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _op("b", [(1, 0)], 100),
            _nop("n", (2, 0)),
            _op("c", [(1, 0)], 100),
        ],
        heads=[(3, 0), (4, 0)],
    )
    lv = compute_liveness(dag, alignment=1)
    assert dict(lv.aliases) == {E(3, 0): E(2, 0)}
    assert _lifetimes(dag) == {E(1, 0): (0, 3), E(2, 0): (1, 3), E(4, 0): (3, 3)}
    plan = lv.plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(2, 0): 400, E(4, 0): 800}
    assert plan.size == 1200


def test_nop_chain_and_larger_view() -> None:
    # A nop of a nop resolves to the first producer, sized to the largest view.
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _nop("n1", (1, 0), 100),
            _nop("n2", (2, 0), 120),
        ],
        heads=[(3, 0)],
    )
    lv = compute_liveness(dag, alignment=1)
    assert dict(lv.aliases) == {E(2, 0): E(1, 0), E(3, 0): E(1, 0)}
    assert [(r.key, r.nbytes) for r in lv.requests] == [(E(1, 0), 480)]
    assert dict(lv.lifetimes) == {E(1, 0): Lifetime(0, 2)}


def test_multi_output_node() -> None:
    # s has two outputs (400 B, 200 B); u reads s.0; v reads s.1 and u.
    dag = _dag(
        [
            _input("x"),
            _op("s", [(0, 0)], 100, 50),
            _op("u", [(1, 0)], 100),
            _op("v", [(1, 1), (2, 0)], 100),
        ],
        heads=[(3, 0)],
    )
    assert _lifetimes(dag) == {
        E(1, 0): (0, 1),
        E(1, 1): (0, 2),
        E(2, 0): (1, 2),
        E(3, 0): (2, 2),
    }
    plan = compute_liveness(dag, alignment=1).plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(1, 1): 800, E(2, 0): 400, E(3, 0): 0}
    assert (plan.size, plan.lower_bound) == (1000, 1000)


def test_unread_output_occupies_its_step() -> None:
    # s.1 is never read and not a head: live only while s runs.
    dag = _dag(
        [_input("x"), _op("s", [(0, 0)], 100, 100), _op("u", [(1, 0)], 100)],
        heads=[(2, 0)],
    )
    assert _lifetimes(dag) == {E(1, 0): (0, 1), E(1, 1): (0, 0), E(2, 0): (1, 1)}
    plan = compute_liveness(dag, alignment=1).plan()
    assert dict(plan.offsets) == {E(1, 0): 0, E(1, 1): 400, E(2, 0): 400}
    assert plan.size == 800


@pytest.mark.parametrize(
    ("heads", "offsets", "size"),
    [
        # a is a head: kept to the end, so b and c cannot reuse it.
        ([(1, 0), (3, 0)], {E(1, 0): 0, E(2, 0): 400, E(3, 0): 800}, 1200),
        # a is not a head: dead after its step, b reuses its bytes.
        ([(3, 0)], {E(1, 0): 0, E(2, 0): 0, E(3, 0): 400}, 800),
    ],
)
def test_head_is_not_reused(
    heads: list[tuple[int, int]], offsets: dict[Entry, int], size: int
) -> None:
    dag = _dag(
        [
            _input("x"),
            _op("a", [(0, 0)], 100),
            _op("b", [(0, 0)], 100),
            _op("c", [(2, 0)], 100),
        ],
        heads=heads,
    )
    plan = compute_liveness(dag, alignment=1).plan()
    assert dict(plan.offsets) == offsets
    assert plan.size == size


def test_launch_order_changes_lifetimes() -> None:
    # Running c before b keeps a alive longer: order (c, b, d) vs (b, c, d).
    nodes = [
        _input("x"),
        _op("a", [(0, 0)], 100),
        _op("b", [(0, 0)], 100),
        _op("c", [(1, 0)], 100),
        _op("d", [(2, 0), (3, 0)], 100),
    ]
    dag = _dag(nodes, heads=[(4, 0)])
    lv = compute_liveness(dag, order=[0, 1, 3, 2, 4], alignment=1)
    assert lv.order == (1, 3, 2, 4)
    assert dict(lv.lifetimes) == {
        E(1, 0): Lifetime(0, 1),
        E(3, 0): Lifetime(1, 3),
        E(2, 0): Lifetime(2, 3),
        E(4, 0): Lifetime(3, 3),
    }


def test_bad_orders() -> None:
    dag = _dag(
        [_input("x"), _op("a", [(0, 0)], 1), _op("b", [(1, 0)], 1)], heads=[(2, 0)]
    )
    assert default_order(dag) == (0, 1, 2)
    with pytest.raises(PlanError, match="node 'b' \\(id 2\\) before input 0"):
        compute_liveness(dag, order=[2, 1])
    with pytest.raises(PlanError, match="leaves out node ids \\[2\\]"):
        compute_liveness(dag, order=[1])
    with pytest.raises(PlanError, match="names node id 1 twice"):
        compute_liveness(dag, order=[1, 1, 2])
    with pytest.raises(PlanError, match="node id 7, not in the graph"):
        compute_liveness(dag, order=[1, 2, 7])
    bad_nop = _dag([_input("x"), NodeSpec("n", "tvm_op", "__nop", (), (_t(1),))], [])
    with pytest.raises(PlanError, match="__nop node 'n'"):
        compute_liveness(bad_nop)


# ---------------------------------------------------------------- random DAGs


@st.composite
def _random_dag(draw: st.DrawFn) -> tuple[nx.DiGraph, list[int]]:
    """A random DAG (some inputs, ops with 1-3 outputs, nops) and a random
    valid launch order."""
    n_inputs = draw(st.integers(1, 3))
    nodes = [_input(f"x{i}", draw(st.integers(0, 50))) for i in range(n_inputs)]
    for k in range(draw(st.integers(0, 14))):
        entries = [E(i, j) for i, n in enumerate(nodes) for j in range(len(n.outputs))]
        if draw(st.integers(0, 4)) == 0:
            nodes.append(_nop(f"n{k}", draw(st.sampled_from(entries)), 10))
            continue
        ins = draw(st.lists(st.sampled_from(entries), min_size=1, max_size=3))
        outs = draw(st.lists(st.integers(0, 300), min_size=1, max_size=3))
        nodes.append(_op(f"op{k}", ins, *outs))
    entries = [E(i, j) for i, n in enumerate(nodes) for j in range(len(n.outputs))]
    heads = draw(st.lists(st.sampled_from(entries), max_size=3))
    dag = _dag(nodes, heads)
    # A random topological order: repeatedly pick any ready node.
    indegree = {n: dag.in_degree(n) for n in dag.nodes}
    ready = sorted(n for n, d in indegree.items() if d == 0)
    order: list[int] = []
    while ready:
        nid = ready.pop(draw(st.integers(0, len(ready) - 1)))
        order.append(nid)
        for succ in sorted(dag.successors(nid)):
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
    return dag, order


@settings(max_examples=150, deadline=None)
@given(case=_random_dag(), alignment=st.sampled_from([1, 64]))
def test_random_dag_plans_never_race(
    case: tuple[nx.DiGraph, list[int]], alignment: int
) -> None:
    dag, order = case
    lv = compute_liveness(dag, order=order, alignment=alignment)
    plan = lv.plan()
    check_no_overlap(plan, lv.requests, lv.conflicts)
    assert plan.size >= plan.lower_bound
    # An independent oracle: replay the order; at each step, every tensor
    # the step touches and every tensor still needed later (or a head
    # already produced) must own disjoint bytes.
    spec = {n: dag.nodes[n]["spec"] for n in dag.nodes}
    heads = dag.graph["spec"].heads
    nbytes = {r.key: r.nbytes for r in lv.requests}

    def root(e: Entry) -> Entry:
        return lv.aliases.get(e, e)

    steps = [n for n in order if not spec[n].is_null]
    for s, nid in enumerate(steps):
        done = steps[: s + 1]
        later = steps[s + 1 :]
        needed = {root(e) for e in spec[nid].inputs}
        needed |= {E(nid, i) for i in range(len(spec[nid].outputs))}
        needed |= {root(h) for h in heads if h.nid in done}
        needed |= {root(e) for n in later for e in spec[n].inputs}
        needed = {
            e
            for e in needed
            if nbytes.get(e) and e.nid in done  # in the arena, produced, not empty
        }
        ranges = sorted((plan.offsets[e], plan.offsets[e] + nbytes[e]) for e in needed)
        for (_, end), (start, _) in pairwise(ranges):
            assert end <= start, f"step {s}: overlapping tensors {ranges}"
