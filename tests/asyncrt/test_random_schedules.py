"""Randomized differential tests of multi-device scheduling.

Random DAGs (random width and depth, fan-in 1 to 3, elementwise kernels,
``__nop`` aliases, a two-output kernel, several heads: sinks, intermediate
nodes, input-adjacent nodes, sometimes repeated) are placed at random over
``cpu:0``, ``sim:0`` and ``sim:1`` (pins through the builder's ``device=``,
named policies, or a user policy that draws a device per node and hands the
assignment to :func:`scheduler.placement.evaluate`), with random host
device, random ``max_streams`` and random sim speeds. Some kernels sleep a
random 0-1 ms before computing, to shake the interleavings. Every plan must
pass :func:`scheduler.happens_before.check_plan`, and every run — ``run_sync``,
``await run``, and several concurrent ``await run`` calls with their own
inputs — must give what a sequential numpy evaluation gives, bit for bit
(the reference does the same float32 operations in the same order).

A *case* is one generated graph run under one placement: each example runs
:data:`PLACEMENTS` placements, each with its own executor.

A second generator, :func:`joins`, draws graphs of large arrays (4 MiB):
layers of parallel elementwise branches, each layer joined by a ``sum``,
``add`` or ``maximum`` (sometimes with a broadcast bias), on the cpu alone
or beside a fast sim, with 2 or 3 cpu streams: the planner splits such
joins into one part per stream (:mod:`scheduler.split`) where the cost
model says the other streams would idle, and every run must still give the
sequential reference, bit for bit.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder
from devices import Device, sim
from scheduler.cost import CostModel
from scheduler.dag import node_spec
from scheduler.happens_before import check_plan
from scheduler.placement import Placement, Policy, evaluate

from .library_reference import library_tanh

DEVICES = ("cpu:0", "sim:0", "sim:1")
#: Placements (executors) per generated graph: cases = examples x this.
PLACEMENTS = 3
#: A binary op whose result could exceed this magnitude becomes a tanh.
BOUND = 16.0

UNARY = ("tanh", "sigmoid", "relu", "__nop", "pair")
BINARY = ("add", "subtract", "multiply", "maximum")
TERNARY = ("sum",)

Array = np.ndarray[Any, Any]
Ref = tuple[int, int]  # (node index, output index)


@dataclass(frozen=True)
class Node:
    """One node of a generated graph.

    :ivar op: ``"input"``, ``"param"`` or a kernel name.
    :ivar inputs: the outputs it reads.
    :ivar shapes: one shape per output.
    :ivar slow: whether its kernel sleeps a random 0-1 ms first.
    """

    op: str
    inputs: tuple[Ref, ...]
    shapes: tuple[tuple[int, ...], ...]
    slow: bool = False

    @property
    def is_null(self) -> bool:
        return self.op in ("input", "param")


@dataclass(frozen=True)
class Case:
    """A generated graph and the seed of its data and delays."""

    size: int
    nodes: tuple[Node, ...]
    heads: tuple[Ref, ...]
    seed: int

    def name(self, index: int) -> str:
        node = self.nodes[index]
        if node.op == "param":
            return f"p{index}"
        return f"x{index}" if node.op == "input" else f"n{index}"


@dataclass(frozen=True)
class Placing:
    """How one executor places a case.

    :ivar devices: the device list, host first.
    :ivar pins: node index -> device, through the builder's ``device=``.
    :ivar policy: a policy name, or ``None`` for the random user policy.
    :ivar assign: node index -> device, for the random user policy.
    :ivar max_streams: compute streams per device.
    :ivar split_min_bytes: the smallest output the planner may split into
        rows (``None``: the executor's default).
    """

    devices: tuple[str, ...]
    pins: Mapping[int, str]
    policy: str | None
    assign: Mapping[int, str]
    max_streams: int
    split_min_bytes: int | None = None


# -- generating ---------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn, with_slow: bool = False) -> Case:
    """A random graph: inputs, an optional parameter, then layers of nodes,
    each reading the previous layer (so the graph is as deep as it has
    layers) and, for more inputs, any earlier tensor of the same shape."""
    size = draw(st.sampled_from((0, 1, 2, 3, 5)))
    nodes: list[Node] = [
        Node("input", (), ((size,),)) for _ in range(draw(st.integers(1, 2)))
    ]
    if draw(st.booleans()):
        nodes.append(Node("param", (), ((size,),)))
    bound: dict[Ref, float] = {(i, 0): 1.0 for i in range(len(nodes))}
    previous = [(i, 0) for i in range(len(nodes))]
    use_slow = with_slow and draw(st.booleans())
    for _ in range(draw(st.integers(1, 5))):
        layer: list[Ref] = []
        for _ in range(draw(st.integers(1, 3))):
            first = draw(st.sampled_from(previous))
            shape = nodes[first[0]].shapes[first[1]]
            same = [r for r in bound if nodes[r[0]].shapes[r[1]] == shape]
            fan_in = draw(st.integers(1, 3))
            ops = (UNARY, BINARY, TERNARY)[fan_in - 1]
            op = draw(st.sampled_from(ops))
            inputs = (first, *(draw(st.sampled_from(same)) for _ in range(fan_in - 1)))
            bounds = [bound[r] for r in inputs]
            if op == "multiply":
                limit = bounds[0] * bounds[1]
            elif op in BINARY or op in TERNARY:
                limit = sum(bounds)
            else:
                limit = bounds[0]
            if limit > BOUND:
                op, inputs = "tanh", inputs[:1]
            if op == "__nop":
                shapes: tuple[tuple[int, ...], ...] = (
                    draw(st.sampled_from(((size,), (1, size), (size, 1)))),
                )
            elif op == "pair":
                shapes = (shape, shape)
            else:
                shapes = (shape,)
            slow = use_slow and op != "__nop" and draw(st.booleans())
            index = len(nodes)
            nodes.append(Node(op, inputs, shapes, slow))
            for k in range(len(shapes)):
                ref = (index, k)
                bound[ref] = _bound(op, k, bounds)
                layer.append(ref)
        previous = layer
    heads = _heads(draw, nodes)
    return Case(size, tuple(nodes), heads, draw(st.integers(0, 2**32 - 1)))


def _bound(op: str, index: int, bounds: Sequence[float]) -> float:
    if op in ("tanh", "sigmoid") or (op == "pair" and index == 0):
        return 1.0
    if op == "pair":
        return bounds[0] / 2
    if op == "multiply":
        return bounds[0] * bounds[1]
    if op in ("add", "subtract", "sum"):
        return sum(bounds)
    return max(bounds)


def _heads(draw: st.DrawFn, nodes: Sequence[Node]) -> tuple[Ref, ...]:
    """Every unread output, some intermediate ones, a node reading a graph
    input directly, sometimes a graph input itself or a head twice."""
    read = {r for node in nodes for r in node.inputs}
    every = [(i, k) for i, n in enumerate(nodes) for k in range(len(n.shapes))]
    ops = [r for r in every if not nodes[r[0]].is_null]
    heads = [r for r in ops if r not in read]
    heads += draw(st.lists(st.sampled_from(ops), max_size=2))
    adjacent = [r for r in ops if any(nodes[i].is_null for i, _ in nodes[r[0]].inputs)]
    heads.append(draw(st.sampled_from(adjacent)))
    if draw(st.integers(0, 9)) == 0:
        heads.append(draw(st.sampled_from([r for r in every if nodes[r[0]].is_null])))
    unique = list(dict.fromkeys(heads))
    if draw(st.integers(0, 4)) == 0:
        unique.append(draw(st.sampled_from(unique)))
    return tuple(draw(st.permutations(unique)))


@st.composite
def placings(
    draw: st.DrawFn,
    case: Case,
    user_policy: bool,
    among: Sequence[str] = DEVICES,
) -> Placing:
    """A random placement of ``case`` over the devices ``among``: host and
    device order, pins, and a named policy or the random user policy."""
    devices = tuple(draw(st.permutations(among)))
    ops = [i for i, n in enumerate(case.nodes) if not n.is_null]
    device = st.sampled_from(among)
    pins = {i: draw(device) for i in ops if draw(st.integers(0, 2)) == 0}
    if user_policy:
        policy = None
        assign = {i: draw(device) for i in ops}
    else:
        policy = draw(st.sampled_from(("auto", "heft", "peft", "fastest", "single")))
        assign = {}
    return Placing(devices, pins, policy, assign, draw(st.integers(1, 3)))


@st.composite
def sim_configs(draw: st.DrawFn) -> tuple[sim.SimConfig, sim.SimConfig]:
    """Sim speeds that tilt the cost model one way or another."""

    def one() -> sim.SimConfig:
        return sim.SimConfig(
            flops=draw(st.sampled_from((1e6, 1e9, 50e9))),
            bandwidth=draw(st.sampled_from((1e7, 8e9))),
            latency=draw(st.sampled_from((0.0, 5e-6))),
        )

    return one(), one()


#: Elements of a :func:`joins` tensor: 4 MiB of float32, enough for the cost
#: model to find a split join worth a thread wake-up.
JOIN_ELEMENTS = 1 << 20


@st.composite
def joins(draw: st.DrawFn) -> Case:
    """Layers of 2-4 parallel branches of 1-2 elementwise ops each (some a
    ``pair`` or a slow kernel, which do not split), each layer joined by one
    node (``sum`` of all branches, ``add`` or ``maximum`` of two, sometimes
    plus a bias that broadcasts along the rows); the next layer reads the
    join. 1-D or 2-D tensors of :data:`JOIN_ELEMENTS`."""
    shape = draw(st.sampled_from(((JOIN_ELEMENTS,), (JOIN_ELEMENTS // 64, 64))))
    nodes: list[Node] = [Node("input", (), (shape,))]
    bias: Ref | None = None
    if draw(st.booleans()):
        bias_shape = draw(st.sampled_from(((1,), (shape[-1],), (1, shape[-1]))))
        if len(bias_shape) > len(shape):
            bias_shape = (1,)
        bias = (len(nodes), 0)
        nodes.append(Node("param", (), (bias_shape,)))
    source: Ref = (0, 0)
    heads: list[Ref] = []
    use_slow = draw(st.booleans())
    for _ in range(draw(st.integers(1, 2))):
        branches: list[Ref] = []
        for _ in range(draw(st.integers(2, 4))):
            ref = source
            for _ in range(draw(st.integers(1, 2))):
                op = draw(st.sampled_from(("tanh", "sigmoid", "relu", "pair")))
                slow = use_slow and draw(st.integers(0, 3)) == 0
                nodes.append(
                    Node(op, (ref,), (shape,) * (2 if op == "pair" else 1), slow)
                )
                ref = (len(nodes) - 1, 0)
            branches.append(ref)
        join = draw(st.sampled_from(("sum", "add", "maximum")))
        reads = tuple(branches) if join == "sum" else tuple(branches[:2])
        if join == "sum" and len(reads) < 3:
            join = "add"
        nodes.append(Node(join, reads, (shape,)))
        source = (len(nodes) - 1, 0)
        if bias is not None and draw(st.booleans()):
            nodes.append(Node("add", (source, bias), (shape,)))
            source = (len(nodes) - 1, 0)
        if draw(st.integers(0, 3)) == 0:
            heads.append(draw(st.sampled_from(branches)))  # a branch is an output
    heads.append(source)
    return Case(
        shape[0],
        tuple(nodes),
        tuple(dict.fromkeys(heads)),
        draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def join_placings(draw: st.DrawFn) -> Placing:
    """The cpu alone or with a sim (either may face the host), a named
    policy, 2 or 3 streams, splits from any size or the default's."""
    devices = draw(
        st.sampled_from((("cpu:0",), ("cpu:0", "sim:0"), ("sim:0", "cpu:0")))
    )
    policy = draw(st.sampled_from(("auto", "single", "heft")))
    return Placing(
        devices,
        {},
        policy,
        {},
        draw(st.integers(2, 3)),
        draw(st.sampled_from((None, 0))),
    )


# -- building and running ---------------------------------------------------------


def build(case: Case, placing: Placing) -> Graph:
    """The case as a graph, with the placement's pins."""
    b = GraphBuilder()
    handles: dict[Ref, Any] = {}
    for i, node in enumerate(case.nodes):
        name = case.name(i)
        if node.op == "input":
            handles[i, 0] = b.input(name, shape=node.shapes[0], dtype="float32")
            continue
        if node.op == "param":
            handles[i, 0] = b.param(name, shape=node.shapes[0], dtype="float32")
            continue
        func = f"slow_{node.op}" if node.slow else node.op
        outs = b.op(
            func,
            *(handles[r] for r in node.inputs),
            outputs=[(s, "float32") for s in node.shapes],
            name=name,
            device=placing.pins.get(i),
        )
        for k, handle in enumerate(outs):
            handles[i, k] = handle
    b.output(*(handles[r] for r in case.heads))
    return b.build()


def random_policy(case: Case, assign: Mapping[int, str]) -> Policy:
    """A user policy: the drawn device of every node, scheduled by
    :func:`evaluate` (pins and ``__nop`` rules still hold)."""
    index_of = {case.name(i): i for i in assign}

    def policy(
        dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        device_of = {}
        for nid in dag.nodes:
            index = index_of.get(node_spec(dag, nid).name)
            if index is not None:
                device_of[nid] = Device.parse(assign[index])
        return evaluate(dag, devices, cost, device_of, name="random")

    return policy


def _pair(a: Array, first: Array, second: Array) -> None:
    np.tanh(a, first)
    np.multiply(a, np.float32(0.5), second)


def make_lib(seed: int, kinds: Sequence[str] = ("cpu", "sim")) -> asyncrt.Module:
    """``pair`` and a ``slow_`` twin of every kernel for the device ``kinds``
    (numpy on cpu and sim, cupy on cuda); a twin sleeps a random 0-1 ms
    (from a seeded, locked generator) and then computes (on cuda: launches)."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def slow(kernel: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Array) -> None:
            with lock:
                delay = rng.uniform(0.0, 1e-3)
            time.sleep(delay)
            kernel(*args)

        return run

    table: dict[str, dict[str, Callable[..., None]]] = {}
    for kind in kinds:
        kernels: dict[str, Callable[..., None]] = {
            "pair": _cupy_pair if kind == "cuda" else _pair
        }
        for op in (*UNARY, *BINARY, *TERNARY):
            if op == "__nop":
                continue
            base = kernels.get(op) or asyncrt.get_global_func(op, kind)
            assert base is not None
            kernels[f"slow_{op}"] = slow(base)
        for name, kernel in kernels.items():
            table.setdefault(name, {})[kind] = kernel
    return asyncrt.Module(table)


def _cupy_pair(a: Any, first: Any, second: Any) -> None:
    import cupy

    cupy.tanh(a, first)
    cupy.multiply(a, cupy.float32(0.5), second)


#: The library's sigmoid of numpy arrays (float32: one compiled loop, where
#: numba is installed): the reference computes what the kernels do.
SIGMOID = asyncrt.get_global_func("sigmoid", "cpu")


def reference(case: Case, values: Mapping[int, Array]) -> list[Array]:
    """The heads, computed node by node in plain numpy (float32 throughout,
    the same operations in the same order as the kernels)."""
    out: dict[Ref, Array] = {}
    for i, node in enumerate(case.nodes):
        if node.is_null:
            out[i, 0] = values[i]
            continue
        args = [out[r] for r in node.inputs]
        a = args[0]
        if node.op == "tanh":
            out[i, 0] = library_tanh(a)
        elif node.op == "sigmoid":  # the library's float32 sigmoid
            out[i, 0] = np.empty_like(a)
            SIGMOID(a, out[i, 0])
        elif node.op == "relu":
            out[i, 0] = np.maximum(a, 0)
        elif node.op == "__nop":
            out[i, 0] = a.reshape(node.shapes[0])
        elif node.op == "pair":
            out[i, 0] = np.tanh(a)
            out[i, 1] = np.multiply(a, np.float32(0.5))
        elif node.op == "add":
            out[i, 0] = a + args[1]
        elif node.op == "subtract":
            out[i, 0] = a - args[1]
        elif node.op == "multiply":
            out[i, 0] = a * args[1]
        elif node.op == "maximum":
            out[i, 0] = np.maximum(a, args[1])
        elif node.op == "sum":  # the kernel's order: ((a + b) + c) + ...
            total = a + args[1]
            for other in args[2:]:
                total = total + other
            out[i, 0] = total
        else:
            raise AssertionError(f"unknown op {node.op}")
    return [out[r] for r in case.heads]


def draw_values(case: Case, rng: np.random.Generator) -> dict[int, Array]:
    """Fresh values for every graph input and parameter."""
    return {
        i: rng.uniform(-1.0, 1.0, node.shapes[0]).astype(np.float32)
        for i, node in enumerate(case.nodes)
        if node.is_null
    }


def run_inputs(case: Case, values: Mapping[int, Array]) -> dict[str, Any]:
    """The keyword inputs of a run (graph inputs only, not parameters)."""
    return {case.name(i): v for i, v in values.items() if case.nodes[i].op == "input"}


def assert_outputs(
    case: Case, got: Sequence[Any] | None, want: list[Array], rtol: float = 0.0
) -> None:
    """Every head as the reference has it: bit for bit, or within ``rtol``
    (and as much absolute error) where another math library computed it."""
    assert got is not None
    assert len(got) == len(want)
    for k, (array, expected) in enumerate(zip(got, want, strict=True)):
        actual = array.numpy()
        assert actual.shape == expected.shape, f"head {k} ({case.heads[k]})"
        np.testing.assert_allclose(
            actual,
            expected,
            rtol=rtol,
            atol=rtol,
            err_msg=f"head {k} ({case.heads[k]}) of {case}",
        )


def check_case(
    case: Case,
    placing: Placing,
    concurrent: int,
    configs: Sequence[sim.SimConfig],
    backend: str,
    rtol: float = 0.0,
) -> None:
    """Plan, check the plan, and run ``case`` under ``placing``: once with
    ``run_sync``, then on ``backend`` once awaited and ``concurrent`` awaited
    runs at once, each with its own inputs. Outputs match the reference bit
    for bit, or within ``rtol`` (for devices with other math libraries)."""
    sim.configure(2, configs)
    rng = np.random.default_rng(case.seed)
    base = draw_values(case, rng)
    params = {case.name(i): v for i, v in base.items() if case.nodes[i].op == "param"}

    def fresh() -> dict[int, Array]:
        values = draw_values(case, rng)
        values.update({i: v for i, v in base.items() if case.nodes[i].op == "param"})
        return values

    policy: str | Policy = (
        placing.policy
        if placing.policy is not None
        else random_policy(case, placing.assign)
    )
    # Half the cases declare the parameters at creation (the planner then
    # copies them to other devices once, as constants); the others load them
    # later (copied on every run, like inputs).
    declared = bool(params) and case.seed % 2 == 0
    with graph_executor.create(
        build(case, placing),
        make_lib(case.seed, sorted({Device.parse(d).kind for d in placing.devices})),
        list(placing.devices),
        policy=policy,
        max_streams=placing.max_streams,
        params=params if declared else None,
        # every drawn node scheduled as drawn, bit for bit: no fused chains
        fuse=False,
        **(
            {}
            if placing.split_min_bytes is None
            else {"split_min_bytes": placing.split_min_bytes}
        ),
    ) as ex:
        check_plan(ex.plan)
        split = any(launch.part is not None for launch in ex.plan.launches())
        event("a node split into rows" if split else "no node split")
        for i, device in placing.pins.items():
            assert str(ex.plan.placement[i]) == device
        if not declared:
            assert not ex.plan.constant_copies
        if params:
            ex.load_params(params)  # again when declared: copies refresh
        values = fresh()
        got = ex.run_sync(**run_inputs(case, values))
        assert_outputs(case, got, reference(case, values), rtol)
        batches = [[fresh()], [fresh() for _ in range(concurrent)]]
        results = anyio.run(awaited_runs, ex, case, batches, backend=backend)
        for batch, outputs in zip(batches, results, strict=True):
            for values, got in zip(batch, outputs, strict=True):
                assert_outputs(case, got, reference(case, values), rtol)


async def awaited_runs(
    ex: graph_executor.GraphModule, case: Case, batches: list[list[dict[int, Array]]]
) -> list[list[Any]]:
    """Each batch's runs at once (batches one after another); their outputs."""
    results: list[list[Any]] = []
    for batch in batches:
        results.append(await _at_once(ex, case, batch))
    return results


async def _at_once(
    ex: graph_executor.GraphModule, case: Case, batch: list[dict[int, Array]]
) -> list[Any]:
    outputs: list[Any] = [None] * len(batch)

    async def one(k: int, values: dict[int, Array]) -> None:
        outputs[k] = await ex.run(**run_inputs(case, values))

    async with anyio.create_task_group() as tg:
        for k, values in enumerate(batch):
            tg.start_soon(one, k, values)
    return outputs


COMMON = settings(
    deadline=None,
    database=None,
    # The fixtures (sim reset, thread-leak check) hold for the whole test;
    # every example closes its executors itself.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_placings(
    data: st.DataObject,
    case: Case,
    user_policy: bool,
    backend: str,
    among: Sequence[str] = DEVICES,
    rtol: float = 0.0,
) -> None:
    configs = data.draw(sim_configs())
    for _ in range(PLACEMENTS):
        placing = data.draw(placings(case, user_policy, among))
        concurrent = data.draw(st.integers(3, 5))
        check_case(case, placing, concurrent, configs, backend, rtol)


# -- the tests: cases = examples x PLACEMENTS, on each backend ---------------------


# 60 examples a test and backend: each CI run draws new ones (no database,
# no fixed seed), so the cases covered grow run by run.
@settings(COMMON, max_examples=60)
@given(case=cases(), data=st.data())
def test_pinned_and_named_policies(
    anyio_backend: str, case: Case, data: st.DataObject
) -> None:
    """Builder pins over named policies (auto, heft, peft, fastest, single)."""
    run_placings(data, case, False, anyio_backend)


@settings(COMMON, max_examples=60)
@given(case=cases(), data=st.data())
def test_random_user_policy(
    anyio_backend: str, case: Case, data: st.DataObject
) -> None:
    """A user policy drawing every node's device, plus some builder pins."""
    run_placings(data, case, True, anyio_backend)


@settings(COMMON, max_examples=30)
@given(case=cases(with_slow=True), data=st.data())
def test_slow_kernels_shake_interleavings(
    anyio_backend: str, case: Case, data: st.DataObject
) -> None:
    """Kernels that sleep 0-1 ms first, so streams finish out of order."""
    run_placings(data, case, data.draw(st.booleans()), anyio_backend)


#: Fast sims for the large-array joins (a 4 MiB op or copy takes about a
#: millisecond of modelled time).
FAST_SIMS = (
    sim.SimConfig(flops=50e9, bandwidth=8e9),
    sim.SimConfig(flops=50e9, bandwidth=8e9),
)


@settings(COMMON, max_examples=12)
@given(case=joins(), data=st.data())
def test_large_joins_split_and_match_the_reference(
    anyio_backend: str, case: Case, data: st.DataObject
) -> None:
    """Parallel branches over 4 MiB arrays joined by elementwise nodes: the
    joins are split over the cpu streams where that pays."""
    for _ in range(2):
        placing = data.draw(join_placings())
        check_case(
            case, placing, data.draw(st.integers(2, 3)), FAST_SIMS, anyio_backend
        )


# -- regressions found by the tests above ---------------------------------------------


def test_a_head_copied_back_early_is_read_from_its_host_copy(
    anyio_backend: str,
) -> None:
    """Head ``a`` runs on sim:0 and is copied to the host early, because a
    host node reads it; the planner may then reuse ``a``'s sim bytes (only
    the host copy, ``plan.heads``, must live to the end). The executor must
    return the host copy, not the reused device tensor."""
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    a = b.op("tanh", x, shape=(4,), dtype="float32", name="a", device="sim:0")
    s = b.op("add", a, x, shape=(4,), dtype="float32", name="s", device="cpu:0")
    t = b.op("tanh", s, shape=(4,), dtype="float32", name="t", device="sim:0")
    b.output(a, t)
    xv = np.linspace(-1.0, 1.0, 4, dtype=np.float32)
    want = [library_tanh(xv), library_tanh(library_tanh(xv) + xv)]
    with graph_executor.create(b.build(), None, ["cpu:0", "sim:0"]) as ex:
        check_plan(ex.plan)
        got = ex.run_sync(x=xv)
        assert got is not None
        np.testing.assert_array_equal(got[0].numpy(), want[0])
        np.testing.assert_array_equal(got[1].numpy(), want[1])

        async def awaited() -> list[Any] | None:
            return await ex.run(x=xv)

        got = anyio.run(awaited, backend=anyio_backend)
        assert got is not None
        np.testing.assert_array_equal(got[0].numpy(), want[0])


def test_parameters_read_elsewhere_are_copied_once(anyio_backend: str) -> None:
    """A parameter declared at creation and read on sim:0 is copied there
    when loaded (a constant copy, no launch); changing it with ``set_input``
    or ``load_params`` refreshes the copy; an undeclared one is copied by a
    launch on every run."""
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    w = b.param("w", shape=(4,), dtype="float32")
    y = b.op("add", x, w, shape=(4,), dtype="float32", name="y", device="sim:0")
    b.output(y)
    graph = b.build()
    xv = np.arange(4, dtype=np.float32)
    wv = np.full(4, 0.5, np.float32)
    with graph_executor.create(graph, None, ["cpu:0", "sim:0"], params={"w": wv}) as ex:
        check_plan(ex.plan)
        assert len(ex.plan.constant_copies) == 1
        copies = [s for s in ex.plan.launches() if s.func_name == "__copy"]
        assert [c.args[0].nid for c in copies] == [0, 2]  # x in, y back: not w
        assert "parameter copy" in str(ex.plan)

        async def run() -> Any:
            return await ex.run(x=xv)

        got = anyio.run(run, backend=anyio_backend)
        np.testing.assert_array_equal(got[0].numpy(), xv + wv)
        ex.set_input("w", wv * 4)
        got = anyio.run(run, backend=anyio_backend)
        np.testing.assert_array_equal(got[0].numpy(), xv + 4 * wv)
        ex.load_params({"w": wv * 8})
        got = anyio.run(run, backend=anyio_backend)
        np.testing.assert_array_equal(got[0].numpy(), xv + 8 * wv)
    with graph_executor.create(graph, None, ["cpu:0", "sim:0"]) as ex:
        assert not ex.plan.constant_copies
        copies = [s for s in ex.plan.launches() if s.func_name == "__copy"]
        assert sorted(c.args[0].nid for c in copies) == [0, 1, 2]
        ex.load_params({"w": wv})
        got = anyio.run(run, backend=anyio_backend)
        np.testing.assert_array_equal(got[0].numpy(), xv + wv)


def test_unknown_parameter_names_at_creation_are_a_graph_error() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(2,), dtype="float32")
    y = b.op("tanh", x, shape=(2,), dtype="float32", name="y", device="sim:0")
    b.output(y)
    with pytest.raises(asyncrt.errors.GraphError, match="nope"):
        graph_executor.create(
            b.build(), None, ["cpu:0", "sim:0"], params={"nope": np.ones(2)}
        )
