"""Converting graphs to the scheduler's DAG."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from asyncrt.errors import GraphError
from asyncrt.graph import load_graph, to_dag
from devices import Device
from scheduler.dag import (
    EdgeUse,
    Entry,
    GraphSpec,
    NodeSpec,
    TensorSpec,
    edge_uses,
    graph_spec,
    node_spec,
)

from .test_graph_json import FILES, small


def test_small_graph_literal() -> None:
    obj = small()
    obj["nodes"][4]["attrs"]["device"] = "sim:1"
    obj["nodes"][2]["attrs"]["layout"] = "NCHW"
    dag = to_dag(load_graph(obj), params=["w"])

    assert graph_spec(dag) == GraphSpec(
        inputs=(0,), params=(1,), heads=(Entry(4, 0), Entry(3, 1))
    )
    assert sorted(dag.edges) == [(0, 2), (1, 2), (2, 3), (3, 4)]
    assert edge_uses(dag, 3, 4) == (EdgeUse(0, 0), EdgeUse(1, 1))
    assert edge_uses(dag, 1, 2) == (EdgeUse(0, 1),)

    f4 = TensorSpec((4,), "float32")
    f2 = TensorSpec((2,), "float32")
    assert node_spec(dag, 0) == NodeSpec(
        name="x", op="null", func_name="", inputs=(), outputs=(f4,), device_type=1
    )
    add = node_spec(dag, 2)
    assert add == NodeSpec(
        name="add0",
        op="tvm_op",
        func_name="add",
        inputs=(Entry(0, 0), Entry(1, 0)),
        outputs=(f4,),
        attrs={
            "func_name": "add",
            "num_inputs": "2",
            "num_outputs": "1",
            "flatten_data": "0",
            "layout": "NCHW",
        },
        device_type=1,
        flops=4.0,
    )
    split = node_spec(dag, 3)
    assert split.outputs == (f2, f2) and split.flops == 4.0
    assert split.device is None
    mul = node_spec(dag, 4)
    assert mul.device == Device("sim", 1)
    assert mul.inputs == (Entry(3, 0), Entry(3, 1))


def test_no_device_index_gives_none() -> None:
    obj = small()
    del obj["attrs"]["device_index"]
    dag = to_dag(load_graph(obj))
    assert all(node_spec(dag, n).device_type is None for n in dag)
    assert graph_spec(dag).inputs == (0, 1) and graph_spec(dag).params == ()


def test_unknown_param_name() -> None:
    with pytest.raises(GraphError) as info:
        to_dag(load_graph(small()), params=["w", "add0", "nope"])
    assert info.value.field == "params"
    assert "['add0', 'nope']" in str(info.value)


def test_nop_costs_nothing() -> None:
    path = next(p for p in FILES if "face_deeppose" in p.name)
    graph = load_graph(path)
    dag = to_dag(graph)
    nops = [n for n in dag if node_spec(dag, n).is_nop]
    assert len(nops) == 2
    assert all(node_spec(dag, n).flops == 0.0 for n in nops)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:40])
def test_every_file_converts(path: Path) -> None:
    graph = load_graph(path)
    params = [n.name for n in graph.nodes if n.is_null][1:]
    dag = to_dag(graph, params)
    assert nx.is_directed_acyclic_graph(dag)
    assert dag.number_of_nodes() == len(graph.nodes)
    spec = graph_spec(dag)
    assert len(spec.inputs) + len(spec.params) == len(graph.arg_nodes)
    assert spec.heads == tuple(Entry(h.nid, h.index) for h in graph.heads)
    uses = sum(len(edge_uses(dag, u, v)) for u, v in dag.edges)
    assert uses == sum(len(n.inputs) for n in graph.nodes)
    outputs = sum(len(node_spec(dag, n).outputs) for n in dag)
    assert outputs == graph.num_entries
