"""Stride-1 convolution through flat-plane im2col against a direct
reference: groups, depthwise, dilations, uneven pads, 1x1, other ranks, and
a batch split into chunks."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from asyncrt import Bindable
from asyncrt.ops import _banded, _common, _im2col, _jit, _scratch, lookup

from ..ops.conv_reference import conv_reference


def _reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    group: int,
    pads: list[int],
    dilations: list[int],
) -> np.ndarray:
    """Stride 1: the float64 reference."""
    return conv_reference(x, w, b, group, [1] * (x.ndim - 2), pads, dilations)


CASES = [
    # (x shape, w shape, group, pads, dilations, bias)
    ((2, 3, 16, 16), (8, 3, 3, 3), 1, [1, 1, 1, 1], [1, 1], True),
    ((3, 8, 9, 7), (8, 1, 3, 3), 8, [1, 1, 1, 1], [1, 1], False),
    ((2, 8, 9, 7), (16, 2, 3, 2), 4, [2, 0, 1, 1], [1, 1], True),
    ((2, 4, 11, 10), (6, 4, 3, 3), 1, [0, 2, 1, 0], [2, 3], False),
    ((2, 8, 6, 5), (4, 8, 1, 1), 1, [0, 0, 0, 0], [1, 1], True),
    ((2, 8, 6, 5), (4, 8, 1, 1), 1, [1, 0, 0, 1], [1, 1], False),
    ((2, 3, 20), (5, 3, 4), 1, [1, 2], [2], True),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), 1, [1, 0, 1, 0, 1, 0], [1, 1, 1], True),
    # depthwise with enough rows: the banded matmul (BANDED below)
    ((8, 4, 10, 9), (4, 1, 3, 3), 4, [1, 1, 1, 1], [1, 1], True),
    ((4, 3, 20, 12), (3, 1, 3, 2), 3, [2, 0, 0, 1], [2, 3], False),
    ((16, 2, 8, 8), (2, 1, 5, 5), 2, [2, 2, 2, 2], [1, 1], True),
]
BANDED = CASES[-3:]


def _random_case(
    xs: tuple[int, ...], ws: tuple[int, ...], bias: bool, seed: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """A case's input, weights and bias (a list: empty without one)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    return x, w, [rng.standard_normal(ws[0]).astype(np.float32)] if bias else []


def _stride1_attrs(
    ws: tuple[int, ...], group: int, pads: list[int], dil: list[int], bias: bool
) -> dict[str, object]:
    """The conv op's attributes for a case (strides of 1)."""
    return {
        "kernel_shape": list(ws[2:]),
        "strides": [1] * (len(ws) - 2),
        "dilations": dil,
        "pads": pads,
        "auto_pad": "NOTSET",
        "group": group,
        "bias": bias,
    }


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1 << 23, 1])
@pytest.mark.parametrize(("xs", "ws", "group", "pads", "dil", "bias"), CASES)
def test_stride1_conv_matches_reference(
    monkeypatch: pytest.MonkeyPatch,
    chunk_bytes: int,
    relu: bool,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    pads: list[int],
    dil: list[int],
    bias: bool,
) -> None:
    monkeypatch.setattr(_im2col, "CHUNK_BYTES", chunk_bytes)  # 1: one per chunk
    x, w, b = _random_case(xs, ws, bias, seed=math.prod(xs))
    attrs = _stride1_attrs(ws, group, pads, dil, bias)
    if relu:
        attrs["activation"] = "relu"
    kernel = lookup("conv").make(np, attrs)
    want = _reference(x, w, b[0] if b else None, group, pads, dil)
    if relu:
        want = np.maximum(want, 0)
    out = np.full(want.shape, np.nan, np.float32)
    kernel(x, w, *b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize(("xs", "ws", "group", "pads", "dil", "bias"), CASES)
def test_a_non_finite_input_reaches_only_the_outputs_it_feeds(
    bound: bool,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    pads: list[int],
    dil: list[int],
    bias: bool,
) -> None:
    """A NaN and an infinity in the input give NaN and infinity exactly
    where the reference puts them (the banded matmul's zeros would spread
    them along their rows), and the finite outputs stay right."""
    x, w, b = _random_case(xs, ws, bias, seed=math.prod(ws))
    flat = x.reshape(-1)
    flat[flat.size // 3] = np.nan
    flat[2 * flat.size // 3] = np.inf
    kernel = lookup("conv").make(np, _stride1_attrs(ws, group, pads, dil, bias))
    assert isinstance(kernel, Bindable)
    with np.errstate(invalid="ignore"):
        want = _reference(x, w, b[0] if b else None, group, pads, dil)
    out = np.zeros(want.shape, np.float32)
    with np.errstate(invalid="ignore"):
        if bound:
            kernel.bind(x, w, *b, out)()
        else:
            kernel(x, w, *b, out)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("scratch_bytes", [1 << 20, 0])
@pytest.mark.parametrize(("xs", "ws", "group", "pads", "dil", "bias"), CASES)
def test_a_bound_conv_computes_what_the_call_does(
    monkeypatch: pytest.MonkeyPatch,
    scratch_bytes: int,
    relu: bool,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    pads: list[int],
    dil: list[int],
    bias: bool,
) -> None:
    """``kernel.bind(*arrays)()`` (views and scratch made once; with no room
    for scratch, the thread's scratch borrowed per call) gives the plain
    call's bits, run after run on new values in the same arrays (the
    padding stays zero, even where other kernels dirtied the scratch). The
    numpy paths: the compiled depthwise loops are tests/asyncrt/ops'."""
    monkeypatch.setattr(_jit, "enabled", False)
    monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", scratch_bytes)
    attrs = _stride1_attrs(ws, group, pads, dil, bias)
    if relu:
        attrs["activation"] = "relu"
    kernel = lookup("conv").make(np, attrs)
    assert isinstance(kernel, Bindable)
    rng = np.random.default_rng(math.prod(ws))
    x = np.zeros(xs, np.float32)
    w = np.zeros(ws, np.float32)
    b = [np.zeros(ws[0], np.float32)] if bias else []
    out_shape = _reference(x, w, None, group, pads, dil).shape
    out = np.full(out_shape, np.nan, np.float32)
    bound = kernel.bind(x, w, *b, out)
    # Every case here binds its own call, scratch kept or borrowed, but the
    # banded matmul without room for its band (the plain call makes it).
    banded = _banded.takes(np, x, w, out, group, tuple(dil))
    assert isinstance(bound, functools.partial) == (scratch_bytes == 0 and banded)
    for _ in range(3):
        for array in (x, w, *b):
            array[...] = rng.standard_normal(array.shape)
        want = np.full(out_shape, np.nan, np.float32)
        kernel(x, w, *b, want)
        out[...] = np.nan
        _scratch.borrow(((1 << 18,),), np.dtype(np.float32))[0].fill(np.nan)
        bound()
        np.testing.assert_array_equal(out, want)
    if relu:
        assert (out >= 0).all()


def test_narrow_depthwise_convolutions_take_the_banded_matmul(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the compiled engine (whose planar loop takes them first), the
    banded cases above bind the banded matmul; a depthwise one with too few
    rows (the test CNN at batch 2) keeps im2col."""
    monkeypatch.setattr(_jit, "enabled", False)
    for xs, ws, group, pads, dil, bias in [*BANDED, CASES[1]]:
        kernel = lookup("conv").make(np, _stride1_attrs(ws, group, pads, dil, bias))
        assert isinstance(kernel, Bindable)
        x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
        out = np.zeros(_reference(x, w, None, group, pads, dil).shape, np.float32)
        b = [np.zeros(ws[0], np.float32)] if bias else []
        bound = kernel.bind(x, w, *b, out)
        banded = _banded.takes(np, x, w, out, group, tuple(dil))
        assert banded == ((xs, ws, group, pads, dil, bias) in BANDED)
        assert (getattr(bound, "__name__", "") == "banded") == banded


POOLS = [
    # (x shape, kernel, strides, pads, count_include_pad, out spatial)
    ((2, 3, 8, 8), [3, 3], [2, 2], [1, 1, 1, 1], False, (4, 4)),
    ((2, 3, 8, 8), [3, 3], [2, 2], [1, 1, 1, 1], True, (4, 4)),
    ((1, 2, 7, 9), [2, 3], [2, 2], [0, 1, 0, 1], False, (4, 5)),  # ceil_mode
    ((1, 2, 6, 6), [2, 2], [2, 2], [0, 0, 0, 0], False, (3, 3)),
    ((1, 2, 10), [3], [1], [1, 1], True, (10,)),
]


@pytest.mark.parametrize(("xs", "k", "s", "pads", "count", "out_sp"), POOLS)
def test_avg_pool_matrix_matches_window_folds(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    k: list[int],
    s: list[int],
    pads: list[int],
    count: bool,
    out_sp: tuple[int, ...],
) -> None:
    from asyncrt.ops import nn

    attrs = {
        "kernel_shape": k,
        "strides": s,
        "dilations": [1] * len(k),
        "pads": pads,
        "auto_pad": "NOTSET",
        "count_include_pad": count,
    }
    x = np.random.default_rng(3).standard_normal(xs).astype(np.float32)
    matrix_cells = nn.POOL_MATRIX_CELLS
    results = []
    for cells in (matrix_cells, 0):  # the matrix, then the folds
        monkeypatch.setattr(nn, "POOL_MATRIX_CELLS", cells)
        out = np.full((*xs[:2], *out_sp), np.nan, np.float32)
        lookup("avg_pool").make(np, attrs)(x, out)
        results.append(out)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)
    assert np.isfinite(results[0]).all()
    # A NaN and an infinity reach only their own windows (the matrix's
    # zeros would spread them over the plane), bound or not.
    flat = x.reshape(-1)
    flat[1], flat[-2] = np.nan, np.inf
    kernel = lookup("avg_pool").make(np, attrs)
    assert isinstance(kernel, Bindable)
    outs = []
    for cells in (matrix_cells, 0):
        monkeypatch.setattr(nn, "POOL_MATRIX_CELLS", cells)
        for bound in (False, True):
            out = np.zeros((*xs[:2], *out_sp), np.float32)
            with np.errstate(invalid="ignore"):
                kernel.bind(x, out)() if bound else kernel(x, out)
            outs.append(out)
    for out in outs[:-1]:  # against the folds, bound
        np.testing.assert_array_equal(np.isnan(out), np.isnan(outs[-1]))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(outs[-1]))
    assert 0 < np.isnan(outs[0]).sum() < outs[0].size / 2
