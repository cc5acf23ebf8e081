"""The softmax over rows of about a vector (``_softvector``): against the
float64 reference at both vector widths, rows not a multiple of a group,
each way of scaling and masking, NaN and infinite scores, split over
threads, in place; and the library's softmax ops, which take it for such
rows, still giving the unfused kernels' bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _dwvector, _softvector, _team_parts, lookup
from asyncrt.runtime import _threads

pytest.importorskip("numba")

Array = np.ndarray[Any, Any]
RNG = np.random.default_rng(5)


def _reference(scores: Array) -> Array:
    v = scores.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.exp(v - v.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)


def _scores(
    x: Array, mode: str, c: float, mask: Array, rows: Array, fill: float, **flags: bool
) -> Array:
    """The scores the softmax reads, as the unfused numpy ops make them."""
    scaled = x / np.float32(c) if flags.get("divide") else x * np.float32(c)
    if mode == "add":
        return scaled + mask[rows]
    if mode == "where":
        filled = mask[rows] != flags.get("keep", False)
        return np.where(filled, np.float32(fill), scaled)
    return x


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize(
    ("mode", "divide", "keep", "c"),
    [
        ("plain", False, False, 1.0),
        ("add", True, False, 8.0),  # a power of two: by its reciprocal
        ("add", False, False, 0.3),
        ("where", True, True, 3.0),
        ("where", True, False, 0.25),
    ],
)
def test_rows_against_the_float64_reference(
    mode: str,
    divide: bool,
    keep: bool,
    c: float,
    lanes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_dwvector, "lanes", lambda: lanes)
    for width, count in ((lanes, 3 * lanes + 5), (lanes // 2 + 1, lanes // 2)):
        x = (RNG.standard_normal((count, width)) * 4).astype(np.float32)
        if mode == "where":
            mask = np.tril(np.ones((width, width), bool))
        else:
            mask = RNG.standard_normal((width, width)).astype(np.float32)
        rows = (np.arange(count) % width).astype(np.int64)
        scores = _scores(x, mode, c, mask, rows, -3.4e38, divide=divide, keep=keep)
        out = np.full_like(x, np.nan)
        assert _softvector.takes(x, out)
        _softvector.bind(
            x,
            out,
            split_elements=1 << 30,
            mode=mode,
            aux=None if mode == "plain" else mask,
            aux_rows=None if mode == "plain" else rows,
            scale=np.array([c], np.float32),
            fill=np.array([-3.4e38], np.float32),
            divide=divide,
            keep=keep,
        )()
        np.testing.assert_allclose(out, _reference(scores), rtol=2e-6, atol=1e-7)


def test_nan_and_infinite_scores_make_their_rows_nan() -> None:
    lanes = _dwvector.lanes()
    x = RNG.standard_normal((lanes, lanes)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, :] = -np.inf  # every exponential of the row is 0 / 0
    x[4, 2:] = -np.inf  # these are 0, the others not
    x[5, 1] = -1000.0  # its exponential is flushed to 0, not subnormal
    out = np.empty_like(x)
    _softvector.bind(x, out, split_elements=1 << 30)()
    assert np.isnan(out[1:4]).all()
    with np.errstate(invalid="ignore", over="ignore"):
        expected = _reference(x)
    np.testing.assert_allclose(out[4:], expected[4:], rtol=2e-6, atol=1e-7)
    assert out[4, 2:].tolist() == [0.0] * (lanes - 2)
    assert out[5, 1] == 0.0
    np.testing.assert_allclose(out[5].sum(), 1.0, rtol=1e-6)


def test_split_over_threads_and_in_place_give_one_threads_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lanes = _dwvector.lanes()
    x = RNG.standard_normal((5 * lanes + 3, lanes)).astype(np.float32)
    alone = np.empty_like(x)
    _softvector.bind(x, alone, split_elements=1 << 30)()
    monkeypatch.setattr(_team_parts, "MIN_TEAM_ELEMENTS", 1)
    monkeypatch.setattr(_threads.limits, "compiled_threads", 3)
    monkeypatch.setattr(_threads.limits, "threads", 3)
    split = np.empty_like(x)
    _softvector.bind(x, split, split_elements=1)()
    np.testing.assert_array_equal(split, alone)
    in_place = x.copy()
    _softvector.bind(in_place, in_place, split_elements=1 << 30)()
    np.testing.assert_array_equal(in_place, alone)


def test_rows_too_narrow_or_too_few_take_the_row_loops() -> None:
    lanes = _dwvector.lanes()
    for shape in ((lanes, lanes // 2), (lanes, lanes + 1), (lanes // 2 - 1, lanes)):
        x = np.zeros(shape, np.float32)
        assert not _softvector.takes(x, np.empty_like(x))
    x = np.zeros((lanes, lanes), np.float32)
    assert not _softvector.takes(x, np.empty((lanes, lanes), np.float64))
    assert not _softvector.takes(x[:, ::-1], np.empty_like(x))


def _op(name: str, **attrs: Any) -> Any:
    definition = lookup(name)
    assert definition is not None
    return definition.make(np, attrs)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("c", [8.0, 3.0])
def test_scale_where_softmax_of_rows_of_a_vector_gives_the_unfused_bits(
    keep: bool, c: float
) -> None:
    # attention over a sequence of a vector's length: the fused op and
    # numpy's scale and mask before the library's softmax both take the
    # groups, from the same scores
    s = _dwvector.lanes()
    x = (RNG.standard_normal((2, 3, s, s)) * 4).astype(np.float32)
    k = np.ascontiguousarray(np.tril(np.ones((s, s), bool))[None, None])
    scale, fill = np.array(c, np.float32), np.array(-3.4e38, np.float32)
    expected = np.empty_like(x)
    scores = np.where(k == keep, np.divide(x, scale), fill)
    _op("softmax", axes=[3], log=False)(scores, expected)
    out = np.full_like(x, np.nan)
    kernel = _op("scale_where_softmax", divide=True, keep=keep, axes=[3])
    kernel.bind(x, scale, k, fill, out)()
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_allclose(out, _reference(scores), rtol=2e-6, atol=1e-7)


def test_scale_add_softmax_of_rows_of_a_vector_gives_the_unfused_bits() -> None:
    s = _dwvector.lanes()
    x = (RNG.standard_normal((2, 3, s, s)) * 4).astype(np.float32)
    c = np.array(0.125, np.float32)
    mask = np.zeros((2, 1, 1, s), np.float32)
    mask[0, ..., -3:] = np.finfo(np.float32).min
    expected = np.empty_like(x)
    _op("softmax", axes=[3], log=False)(np.add(np.multiply(x, c), mask), expected)
    out = np.full_like(x, np.nan)
    _op("scale_add_softmax", divide=False, axes=[3]).bind(x, c, mask, out)()
    np.testing.assert_array_equal(out, expected)
