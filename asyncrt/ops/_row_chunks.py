"""A strided 2-D convolution's column matrix made a few output rows at a
time, each chunk multiplied while it is in cache.

:mod:`asyncrt.ops._strided` builds the whole column matrix with one numpy
copy per kernel tap, then runs one GEMM. For a large one that is slow
twice: ResNet's stem (3 -> 64 channels, 7 x 7 at stride 2, 224 x 224)
writes 7.4 MB of columns through 49 strided copies (1.2 ms of its 2.7),
and its GEMM then reads them back from memory. Here the input is split into
the padded input's stride phases once (:func:`split_phases`, its pads
zero), a compiled loop (:func:`_gather_rows`) copies each tap's rows of a
chunk of output rows into a column matrix of about :data:`CHUNK_BYTES`,
and BLAS writes that chunk's columns of the output (``out`` viewed ``(M,
rows * width)``, at its row stride). The bias and activation follow in one
pass (:mod:`asyncrt.ops._conv_epilogue`). Both copies are split over the
kernel threads by input channels: on one thread they took as long as the
chunk's product on two (ResNet-18's stride-2 layers, two threads, the
same bits: 64 -> 128 channels at 56 x 56 866-880 -> 705 us, 128 -> 256 at
28 x 28 738 -> 655-664, 256 -> 512 at 14 x 14 699 -> 679-690).

Measured on one thread (``bench/bench_ops.py``), ResNet's stem 3.3-3.4 ->
2.8 ms and 128 -> 256 channels at stride 2, 28 x 28, 1.34-1.41 -> 1.30-1.32
ms; in ResNet-18 on two threads, where its GEMMs stream the weights from
memory, the same (a serving process's one-thread runs gain).

The columns and their order are those of :mod:`asyncrt.ops._strided`, so
each output is the same dot product; BLAS may block a narrower GEMM
differently, so results agree within float32 rounding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _jit, _panel_conv, _team_blas, _team_parts
from ._common import Array
from ._conv_epilogue import bind_bias_activation

__all__ = (
    "CHUNK_BYTES",
    "MIN_DEPTH",
    "bind_row_chunks",
    "phase_splitter",
    "split_pairs",
    "split_phases",
    "takes",
)

#: The column matrix of one chunk of output rows, at most (about L2's share
#: of one core): one row at least.
CHUNK_BYTES = 1 << 20
#: Columns shorter than this (input channels times taps) take
#: :mod:`._strided`: 3 -> 32 channels, 3 x 3 at stride 2, 224 x 224, ran
#: 1.27x slower here. Measured against it (one run, 2 cores): 64 -> 128
#: channels, 3 x 3 at stride 2, 56 x 56: 0.78x; 512 x 7 x 7 at stride 1:
#: 0.76x; 64 x 14 x 14: 0.67x; ResNet's stem (147 deep): 1.04x.
MIN_DEPTH = 64
#: Images whose column matrices are whole chunks and whose planes have at
#: most this many positions share one GEMM, up to :data:`GROUP_BYTES` of
#: columns: ResNet-18's stride-2 convolutions at batch 8, 512 channels of
#: 7 x 7 and 256 of 14 x 14 (a GEMM per image reads all the weights for 49
#: or 196 columns).
GROUP_MAX_POSITIONS = 100
#: Cells a thread of the part pool copies at least before the phases and
#: columns are split over it (the native team's threshold:
#: :data:`asyncrt.ops._team_parts.MIN_TEAM_WORK`).
MIN_WORK_PER_THREAD = 1_000_000
GROUP_BYTES = 1 << 23
_DTYPES = _jit.FLOATS


def split_phases(  # pragma: no cover - compiled by numba
    x: Any,
    phases: Any,
    first: int,
    last: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
) -> None:
    """Channels ``first:last`` of ``phases (C, SH * SW, PH, PW)``: plane ``a
    * SW + e`` holds the padded input's cells at row offset ``a`` and
    column offset ``e`` modulo the strides, ``x (C, H, W)``'s or zero."""
    height, width = x.shape[1], x.shape[2]
    rows, columns = phases.shape[2], phases.shape[3]
    for c in range(first, last):
        for a in range(stride_h):
            for e in range(stride_w):
                plane = a * stride_w + e
                shift = e - pad_w
                # the phase's columns whose cell is inside x: j0 <= j < j1
                j0 = min(columns, max(0, (stride_w - 1 - shift) // stride_w))
                j1 = max(j0, min(columns, (width - 1 - shift) // stride_w + 1))
                for i in range(rows):
                    h = i * stride_h + a - pad_h
                    if h < 0 or h >= height:
                        for j in range(columns):
                            phases[c, plane, i, j] = 0.0
                        continue
                    for j in range(j0):
                        phases[c, plane, i, j] = 0.0
                    for j in range(j0, j1):
                        phases[c, plane, i, j] = x[c, h, j * stride_w + shift]
                    for j in range(j1, columns):
                        phases[c, plane, i, j] = 0.0


def split_pairs(  # pragma: no cover - compiled by numba
    x: Any,
    phases: Any,
    first: int,
    last: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
) -> None:
    """:func:`split_phases` at column stride 2 (``stride_w`` must be 2):
    each input row's two column phases written in one loop, an interleaved
    pair of loads that LLVM vectorises with shuffles (a loop a phase read
    every second cell, one at a time), the pads' columns apart: 64
    channels of 56 x 56, one thread, 167-180 -> 70 us; two, 107-115 ->
    46."""
    u = np.uint64
    height, width = x.shape[1], x.shape[2]
    rows, columns = phases.shape[2], phases.shape[3]
    # phase e's column j is x's column 2 j + e - pad_w: both inside x for
    # lo <= j < hi
    lo = min(columns, (pad_w + 1) // 2)
    hi = max(lo, min(columns, (width - 2 + pad_w) // 2 + 1))
    start = u(2 * lo - pad_w)
    for c in range(u(first), u(last)):
        for a in range(stride_h):
            for i in range(rows):
                h = i * stride_h + a - pad_h
                row = u(i)
                for e in range(2):
                    plane = u(2 * a + e)
                    if h < 0 or h >= height:
                        for j in range(u(columns)):
                            phases[c, plane, row, j] = 0.0
                        continue
                    for edge in ((0, lo), (hi, columns)):  # the pads' columns
                        for j in range(edge[0], edge[1]):
                            column = 2 * j + e - pad_w
                            inside = 0 <= column < width
                            value = x[c, u(h), u(column)] if inside else 0.0
                            phases[c, plane, row, u(j)] = value
                if h < 0 or h >= height:
                    continue
                line, even, odd = u(h), u(2 * a), u(2 * a + 1)
                for q in range(u(hi - lo)):
                    at = start + u(2) * q
                    phases[c, even, row, u(lo) + q] = x[c, line, at]
                    phases[c, odd, row, u(lo) + q] = x[c, line, at + u(1)]


def phase_splitter(stride_w: int) -> Callable[..., None]:
    """The compiled :func:`split_phases` for a column stride (2:
    :func:`split_pairs`)."""
    return _jit.compile_kernel(split_pairs if stride_w == 2 else split_phases)


def _gather_rows(  # pragma: no cover - compiled by numba
    phases: Any,
    cols: Any,
    taps: Any,
    first: int,
    last: int,
    first_row: int,
    rows: int,
    out_w: int,
) -> None:
    """``cols[c * T + t, r * out_w + q] = phases[c, plane_t, first_row + r +
    dy_t, dx_t + q]`` for channels ``first:last`` and ``rows`` output rows,
    ``taps[t] = (plane_t, dy_t, dx_t)``."""
    count = np.uint64(taps.shape[0])
    width = np.uint64(out_w)
    # Unsigned indices: numba wraps negative signed ones (no vectors), and
    # no views: numba counts every view's references (atomics).
    for c in range(np.uint64(first), np.uint64(last)):
        for t in range(count):
            plane = np.uint64(taps[t, 0])
            dy = np.uint64(taps[t, 1])
            dx = np.uint64(taps[t, 2])
            k = c * count + t
            for r in range(np.uint64(rows)):
                row = np.uint64(first_row) + r + dy
                base = r * width
                for q in range(width):
                    cols[k, base + q] = phases[c, plane, row, dx + q]


def takes(x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether a convolution of these arrays takes the row chunks: numpy
    float32 or float64, 2-D, one group, C-contiguous, numba available, and
    columns at least :data:`MIN_DEPTH` deep."""
    return bool(
        isinstance(x, np.ndarray)
        and x.ndim == 4
        and w.ndim == 4
        and group == 1
        and x.dtype in _DTYPES
        and x.dtype == w.dtype == out.dtype
        and all(a.flags.c_contiguous for a in (x, w, out))
        and math.prod(w.shape[1:]) >= MIN_DEPTH
        and out.size > 0
        and _jit.available()
    )


def bind_row_chunks(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    constant_weights: bool = False,
) -> Callable[[], None]:
    """``out = activation(conv(x, w) + bias)`` for :func:`takes`' arrays,
    as a call without arguments.

    :param bias: ``(M,)`` or ``None``.
    :param begin: the pads before each spatial axis.
    :param constant_weights: ``w``'s values are fixed for the binding's
        life (a parameter): float32 chunks multiply by weights packed once
        (:mod:`asyncrt.ops._panel_conv`), each chunk's product bound now.
    """
    n, c = x.shape[:2]
    m, _, k_h, k_w = w.shape
    out_h, out_w = out.shape[2:]
    (s_h, s_w), (d_h, d_w), (p_h, p_w) = strides, dilations, begin
    # Each phase holds the padded cells at one (row, column) offset modulo
    # the strides; a tap reads a window of one phase.
    phase_h = out_h + (k_h - 1) * d_h // s_h
    phase_w = out_w + (k_w - 1) * d_w // s_w
    phases = np.empty((c, s_h * s_w, phase_h, phase_w), x.dtype)
    taps = np.array(
        [
            (
                (i * d_h % s_h) * s_w + j * d_w % s_w,
                i * d_h // s_h,
                j * d_w // s_w,
            )
            for i in range(k_h)
            for j in range(k_w)
        ],
        np.int64,
    )
    depth = c * len(taps)
    rows = max(1, min(out_h, CHUNK_BYTES // (depth * out_w * x.itemsize)))
    cols = np.empty((depth, rows * out_w), x.dtype)
    weights = w.reshape(m, depth)
    planes = out.reshape(n, m, out_h * out_w)
    chunks = [(top, min(rows, out_h - top)) for top in range(0, out_h, rows)]
    gather = _jit.compile_kernel(_gather_rows)
    bias_view = None if bias is None else bias.reshape(1, m, 1, 1)
    epilogue = bind_bias_activation(np, out, bias_view, out, activation)
    copyto, matmul = np.copyto, _team_blas.matmul
    # The phases and each chunk's columns, compiled passes split over the
    # kernel threads by input channels (one thread took as long as the
    # chunk's GEMM on two: 64 -> 128 channels at stride 2, 56 x 56).
    cells = c * phase_h * phase_w * s_h * s_w
    by_channel = _team_parts.shares(c, cells, MIN_WORK_PER_THREAD)
    splits = [
        _jit.bind_parts(
            phase_splitter(s_w),
            (x[image], phases),
            by_channel,
            trailing=(s_h, s_w, p_h, p_w),
            work=cells,
        )
        for image in range(n)
    ]

    def split(image: int) -> None:
        """The image's padded cells into their phases."""
        splits[image]()

    def gather_into(target: Array, top: int, count: int) -> Callable[[], None]:
        """The columns of output rows ``top : top + count`` into ``target``."""
        cells = depth * count * out_w
        shares = _team_parts.shares(c, cells, MIN_WORK_PER_THREAD)
        return _jit.bind_parts(
            gather,
            (phases, target, taps),
            shares,
            trailing=(top, count, out_w),
            work=cells,
        )

    positions = out_h * out_w
    group = 1
    if rows == out_h and n > 1 and positions <= GROUP_MAX_POSITIONS:
        group = max(1, min(n, GROUP_BYTES // (depth * positions * x.itemsize)))
    if group > 1:
        # Whole images' columns side by side: one GEMM for the group (a
        # plane's few positions make a narrow GEMM that reads all the
        # weights per image), its products copied into the NCHW planes.
        cols = np.empty((depth, group * positions), x.dtype)
        result = np.empty((m, group * positions), x.dtype)
        views = [cols[:, i * positions : (i + 1) * positions] for i in range(group)]
        gathers = [gather_into(view, 0, out_h) for view in views]

        def grouped() -> None:
            for start in range(0, n, group):
                size = min(group, n - start)
                for i in range(size):
                    split(start + i)
                    gathers[i]()
                span = size * positions
                matmul(weights, cols[:, :span], out=result[:, :span])
                products = result[:, :span].reshape(m, size, positions)
                copyto(planes[start : start + size].transpose(1, 0, 2), products)
            epilogue()

        return grouped

    finished = [True]  # whether every chunk's product adds bias and activation

    def product(image: int, top: int, count: int) -> Callable[[], None]:
        """The chunk's GEMM into its run of the image's planes (the bias and
        activation added as the packed kernel stores its blocks)."""
        span = count * out_w
        into = planes[image, :, top * out_w : top * out_w + span]
        matrix = cols[:, :span]
        if constant_weights and _panel_conv.takes(
            weights, matrix[None], into[None], bias
        ):
            return _panel_conv.bind(
                weights,
                matrix[None],
                into[None],
                bias=bias,
                activation=activation,
            )
        finished[0] = False
        return functools.partial(matmul, weights, matrix, out=into)

    products = [[product(i, top, count) for top, count in chunks] for i in range(n)]
    gathers = [gather_into(cols, top, count) for top, count in chunks]
    after = None if finished[0] else epilogue

    def row_chunks() -> None:
        for image, multiplies in enumerate(products):
            split(image)
            for fill, multiply in zip(gathers, multiplies, strict=True):
                fill()
                multiply()
        if after is not None:
            after()

    return row_chunks
