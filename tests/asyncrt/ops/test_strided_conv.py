"""Convolutions by one copy per tap and one GEMM (strided ones, and
stride-1 ones with large column matrices) against a float64 reference:
strides in every axis, uneven and missing pads, dilations, groups, 1-D and
3-D, 1x1 kernels, batches, bias and ReLU, a call and a binding alike,
scratch kept by the binding or borrowed from the thread (left dirty by
other kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _common, _scratch

from .conv_reference import conv_kernel, conv_reference

CASES = [
    # x shape, w shape, group, strides, pads, dilations, bias, relu
    ((1, 3, 23, 22), (8, 3, 3, 3), 1, [2, 2], [1, 1, 1, 1], [1, 1], True, False),
    ((2, 3, 20, 20), (6, 3, 7, 7), 1, [2, 2], [3, 3, 3, 3], [1, 1], False, True),
    ((1, 8, 12, 12), (12, 8, 1, 1), 1, [2, 2], [0, 0, 0, 0], [1, 1], True, False),
    # 1x1 kernels: one strided window each, straight into the columns
    ((1, 8, 13, 11), (6, 8, 1, 1), 1, [2, 2], [1, 0, 0, 1], [1, 1], True, True),
    ((2, 8, 9, 10), (8, 2, 1, 1), 4, [2, 3], [0, 0, 0, 0], [1, 1], False, True),
    ((1, 64, 15, 15), (32, 64, 1, 1), 1, [2, 2], [0, 0, 0, 0], [1, 1], True, False),
    ((2, 8, 11, 9), (8, 2, 3, 2), 4, [2, 3], [2, 0, 1, 1], [1, 1], True, True),
    ((1, 4, 13, 14), (6, 4, 3, 3), 1, [3, 1], [0, 2, 1, 0], [2, 1], False, False),
    ((1, 4, 5, 5), (6, 4, 3, 3), 1, [2, 2], [3, 3, 3, 3], [1, 1], True, False),
    ((2, 3, 21), (5, 3, 4), 1, [3], [1, 2], [2], True, True),
    # stride 1 with a column matrix of at least TAPS_MIN_CELLS
    ((1, 16, 24, 24), (8, 16, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1], True, True),
    ((2, 8, 30, 29), (8, 2, 3, 3), 4, [1, 1], [2, 0, 1, 2], [2, 1], False, False),
    (
        (1, 2, 7, 6, 5),
        (3, 2, 2, 3, 2),
        1,
        [2, 1, 2],
        [1, 0, 1, 0, 1, 0],
        [1, 1, 1],
        True,
        False,
    ),
]


def _dirty_scratch() -> None:
    """NaN over this thread's scratch buffer (its first MiB)."""
    _scratch.borrow(((1 << 18,),), np.dtype(np.float32))[0].fill(np.nan)


def _conv(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None,
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    relu: bool,
    bound: bool,
    packed: bool = False,
) -> None:
    kernel = conv_kernel(
        list(w.shape[2:]),
        strides,
        pads,
        dilations,
        group,
        bias=b is not None,
        relu=relu,
    )
    want = conv_reference(x, w, b, group, strides, pads, dilations)
    out = np.full(want.shape, np.nan, x.dtype)
    args = (x, w, *(() if b is None else (b,)), out)
    if bound:
        # packed: the weights a parameter (packed once, the bias and ReLU
        # added as the packed kernel stores its blocks)
        constant = frozenset({1}) if packed else frozenset()
        call = kernel.bind(*args, constant=constant)  # type: ignore[attr-defined]
        call()
        x[...] += 1  # a bound call sees its arrays' new values
        want = conv_reference(x, w, b, group, strides, pads, dilations)
        _dirty_scratch()  # as another kernel on this thread leaves it
        call()
    else:
        kernel(*args)
    if relu:
        want = np.maximum(want, 0)
    tolerance = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("scratch", ["kept", "per call"])
@pytest.mark.parametrize("bound", [False, True, "packed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("xs", "ws", "group", "strides", "pads", "dilations", "bias", "relu"), CASES
)
def test_strided_conv_matches_theconv_reference(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    bias: bool,
    relu: bool,
    dtype: Any,
    bound: bool | str,
    scratch: str,
) -> None:
    if bound == "packed" and (dtype != np.float32 or scratch != "kept"):
        pytest.skip("weights are packed for float32 and a kept column matrix")
    if scratch == "per call":
        monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    _conv(
        x, w, b, group, strides, pads, dilations, relu, bool(bound), bound == "packed"
    )


def test_a_non_finite_input_reaches_only_the_outputs_it_feeds() -> None:
    x = np.zeros((1, 2, 9, 9), np.float32)
    x[0, 1, 4, 4] = np.inf
    w = np.ones((3, 2, 3, 3), np.float32)
    kernel = conv_kernel(
        [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1, bias=False, relu=False
    )
    out = np.zeros((1, 3, 5, 5), np.float32)
    kernel.bind(x, w, out)()  # type: ignore[attr-defined]
    # Input cell 4 (padded 5) is under output cell 2 of each axis alone.
    assert np.isinf(out[:, :, 2, 2]).all()
    assert np.isfinite(out).sum() == out.size - 3
