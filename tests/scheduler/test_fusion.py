"""The elementwise fusion pass: fused graphs compared with literal expectations."""

from __future__ import annotations

import json
from types import MappingProxyType

import networkx as nx
import pytest

from devices import Device
from scheduler.dag import (
    EdgeUse,
    Entry,
    GraphSpec,
    NodeSpec,
    TensorSpec,
    edge_uses,
    make_dag,
    node_spec,
)
from scheduler.fusion import FusedArg, fuse_elementwise
from scheduler.planner import plan_graph

ELEMENTWISE = frozenset({"add", "multiply", "tanh", "exp", "sqrt", "relu"})
VEC = TensorSpec((8,), "float32")
ONE = TensorSpec((1,), "float32")


def null(name: str, tensor: TensorSpec = VEC) -> NodeSpec:
    return NodeSpec(name, "null", "", (), (tensor,))


def op(
    name: str,
    func: str,
    *inputs: int,
    tensor: TensorSpec = VEC,
    device: Device | None = None,
) -> NodeSpec:
    return NodeSpec(
        name,
        "tvm_op",
        func,
        tuple(Entry(i, 0) for i in inputs),
        (tensor,),
        device=device,
        flops=float(tensor.size),
    )


def dag_of(nodes: list[NodeSpec], heads: tuple[int, ...]) -> nx.DiGraph:
    nulls = tuple(i for i, n in enumerate(nodes) if n.is_null)
    return make_dag(nodes, GraphSpec(nulls, (), tuple(Entry(h, 0) for h in heads)))


def fusible(spec: NodeSpec) -> bool:
    return spec.func_name in ELEMENTWISE


def fused(nodes: list[NodeSpec], heads: tuple[int, ...]) -> nx.DiGraph:
    return fuse_elementwise(dag_of(nodes, heads), fusible).dag


def edges(dag: nx.DiGraph) -> dict[tuple[int, int], tuple[EdgeUse, ...]]:
    return {(u, v): edge_uses(dag, u, v) for u, v in dag.edges}


def test_chain_becomes_one_node() -> None:
    dag = dag_of(
        [
            null("x"),
            null("c", ONE),
            op("m", "multiply", 0, 1),
            op("t", "tanh", 2),
            op("e", "exp", 3),
            op("s", "sqrt", 4),
        ],
        heads=(5,),
    )
    result = fuse_elementwise(dag, fusible)
    assert sorted(result.dag.nodes) == [0, 1, 5]
    assert node_spec(result.dag, 5) == NodeSpec(
        name="fused_multiply_tanh_exp_sqrt",
        op="tvm_op",
        func_name="__fused_5",
        inputs=(Entry(0, 0), Entry(1, 0)),
        outputs=(VEC,),
        attrs=MappingProxyType({"fused_nodes": json.dumps(["m", "t", "e", "s"])}),
        flops=32.0,
    )
    assert edges(result.dag) == {(0, 5): (EdgeUse(0, 0),), (1, 5): (EdgeUse(0, 1),)}
    recipe = result.groups[5]
    assert recipe.member_ids == (2, 3, 4, 5)
    assert recipe.names == ("m", "t", "e", "s")
    assert recipe.args == (
        (FusedArg("input", 0), FusedArg("input", 1)),
        (FusedArg("member", 0),),
        (FusedArg("member", 1),),
        (FusedArg("member", 2),),
    )
    assert sorted(dag.nodes) == [0, 1, 2, 3, 4, 5]  # the input is untouched


def test_diamond_with_broadcast_bias_fuses_completely() -> None:
    # f = x + b; y = f + f * f: f is read twice, all inside the group
    dag = dag_of(
        [
            null("x", TensorSpec((2, 4), "float32")),
            null("b", TensorSpec((4,), "float32")),
            op("f", "add", 0, 1, tensor=TensorSpec((2, 4), "float32")),
            op("ff", "multiply", 2, 2, tensor=TensorSpec((2, 4), "float32")),
            op("y", "add", 2, 3, tensor=TensorSpec((2, 4), "float32")),
        ],
        heads=(4,),
    )
    result = fuse_elementwise(dag, fusible)
    assert sorted(result.dag.nodes) == [0, 1, 4]
    assert node_spec(result.dag, 4).inputs == (Entry(0, 0), Entry(1, 0))
    assert result.groups[4].args == (
        (FusedArg("input", 0), FusedArg("input", 1)),
        (FusedArg("member", 0), FusedArg("member", 0)),
        (FusedArg("member", 0), FusedArg("member", 1)),
    )


def test_outputs_read_outside_or_heads_stay_visible() -> None:
    # t is a head and u is read by a matmul: neither may vanish.
    dag = fused(
        [
            null("x"),
            op("m", "multiply", 0, 0),
            op("t", "tanh", 1),
            op("e", "exp", 2),
            op("u", "relu", 0),
            op("mm", "matmul", 4, 0),
            op("r", "add", 4, 5),
        ],
        heads=(2, 3, 6),
    )
    names = {nid: node_spec(dag, nid).name for nid in dag.nodes}
    assert names == {
        0: "x",
        2: "fused_multiply_tanh",
        3: "e",
        4: "u",
        5: "mm",
        6: "r",
    }
    assert edges(dag) == {
        (0, 2): (EdgeUse(0, 0),),  # x * x reads x once
        (2, 3): (EdgeUse(0, 0),),
        (0, 4): (EdgeUse(0, 0),),
        (0, 5): (EdgeUse(0, 1),),
        (4, 5): (EdgeUse(0, 0),),
        (4, 6): (EdgeUse(0, 0),),
        (5, 6): (EdgeUse(0, 1),),
    }


def test_shared_producer_of_two_groups_stays_alone() -> None:
    dag = fused(
        [null("x"), op("a", "tanh", 0), op("b", "exp", 1), op("c", "sqrt", 1)],
        heads=(2, 3),
    )
    assert sorted(dag.nodes) == [0, 1, 2, 3]


def test_non_fusible_node_splits_a_chain() -> None:
    dag = fused(
        [
            null("x"),
            op("a", "tanh", 0),
            op("b", "exp", 1),
            op("mm", "matmul", 2, 2),
            op("c", "sqrt", 3),
            op("d", "relu", 4),
        ],
        heads=(5,),
    )
    assert {n: node_spec(dag, n).name for n in dag.nodes} == {
        0: "x",
        2: "fused_tanh_exp",
        3: "mm",
        5: "fused_sqrt_relu",
    }


def test_shape_dtype_and_pin_bound_groups() -> None:
    other_shape = TensorSpec((4, 2), "float32")
    as_f64 = TensorSpec((8,), "float64")
    sim0 = Device("sim", 0)
    dag = fused(
        [
            null("x"),
            null("w", other_shape),  # does not broadcast to (8,)
            op("a", "tanh", 0),
            op("b", "add", 2, 1),  # reads w: cannot join a group of (8,)
            op("c", "exp", 0),
            op("d", "tanh", 4, tensor=as_f64),  # other dtype than its input
            op("e", "exp", 0, device=sim0),
            op("f", "sqrt", 6),  # pinned nowhere, unlike e
        ],
        heads=(3, 5, 7),
    )
    assert sorted(dag.nodes) == list(range(8))  # nothing fused


def test_max_inputs_bounds_a_group() -> None:
    nodes = [null(f"x{i}") for i in range(4)]
    nodes += [op("a", "add", 0, 1), op("b", "add", 4, 2), op("c", "add", 5, 3)]
    dag = dag_of(nodes, heads=(6,))
    two = fuse_elementwise(dag, fusible, max_inputs=3)
    assert {n: node_spec(two.dag, n).name for n in two.dag.nodes if n > 3} == {
        4: "a",
        6: "fused_add_add",
    }
    assert fuse_elementwise(dag, fusible).groups[6].member_ids == (4, 5, 6)


def test_long_group_name_is_abbreviated_and_names_are_recorded() -> None:
    nodes = [null("x")] + [op(f"n{i}", "tanh", i) for i in range(8)]
    result = fuse_elementwise(dag_of(nodes, heads=(8,)), fusible)
    spec = node_spec(result.dag, 8)
    assert spec.name == "fused_tanh_tanh_tanh_tanh_tanh_3more"
    assert json.loads(spec.attrs["fused_nodes"]) == [f"n{i}" for i in range(8)]


def test_fused_graph_plans() -> None:
    dag = fused(
        [null("x"), op("a", "tanh", 0), op("b", "exp", 1), op("c", "sqrt", 0)],
        heads=(2, 3),
    )
    plan = plan_graph(dag, [Device("cpu", 0)])
    assert [launch.name for launch in plan.launches()] == ["fused_tanh_exp", "c"]
    assert nx.is_directed_acyclic_graph(dag)


def test_rejects_bad_max_inputs() -> None:
    with pytest.raises(ValueError, match="max_inputs"):
        fuse_elementwise(dag_of([null("x")], heads=(0,)), fusible, max_inputs=0)
