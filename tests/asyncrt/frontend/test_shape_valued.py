"""Inputs whose values decide shapes, given at run time: every operator
whose shape-carrying input is a graph input takes it, and its value is part
of the signature. Each family against ONNX Runtime, at two values or more."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from asyncrt import graph_executor
from asyncrt.errors import InputError
from asyncrt.frontend import from_onnx
from asyncrt.graph import SymbolicGraph

from .models import model_of

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return helper.make_tensor_value_info(
        name, elem, [f"{name}_{i}" for i in range(array.ndim)]
    )


def _model(
    node: onnx.NodeProto,
    feed: Mapping[str, np.ndarray],
    outputs: Mapping[str, tuple[int, int]],
    opset: int,
) -> onnx.ModelProto:
    """One node; its inputs typed after ``feed`` (every dimension a symbol),
    its outputs as ``name: (elem_type, rank)``."""
    graph = helper.make_graph(
        [node],
        "g",
        [_value_info(name, array) for name, array in feed.items()],
        [
            helper.make_tensor_value_info(name, elem, [f"o{i}" for i in range(rank)])
            for name, (elem, rank) in outputs.items()
        ],
    )
    return model_of(graph, opset)


def _check(
    model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]], valued: set[str]
) -> None:
    """Every feed through one import: the shape-valued inputs named
    ``valued``, outputs equal to ONNX Runtime's, a signature per value."""
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    assert set(graph.shape_valued) == valued
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    keys = set()
    for feed in feeds:
        shapes = {name: array.shape for name, array in feed.items()}
        keys.add(graph.signature(shapes, feed))
        spec = graph.specialize(shapes, feed)
        assert not set(spec.inputs) & valued
        with graph_executor.create(
            spec.graph, None, "cpu", params=spec.with_shared(params)
        ) as executor:
            if spec.inputs:
                got = executor.run_sync(**{n: feed[n] for n in spec.inputs}) or []
            else:  # every output is constant: run() with no inputs is stateful
                executor.run_sync()
                got = [executor.get_output(i) for i in range(len(graph.outputs))]
        want = session.run(None, feed)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-6, atol=1e-6)
    assert len(keys) == len(feeds)


def _x(*shape: int) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 5.5


def _i(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_reshape_takes_its_target_shape_at_run_time() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    feeds = [
        {"x": _x(2, 6), "shape": _i(3, 4)},
        {"x": _x(2, 6), "shape": _i(4, 3)},
        {"x": _x(2, 6), "shape": _i(-1, 2)},
    ]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 17), feeds, {"shape"})
    three = [
        {"x": _x(2, 6), "shape": _i(0, 3, -1)},
        {"x": _x(4, 3), "shape": _i(0, 3, 1)},
    ]
    _check(_model(node, three[0], {"y": (F, 3)}, 17), three, {"shape"})


def test_slice_takes_starts_ends_axes_and_steps_at_run_time() -> None:
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    feeds = [
        {"x": _x(4, 6), "starts": _i(1), "ends": _i(3), "axes": _i(0), "steps": _i(1)},
        {
            "x": _x(4, 6),
            "starts": _i(-1),
            "ends": _i(-7),
            "axes": _i(1),
            "steps": _i(-2),
        },
        {
            "x": _x(5, 6),
            "starts": _i(0, 1),
            "ends": _i(9, 5),
            "axes": _i(1, 0),
            "steps": _i(2, 1),
        },
    ]
    valued = {"starts", "ends", "axes", "steps"}
    _check(_model(node, feeds[0], {"y": (F, 2)}, 13), feeds, valued)


@pytest.mark.parametrize(
    ("op", "opset"), [("ReduceSum", 13), ("ReduceMean", 18), ("ReduceMax", 18)]
)
def test_reductions_take_their_axes_at_run_time(op: str, opset: int) -> None:
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    feeds = [{"x": _x(2, 3, 4), "axes": _i(1)}, {"x": _x(2, 3, 4), "axes": _i(-1)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, opset), feeds, {"axes"})


def test_unsqueeze_and_squeeze_take_their_axes_at_run_time() -> None:
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    feeds = [{"x": _x(2, 3), "axes": _i(0)}, {"x": _x(2, 3), "axes": _i(-1)}]
    _check(_model(node, feeds[0], {"y": (F, 3)}, 13), feeds, {"axes"})
    node = helper.make_node("Squeeze", ["x", "axes"], ["y"])
    feeds = [{"x": _x(1, 3, 1), "axes": _i(0)}, {"x": _x(1, 3, 1), "axes": _i(2)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 13), feeds, {"axes"})


def test_pad_takes_pads_value_and_axes_at_run_time() -> None:
    node = helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"])
    feeds = [
        {
            "x": _x(2, 3),
            "pads": _i(1, 0, 0, 2),
            "value": np.array(7, np.float32),
            "axes": _i(0, 1),
        },
        {
            "x": _x(2, 3),
            "pads": _i(2, 1),
            "value": np.array(-1, np.float32),
            "axes": _i(1),
        },
    ]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 18), feeds, {"pads", "value", "axes"})


def test_tile_and_expand_take_their_shapes_at_run_time() -> None:
    node = helper.make_node("Tile", ["x", "repeats"], ["y"])
    feeds = [{"x": _x(2, 3), "repeats": _i(1, 2)}, {"x": _x(2, 3), "repeats": _i(3, 1)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 13), feeds, {"repeats"})
    node = helper.make_node("Expand", ["x", "shape"], ["y"])
    feeds = [
        {"x": _x(3, 1), "shape": _i(2, 3, 4)},
        {"x": _x(3, 1), "shape": _i(1, 1, 1)},
    ]
    _check(_model(node, feeds[0], {"y": (F, 3)}, 13), feeds, {"shape"})


def test_range_with_run_time_bounds_has_a_shape_per_signature() -> None:
    node = helper.make_node("Range", ["start", "limit", "delta"], ["y"])
    scalar = lambda v: np.array(v, np.int64)  # noqa: E731
    feeds = [
        {"start": scalar(0), "limit": scalar(5), "delta": scalar(1)},
        {"start": scalar(10), "limit": scalar(-3), "delta": scalar(-4)},
        {"start": scalar(3), "limit": scalar(3), "delta": scalar(1)},  # empty
    ]
    _check(
        _model(node, feeds[0], {"y": (I64, 1)}, 13), feeds, {"start", "limit", "delta"}
    )
    # A range that feeds a computation: its length is the data's.
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F),
        helper.make_node("Mul", ["x", "rf"], ["y"]),
    ]
    feeds = [
        {"x": _x(2, 4), "start": scalar(0), "limit": scalar(4), "delta": scalar(1)},
        {"x": _x(2, 2), "start": scalar(5), "limit": scalar(1), "delta": scalar(-2)},
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [_value_info(n, a) for n, a in feeds[0].items()],
        [helper.make_tensor_value_info("y", F, ["a", "b"])],
    )
    _check(model_of(graph, 13), feeds, {"start", "limit", "delta"})
    symbolic, _ = from_onnx(model_of(graph, 13))
    assert isinstance(symbolic, SymbolicGraph)
    bad = {"x": _x(2, 3), **{k: v for k, v in feeds[0].items() if k != "x"}}
    with pytest.raises(InputError, match=r"node .*\(Mul\) cannot take"):
        symbolic.specialize({k: v.shape for k, v in bad.items()}, bad)


def test_constant_of_shape_takes_its_shape_at_run_time() -> None:
    value = helper.make_tensor("value", F, [1], [2.5])
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)
    feeds = [{"shape": _i(2, 3)}, {"shape": _i(4, 1)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 13), feeds, {"shape"})


def test_clip_takes_its_bounds_at_run_time() -> None:
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    feeds = [
        {"x": _x(3, 4), "lo": np.array(-2, np.float32), "hi": np.array(3, np.float32)},
        {"x": _x(3, 4), "lo": np.array(0, np.float32), "hi": np.array(1, np.float32)},
    ]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 13), feeds, {"lo", "hi"})


def test_split_takes_its_sizes_at_run_time() -> None:
    node = helper.make_node("Split", ["x", "split"], ["a", "b"], axis=1)
    feeds = [{"x": _x(2, 6), "split": _i(2, 4)}, {"x": _x(2, 6), "split": _i(5, 1)}]
    outputs = {"a": (F, 2), "b": (F, 2)}
    _check(_model(node, feeds[0], outputs, 13), feeds, {"split"})


def test_topk_cumsum_and_trilu_take_their_scalars_at_run_time() -> None:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    feeds = [{"x": _x(2, 5)[:, ::-1].copy(), "k": _i(2)}, {"x": _x(2, 5), "k": _i(4)}]
    outputs = {"v": (F, 2), "i": (I64, 2)}
    _check(_model(node, feeds[0], outputs, 11), feeds, {"k"})
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    scalar = lambda v: np.array(v, np.int64)  # noqa: E731
    feeds = [{"x": _x(2, 3), "axis": scalar(0)}, {"x": _x(2, 3), "axis": scalar(1)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 14), feeds, {"axis"})
    node = helper.make_node("Trilu", ["x", "k"], ["y"])
    feeds = [{"x": _x(3, 4), "k": scalar(0)}, {"x": _x(3, 4), "k": scalar(-1)}]
    _check(_model(node, feeds[0], {"y": (F, 2)}, 14), feeds, {"k"})


def test_a_shape_input_computed_from_a_graph_input_is_shape_valued() -> None:
    # The target shape is computed (Concat of a constant and the input):
    # the input it comes from decides shapes.
    nodes = [
        helper.make_node("Constant", [], ["minus_one"], value_ints=[-1]),
        helper.make_node("Concat", ["rows", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    feeds = [{"x": _x(2, 6), "rows": _i(3)}, {"x": _x(2, 6), "rows": _i(6)}]
    graph = helper.make_graph(
        nodes,
        "g",
        [_value_info(n, a) for n, a in feeds[0].items()],
        [helper.make_tensor_value_info("y", F, ["a", "b"])],
    )
    _check(model_of(graph, 13), feeds, {"rows"})


def test_values_that_do_not_fit_are_input_errors_naming_the_node() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    feed: dict[str, Any] = {"x": _x(2, 6), "shape": _i(5, -1)}
    graph, _ = from_onnx(_model(node, feed, {"y": (F, 2)}, 17))
    assert isinstance(graph, SymbolicGraph)
    shapes = {k: v.shape for k, v in feed.items()}
    with pytest.raises(
        InputError, match=r"'reshape' \(Reshape\) cannot take .*shape=\[5, -1\]"
    ):
        graph.specialize(shapes, feed)
    with pytest.raises(
        InputError, match="'shape': dtype int32, the model expects int64"
    ):
        graph.signature(shapes, {"shape": np.array([3, 4], np.int32)})
