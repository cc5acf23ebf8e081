"""Row splitting (:mod:`scheduler.split`): what splits and what does not,
how the parts are cut, ordered and printed, what the race checker proves,
and random DAGs whose splits must run to the unsplit results, bit for bit.

Costs come from a :class:`TableCostModel` (its streams wake for free), so
every decision here is exact: a split pays wherever another stream idles.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from devices import Device, NDArray, empty
from scheduler.cost import Link, TableCostModel
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag, node_spec
from scheduler.dispatch import Program
from scheduler.errors import NodeFailedError, PlanError
from scheduler.happens_before import HappensBefore, check_plan
from scheduler.plan import Launch, Part, Plan, RecordEvent, WaitEvent
from scheduler.planner import plan_graph
from scheduler.split import MIN_BYTES, RowSplit, row_cuts, split_launch
from tests.scheduler.test_happens_before import (
    dags,
    hand_plan,
    launch,
    overlap_is_caught,
    step_graph,
)

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
ROWS = 1 << 10  # 4 KiB of float32: small and fast, split with min_bytes=0
F = TensorSpec((ROWS,), "float32")
FREE = Link(0.0, float("inf"))
ELEMENTWISE = frozenset({"add", "tanh", "sum", "k"})


def elementwise(spec: NodeSpec) -> bool:
    return spec.func_name in ELEMENTWISE


#: Split anything elementwise and non-empty on the cpu.
ANY_SIZE = RowSplit(elementwise, min_bytes=0)

Array = np.ndarray[Any, Any]


def table(dag: nx.DiGraph, devices: Sequence[Device], seconds: float = 1e-3) -> Any:
    """Every node takes ``seconds`` anywhere; links are free."""
    compute = {(nid, d): seconds for nid in dag.nodes for d in devices}
    return TableCostModel(compute, default_link=FREE, dag=dag)


def join(
    branches: int = 4,
    shape: tuple[int, ...] = (ROWS,),
    join_func: str = "sum",
    extra: Sequence[TensorSpec] = (),
) -> nx.DiGraph:
    """x -> ``branches`` tanh nodes -> one join reading them all (the head),
    and reading parameters of the ``extra`` shapes too."""
    spec = TensorSpec(shape, "float32")
    specs = [NodeSpec("x", "null", "", (), (spec,))]
    params = []
    for i, tensor in enumerate(extra):
        params.append(len(specs))
        specs.append(NodeSpec(f"p{i}", "null", "", (), (tensor,)))
    first = len(specs)
    for i in range(branches):
        specs.append(NodeSpec(f"b{i}", "tvm_op", "tanh", (Entry(0, 0),), (spec,)))
    reads = [Entry(first + i, 0) for i in range(branches)]
    reads += [Entry(p, 0) for p in params]
    specs.append(NodeSpec("j", "tvm_op", join_func, tuple(reads), (spec,)))
    heads = (Entry(len(specs) - 1, 0),)
    return make_dag(specs, GraphSpec((0,), tuple(params), heads))


def plan_of(
    dag: nx.DiGraph,
    *,
    streams: int = 2,
    split: RowSplit | None = ANY_SIZE,
    devices: Sequence[Device] = (CPU,),
    seconds: float = 1e-3,
) -> Plan:
    plan = plan_graph(
        dag,
        devices,
        max_streams=streams,
        cost=table(dag, devices, seconds),
        split=split,
    )
    check_plan(plan)
    return plan


def parts_of(plan: Plan) -> dict[str, list[tuple[int, Part]]]:
    """Each split node's parts, by node name: (stream, part)."""
    found: dict[str, list[tuple[int, Part]]] = {}
    for s, stream in enumerate(plan.streams):
        for step in stream.steps:
            if isinstance(step, Launch) and step.part is not None:
                found.setdefault(step.name, []).append((s, step.part))
    return {name: sorted(ps, key=lambda p: p[1].index) for name, ps in found.items()}


# -- how parts are cut ------------------------------------------------------------


def test_row_cuts_cut_same_shape_inputs_and_pass_broadcast_ones_whole() -> None:
    out = TensorSpec((8, 4), "float32")
    same, bias, scalar = out, TensorSpec((4,), "float32"), TensorSpec((), "float32")
    lead = TensorSpec((1, 4), "float32")
    assert row_cuts(out, [same, bias, scalar, lead]) == (True, False, False, False)
    assert row_cuts(out, []) == ()


def test_row_cuts_refuse_what_is_not_safe_to_cut() -> None:
    out = TensorSpec((8, 4), "float32")
    # a column broadcast along axis 1 spans the rows: conservative, no split
    assert row_cuts(out, [TensorSpec((8, 1), "float32")]) is None
    assert row_cuts(out, [TensorSpec((2, 4), "float32")]) is None  # no broadcast
    assert row_cuts(TensorSpec((1, 4), "float32"), [out]) is None  # one row
    assert row_cuts(TensorSpec((), "float32"), []) is None  # no rows at all


def test_split_launch_cuts_balanced_cache_line_aligned_blocks() -> None:
    tensors = {Entry(0, 0): F, Entry(1, 0): TensorSpec((1,), "float32"), Entry(2, 0): F}
    launch = Launch(2, "j", "add", (Entry(0, 0), Entry(1, 0), Entry(2, 0)), 2, 300.0)
    parts = split_launch(launch, tensors, 3)
    assert [p.part for p in parts] == [
        Part(0, 3, 0, 336, (True, False)),
        Part(1, 3, 336, 688, (True, False)),
        Part(2, 3, 688, ROWS, (True, False)),
    ]
    assert all(p.part is not None and p.part.start * 4 % 64 == 0 for p in parts)
    assert sum(p.work for p in parts) == pytest.approx(300.0)
    assert [p.label for p in parts] == ["j[0/3]", "j[1/3]", "j[2/3]"]
    assert len({p.key for p in parts}) == 3
    assert split_launch(launch, tensors, 1) == (launch,)


def test_split_launch_makes_fewer_parts_of_fewer_rows() -> None:
    three = TensorSpec((3, 5), "float64")  # 40-byte rows: no aligned cut fits
    tensors = {Entry(0, 0): three, Entry(1, 0): three}
    launch = Launch(1, "t", "tanh", (Entry(0, 0), Entry(1, 0)), 1)
    bounds = [(p.part.start, p.part.stop) for p in split_launch(launch, tensors, 8)]
    assert bounds == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match="cannot be split"):
        split_launch(launch, {**tensors, Entry(0, 0): TensorSpec((3, 1), "f")}, 2)


# -- what splits ------------------------------------------------------------------


def test_a_join_after_parallel_branches_is_split_over_the_streams() -> None:
    """Four branches run two by two; the join would run alone on one
    stream: it runs as two parts, one per stream, each after both streams'
    branches, and the predicted makespan drops by half the join."""
    dag = join()
    whole = plan_of(dag, split=None)
    plan = plan_of(dag)
    (parts,) = parts_of(plan).values()
    assert [(s, p.index, p.start, p.stop) for s, p in parts] == [
        (0, 0, 0, ROWS // 2),
        (1, 1, ROWS // 2, ROWS),
    ]
    # (the table charges no start: the makespans are the schedules')
    assert plan.makespan == pytest.approx(whole.makespan - 0.5e-3)
    # Every part waits for the other stream's branches; the join's tensor is
    # the head, written by both parts.
    order = HappensBefore(plan)
    branch_refs = [r for r, launch in order.launch_at.items() if launch.name[0] == "b"]
    part_refs = [r for r, launch in order.launch_at.items() if launch.part is not None]
    for b, p in itertools.product(branch_refs, part_refs):
        assert order.before(b, p)
    assert not any(order.before(a, b) for a, b in itertools.permutations(part_refs))


def test_print_and_dot_show_the_parts() -> None:
    plan = plan_of(join())
    text = str(plan)
    assert "j[0/2] = sum(" in text and "j[1/2] = sum(" in text
    assert f"[0:{ROWS // 2}]" in text and f"[{ROWS // 2}:{ROWS}]" in text
    dot = plan.to_dot()
    assert 'n5_0 [label="j[0/2]\\nsum"]' in dot
    assert 'n5_1 [label="j[1/2]\\nsum"]' in dot
    for branch, part in itertools.product(range(1, 5), range(2)):
        assert f"n{branch} -> n5_{part};" in dot


def test_three_streams_three_parts() -> None:
    plan = plan_of(join(branches=6), streams=3)
    (parts,) = parts_of(plan).values()
    assert sorted(s for s, _ in parts) == [0, 1, 2]
    assert [p.count for _, p in parts] == [3, 3, 3]


def test_broadcast_inputs_are_read_whole_by_every_part() -> None:
    rows = TensorSpec((64, 16), "float32")
    bias, lead = TensorSpec((16,), "float32"), TensorSpec((1, 16), "float32")
    plan = plan_of(join(shape=rows.shape, extra=(bias, lead)))
    (parts,) = parts_of(plan).values()
    assert [p.cut for _, p in parts] == [(True,) * 4 + (False, False)] * 2
    assert "j[0/2] = sum(3.0@" in str(plan)
    assert ", 1.0(ext), 2.0(ext)) -> 7.0@" in str(plan)


def test_a_chain_is_not_split_onto_a_stream_it_does_not_have() -> None:
    """A chain uses one stream even with two allowed: a split would have
    to open the second one (and halve the BLAS threads of everything else
    on the executor's cpu), so the big node stays whole, however long."""
    specs = [
        NodeSpec("x", "null", "", (), (F,)),
        NodeSpec("t", "tvm_op", "tanh", (Entry(0, 0),), (F,)),
        NodeSpec("u", "tvm_op", "tanh", (Entry(1, 0),), (F,)),
    ]
    dag = make_dag(specs, GraphSpec((0,), (), (Entry(2, 0),)))
    plan = plan_of(dag, seconds=1.0)
    assert len(plan.streams) == 1
    assert not parts_of(plan)


# -- what does not split ----------------------------------------------------------


def test_one_stream_never_splits() -> None:
    plan = plan_of(join(), streams=1)
    assert not parts_of(plan)


def test_no_split_option_no_split() -> None:
    assert not parts_of(plan_of(join(), split=None))


def test_small_outputs_do_not_split() -> None:
    assert F.nbytes < MIN_BYTES
    assert not parts_of(plan_of(join(), split=RowSplit(elementwise)))
    exactly = RowSplit(elementwise, min_bytes=F.nbytes)
    assert parts_of(plan_of(join(), split=exactly))


def test_kernels_not_known_to_be_elementwise_do_not_split() -> None:
    assert not parts_of(plan_of(join(join_func="concat_like")))


def test_inputs_broadcast_along_the_rows_do_not_split() -> None:
    """A (64, 1) input against a (64, 16) output spans the rows while
    broadcasting along the columns: left whole (conservative)."""
    plan = plan_of(
        join(shape=(64, 16), extra=(TensorSpec((64, 1), "float32"),)),
    )
    assert not parts_of(plan)


def test_branches_that_keep_both_streams_busy_stay_whole() -> None:
    """Every tanh is elementwise and big enough, but the other stream is
    busy all along: nothing would idle, so only the join splits."""
    plan = plan_of(join(branches=4))
    assert set(parts_of(plan)) == {"j"}


def test_multi_output_and_other_device_nodes_do_not_split() -> None:
    """``two`` (two outputs) and the join of its two branches on the sim
    stay whole; a sim's join splits only where its kind is allowed."""
    specs = [
        NodeSpec("x", "null", "", (), (F,)),
        NodeSpec("two", "tvm_op", "k", (Entry(0, 0),), (F, F), device=S0),
        NodeSpec("b0", "tvm_op", "tanh", (Entry(1, 0),), (F,), device=S0),
        NodeSpec("b1", "tvm_op", "tanh", (Entry(1, 1),), (F,), device=S0),
        NodeSpec("s", "tvm_op", "add", (Entry(2, 0), Entry(3, 0)), (F,), device=S0),
    ]
    dag = make_dag(specs, GraphSpec((0,), (), (Entry(4, 0),)))
    plan = plan_of(dag, devices=(CPU, S0), seconds=1.0)
    assert not parts_of(plan)
    sims = dataclasses.replace(ANY_SIZE, kinds=frozenset({"cpu", "sim"}))
    plan = plan_of(dag, devices=(CPU, S0), split=sims, seconds=1.0)
    assert set(parts_of(plan)) == {"s"}


# -- the race checker -------------------------------------------------------------


def _launch_steps(plan: Plan) -> list[tuple[int, int, Launch]]:
    return [
        (s, i, step)
        for s, stream in enumerate(plan.streams)
        for i, step in enumerate(stream.steps)
        if isinstance(step, Launch)
    ]


def _with_step(plan: Plan, s: int, i: int, step: Any) -> Plan:
    streams = list(plan.streams)
    steps = list(streams[s].steps)
    steps[i] = step
    streams[s] = dataclasses.replace(streams[s], steps=tuple(steps))
    return dataclasses.replace(plan, streams=tuple(streams))


def test_checker_catches_overlapping_or_missing_rows() -> None:
    plan = plan_of(join())
    (s, i, second), *_ = [x for x in _launch_steps(plan) if x[2].label == "j[1/2]"]
    assert second.part is not None
    for start, stop, match in (
        (ROWS // 2 - 1, ROWS, "overlap or leave a gap"),
        (ROWS // 2 + 1, ROWS, "overlap or leave a gap"),
        (ROWS // 2, ROWS - 1, "do not cover"),
    ):
        part = dataclasses.replace(second.part, start=start, stop=stop)
        bad = _with_step(plan, s, i, dataclasses.replace(second, part=part))
        with pytest.raises(PlanError, match=match):
            check_plan(bad)
    whole = _with_step(plan, s, i, dataclasses.replace(second, part=None))
    with pytest.raises(PlanError, match="more than one launch"):
        check_plan(whole)


def _part(nid: int, index: int, rows: tuple[int, int], *inputs: int) -> Launch:
    """Part ``index`` of 2 of node ``nid`` (float32[4], rows ``rows``)."""
    args = (*(Entry(i, 0) for i in inputs), Entry(nid, 0))
    part = Part(index, 2, rows[0], rows[1], (True,) * len(inputs))
    return Launch(nid, f"n{nid}", "k", args, len(inputs), part=part)


def test_checker_catches_a_reader_that_waits_for_one_part_only() -> None:
    """``r`` follows part 0 on its stream but never waits for part 1."""
    j0, j1 = _part(1, 0, (0, 2), 0), _part(1, 1, (2, 4), 0)
    bad = hand_plan([[j0, launch(2, 1)], [j1]])
    with pytest.raises(PlanError, match=r"'n2' reads Entry\(nid=1, index=0\) before"):
        check_plan(bad)
    check_plan(
        hand_plan(
            [[j0, WaitEvent(0), launch(2, 1)], [j1, RecordEvent(0)]],
            order=[(1, 0), (1, 1), (0, 0), (0, 1), (0, 2)],
        )
    )


def test_bytes_of_a_split_tensor_wait_for_every_part() -> None:
    """``a`` (written and read on stream 1) shares bytes with ``j``: safe
    only if both parts of ``j`` come after ``b`` read ``a``. Part 1 does
    (same stream); part 0, on stream 0, does not: caught. (Asking only
    the last part would have let it through.)"""
    a, b = launch(1, 0), launch(2, 1)
    j0, j1 = _part(3, 0, (0, 2), 0), _part(3, 1, (2, 4), 0)
    shared = {1: 0, 2: 16, 3: 0}
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(hand_plan([[j0], [a, b, j1]], offsets=shared))
    check_plan(hand_plan([[], [a, b, j0, j1]], offsets=shared))
    ordered = hand_plan(
        [[WaitEvent(0), j0], [a, b, RecordEvent(0), j1]],
        offsets=shared,
        order=[(1, 0), (1, 1), (1, 2), (0, 0), (0, 1), (1, 3)],
    )
    check_plan(ordered)


# -- running parts ----------------------------------------------------------------


def make_k(num_inputs: int) -> Any:
    """``k``: output ``i`` is ``tanh(i / 4 + the inputs that broadcast to
    it + the sums of those that do not) + 0.5``: elementwise in the inputs
    of its shape and the ones it broadcasts."""

    def k(*arrays: Array) -> None:
        ins, outs = arrays[:num_inputs], arrays[num_inputs:]
        for index, out in enumerate(outs):
            total = np.full(out.shape, np.float32(0.25 * index), np.float32)
            for x in ins:
                if x.ndim <= out.ndim and all(
                    n in (1, m)
                    for n, m in zip(
                        x.shape, out.shape[out.ndim - x.ndim :], strict=True
                    )
                ):
                    np.add(total, x, total)
                else:
                    np.add(total, np.float32(x.sum(dtype=np.float32)), total)
            np.tanh(total, out)
            np.add(out, np.float32(0.5), out)

    return k


def reference(dag: nx.DiGraph, values: Mapping[int, Array]) -> dict[Entry, Array]:
    """Every tensor, node by node, each kernel called once on whole arrays."""
    out: dict[Entry, Array] = {}
    for nid in nx.lexicographical_topological_sort(dag):
        spec = node_spec(dag, nid)
        if spec.is_null:
            out[Entry(nid, 0)] = values[nid]
            continue
        ins = [out[e] for e in spec.inputs]
        if spec.is_nop:
            out[Entry(nid, 0)] = ins[0]
            continue
        results = [np.empty(t.shape, np.float32) for t in spec.outputs]
        make_k(len(ins))(*ins, *results)
        for index, result in enumerate(results):
            out[Entry(nid, index)] = result
    return out


def run_plan(plan: Plan, dag: nx.DiGraph, values: Mapping[int, Array]) -> list[Array]:
    """Run ``plan`` once on its devices; its heads."""
    external: dict[Entry, NDArray] = {}
    for nid in plan.inputs:
        entry = Entry(nid, 0)
        array = empty(plan.tensors[entry].shape, "float32", plan.storage[entry].device)
        array.copyfrom(values[nid])
        external[entry] = array
    kernels = {
        nid: make_k(len(node_spec(dag, nid).inputs))
        for nid in dag.nodes
        if not node_spec(dag, nid).is_null
    }
    program = Program(plan, kernels, external)
    try:
        program.run_sync()
        return [program.arrays[h].numpy() for h in plan.heads]
    finally:
        program.close()


def test_parts_compute_the_whole_node_bit_for_bit() -> None:
    dag = join(
        branches=5,
        join_func="k",
        shape=(ROWS, 3),
        extra=(TensorSpec((3,), "float32"), TensorSpec((1, 3), "float32")),
    )
    plan = plan_of(dag)
    assert parts_of(plan)
    rng = np.random.default_rng(0)
    values = {
        nid: rng.uniform(-1, 1, node_spec(dag, nid).outputs[0].shape).astype(np.float32)
        for nid in dag.nodes
        if node_spec(dag, nid).is_null
    }
    want = reference(dag, values)
    for got, head in zip(run_plan(plan, dag, values), plan.heads, strict=True):
        np.testing.assert_array_equal(got, want[head])


def test_a_failing_part_names_its_node_and_the_program_runs_again() -> None:
    dag = join()
    plan = plan_of(dag)
    x = empty((ROWS,), "float32", CPU)
    x.copyfrom(np.zeros(ROWS, np.float32))
    fail_on = [True]

    def tanh(a: Array, out: Array) -> None:
        np.tanh(a, out)

    def total(*arrays: Array) -> None:
        if fail_on[0] and arrays[-1].shape[0] < ROWS:  # a part
            raise RuntimeError("boom")
        np.add(arrays[0], arrays[1], arrays[-1])
        for a in arrays[2:-1]:
            np.add(arrays[-1], a, arrays[-1])

    kernels = {1: tanh, 2: tanh, 3: tanh, 4: tanh, 5: total}
    program = Program(plan, kernels, {Entry(0, 0): x})
    try:
        with pytest.raises(NodeFailedError, match="'j'"):
            program.run_sync()
        fail_on[0] = False
        program.run_sync()
        np.testing.assert_array_equal(program.arrays[Entry(5, 0)].numpy(), 0.0)
    finally:
        program.close()


# -- property: random DAGs, split wherever a stream would idle ----------------------


@st.composite
def joined_branches(draw: st.DrawFn) -> nx.DiGraph:
    """Layers of 2-4 parallel branches (1-2 ``k`` nodes each) joined by one
    ``k`` node reading them all and, sometimes, a broadcast parameter;
    some branches are graph outputs. Rows: 2 to 64, 1-D or 2-D."""
    shape = draw(st.sampled_from(((2,), (16,), (64,), (8, 3))))
    tensor = TensorSpec(shape, "float32")
    specs = [NodeSpec("x", "null", "", (), (tensor,))]
    params: list[int] = []
    if draw(st.booleans()):
        bias = draw(st.sampled_from(((1,), (shape[-1],), (1,) * len(shape))))
        params.append(len(specs))
        specs.append(NodeSpec("p", "null", "", (), (TensorSpec(bias, "float32"),)))
    source, heads = Entry(0, 0), []
    for layer in range(draw(st.integers(1, 3))):
        ends = []
        for branch in range(draw(st.integers(2, 4))):
            entry = source
            for step in range(draw(st.integers(1, 2))):
                name = f"b{layer}_{branch}_{step}"
                specs.append(NodeSpec(name, "tvm_op", "k", (entry,), (tensor,)))
                entry = Entry(len(specs) - 1, 0)
            ends.append(entry)
            if draw(st.integers(0, 4)) == 0:
                heads.append(entry)
        reads = tuple(ends) + tuple(Entry(p, 0) for p in params if draw(st.booleans()))
        specs.append(NodeSpec(f"j{layer}", "tvm_op", "k", reads, (tensor,)))
        source = Entry(len(specs) - 1, 0)
    heads.append(source)
    return make_dag(specs, GraphSpec((0,), tuple(params), tuple(dict.fromkeys(heads))))


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(graph=st.one_of(dags(), joined_branches()), data=st.data())
def test_random_dags_split_race_free_and_bit_identical(
    graph: nx.DiGraph, data: st.DataObject
) -> None:
    devices = data.draw(st.sampled_from([(CPU,), (CPU, S0), (S0, CPU)]))
    streams = data.draw(st.integers(2, 3))
    kinds = data.draw(st.sampled_from([frozenset({"cpu"}), frozenset({"cpu", "sim"})]))
    split = RowSplit(elementwise, min_bytes=0, kinds=kinds)
    plan = plan_graph(
        graph,
        devices,
        policy=data.draw(st.sampled_from(["auto", "single"])),
        max_streams=streams,
        cost=table(graph, devices),
        split=split,
    )
    check_plan(plan)
    split_nodes = parts_of(plan)
    event("split" if split_nodes else "nothing split")
    for parts in split_nodes.values():
        assert len({s for s, _ in parts}) == len(parts)  # one stream each

    # Overlapping two tensors that may be live at once is still caught.
    overlap_is_caught(plan, step_graph(plan), data)

    # And it runs to what whole kernels compute.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    values = {
        nid: rng.uniform(-1, 1, node_spec(graph, nid).outputs[0].shape).astype(
            np.float32
        )
        for nid in graph.nodes
        if node_spec(graph, nid).is_null
    }
    want = reference(graph, values)
    for got, head in zip(run_plan(plan, graph, values), plan.heads, strict=True):
        np.testing.assert_array_equal(got, want[_graph_head(plan, head)])


def _graph_head(plan: Plan, head: Entry) -> Entry:
    """The graph's entry behind one of ``plan.heads`` (a host copy of it,
    when it was computed elsewhere)."""
    for step in plan.launches():
        if step.func_name == "__copy" and step.args[1] == head:
            return step.args[0]
    return head
