"""Pooling in explicit vectors (``_poolvector``) against numpy's folds:
every window's maximum, NaN wherever a window holds one, and every
window's sum times its scale (average pooling), at both vector widths,
over random shapes, windows, strides and pads (blocks, the overlapping
last block, the scalar columns at the pads)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrt.ops import _poolvector

pytest.importorskip("numba")


def _folds(
    x: np.ndarray[Any, Any],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    begin: tuple[int, int],
    out_shape: tuple[int, ...],
    fold: Any = np.maximum,
) -> np.ndarray[Any, Any]:
    """``fold`` over every tap of the padded input (pads -inf for the
    maximum, 0 for sums, in float64)."""
    n, c, h, w = x.shape
    oh, ow = out_shape[2:]
    rows = max(begin[0] + h, (oh - 1) * strides[0] + kernel[0])
    cols = max(begin[1] + w, (ow - 1) * strides[1] + kernel[1])
    start = -np.inf if fold is np.maximum else 0.0
    dtype = np.float32 if fold is np.maximum else np.float64
    padded = np.full((n, c, rows, cols), start, dtype)
    padded[:, :, begin[0] : begin[0] + h, begin[1] : begin[1] + w] = x
    out = np.full(out_shape, start, dtype)
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            tap = padded[
                :,
                :,
                a : a + strides[0] * (oh - 1) + 1 : strides[0],
                b : b + strides[1] * (ow - 1) + 1 : strides[1],
            ]
            out = fold(out, tap)
    return out


def _pool(
    x: np.ndarray[Any, Any],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    begin: tuple[int, int],
    end: tuple[int, int],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    h, w = x.shape[2:]
    oh = (h + begin[0] + end[0] - kernel[0]) // strides[0] + 1
    ow = (w + begin[1] + end[1] - kernel[1]) // strides[1] + 1
    out = np.full((*x.shape[:2], oh, ow), 7.0, np.float32)
    assert _poolvector.takes(x, out, strides, (1, 1))
    _poolvector.bind(x, out, kernel, strides, begin)()
    return out, _folds(x, kernel, strides, begin, out.shape)


# Each geometry compiles a loop of its own per vector width: the width of
# 8 on the geometries that differ most.
@pytest.mark.parametrize(
    ("lanes", "shape", "kernel", "strides", "begin", "end"),
    [
        (16, (1, 4, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1)),  # ResNet's
        (8, (1, 4, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1)),
        (16, (2, 3, 21, 57), (3, 3), (1, 1), (1, 1), (1, 1)),
        (8, (2, 3, 21, 57), (3, 3), (1, 1), (1, 1), (1, 1)),
        (16, (1, 2, 20, 70), (5, 5), (2, 2), (2, 2), (2, 2)),
        (16, (1, 3, 33, 40), (2, 2), (2, 2), (0, 0), (0, 0)),
        (8, (1, 2, 9, 50), (3, 2), (1, 2), (0, 1), (2, 0)),  # uneven pads
        (16, (1, 2, 6, 5), (3, 3), (2, 1), (1, 1), (1, 1)),  # all scalar
    ],
)
def test_every_window_is_numpys_fold(
    monkeypatch: pytest.MonkeyPatch,
    lanes: int,
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    begin: tuple[int, int],
    end: tuple[int, int],
) -> None:
    monkeypatch.setattr(_poolvector._dwvector, "lanes", lambda: lanes)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got, want = _pool(x, kernel, strides, begin, end)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lanes", [8, 16])
def test_a_nan_reaches_every_window_holding_it(
    monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    monkeypatch.setattr(_poolvector._dwvector, "lanes", lambda: lanes)
    x = np.random.default_rng(1).standard_normal((1, 2, 40, 64)).astype(np.float32)
    x[0, 0, 10, 0] = np.nan  # a left pad's column, scalar outputs
    x[0, 0, 20, 33] = np.nan  # inside the blocks
    x[0, 1, 39, 63] = np.nan  # the last cell: the overlapping last block
    x[0, 1, 5, 5] = np.inf
    x[0, 1, 6, 9] = -np.inf
    got, want = _pool(x, (3, 3), (2, 2), (1, 1), (1, 1))
    np.testing.assert_array_equal(got, want)  # NaN where NaN, alike
    assert np.isnan(got[0, 0, 5, 0]) and np.isnan(got[0, 0, 10, 16])
    assert np.isnan(got[0, 1, 19, 31]) and np.isposinf(got[0, 1, 2, 2])


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 24),
    w=st.integers(1, 80),
    # a few geometries (each compiles a loop of its own), any sizes and pads
    geometry=st.sampled_from(
        [((3, 3), (2, 2)), ((2, 2), (2, 2)), ((3, 3), (1, 1)), ((4, 1), (3, 1))]
    ),
    pads=st.tuples(*(st.integers(0, 2) for _ in range(4))),
    seed=st.integers(0, 2**16),
)
def test_random_geometries(
    h: int,
    w: int,
    geometry: tuple[tuple[int, int], tuple[int, int]],
    pads: tuple[int, int, int, int],
    seed: int,
) -> None:
    kernel, strides = geometry
    begin = (min(pads[0], kernel[0] - 1), min(pads[1], kernel[1] - 1))
    end = (min(pads[2], kernel[0] - 1), min(pads[3], kernel[1] - 1))
    if h + begin[0] + end[0] < kernel[0] or w + begin[1] + end[1] < kernel[1]:
        return  # no output
    x = np.random.default_rng(seed).standard_normal((2, 3, h, w)).astype(np.float32)
    got, want = _pool(x, kernel, strides, begin, end)
    np.testing.assert_array_equal(got, want)


def test_other_layouts_and_types_are_not_taken() -> None:
    x = np.zeros((1, 2, 8, 8), np.float32)
    out = np.zeros((1, 2, 4, 4), np.float32)
    assert not _poolvector.takes(x.astype(np.float64), out, (2, 2), (1, 1))
    assert not _poolvector.takes(x, out, (2, 3), (1, 1))  # column stride 3
    assert not _poolvector.takes(x, out, (2, 2), (2, 1))  # dilated
    assert not _poolvector.takes(x[..., ::2], out, (1, 1), (1, 1))


@pytest.mark.parametrize(
    ("lanes", "shape", "kernel", "strides", "begin", "end"),
    [
        (16, (2, 3, 56, 56), (3, 3), (2, 2), (1, 1), (1, 1)),
        (8, (1, 2, 21, 57), (3, 3), (1, 1), (1, 1), (1, 1)),
        (16, (1, 2, 9, 50), (3, 2), (1, 2), (0, 1), (2, 0)),
    ],
)
def test_window_sums_times_their_scale(
    monkeypatch: pytest.MonkeyPatch,
    lanes: int,
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    begin: tuple[int, int],
    end: tuple[int, int],
) -> None:
    monkeypatch.setattr(_poolvector._dwvector, "lanes", lambda: lanes)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    h, w = shape[2:]
    oh = (h + begin[0] + end[0] - kernel[0]) // strides[0] + 1
    ow = (w + begin[1] + end[1] - kernel[1]) // strides[1] + 1
    scale = rng.uniform(0.1, 1, (1, 1, oh, ow)).astype(np.float32)  # per cell
    out = np.full((*shape[:2], oh, ow), np.nan, np.float32)
    _poolvector.bind(x, out, kernel, strides, begin, scale=scale)()
    sums = _folds(x, kernel, strides, begin, out.shape, np.add)
    np.testing.assert_allclose(out, sums * scale, rtol=1e-5, atol=1e-6)
    _poolvector.bind(x, out, kernel, strides, begin, scale=0.5)()  # a number
    np.testing.assert_allclose(out, sums * 0.5, rtol=1e-5, atol=1e-6)


def test_sums_keep_ieee_specials() -> None:
    x = np.zeros((1, 1, 8, 40), np.float32)
    x[0, 0, 2, 20], x[0, 0, 2, 21] = np.inf, -np.inf  # one window holds both
    x[0, 0, 6, 0] = np.nan
    out = np.empty((1, 1, 8, 40), np.float32)
    _poolvector.bind(x, out, (3, 3), (1, 1), (1, 1), scale=1.0)()
    assert np.isnan(out[0, 0, 2, 20]) and np.isnan(out[0, 0, 1, 21])
    assert np.isposinf(out[0, 0, 2, 19]) and np.isneginf(out[0, 0, 2, 22])
    assert np.isnan(out[0, 0, 5:8, 0:2]).all()
