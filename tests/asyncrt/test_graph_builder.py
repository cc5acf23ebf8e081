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


# -- declared outputs of built-in kernels are checked when the node is added ------


def _two_inputs(
    a: tuple[int, ...], b_shape: tuple[int, ...], dtype: str = "float32"
) -> tuple[GraphBuilder, TensorHandle, TensorHandle]:
    b = GraphBuilder()
    return (
        b,
        b.input("a", shape=a, dtype=dtype),
        b.input("b", shape=b_shape, dtype=dtype),
    )


def test_a_wrong_matmul_shape_is_refused_naming_the_node() -> None:
    b, x, w = _two_inputs((2, 3), (3, 4))
    with pytest.raises(
        GraphError, match=r"node 'mm'.*gives shape \(2, 4\), not the declared \(2, 8\)"
    ):
        b.op("matmul", x, w, shape=(2, 8), dtype="float32", name="mm")
    # The failed call left the builder usable, the name free.
    b.output(b.op("matmul", x, w, shape=(2, 4), dtype="float32", name="mm"))
    assert b.build().shape[-1] == (2, 4)


@pytest.mark.parametrize(
    ("func", "shapes", "declared", "fragment"),
    [
        ("add", [(2, 3), (3,)], ((3, 2), "float32"), r"gives shape \(2, 3\)"),
        ("add", [(2, 3), (2,)], ((2, 3), "float32"), "do not broadcast"),
        ("relu", [(4,)], ((4,), "float64"), "gives dtype float32"),
        ("tanh", [(4,), (4,)], ((4,), "float32"), "takes 1 input, got 2"),
        ("less", [(4,)] * 2, ((4,), "float32"), "gives dtype bool"),
        ("dense", [(5, 3), (3, 4)], ((5, 3), "float32"), "dense weights are"),
        ("bias_add", [(5, 3), (2, 1, 3)], ((5, 3), "float32"), "not broadcast over"),
        ("matmul", [(2, 3), (4, 2)], ((2, 2), "float32"), "inner dimensions"),
        ("__nop", [(2, 3)], ((7,), "float32"), "keeps the element count"),
        ("sum", [(2, 3)] * 3, ((3,), "float32"), r"gives shape \(2, 3\)"),
    ],
)
def test_declared_outputs_of_builtin_kernels_are_checked(
    func: str,
    shapes: list[tuple[int, ...]],
    declared: tuple[tuple[int, ...], str],
    fragment: str,
) -> None:
    b = GraphBuilder()
    handles = [b.input(f"i{k}", shape=s, dtype="float32") for k, s in enumerate(shapes)]
    with pytest.raises(GraphError, match=fragment) as caught:
        b.op(func, *handles, shape=declared[0], dtype=declared[1], name="n")
    assert "node 'n'" in str(caught.value)


def test_right_outputs_and_unknown_kernels_pass() -> None:
    b, x, w = _two_inputs((1, 2, 3), (4, 3, 5))
    b.op("matmul", x, w, shape=(4, 2, 5), dtype="float32")  # batch broadcast
    v = b.input("v", shape=(3,), dtype="float32")
    b.op("matmul", v, w, shape=(4, 5), dtype="float32")  # 1-D on the left
    b.op("cast", x, shape=(1, 2, 3), dtype="int64")  # any dtype
    b.op("equal", x, x, shape=(1, 2, 3), dtype="bool")
    b.op("__nop", x, shape=(6,), dtype="float32")  # a reshape
    b.op("my_kernel", x, shape=(99,), dtype="int8")  # no rule: not checked
