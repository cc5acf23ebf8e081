"""GatherND, ScatterND, ScatterElements and NonZero against ONNX's reference
implementation: batch dims, negative indices, every reduction with
duplicate indices; indices out of range and run-time NonZero refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt import graph_executor
from asyncrt.errors import NodeFailedError
from asyncrt.frontend import from_onnx
from asyncrt.graph import SymbolicGraph
from asyncrt.ops._library import global_namespace_func

from .single_node import node_model, run_asyncrt, run_reference

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _compare(model: Any, inputs: dict[str, Any]) -> None:
    got = run_asyncrt(model, inputs)
    want = run_reference(model, inputs)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    ("data_shape", "indices", "batch_dims"),
    [
        ((2, 3, 4), [[1, 2], [0, -1]], 0),
        ((2, 3, 4), [[[1], [0]], [[-1], [1]]], 0),
        ((2, 3, 4), [[1, 2, 3], [0, 0, -4]], 0),
        ((2, 3, 4), [[1], [2]], 1),
        ((2, 3, 4), [[[0, 1]], [[2, 3]]], 1),
        ((2, 3, 4), [[[1], [3]], [[0], [2]], [[1], [1]]], 2),
    ],
)
def test_gather_nd(data_shape: tuple[int, ...], indices: Any, batch_dims: int) -> None:
    if batch_dims == 2:
        data_shape = (3, 2, 4)
    inputs = {
        "data": np.arange(np.prod(data_shape), dtype=np.float32).reshape(data_shape),
        "indices": np.asarray(indices, np.int64),
    }
    _compare(node_model("GatherND", inputs, batch_dims=batch_dims), inputs)


def test_gather_nd_of_empty_index_tuples_takes_whole_slices() -> None:
    inputs = {
        "data": np.arange(6, dtype=np.float32).reshape(2, 3),
        "indices": np.zeros((4, 0), np.int64),
    }
    (got,) = run_asyncrt(node_model("GatherND", inputs), inputs)
    np.testing.assert_array_equal(got, np.broadcast_to(inputs["data"], (4, 2, 3)))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_folds_duplicates(reduction: str) -> None:
    rng = np.random.default_rng(0)
    indices = [[0, 1], [2, -1], [0, 1], [1, 0]]
    if reduction == "none":
        indices[2] = [1, 1]  # duplicates leave one update, unspecified which
    inputs = {
        "data": rng.standard_normal((3, 2, 4)).astype(np.float32),
        "indices": np.array(indices, np.int64),
        "updates": rng.standard_normal((4, 4)).astype(np.float32),
    }
    model = node_model("ScatterND", inputs, reduction=reduction)
    _compare(model, inputs)


def test_scatter_nd_of_whole_slices() -> None:
    inputs = {
        "data": np.zeros((4, 2, 3), np.int32),
        "indices": np.array([[3], [1]], np.int64),
        "updates": np.arange(12, dtype=np.int32).reshape(2, 2, 3),
    }
    _compare(node_model("ScatterND", inputs, reduction="add"), inputs)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements(axis: int, reduction: str) -> None:
    rng = np.random.default_rng(1)
    data = rng.standard_normal((3, 4)).astype(np.float32)
    size = data.shape[axis]
    indices = rng.integers(-size, size, (2, 3))
    if reduction == "none":  # no duplicates along the axis
        indices = np.array([[0, 1, 2], [-1, -2, -3]]) if axis == 0 else indices
        if axis != 0:
            indices = np.array([[0, 1, 2], [3, 2, 1]])
    inputs = {
        "data": data,
        "indices": indices.astype(np.int64),
        "updates": rng.standard_normal((2, 3)).astype(np.float32),
    }
    model = node_model("ScatterElements", inputs, axis=axis, reduction=reduction)
    _compare(model, inputs)


def test_scatter_of_opset_10_is_scatter_elements() -> None:
    inputs = {
        "data": np.zeros((3, 3), np.float32),
        "indices": np.array([[1, 0, 2]], np.int64),
        "updates": np.array([[1.0, 2.0, 3.0]], np.float32),
    }
    (got,) = run_asyncrt(node_model("Scatter", inputs, axis=1, opset=10), inputs)
    assert got.tolist() == [[2.0, 1.0, 3.0], [0, 0, 0], [0, 0, 0]]


def test_an_index_out_of_range_fails_the_node_not_the_executor() -> None:
    inputs = {
        "data": np.zeros((3, 2), np.float32),
        "indices": np.array([[5]], np.int64),
    }
    graph, params = from_onnx(node_model("GatherND", inputs))
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        with pytest.raises(NodeFailedError, match="gather_nd") as failed:
            executor.run_sync(**inputs)
        assert "index 5 is out of bounds" in str(failed.value.__cause__)
        good = {**inputs, "indices": np.array([[2]], np.int64)}
        (out,) = executor.run_sync(**good) or []
        assert out.numpy().tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize(
    "values", [[[1, 0, 2], [0, 0, 3]], [0.0, -1.5, 0.0, 2.0], np.zeros((2, 2)), 5.0]
)
def test_nonzero_of_a_constant_is_folded(values: Any) -> None:
    x = np.asarray(values, np.float32)
    model = node_model("NonZero", {"x": x}, constants=("x",))
    graph, params = from_onnx(model)
    assert not [n for n in graph.nodes if not n.is_null]  # folded
    (want,) = run_reference(model, {})
    np.testing.assert_array_equal(params["y0"], want)


def test_nonzero_of_run_time_data_is_specialized_per_value() -> None:
    """Its output's length depends on the data: the data decides a shape,
    so each distinct value is a signature of its own (correct, and cached;
    a plan split at the NonZero would serve every value from one plan)."""
    model = node_model("NonZero", {"x": np.ones(3, np.float32)})
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph) and graph.shape_valued == ("x",)
    with graph_executor.create(graph, params=params) as executor:
        for x in ([1, 0, 2], [0, 0, 0], [5, 5, 0]):
            value = np.array(x, np.float32)
            (got,) = executor.run_sync(x=value) or []
            np.testing.assert_array_equal(got.numpy(), np.array(np.nonzero(value)))


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_a_scatter_index_out_of_range_is_refused(reduction: str) -> None:
    inputs = {
        "data": np.zeros((3, 2), np.float32),
        "indices": np.array([[1], [-4]], np.int64),
        "updates": np.ones((2, 2), np.float32),
    }
    graph, params = from_onnx(node_model("ScatterND", inputs, reduction=reduction))
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        with pytest.raises(NodeFailedError, match="scatter_nd") as failed:
            executor.run_sync(**inputs)
        assert "index -4 is out of bounds for axis 0 with size 3" in str(
            failed.value.__cause__
        )


@pytest.mark.parametrize("ufunc", [np.multiply, np.add, np.maximum])
def test_folding_in_rounds_equals_ufunc_at(ufunc: np.ufunc) -> None:
    """The fold cupy's ``mul`` scatters use (cupy has no ``multiply.at``),
    run on numpy against ``ufunc.at``: heavy duplicates, in index order."""
    from asyncrt.ops.indexing import _fold_in_rounds

    rng = np.random.default_rng(3)
    targets = rng.integers(0, 7, 200)
    values = rng.uniform(0.5, 1.5, 200).astype(np.float32)
    start = rng.standard_normal(10).astype(np.float32)
    want, got = start.copy(), start.copy()
    ufunc.at(want, targets, values)
    _fold_in_rounds(np, ufunc, got, targets, values)
    np.testing.assert_array_equal(got, want)
    _fold_in_rounds(np, ufunc, got, targets[:0], values[:0])  # nothing to fold
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((7,), np.float32),
        ((3, 5), np.bool_),
        ((2, 3, 4, 5), np.float32),
        ((4, 1, 6), np.int64),
        ((2, 0, 3), np.float32),  # no cells
        ((3, 4), np.float64),
    ],
)
def test_nonzero_kernel_gives_numpys_coordinates(shape: Any, dtype: Any) -> None:
    """The compiled pass and numpy's ``nonzero`` agree, NaN counting as
    nonzero, in row-major order."""
    kernel = global_namespace_func("nonzero", "numpy")
    rng = np.random.default_rng(len(shape))
    a = (rng.standard_normal(shape) * (rng.random(shape) < 0.4)).astype(dtype)
    if dtype == np.float32 and a.size:
        a.reshape(-1)[-1] = np.nan
    want = np.array(np.nonzero(a), np.int64).reshape(len(shape), -1)
    out = np.full(want.shape, -1, np.int64)
    kernel(a, out)
    np.testing.assert_array_equal(out, want)
