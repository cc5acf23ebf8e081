"""The compiled depthwise convolution against the numpy paths (im2col,
strided windows) and a float64 reference: strides, dilations, uneven pads,
bias, ReLU, batches, non-finite inputs, a call and a binding alike, in both
of its layouts (NCHW planes and channels-last pixels)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _depthwise, _jit

from .conv_reference import activated_reference, conv_kernel

pytest.importorskip("numba")


CASES = [
    # x shape, kernel, strides, pads, dilations, bias, relu
    ((1, 24, 14, 14), (5, 5), [1, 1], [2, 2, 2, 2], [1, 1], True, False),
    ((2, 16, 15, 13), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], True, True),
    ((1, 32, 9, 11), (3, 5), [1, 2], [0, 2, 1, 1], [1, 1], False, False),
    ((3, 20, 12, 12), (3, 3), [1, 1], [2, 2, 2, 2], [2, 2], True, True),
    ((1, 17, 7, 7), (5, 5), [2, 1], [2, 2, 2, 2], [1, 1], False, True),
    ((1, 16, 4, 4), (5, 5), [1, 1], [0, 0, 0, 0], [1, 1], True, False),  # empty
    ((1, 16, 2, 3), (3, 3), [1, 1], [3, 3, 3, 3], [1, 1], True, False),  # pads > x
    ((1, 16, 57, 58), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], True, True),
    ((2, 16, 30, 31), (5, 5), [1, 1], [2, 1, 2, 3], [2, 2], True, False),
    ((1, 18, 33, 36), (5, 3), [2, 3], [2, 0, 1, 2], [1, 2], False, False),
    # few channels: planar where the output is wide enough, numpy otherwise
    ((2, 8, 16, 16), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], True, True),
    ((1, 3, 17, 19), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], False, False),
]

LAYOUTS = {"planes": 1, "pixels": 1 << 30}


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test in both layouts: every width on the NCHW planes, or every
    width channels-last."""
    name: str = request.param
    monkeypatch.setattr(_depthwise, "PLANAR_MIN_WIDTH", LAYOUTS[name])
    if name == "planes":  # no 5 x 5 kernel goes channels-last either
        monkeypatch.setattr(_depthwise, "VECTOR_MAX_WIDTH", 0)
        monkeypatch.setattr(_depthwise, "VECTOR_MAX_WIDTH_MANY_TAPS", 0)
    return name


def _conv(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    relu: bool,
    bound: bool,
) -> np.ndarray[Any, Any]:
    kernel = conv_kernel(
        list(w.shape[2:]),
        strides,
        pads,
        dilations,
        x.shape[1],
        bias=b is not None,
        relu=relu,
    )
    want = activated_reference(
        x, w, b, strides, pads, dilations, "none", depthwise=True
    )
    out = np.full(want.shape, np.nan, x.dtype)
    args = (x, w, *(() if b is None else (b,)), out)
    if bound:
        call = kernel.bind(*args)  # type: ignore[attr-defined]
        call()
        x[...] += 1  # a bound call sees its arrays' new values
        want = activated_reference(
            x, w, b, strides, pads, dilations, "none", depthwise=True
        )
        call()
    else:
        kernel(*args)
    if relu:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    return out


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("shape", "kernel", "strides", "pads", "dilations", "bias", "relu"), CASES
)
def test_compiled_depthwise_matches_the_reference_and_the_numpy_path(
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    bias: bool,
    relu: bool,
    dtype: Any,
    bound: bool,
) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((shape[1], 1, *kernel)).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype) if bias else None
    out = np.empty(
        activated_reference(
            x, w, b, strides, pads, dilations, "none", depthwise=True
        ).shape,
        dtype,
    )
    # few channels compile only on the planes (no channels-last copies)
    few = shape[1] < _depthwise.MIN_CHANNELS
    narrow = out.shape[3] < _depthwise.PLANAR_MIN_WIDTH
    assert _depthwise.takes(np, x, w, out, shape[1]) == (not (few and narrow))
    compiled = _conv(x.copy(), w, b, strides, pads, dilations, relu, bound)
    monkeypatch.setattr(_jit, "enabled", False)
    assert not _depthwise.takes(np, x, w, out, shape[1])
    plain = _conv(x.copy(), w, b, strides, pads, dilations, relu, bound)
    np.testing.assert_allclose(compiled, plain, rtol=1e-5, atol=1e-5)


def test_non_finite_inputs_reach_only_the_outputs_they_feed(layout: str) -> None:
    x = np.zeros((1, 16, 8, 8), np.float32)
    x[0, 3, 4, 4] = np.inf
    x[0, 5, 0, 0] = np.nan
    w = np.ones((16, 1, 3, 3), np.float32)
    out = _conv(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], False, True)
    assert np.isinf(out[0, 3, 3:6, 3:6]).all()
    assert np.isnan(out[0, 5, :2, :2]).all()
    finite = np.isfinite(out)
    assert finite.sum() == out.size - 9 - 4


def test_few_channels_and_other_layouts_take_the_numpy_paths() -> None:
    x = np.zeros((1, 8, 8, 8), np.float32)
    w = np.zeros((8, 1, 3, 3), np.float32)
    out = np.zeros((1, 8, 6, 6), np.float32)
    assert not _depthwise.takes(np, x, w, out, 8)  # few channels, narrow
    wide = np.zeros((1, 8, 8, 8), np.float32)  # the planar loop takes them
    assert _depthwise.takes(np, np.zeros((1, 8, 10, 10), np.float32), w, wide, 8)
    x16, w16 = np.zeros((1, 16, 8, 8), np.float32), np.zeros((16, 1, 3, 3), np.float32)
    out16 = np.zeros((1, 16, 6, 6), np.float32)
    assert _depthwise.takes(np, x16, w16, out16, 16)
    assert not _depthwise.takes(np, x16[:, :, ::2], w16, out16, 16)  # strided
    assert not _depthwise.takes(np, x16, np.zeros((32, 1, 3, 3), np.float32), out16, 16)
    assert not _depthwise.takes(np, x16.astype(np.float16), w16, out16, 16)


@pytest.mark.parametrize("constant", [False, True])
def test_channels_last_weights_are_copied_per_call_unless_constant(
    constant: bool,
) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 32, 6, 6)).astype(np.float32)
    w = rng.standard_normal((32, 1, 5, 5)).astype(np.float32)
    out = np.empty((1, 32, 6, 6), np.float32)
    assert out.shape[3] < _depthwise.PLANAR_MIN_WIDTH  # the pixels' layout
    kernel = conv_kernel([5, 5], [1, 1], [2] * 4, [1, 1], 32, bias=False, relu=False)
    call = kernel.bind(x, w, out, constant=frozenset({1} if constant else ()))
    call()
    first = activated_reference(
        x, w, None, [1, 1], [2] * 4, [1, 1], "none", depthwise=True
    )
    np.testing.assert_allclose(out, first, rtol=1e-5, atol=1e-5)
    w *= 2  # a graph input's new values (a parameter's never change)
    call()
    want = first if constant else 2 * first
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "kernel_shape", "strides"),
    [
        ((1, 32, 6, 6), [5, 5], [1, 1]),  # the channels-last vectors
        ((1, 16, 20, 20), [3, 3], [2, 2]),  # at stride 2
    ],
)
@pytest.mark.parametrize("constant_bias", [False, True])
def test_a_bias_is_read_per_call_unless_constant(
    shape: tuple[int, ...],
    kernel_shape: list[int],
    strides: list[int],
    constant_bias: bool,
) -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[1]
    w = rng.standard_normal((c, 1, *kernel_shape)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    pads = [kernel_shape[0] // 2] * 4
    kernel = conv_kernel(kernel_shape, strides, pads, [1, 1], c, bias=True)
    size = [
        (n + 2 * pads[0] - k) // s + 1
        for n, k, s in zip(shape[2:], kernel_shape, strides, strict=True)
    ]
    out = np.empty((1, c, *size), np.float32)
    constant = frozenset({1, 2} if constant_bias else {1})
    call = kernel.bind(x, w, b, out, constant=constant)
    call()
    first = activated_reference(x, w, b, strides, pads, [1, 1], "none", depthwise=True)
    np.testing.assert_allclose(out, first, rtol=1e-5, atol=1e-5)
    b += 1  # a graph input's new values (a parameter's never change)
    call()
    want = first if constant_bias else first + 1
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
