"""ConvTranspose: a GEMM then col2im, against ONNX Runtime over groups,
strides, dilations, pads, output_padding, output_shape and auto_pad."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import helper

from asyncrt.errors import UnsupportedOpError
from asyncrt.frontend import from_onnx
from asyncrt.ops import _common, _subpixel, lookup
from asyncrt.ops.conv_transpose import _col2im

from .single_node import node_model, run_asyncrt, run_ort

CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((1, 1, 3, 3), (1, 2, 3, 3), {}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"strides": [2, 3]}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((2, 4, 5, 6), (4, 3, 3, 3), {"group": 2, "strides": [2, 2], "dilations": [2, 1]}),
    (
        (1, 6, 4, 4),
        (6, 1, 3, 3),
        {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    ((1, 2, 4, 4), (2, 3, 2, 2), {"strides": [2, 2]}),  # tiles the output
    ((1, 2, 4, 4), (2, 3, 2, 2), {"strides": [2, 2], "output_padding": [1, 0]}),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 4), (2, 3, 4, 4), {"strides": [3, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5, 4), (2, 3, 4, 4), {"strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 8]}),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 6]}),
    (
        (1, 2, 5, 4),
        (2, 3, 3, 3),
        {"strides": [2, 2], "output_shape": [9, 7], "output_padding": [1, 1]},
    ),
    (
        (1, 2, 5, 4),
        (2, 3, 3, 3),
        {"strides": [2, 2], "output_shape": [8, 6], "auto_pad": "SAME_UPPER"},
    ),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
    ((1, 3, 7), (3, 2, 4), {"strides": [3], "dilations": [2]}),
    ((1, 2, 3, 4, 5), (2, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [0, 1, 0] * 2}),
    ((1, 2, 3, 4), (2, 2, 1, 1), {}),
    ((1, 2, 3, 4), (2, 2, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 2, 3, 4), (2, 2, 2, 2), {"strides": [4, 4]}),  # gaps between taps
]


@pytest.fixture(params=["col2im", "phases"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Small cases take col2im; with no bound scratch, every case without
    dilation whose column matrix is at least its input takes the phases."""
    if request.param == "phases":
        monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", 0)
    return str(request.param)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CASES)
def test_matches_onnx_runtime(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    attrs: dict[str, Any],
    bias: bool,
    path: str,
) -> None:
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal(x_shape).astype(np.float32),
        "w": rng.standard_normal(w_shape).astype(np.float32),
    }
    if bias:
        inputs["b"] = rng.standard_normal(w_shape[1] * attrs.get("group", 1))
        inputs["b"] = inputs["b"].astype(np.float32)
    model = node_model("ConvTranspose", inputs, constants=("w", "b"), opset=17, **attrs)
    (got,) = run_asyncrt(model, inputs)
    (want,) = run_ort(model, inputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_phases_are_taken_where_they_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", 0)
    x = np.ones((1, 2, 4, 4), np.float32)
    out = np.empty((1, 4, 7, 7), np.float32)
    kernel = _kernel(strides=(2, 2))
    before = _subpixel.phases.cache_info().misses
    kernel.bind(x, np.ones((2, 4, 3, 3), np.float32), out)  # C 2 <= M 4
    assert _subpixel.phases.cache_info().misses == before + 1
    assert _subpixel.worth_it((2, 2), (1, 1), 2, 4)
    assert not _subpixel.worth_it((2, 2), (1, 1), 8, 4)  # col2im: smaller
    assert not _subpixel.worth_it((2, 2), (2, 1), 2, 4)  # dilated
    assert _subpixel.worth_it((1, 1), (1, 1), 8, 4)  # one phase: a conv


def test_an_exact_tiling_is_one_copy() -> None:
    tiled = _col2im((4, 4), (8, 8), (2, 2), (2, 2), (1, 1), (0, 0))
    assert tiled.tiles
    assert not _col2im((4, 4), (9, 8), (2, 2), (2, 2), (1, 1), (0, 0)).tiles
    # every kernel offset but the ones cut by the pads adds into the output
    padded = _col2im((3,), (5,), (3,), (2,), (1,), (1,))
    assert len(padded.adds) == 3 and not padded.tiles


def _kernel(group: int = 1, strides: tuple[int, ...] = (2, 2)) -> Any:
    definition = lookup("conv_transpose")
    assert definition is not None
    attrs = {
        "kernel_shape": [3, 3],
        "strides": list(strides),
        "dilations": [1, 1],
        "pads_begin": [1, 1],
        "group": group,
        "bias": False,
    }
    return definition.make(np, attrs)


def _reference(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any]) -> Any:
    """The float64 result of the kernel above (strides 2, pads 1)."""
    kernel = _kernel()
    out = np.empty((x.shape[0], w.shape[1], 2 * x.shape[2] - 1, 2 * x.shape[3] - 1))
    kernel(x.astype(np.float64), w.astype(np.float64), out)
    return out


def test_a_bound_kernel_reads_its_inputs_afresh() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = np.empty((2, 3, 9, 9), np.float32)
    call = _kernel().bind(x, w, out)
    for _ in range(2):
        x[...] = rng.standard_normal(x.shape)
        call()
        np.testing.assert_allclose(out, _reference(x, w), rtol=1e-4, atol=1e-4)


def test_strided_inputs_and_half_precision() -> None:
    rng = np.random.default_rng(2)
    wide = rng.standard_normal((2, 4, 5, 10)).astype(np.float32)
    x = wide[..., ::2]  # not contiguous: the bound call re-binds each run
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = np.empty((2, 3, 9, 9), np.float32)
    _kernel().bind(x, w, out)()
    np.testing.assert_allclose(out, _reference(x, w), rtol=1e-4, atol=1e-4)
    half = np.empty((2, 3, 9, 9), np.float16)
    _kernel()(x.astype(np.float16), w.astype(np.float16), half)
    want = _reference(x.astype(np.float16), w.astype(np.float16))
    np.testing.assert_allclose(half, want.astype(np.float16), rtol=2e-3, atol=2e-3)


def test_a_kernel_shape_other_than_the_weights_is_refused() -> None:
    inputs = {"x": np.zeros((1, 2, 3, 3), np.float32)}
    inputs["w"] = np.zeros((2, 2, 3, 3), np.float32)
    model = node_model("ConvTranspose", inputs, constants=("w",))
    model.graph.node[0].attribute.append(helper.make_attribute("kernel_shape", [2, 2]))
    with pytest.raises(UnsupportedOpError, match=r"kernel_shape \[2, 2\] differs"):
        from_onnx(model)
