"""Kernels are written once against the array namespace they are given, so
they may use only what numpy and cupy both accept. These tests hand the
kernel factories a namespace as strict as cupy where the two differ (found
on an H200: cupy's matmul takes ``out`` by keyword only, its float
``remainder`` and float16 sums differ from numpy's), so the cpu suite
catches a kernel that would fail or drift on cuda."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from asyncrt.ops._builtin import _dense, _floor_mod, _keyword_out, exact_sums


def _strict_matmul(a: Any, b: Any, /, *, out: Any = None) -> Any:
    return np.matmul(a, b, out=out)


STRICT = types.SimpleNamespace(**{**vars(np), "matmul": _strict_matmul})


def test_matmul_and_dense_pass_out_by_keyword() -> None:
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    out = np.empty((3, 5))
    _keyword_out("matmul")(STRICT)(a, w.T, out)
    np.testing.assert_array_equal(out, a @ w.T)
    out[...] = 0
    _dense(STRICT)(a, w, out)
    np.testing.assert_array_equal(out, a @ w.T)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_floor_mod_is_pythons_percent_at_the_edges(dtype: type) -> None:
    """ONNX's Mod without fmod: the divisor's sign, signed zeros and
    infinities as numpy's remainder gives them (cupy's does not)."""
    x = np.array(
        [0, -0.0, 0, -0.0, -3, 3, -1, 1, np.inf, -np.inf, 1, 1, np.nan, 1, 7.5]
    )
    y = np.array(
        [-2, 2, 2, -2, np.inf, np.inf, -np.inf, -np.inf, 2, 2, 0, -0.0, 2, np.nan, -2]
    )
    x, y = x.astype(dtype), y.astype(dtype)
    out = np.empty_like(x)
    _floor_mod(np)(x, y, out)
    with np.errstate(all="ignore"):
        expected = np.remainder(x, y)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(expected))


def test_floor_mod_of_integers_is_remainder() -> None:
    x = np.array([-7, 7, -7, 7], dtype=np.int32)
    y = np.array([2, -2, -2, 2], dtype=np.int32)
    out = np.empty_like(x)
    _floor_mod(np)(x, y, out)
    np.testing.assert_array_equal(out, [1, -1, -1, 1])


def test_half_precision_sums_round_once() -> None:
    """Summed in float32 and rounded once, as numpy sums float16 (a float16
    accumulator, as cupy's, drifts by several ulps over a row of 1000)."""
    rng = np.random.default_rng(1)
    rows = np.exp(rng.standard_normal((200, 1000))).astype(np.float16)
    got = exact_sums(rows, -1)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, rows.sum(axis=-1, keepdims=True))
    accumulated_in_half = np.zeros((200, 1), dtype=np.float16)
    for column in rows.T:
        accumulated_in_half += column[:, None]
    assert not np.array_equal(got, accumulated_in_half)
