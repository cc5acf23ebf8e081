"""Sums, means, maxima and minima of small float32 arrays over their
trailing axes as one compiled loop (``asyncrt.ops.reduce.compiled_rows``):
within float32 rounding of numpy's pairwise sums, numpy's extremes exactly,
IEEE specials, and which arrays keep numpy's reduction."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt import ops
from asyncrt.ops import reduce
from asyncrt.ops._kernels import global_namespace_func

pytest.importorskip("numba")


def _bound(kind: str, axes: list[int], x: Any, keepdims: bool = True) -> Any:
    attrs = {"kind": kind, "axes": axes, "keepdims": keepdims}
    kernel = global_namespace_func(ops.register_op_kernel("reduce", attrs), "numpy")
    want = getattr(np, kind)(x, axis=tuple(axes), keepdims=keepdims)
    out = np.empty(want.shape, x.dtype)
    kernel.bind(x, out)()
    return out, want


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize(
    ("shape", "axes"), [((1, 16, 384), [2]), ((3, 5, 7, 9), [2, 3]), ((33,), [0])]
)
def test_compiled_sums_equal_numpys_within_rounding(
    kind: str, shape: tuple[int, ...], axes: list[int]
) -> None:
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    assert reduce.compiled_rows(x, x, tuple(axes), 1, kind) is not None
    out, want = _bound(kind, axes, x)
    exact = getattr(np, kind)(x.astype(np.float64), axis=tuple(axes), keepdims=True)
    scale = np.abs(x).sum(axis=tuple(axes), keepdims=True)
    if kind == "mean":
        scale /= np.prod([shape[a] for a in axes])
    # a sum's rounding error is a few ulps of the sum of magnitudes
    assert np.all(np.abs(out - exact) <= 4e-7 * scale)
    assert np.all(np.abs(want - exact) <= 4e-7 * scale)


def test_specials_propagate_without_warnings() -> None:
    x = np.ones((4, 8), np.float32)
    x[0, 3], x[1, 0], x[2, :2], x[3, :] = np.nan, np.inf, [np.inf, -np.inf], 3e38
    attrs = {"kind": "sum", "axes": [1], "keepdims": False}
    kernel = global_namespace_func(ops.register_op_kernel("reduce", attrs), "numpy")
    out = np.empty(4, np.float32)
    run = kernel.bind(x, out)
    with np.errstate(all="raise"):  # the compiled loop never warns
        run()
    assert np.isnan(out[0]) and out[1] == np.inf and np.isnan(out[2])
    assert out[3] == np.inf  # overflow, as IEEE


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize(
    ("shape", "axes"),
    [((1, 16, 384), [2]), ((3, 5, 7, 9), [2, 3]), ((33,), [0]), ((4, 1), [1])],
)
def test_compiled_extremes_are_numpys(
    kind: str, shape: tuple[int, ...], axes: list[int]
) -> None:
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    assert reduce.compiled_rows(x, x, tuple(axes), 1, kind) is not None
    out, want = _bound(kind, axes, x)
    np.testing.assert_array_equal(out, want)
    x = -np.abs(x)  # every value negative (order keys of negative floats)
    out, want = _bound(kind, axes, x, keepdims=False)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremes_of_specials(kind: str) -> None:
    """NaN of either sign wins (numpy's maximum propagates it), the
    infinities and the largest finite values are ordered, rows of one."""
    x = np.ones((6, 5), np.float32)
    x[0, 2] = np.nan
    x[1, 4] = -np.float32(np.nan)  # sign bit set: its key is below -inf
    x[2, :] = [np.inf, -np.inf, 0.0, 3e38, -3e38]
    x[3, :] = -3.4e38
    x[4, :] = [-0.0, -1e-45, 1e-45, -2.0, 2.0]  # subnormals
    x[5, 0] = np.float32(np.nan) * 0  # NaN first in its row
    attrs = {"kind": kind, "axes": [1], "keepdims": False}
    kernel = global_namespace_func(ops.register_op_kernel("reduce", attrs), "numpy")
    out = np.empty(6, np.float32)
    with np.errstate(all="raise"):
        kernel.bind(x, out)()
    want = getattr(np, kind)(x, axis=1)
    np.testing.assert_array_equal(out, want)
    assert np.isnan(out[:2]).all() and np.isnan(out[5])


class _DeviceArray:
    """An array of another device: numpy's attributes, not its type."""

    def __init__(self, host: np.ndarray[Any, Any]) -> None:
        self.dtype, self.shape, self.flags = host.dtype, host.shape, host.flags
        self.size, self.ndim = host.size, host.ndim


def test_which_arrays_keep_numpys_reduction() -> None:
    rows = reduce.compiled_rows
    small = np.ones((4, 6), np.float32)
    assert rows(small, small, (0,), 4, "sum") is None  # not the trailing axes
    assert rows(small.astype(np.float64), small, (1,), 6, "sum") is None
    assert rows(small[:, ::2], small, (1,), 3, "sum") is None  # strided
    big = np.ones((2, reduce.MAX_COMPILED_SUM), np.float32)
    assert rows(big, big, (1,), big.shape[1], "sum") is None
    device = _DeviceArray(small)  # another device's array, as cupy's
    assert rows(device, device, (1,), 6, "sum") is None
    # and those give numpy's sums bit for bit
    x = np.random.default_rng(5).standard_normal((9, 6)).astype(np.float32)
    out, want = _bound("sum", [0], x)
    np.testing.assert_array_equal(out, want)


def test_global_average_pools_take_the_compiled_rows() -> None:
    name = ops.register_op_kernel("global_avg_pool", {})
    kernel = global_namespace_func(name, "numpy")
    x = np.random.default_rng(7).standard_normal((2, 16, 7, 7)).astype(np.float32)
    out = np.empty((2, 16, 1, 1), np.float32)
    assert reduce.compiled_rows(x, out, (2, 3), 49, "mean") is not None
    kernel.bind(x, out)()
    exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    scale = np.abs(x).astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert np.all(np.abs(out - exact) <= 4e-7 * scale)
