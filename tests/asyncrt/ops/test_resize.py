"""Resize: every mode, coordinate transformation and rounding against ONNX's
reference implementation; opset 10 and tf_half_pixel_for_nn against ONNX
Runtime; integer rounding, extrapolation and refusals."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from asyncrt import graph_executor
from asyncrt.errors import UnsupportedOpError
from asyncrt.frontend import from_onnx
from asyncrt.graph import SymbolicGraph
from asyncrt.ops.resize import Interpolation, axis_taps

from .single_node import node_model, run_asyncrt, run_ort, run_reference

ort = pytest.importorskip("onnxruntime")

MODES = ("nearest", "linear", "cubic")
COORDINATES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
SCALES = ([1, 1, 2, 3], [1, 1, 0.6, 0.8], [1, 1, 1.7, 0.5], [1, 1, 1 / 3, 3])


def _resize(
    x: np.ndarray[Any, Any],
    *,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    roi: list[float] | None = None,
    opset: int = 19,
    **attrs: Any,
) -> Any:
    """A Resize model of ``x`` (scales, sizes and roi as initializers)."""
    inputs = {
        "x": x,
        "roi": None if roi is None else np.array(roi, np.float32),
        "scales": None if scales is None else np.array(scales, np.float32),
        "sizes": None if sizes is None else np.array(sizes, np.int64),
    }
    if opset == 10:
        inputs = {"x": x, "scales": inputs["scales"]}
    elif opset < 13:  # roi and scales are required inputs, empty if unused
        for name in ("roi", "scales"):
            if inputs[name] is None:
                inputs[name] = np.zeros(0, np.float32)
    constants = ("roi", "scales", "sizes")
    return node_model("Resize", inputs, constants=constants, opset=opset, **attrs)


def _compare(
    model: Any, x: np.ndarray[Any, Any], reference: Any = run_reference
) -> None:
    (got,) = run_asyncrt(model, {"x": x})
    (want,) = reference(model, {"x": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _x(shape: tuple[int, ...] = (2, 3, 5, 7), dtype: Any = np.float32) -> Any:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    return rng.integers(0, 256, shape).astype(dtype)


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", MODES)
def test_scales_match_the_reference(
    mode: str, coordinates: str, scales: list[float]
) -> None:
    crop: dict[str, Any] = {}
    if coordinates == "tf_crop_and_resize":
        crop = {"roi": [0, 0, 0.1, 0.2, 1, 1, 0.9, 1.1], "extrapolation_value": -7.0}
    rounding = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
    variants: list[dict[str, Any]] = (
        [{"nearest_mode": r} for r in rounding]
        if mode == "nearest"
        else [{}, {"exclude_outside": 1, "cubic_coeff_a": -0.5}, {"antialias": 1}]
    )
    x = _x()
    for variant in variants:
        model = _resize(
            x,
            scales=scales,
            mode=mode,
            coordinate_transformation_mode=coordinates,
            **crop,
            **variant,
        )
        _compare(model, x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "attrs",
    [
        {"sizes": [2, 3, 9, 4]},
        {"sizes": [9, 4], "axes": [2, 3]},
        {"sizes": [4, 9], "axes": [3, 2]},
        {"sizes": [9, 4], "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
        {"sizes": [9, 4], "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"},
        {"scales": [2.0, 0.5], "axes": [3, 2]},
        {
            "scales": [1, 1, 2, 2],
            "coordinate_transformation_mode": "half_pixel_symmetric",
        },
    ],
)
def test_sizes_axes_and_policies_match_the_reference(
    mode: str, attrs: dict[str, Any]
) -> None:
    x = _x()
    _compare(_resize(x, mode=mode, **attrs), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("dtype", "opset"),
    [(np.uint8, 19), (np.int32, 19), (np.float16, 19), (np.float64, 13)],
)
def test_dtypes_round_and_saturate_as_the_reference(
    mode: str, dtype: Any, opset: int
) -> None:
    x = _x(dtype=dtype)
    if dtype == np.uint8:  # sharp edges: cubic overshoots past 0 and 255
        x = np.where(x > 127, 255, 0).astype(np.uint8)
    model = _resize(x, scales=[1, 1, 1.5, 0.7], mode=mode, opset=opset)
    (got,) = run_asyncrt(model, {"x": x})
    (want,) = run_reference(model, {"x": x})
    assert got.dtype == want.dtype
    # (float64 too: the reference computes cubic weights in float32)
    tolerance = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rank", [2, 3, 5])
def test_other_ranks(rank: int) -> None:
    shape = (4, 6, 3, 5, 2)[:rank]
    scales = [2.5, 0.5, 1, 2, 1.5][:rank]
    x = _x(shape)
    for mode in MODES:
        _compare(_resize(x, scales=scales, mode=mode, opset=18), x)


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.6, 0.8], [1, 1, 0.5, 0.5]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_opset_10_reads_as_onnx_runtime_does(mode: str, scales: list[float]) -> None:
    x = _x()
    _compare(_resize(x, scales=scales, mode=mode, opset=10), x, run_ort)


@pytest.mark.parametrize("mode", MODES)
def test_tf_half_pixel_for_nn_matches_onnx_runtime(mode: str) -> None:
    x = _x()
    model = _resize(
        x,
        scales=[1, 1, 2, 3],
        mode=mode,
        coordinate_transformation_mode="tf_half_pixel_for_nn",
        opset=11,
    )
    _compare(model, x, run_ort)


def test_a_whole_source_coordinate_reads_its_own_position() -> None:
    """half_pixel_symmetric maps output 2 of 7 -> 5 (scale 0.8) to input 3
    (3.0000000000000004 in float64). ONNX's reference reads input 2 there:
    its window search rounds ``x + 1`` to 4.0 while its ratio keeps the
    excess. The taps here read 3."""
    linear = Interpolation("linear", "half_pixel_symmetric", "", -0.75, False, False)
    taps = axis_taps(linear, 7, 5, float(np.float32(0.8)))
    assert taps.weights is not None
    positions = (taps.weights * taps.index).sum(axis=1)
    np.testing.assert_allclose(positions[2], 3.0, atol=1e-12)


def test_nearest_copies_non_finite_values_exactly() -> None:
    x = np.array([[[[1.0, np.inf], [np.nan, -np.inf]]]], np.float32)
    (got,) = run_asyncrt(_resize(x, scales=[1, 1, 2, 2], mode="nearest"), {"x": x})
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))


def test_run_time_scales_make_a_symbolic_graph_specialized_per_value() -> None:
    x = _x()
    inputs = {"x": x, "roi": None, "scales": np.array([1, 1, 2, 2], np.float32)}
    model = node_model("Resize", inputs, mode="linear")  # scales: a graph input
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph) and graph.shape_valued == ("scales",)
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    with graph_executor.create(graph, params=params) as executor:
        for scales in ([1, 1, 2, 2], [1, 1, 0.5, 3], [1, 1, 2, 2]):
            feed = {"x": x, "scales": np.array(scales, np.float32)}
            (got,) = executor.run_sync(**feed) or []
            (want,) = session.run(None, feed)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
        stats = executor.plan_cache_stats()
        assert stats is not None and (stats.builds, stats.hits) == (2, 1)
    # bound at import time, it is a static graph
    static, _ = from_onnx(model, bind={"scales": inputs["scales"]})
    assert static.nodes[-1].name


def test_scales_and_sizes_together_are_refused() -> None:
    model = _resize(_x(), scales=[1, 1, 2, 2], sizes=[2, 3, 10, 14], mode="linear")
    # (ONNX's inference refuses to type the output: declare it)
    output = helper.make_tensor_type_proto(TensorProto.FLOAT, ["n", "c", "h", "w"])
    model.graph.output[0].type.CopyFrom(output)
    with pytest.raises(UnsupportedOpError, match="exactly one of scales and sizes"):
        from_onnx(model)


def test_every_coordinate_and_rounding_mode_has_taps_in_range() -> None:
    modes = itertools.product(
        MODES, (*COORDINATES, "half_pixel_symmetric", "tf_half_pixel_for_nn")
    )
    for mode, coordinates in modes:
        for antialias in (False, True):
            how = Interpolation(
                mode, coordinates, "round_prefer_floor", -0.75, False, antialias
            )
            for size_in, size_out, scale in ((1, 3, 3.0), (5, 2, 0.4), (4, 4, 1.0)):
                taps = axis_taps(how, size_in, size_out, scale)
                assert taps.index.min() >= 0 and taps.index.max() < size_in
