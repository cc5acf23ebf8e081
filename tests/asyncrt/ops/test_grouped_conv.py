"""Grouped convolutions on the compiled planar loop (a group's input
channels as more taps) against a float64 reference: strides, dilations,
uneven pads, channel multipliers, bias and ReLU, batches, parts over
threads, non-finite inputs, a call and a binding alike; and the groups the
loop leaves to im2col."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _depthwise, _team_parts
from asyncrt.runtime import _threads

from .conv_reference import conv_kernel, conv_reference

pytest.importorskip("numba")

CASES = [
    # x shape, weights shape, group, strides, pads, dilations
    ((1, 128, 28, 28), (128, 4, 3, 3), 32, [1, 1], [1, 1, 1, 1], [1, 1]),
    ((2, 12, 33, 29), (18, 4, 3, 3), 3, [2, 2], [1, 1, 1, 1], [1, 1]),
    ((1, 16, 20, 21), (8, 2, 5, 5), 8, [1, 1], [2, 1, 2, 3], [1, 1]),
    ((1, 8, 12, 14), (8, 4, 3, 3), 2, [1, 1], [2, 2, 2, 2], [2, 2]),
    ((3, 6, 19, 18), (12, 1, 3, 3), 6, [1, 2], [0, 1, 2, 0], [1, 1]),  # x2
    # a stem: one group of few inputs, columns split into phases
    ((1, 3, 30, 31), (16, 3, 3, 3), 1, [2, 2], [1, 1, 1, 1], [1, 1]),
    ((2, 2, 23, 26), (5, 2, 3, 5), 1, [3, 3], [0, 2, 1, 0], [2, 1]),
]


def _kernel(
    w: np.ndarray[Any, Any],
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    relu: bool,
) -> Any:
    shape = list(w.shape[2:])
    return conv_kernel(shape, strides, pads, dilations, group, bias=True, relu=relu)


# float64 on the first case only: each case and dtype compiles a kernel
# of its own (about a second on a cold cache).
@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize(
    ("xs", "ws", "group", "strides", "pads", "dilations", "dtype"),
    [(*CASES[0], np.float64)] + [(*case, np.float32) for case in CASES],
)
def test_grouped_convolutions_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    dtype: Any,
    bound: bool,
    threads: bool,
) -> None:
    if threads:  # on the native team where it runs here, else the part pool
        monkeypatch.setattr(_depthwise, "MIN_WORK_PER_THREAD", 1)
        monkeypatch.setattr(_team_parts, "MIN_TEAM_WORK", 1)
        monkeypatch.setattr(_threads.limits, "compiled_threads", 3)
        monkeypatch.setattr(_threads, "available_cores", lambda: 3)
    else:
        monkeypatch.setattr(_team_parts, "MIN_TEAM_WORK", float("inf"))
    rng = np.random.default_rng(len(xs) + group)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    relu = group % 2 == 0
    want = conv_reference(x, w, b, group, strides, pads, dilations)
    if relu:
        want = np.maximum(want, 0)
    out = np.full(want.shape, np.nan, dtype)
    assert _depthwise.groups(np, x, w, out, group)
    # parts split at output channels, a group's between two parts too
    shares = _depthwise._shares(out, w, ws[0], 1)
    assert len(shares) == (min(3, ws[0]) if threads else 1)
    kernel = _kernel(w, group, strides, pads, dilations, relu)
    if bound:
        call = kernel.bind(x, w, b, out)
        call()
        x[...] = rng.standard_normal(xs)  # a binding reads its arrays anew
        w[...] = rng.standard_normal(ws)  # weights too
        want = conv_reference(x, w, b, group, strides, pads, dilations)
        if relu:
            want = np.maximum(want, 0)
        call()
    else:
        kernel(x, w, b, out)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance * scale)


def test_a_non_finite_input_reaches_only_its_groups_outputs() -> None:
    x = np.zeros((1, 8, 10, 10), np.float32)
    x[0, 5, 4, 4] = np.inf  # group 2 (channels 4 and 5)
    w = np.ones((8, 2, 3, 3), np.float32)
    out = np.empty((1, 8, 10, 10), np.float32)
    _kernel(w, 4, [1, 1], [1, 1, 1, 1], [1, 1], False)(
        x, w, np.zeros(8, np.float32), out
    )
    touched = ~np.isfinite(out)
    assert touched[0, 4:6, 3:6, 3:6].all()
    assert touched.sum() == 2 * 9


def test_large_groups_and_narrow_outputs_are_left_to_im2col() -> None:
    x = np.zeros((1, 64, 16, 16), np.float32)
    out = np.zeros((1, 64, 16, 16), np.float32)
    groups = _depthwise.groups
    assert groups(np, x, np.zeros((64, 8, 3, 3), np.float32), out, 8)  # 72 terms
    assert not groups(np, x, np.zeros((64, 16, 3, 3), np.float32), out, 4)
    # 32 outputs per group: the GEMM's blocking wins.
    wide = np.zeros((1, 128, 16, 16), np.float32)
    assert not groups(np, x[:, :8], np.zeros((128, 2, 3, 3), np.float32), wide, 4)
    assert groups(np, x[:, :8], np.zeros((32, 2, 3, 3), np.float32), out[:, :32], 4)
    narrow = np.zeros((1, 64, 7, 7), np.float32)
    assert not groups(np, x, np.zeros((64, 4, 3, 3), np.float32), narrow, 16)
    assert not groups(np, x, np.zeros((64, 1, 3, 3), np.float32), out, 1)
    # one group: a stem's few inputs and outputs, not more outputs
    image = np.zeros((1, 3, 224, 224), np.float32)
    stem = np.zeros((1, 16, 112, 112), np.float32)
    assert groups(np, image, np.zeros((16, 3, 3, 3), np.float32), stem, 1)
    wider = np.zeros((1, 32, 112, 112), np.float32)
    assert not groups(np, image, np.zeros((32, 3, 3, 3), np.float32), wider, 1)
    assert not groups(np, image, np.zeros((16, 3, 7, 7), np.float32), stem, 1)
