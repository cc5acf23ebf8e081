"""The depthwise convolution along output rows in explicit vectors
(``_dwrows``): its sums against the float64 reference at strides 1 and 2,
every border case (rows and columns past the input, planes narrower than a
vector, dilations), the bits of the channels-last vectors, the pads' zero
products and non-finite inputs, and the library's choice of it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _depthwise, _dwrows, _dwvector

from .conv_reference import activated_reference
from .team_split import assert_activation_is_the_pass, split_everywhere

pytest.importorskip("numba")


def _bind(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None,
    out: np.ndarray[Any, Any],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    activation: str = "none",
) -> Any:
    return _dwrows.bind(
        x,
        w,
        b,
        out,
        tuple(strides),
        tuple(pads[:2]),
        tuple(dilations),
        activation=activation,
    )


# Each geometry with one activation (each compiles a loop of its own).
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    ("shape", "kernel", "strides", "pads", "dilations", "activation"),
    [
        # stride 2, rows of 56: a whole vector inside, both borders masked
        ((1, 5, 112, 112), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], "relu"),
        # a batch, rows of 28: groups of rows and single rows at the foot
        ((2, 3, 28, 30), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], "hard_swish"),
        # 5 x 5 at stride 2, a plane narrower than a vector
        ((1, 4, 28, 28), (5, 5), [2, 2], [2, 2, 2, 2], [1, 1], "none"),
        # asymmetric pads, a dilation, row stride 2 beside column stride 1
        ((1, 3, 21, 40), (3, 5), [2, 1], [0, 2, 2, 1], [2, 1], "relu"),
        # no pads: every column vector inside, the rows past whole groups
        ((1, 2, 19, 70), (3, 3), [1, 2], [0, 0, 0, 0], [1, 1], "none"),
        # column stride 2 dilated: each tap its own loads (no odd lanes)
        ((1, 3, 30, 75), (3, 3), [1, 2], [2, 2, 2, 2], [2, 2], "relu"),
        # pads wider than the input
        ((1, 2, 3, 3), (5, 5), [1, 1], [3, 3, 3, 3], [1, 1], "relu"),
    ],
)
def test_the_row_vectors_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    split: bool,
    activation: str,
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    if split:  # channels shared out, on the native team where it runs
        split_everywhere(monkeypatch, _dwrows)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, *kernel)).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    want = activated_reference(
        x, w, b, strides, pads, dilations, activation, depthwise=True
    )
    out = np.full(want.shape, np.nan, np.float32)
    call = _bind(x, w, b, out, strides, pads, dilations, activation)
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    w[...] *= -1  # weights that are inputs are read anew on every call
    b[...] += 1
    call()
    want = activated_reference(
        x, w, b, strides, pads, dilations, activation, depthwise=True
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "kernel", "stride"),
    [
        ((1, 24, 56, 56), (3, 3), 2),
        ((1, 40, 14, 14), (5, 5), 1),
        ((1, 16, 38, 38), (5, 5), 2),
    ],
)
def test_the_bits_are_the_channels_last_vectors(
    shape: tuple[int, ...], kernel: tuple[int, int], stride: int
) -> None:
    # the same sums in the same order: a model's result does not depend on
    # which of the two layouts a layer took
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, *kernel)).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    pad = kernel[0] // 2
    size = (shape[2] + 2 * pad - kernel[0]) // stride + 1
    rows = np.empty((*shape[:2], size, size), np.float32)
    vectors = np.empty_like(rows)
    geometry = ((stride, stride), (pad, pad), (1, 1))
    _dwrows.bind(x, w, b, rows, *geometry, activation="hard_swish")()
    _dwvector.bind(x, w, b, vectors, *geometry, activation="hard_swish")()
    np.testing.assert_array_equal(rows, vectors)


def test_hard_swish_in_the_registers_is_the_pass_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 6, 30, 30)) * 3).astype(np.float32)
    x[0, 2, 4, 4] = np.nan
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    geometry = ((2, 2), (1, 1), (1, 1))
    assert_activation_is_the_pass(
        _dwrows.bind, (x, w, b), (1, 6, 15, 15), geometry, "hard_swish"
    )


def test_non_finite_inputs_reach_only_the_outputs_they_feed() -> None:
    x = np.zeros((1, 2, 20, 40), np.float32)
    x[0, 0, 3, 3] = np.inf
    x[0, 1, 19, 39] = np.nan  # the last cell: read by a masked load
    w = np.ones((2, 1, 3, 3), np.float32)
    out = np.empty((1, 2, 20, 40), np.float32)
    _dwrows.bind(x, w, None, out, (1, 1), (1, 1), (1, 1))()
    assert np.isposinf(out[0, 0, 2:5, 2:5]).all()
    assert np.isnan(out[0, 1, 18:, 38:]).all()
    finite = np.ones(out.shape, bool)
    finite[0, 0, 2:5, 2:5] = finite[0, 1, 18:, 38:] = False
    assert np.all(out[finite] == 0)


def test_pads_add_zero_products_as_im2col_does() -> None:
    # an infinite weight times a pad's zero is NaN, where a sum that skipped
    # the pads would give a number
    x = np.ones((1, 1, 20, 20), np.float32)
    w = np.zeros((1, 1, 3, 3), np.float32)
    w[0, 0, 0, 0] = np.inf
    out = np.empty((1, 1, 20, 20), np.float32)
    _dwrows.bind(x, w, None, out, (1, 1), (1, 1), (1, 1))()
    assert np.isnan(out[0, 0, 0, :]).all() and np.isnan(out[0, 0, :, 0]).all()
    assert np.isposinf(out[0, 0, 1:, 1:]).all()


def test_a_strided_bias_is_read_on_every_call() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 18, 18)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    pairs = rng.standard_normal(8).astype(np.float32)
    b = pairs[::2]  # a view: not contiguous
    out = np.empty((1, 4, 18, 18), np.float32)
    call = _bind(x, w, b, out, [1, 1], [1, 1, 1, 1], [1, 1])
    call()
    want = activated_reference(
        x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], "none", depthwise=True
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    pairs[::2] = 5.0
    call()
    want = activated_reference(
        x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], "none", depthwise=True
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_wide_float32_planes_take_the_rows_and_float64_the_planar_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[str] = []
    monkeypatch.setattr(_dwrows, "bind", lambda *a, **k: taken.append("rows"))
    monkeypatch.setattr(
        _depthwise, "_bind_planes", lambda *a, **k: taken.append("planes")
    )
    for dtype, stride in ((np.float32, 2), (np.float64, 2), (np.float32, 3)):
        x = np.zeros((1, 16, 112, 112), dtype)
        w = np.zeros((16, 1, 3, 3), dtype)
        size = (112 + 2 - 3) // stride + 1
        out = np.zeros((1, 16, size, size), dtype)
        _depthwise.bind_depthwise(x, w, None, out, (stride, stride), (1, 1), (1, 1))
    assert taken == ["rows", "planes", "planes"]


def test_bad_arguments_are_refused() -> None:
    x = np.zeros((1, 16, 20, 20), np.float32)
    w = np.zeros((16, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match="swish2"):
        _dwrows.bind(x, w, None, x.copy(), (1, 1), (1, 1), (1, 1), activation="swish2")
    with pytest.raises(ValueError, match="column stride 3"):
        _dwrows.bind(
            x, w, None, np.zeros((1, 16, 7, 7), np.float32), (3, 3), (1, 1), (1, 1)
        )
