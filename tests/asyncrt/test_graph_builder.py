"""Building graphs in Python."""

from __future__ import annotations

import pytest

from asyncrt.errors import GraphError
from asyncrt.graph import (
    DEVICE_ATTR,
    GraphBuilder,
    NodeEntry,
    TensorHandle,
    load_graph,
    to_dag,
)
from devices import Device
from scheduler.dag import Entry, GraphSpec, TensorSpec, graph_spec, node_spec


def test_build_small_graph() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    w = b.param("w", shape=(4,), dtype="float32")
    y = b.op("add", x, w, shape=(4,), dtype="float32", name="add0", device="cpu:0")
    lo, hi = b.op(
        "split", y, outputs=[((2,), "float32"), ((2,), "float16")], device="sim:1"
    )
    z = b.op("mul", lo, lo, shape=(2,), dtype="float32", attrs={"layout": "NC"})
    b.output(z, hi)
    graph = b.build()

    assert b.params == ("w",)
    assert [n.name for n in graph.nodes] == ["x", "w", "add0", "split", "mul"]
    assert graph.arg_nodes == (0, 1)
    assert graph.node_row_ptr == (0, 1, 2, 3, 5, 6)
    assert graph.storage_id == (0, 1, 2, 3, 4, 5)
    assert graph.shape == ((4,), (4,), (4,), (2,), (2,), (2,))
    assert graph.dltype[4] == "float16"
    assert graph.heads == (NodeEntry(4, 0), NodeEntry(3, 1))
    assert dict(graph.nodes[2].attrs) == {
        "func_name": "add",
        "num_inputs": "2",
        "num_outputs": "1",
        "flatten_data": "0",
        DEVICE_ATTR: "cpu:0",
    }
    assert graph.nodes[4].inputs == (NodeEntry(3, 0), NodeEntry(3, 0))
    assert graph.nodes[4].attrs["layout"] == "NC"
    assert load_graph(graph.to_json()) == graph


def test_pinned_device_reaches_dag_through_json() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(), dtype="int64")
    y = b.op("neg", x, shape=(), dtype="int64", device=Device("sim", 1))
    b.output(y)
    graph = load_graph(b.build().to_json())
    dag = to_dag(graph, b.params)
    assert node_spec(dag, 1).device == Device("sim", 1)
    assert node_spec(dag, 1).outputs == (TensorSpec((), "int64"),)
    assert node_spec(dag, 1).flops == 1.0
    assert node_spec(dag, 0).device is None
    assert graph_spec(dag) == GraphSpec(inputs=(0,), params=(), heads=(Entry(1, 0),))


def test_default_names_are_unique() -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(1,), dtype="float32")
    a = b.op("relu", x, shape=(1,), dtype="float32")
    c = b.op("relu", a, shape=(1,), dtype="float32")
    b.output(c)
    assert [n.name for n in b.build().nodes] == ["x", "relu", "relu_1"]


def _builder() -> tuple[GraphBuilder, TensorHandle]:
    b = GraphBuilder()
    return b, b.input("x", shape=(2,), dtype="float32")


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda b, x: b.input("x", shape=(1,), dtype="float32"), "already used"),
        (lambda b, x: b.input("", shape=(1,), dtype="float32"), "non-empty"),
        (lambda b, x: b.input("y", shape=(-1,), dtype="float32"), ">= 0"),
        (lambda b, x: b.input("y", shape=(1.5,), dtype="float32"), ">= 0"),
        (lambda b, x: b.input("y", shape="2", dtype="float32"), "sequence"),
        (lambda b, x: b.input("y", shape=(1,), dtype="float31"), "unknown dtype"),
        (lambda b, x: b.op("f", x, shape=(2,)), "both shape= and dtype="),
        (lambda b, x: b.op("f", x), "either shape="),
        (
            lambda b, x: b.op("f", x, shape=(2,), dtype="float32", outputs=[]),
            "either shape=",
        ),
        (lambda b, x: b.op("f", x, outputs=[]), "at least one output"),
        (lambda b, x: b.op("", x, shape=(2,), dtype="float32"), "func_name"),
        (lambda b, x: b.op("f", "x", shape=(2,), dtype="float32"), "not a handle"),
        (
            lambda b, x: b.op("f", x, shape=(2,), dtype="float32", device="gpu#0"),
            "cannot parse device",
        ),
        (
            lambda b, x: b.op(
                "f", x, shape=(2,), dtype="float32", attrs={"device": "a"}
            ),
            "reserved",
        ),
        (lambda b, x: b.build(), "no outputs"),
    ],
)
def test_builder_errors(call: object, fragment: str) -> None:
    b, x = _builder()
    with pytest.raises(GraphError) as info:
        call(b, x)  # type: ignore[operator]
    assert fragment in str(info.value)


def test_handle_from_other_builder() -> None:
    _b1, x1 = _builder()
    b2, _ = _builder()
    with pytest.raises(GraphError) as info:
        b2.output(x1)
    assert info.value.field == "heads"
    with pytest.raises(GraphError) as info:
        b2.op("f", x1, shape=(2,), dtype="float32", name="f0")
    assert (info.value.node, info.value.field) == ("f0", "inputs")


def test_failed_op_does_not_claim_name() -> None:
    b, x = _builder()
    with pytest.raises(GraphError):
        b.op("f", x, shape=(2,), dtype="nope", name="f0")
    y = b.op("f", x, shape=(2,), dtype="float32", name="f0")
    b.output(y)
    assert b.build().nodes[1].name == "f0"
