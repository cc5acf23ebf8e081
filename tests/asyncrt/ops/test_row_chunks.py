"""Strided convolutions whose columns are made a few output rows at a time
(a compiled gather, one GEMM per chunk) against a float64 reference:
strides, dilations, uneven pads, batches, one row a chunk, float64, the
fused activations, a binding that reads its arrays anew; and the
convolutions left to the whole column matrix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit, _row_chunks, _team_parts

from .conv_reference import conv_kernel, conv_reference
from .team_split import split_everywhere

pytest.importorskip("numba")

CASES = [
    # x shape, weights shape, strides, pads (begins, then ends), dilations
    ((1, 16, 23, 21), (24, 16, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
    ((2, 8, 19, 26), (12, 8, 3, 5), [3, 2], [0, 2, 1, 0], [1, 1]),
    ((1, 16, 17, 17), (8, 16, 3, 3), [1, 1], [2, 2, 2, 2], [2, 2]),
    ((1, 3, 30, 30), (16, 3, 7, 7), [2, 2], [3, 3, 3, 3], [1, 1]),  # a stem
    ((1, 64, 9, 9), (32, 64, 3, 3), [1, 1], [0, 0, 0, 0], [1, 1]),
    # small planes: images share a GEMM (in groups of two, the last alone,
    # where GROUP_BYTES holds two)
    ((5, 16, 9, 9), (8, 16, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
]


def _activation(a: np.ndarray[Any, Any], activation: str) -> np.ndarray[Any, Any]:
    if activation == "relu":
        return np.maximum(a, 0)
    if activation == "hard_swish":
        return a * np.clip(a / 6 + 0.5, 0, 1)
    return a


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize(
    ("dtype", "activation"),
    [
        (np.float32, "none"),
        (np.float32, "hard_swish"),
        (np.float32, "relu"),
        (np.float64, "relu"),
    ],
)
@pytest.mark.parametrize(("xs", "ws", "strides", "pads", "dilations"), CASES)
def test_row_chunks_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    dtype: Any,
    activation: str,
    one_row: bool,
    packed: bool,
) -> None:
    if packed and dtype != np.float32:
        pytest.skip("weights are packed for float32")
    if one_row:
        monkeypatch.setattr(_row_chunks, "CHUNK_BYTES", 1)
    if xs[0] == 5:
        monkeypatch.setattr(_row_chunks, "GROUP_BYTES", 2 * 144 * 25 * 8)
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    want = conv_reference(x, w, b, 1, strides, pads, dilations)
    out = np.full(want.shape, np.nan, dtype)
    assert _row_chunks.takes(x, w, out, 1)
    kernel = conv_kernel(
        list(ws[2:]), strides, pads, dilations, 1, bias=True, activation=activation
    )
    # packed: the weights a parameter (float32: packed once, the bias and
    # activation added as the packed kernel stores its blocks)
    call = kernel.bind(x, w, b, out, constant=frozenset({1}) if packed else frozenset())
    call()
    x[...] = rng.standard_normal(xs)  # a binding reads its arrays anew
    want = _activation(conv_reference(x, w, b, 1, strides, pads, dilations), activation)
    call()
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize(("xs", "ws", "strides", "pads", "dilations"), CASES)
def test_phases_and_columns_split_by_channels_are_the_same_cells(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    # the phases and each chunk's columns written by channel shares on the
    # native team (the part pool where there is none): the one-share bits
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    kernel = conv_kernel(list(ws[2:]), strides, pads, dilations, 1, bias=False)
    want = conv_reference(x, w, None, 1, strides, pads, dilations)
    whole = np.empty(want.shape, np.float32)
    kernel.bind(x, w, whole)()
    split_everywhere(monkeypatch, _row_chunks)
    monkeypatch.setattr(_row_chunks, "CHUNK_BYTES", 1)  # a chunk a row
    shared = np.full(want.shape, np.nan, np.float32)
    kernel.bind(x, w, shared)()
    one_row = np.empty(want.shape, np.float32)
    monkeypatch.setattr(_team_parts, "MIN_TEAM_WORK", 1 << 62)
    monkeypatch.setattr(_row_chunks, "MIN_WORK_PER_THREAD", 1 << 62)
    kernel.bind(x, w, one_row)()  # the same chunks, unsplit
    np.testing.assert_array_equal(shared, one_row)
    np.testing.assert_allclose(shared, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_shallow_grouped_and_foreign_arrays_keep_the_whole_matrix() -> None:
    x = np.zeros((1, 16, 20, 20), np.float32)
    out = np.zeros((1, 8, 10, 10), np.float32)
    assert _row_chunks.takes(x, np.zeros((8, 16, 3, 3), np.float32), out, 1)
    # 4 x 3 x 3 = 36 deep: the whole matrix's copies are as fast
    assert not _row_chunks.takes(x[:, :4], np.zeros((8, 4, 3, 3), np.float32), out, 1)
    assert not _row_chunks.takes(x, np.zeros((8, 8, 3, 3), np.float32), out, 2)
    volume = np.zeros((1, 16, 8, 8, 8), np.float32)
    cube = np.zeros((8, 16, 3, 3, 3), np.float32)
    assert not _row_chunks.takes(volume, cube, np.zeros((1, 8, 4, 4, 4)), 1)
    halves = np.zeros((1, 16, 20, 20), np.float16)
    assert not _row_chunks.takes(halves, np.zeros((8, 16, 3, 3), np.float16), out, 1)


@pytest.mark.parametrize("pads", [(0, 0), (1, 1), (3, 2), (2, 3)])
@pytest.mark.parametrize("shape", [(3, 9, 16), (2, 10, 23), (1, 5, 3)])
@pytest.mark.parametrize("stride_h", [1, 2])
def test_the_pairs_split_is_the_phases_split(
    pads: tuple[int, int], shape: tuple[int, int, int], stride_h: int
) -> None:
    # split_pairs (column stride 2, both phases of a row in one loop) writes
    # every cell split_phases writes, the pads' zeros included
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    pad_h, pad_w = pads
    rows = -(-(shape[1] + 2 * pad_h) // stride_h)
    columns = -(-(shape[2] + 2 * pad_w) // 2)
    phases = [
        np.full((shape[0], stride_h * 2, rows, columns), np.nan, np.float32)
        for _ in range(2)
    ]
    for kernel, target in zip(
        (_row_chunks.split_phases, _row_chunks.split_pairs), phases, strict=True
    ):
        compiled = _jit.compile_kernel(kernel)
        compiled(x, target, 0, shape[0], stride_h, 2, pad_h, pad_w)
    assert not np.isnan(phases[0]).any()
    np.testing.assert_array_equal(phases[1], phases[0])
