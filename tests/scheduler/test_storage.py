"""The offset assigner and the overlap checker, on explicit requests."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.errors import PlanError
from scheduler.storage import (
    ArenaPlan,
    Conflicts,
    Lifetime,
    StorageRequest,
    check_no_overlap,
    interval_conflicts,
    plan_offsets,
)


def _requests(sizes: dict[str, int], alignment: int = 1) -> list[StorageRequest[str]]:
    return [StorageRequest(key, n, alignment) for key, n in sizes.items()]


# ---------------------------------------------------------------- literal plans


def test_interval_conflicts_and_bound() -> None:
    requests = _requests({"a": 10, "b": 20, "c": 5, "d": 7})
    lifetimes = {
        "a": Lifetime(0, 1),
        "b": Lifetime(1, 2),
        "c": Lifetime(2, 4),
        "d": Lifetime(4, 4),
    }
    conflicts, bound = interval_conflicts(requests, lifetimes)
    assert dict(conflicts.neighbours) == {
        "a": {"b"},
        "b": {"a", "c"},
        "c": {"b", "d"},
        "d": {"c"},
    }
    assert conflicts.num_pairs() == 3
    assert bound == 30  # a + b at step 1


def test_greedy_by_size_best_fit() -> None:
    # b (largest) at 0; a and c conflict with b: just above it, at 20 (they
    # do not conflict with each other); d conflicts only with c: at 0.
    requests = _requests({"a": 10, "b": 20, "c": 5, "d": 7})
    conflicts = Conflicts.from_pairs([("a", "b"), ("b", "c"), ("c", "d")])
    plan = plan_offsets(requests, conflicts)
    assert dict(plan.offsets) == {"a": 20, "b": 0, "c": 20, "d": 0}
    assert plan.size == 30
    assert plan.lower_bound == 30
    check_no_overlap(plan, requests, conflicts)


def test_smallest_fitting_gap_wins() -> None:
    # Largest first: U, V, A at 0 (no conflicts among them); B above U at
    # 250; C above V at 160. N then sees A [0, 100), C [160, 200) and
    # B [250, 350): gaps of 60 at 100 and 50 at 200; the smaller one wins.
    requests = _requests({"U": 250, "V": 160, "A": 100, "B": 100, "C": 40, "N": 40})
    conflicts = Conflicts.from_pairs(
        [("B", "U"), ("C", "V"), ("N", "A"), ("N", "C"), ("N", "B")]
    )
    plan = plan_offsets(requests, conflicts)
    assert dict(plan.offsets) == {"U": 0, "V": 0, "A": 0, "B": 250, "C": 160, "N": 200}
    assert (plan.size, plan.lower_bound) == (350, 350)
    check_no_overlap(plan, requests, conflicts)


def test_alignment_pads_offsets_and_size() -> None:
    requests = _requests({"a": 40, "b": 40, "c": 1}, alignment=64)
    conflicts = Conflicts.from_pairs([("a", "b"), ("b", "c"), ("a", "c")])
    plan = plan_offsets(requests, conflicts)
    assert dict(plan.offsets) == {"a": 0, "b": 64, "c": 128}
    assert plan.size == 192
    assert plan.lower_bound == 192  # padded sizes count when alignment is uniform
    check_no_overlap(plan, requests, conflicts)


def test_general_relation_uses_a_clique_bound() -> None:
    # A 4-cycle a-b-c-d-a: the largest clique is an edge.
    requests = _requests({"a": 10, "b": 20, "c": 10, "d": 20})
    conflicts = Conflicts.from_pairs([("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    plan = plan_offsets(requests, conflicts)
    assert plan.lower_bound == 30
    assert dict(plan.offsets) == {"a": 20, "b": 0, "c": 20, "d": 0}
    assert plan.size == 30


def test_empty_and_zero_sized() -> None:
    plan: ArenaPlan[str] = plan_offsets([], Conflicts())
    assert (dict(plan.offsets), plan.size, plan.lower_bound) == ({}, 0, 0)
    requests = _requests({"a": 0, "b": 8})
    conflicts = Conflicts.from_pairs([("a", "b")])
    plan = plan_offsets(requests, conflicts)
    assert dict(plan.offsets) == {"a": 0, "b": 0}
    check_no_overlap(plan, requests, conflicts)
    # An empty tensor inside a conflicting one's bytes shares none of them
    # (the random liveness test once drew one at 508 inside [504, 512)).
    inside = ArenaPlan({"a": 4, "b": 0}, 8, 8)
    check_no_overlap(inside, requests, conflicts)
    wider = _requests({"a": 1, "b": 8})
    with pytest.raises(PlanError, match="overlap"):
        check_no_overlap(inside, wider, conflicts)


def test_plan_str() -> None:
    requests = _requests({"a": 10, "b": 20})
    plan = plan_offsets(requests, Conflicts.from_pairs([("a", "b")]))
    text = str(plan)
    assert text.splitlines()[0] == (
        "ArenaPlan: 2 tensors, 30 bytes (lower bound 30, 1.000x)"
    )
    assert "'a'" in text and "'b'" in text


# ---------------------------------------------------------------- errors


def test_bad_requests_are_plan_errors() -> None:
    with pytest.raises(PlanError, match="negative size"):
        StorageRequest("a", -1)
    with pytest.raises(PlanError, match="alignment 0"):
        StorageRequest("a", 1, 0)
    with pytest.raises(PlanError, match="ends before it starts"):
        Lifetime(3, 2)
    with pytest.raises(PlanError, match="conflicts with itself"):
        Conflicts.from_pairs([("a", "a")])
    with pytest.raises(PlanError, match="duplicate storage request 'a'"):
        plan_offsets(_requests({"a": 1}) * 2, Conflicts())
    with pytest.raises(PlanError, match="'zz', which has no storage request"):
        plan_offsets(_requests({"a": 1}), Conflicts.from_pairs([("a", "zz")]))
    lopsided = Conflicts(
        MappingProxyType({"a": frozenset({"b"}), "b": frozenset[str]()})
    )
    with pytest.raises(PlanError, match="not symmetric"):
        plan_offsets(_requests({"a": 1, "b": 1}), lopsided)
    with pytest.raises(PlanError, match="without a lifetime"):
        interval_conflicts(_requests({"a": 1}), {})


def test_check_no_overlap_catches_each_fault() -> None:
    requests = _requests({"a": 10, "b": 20}, alignment=2)
    conflicts = Conflicts.from_pairs([("a", "b")])

    def plan(offsets: dict[str, int], size: int = 40) -> ArenaPlan[str]:
        return ArenaPlan(MappingProxyType(offsets), size, 30)

    check_no_overlap(plan({"a": 20, "b": 0}), requests, conflicts)
    with pytest.raises(
        PlanError,
        match=r"overlap: 'a' at \[10, 20\) and 'b' at \[0, 20\)",
    ):
        check_no_overlap(plan({"a": 10, "b": 0}), requests, conflicts)
    with pytest.raises(PlanError, match="'a' at offset 21 is not aligned to 2"):
        check_no_overlap(plan({"a": 21, "b": 0}), requests, conflicts)
    with pytest.raises(PlanError, match="extends past the arena size 25"):
        check_no_overlap(plan({"a": 20, "b": 0}, size=25), requests, conflicts)
    with pytest.raises(PlanError, match="'b' has no offset"):
        check_no_overlap(plan({"a": 20}), requests, conflicts)
    # Overlap between requests that do not conflict is fine.
    check_no_overlap(plan({"a": 0, "b": 0}), requests, Conflicts())


# ---------------------------------------------------------------- properties

_intervals = st.lists(
    st.tuples(
        st.integers(0, 30),  # first
        st.integers(0, 10),  # length
        st.integers(0, 5000),  # nbytes
        st.sampled_from([1, 4, 64]),  # alignment
    ),
    max_size=40,
)


def _interval_case(
    raw: list[tuple[int, int, int, int]], uniform: bool
) -> tuple[list[StorageRequest[int]], dict[int, Lifetime]]:
    requests = [
        StorageRequest(i, n, 64 if uniform else a) for i, (_, _, n, a) in enumerate(raw)
    ]
    lifetimes = {i: Lifetime(f, f + d) for i, (f, d, _, _) in enumerate(raw)}
    return requests, lifetimes


@settings(max_examples=150, deadline=None)
@given(raw=_intervals, uniform=st.booleans())
def test_random_intervals_plan_is_valid(
    raw: list[tuple[int, int, int, int]], uniform: bool
) -> None:
    requests, lifetimes = _interval_case(raw, uniform)
    conflicts, bound = interval_conflicts(requests, lifetimes)
    plan = plan_offsets(requests, conflicts, bound)
    check_no_overlap(plan, requests, conflicts)
    assert plan.size >= plan.lower_bound == bound
    # The bound is the max live bytes at a step (exact nbytes is never more).
    steps = {s for lt in lifetimes.values() for s in range(lt.first, lt.last + 1)}
    live = [
        sum(
            r.nbytes
            for r in requests
            if lifetimes[r.key].first <= s <= lifetimes[r.key].last
        )
        for s in steps
    ]
    assert bound >= max(live, default=0)
    # Deterministic.
    assert plan_offsets(requests, conflicts, bound) == plan


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 1000), max_size=25),
    edges=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 24)), max_size=80),
    alignment=st.sampled_from([1, 8, 64]),
)
def test_random_relation_plan_is_valid(
    sizes: list[int], edges: list[tuple[int, int]], alignment: int
) -> None:
    requests = [StorageRequest(i, n, alignment) for i, n in enumerate(sizes)]
    pairs = [(a, b) for a, b in edges if a != b and a < len(sizes) and b < len(sizes)]
    conflicts = Conflicts.from_pairs(pairs)
    plan = plan_offsets(requests, conflicts)
    check_no_overlap(plan, requests, conflicts)
    assert plan.size >= plan.lower_bound
    assert plan.lower_bound >= max(sizes, default=0)


@settings(max_examples=100, deadline=None)
@given(raw=_intervals, data=st.data())
def test_broken_plan_is_caught(
    raw: list[tuple[int, int, int, int]], data: st.DataObject
) -> None:
    requests, lifetimes = _interval_case(raw, uniform=True)
    conflicts, bound = interval_conflicts(requests, lifetimes)
    nbytes = {r.key: r.nbytes for r in requests}
    pairs = sorted(
        (a, b)
        for a in conflicts.neighbours
        for b in conflicts.of(a)
        if a < b and nbytes[a] and nbytes[b]
    )
    if not pairs:
        return
    a, b = data.draw(st.sampled_from(pairs))
    plan = plan_offsets(requests, conflicts, bound)
    broken = dict(plan.offsets)
    broken[b] = broken[a]  # aligned, but on top of a conflicting tensor
    size = max(plan.size, broken[b] + nbytes[b])
    with pytest.raises(PlanError, match="overlap"):
        check_no_overlap(ArenaPlan(broken, size, bound), requests, conflicts)
