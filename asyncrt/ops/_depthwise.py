"""Depthwise 2-D convolution as a compiled kernel of its own.

A depthwise convolution (one input and one output channel per group, as
MobileNets and EfficientNets use) has a few multiply-adds per output
element: as a matmul it is a batch of one-row products (im2col copies
``Kh * Kw`` times the input for them), as numpy passes it is two calls per
kernel tap. Compiled loops (:mod:`asyncrt.ops._jit`) do it in one of two
layouts, chosen by the output's width:

* **NCHW planes** (outputs at least :data:`PLANAR_MIN_WIDTH` wide): each
  input plane is copied into a flat zero-padded plane, and each tap adds
  its weight times a shifted run of that plane to a run of outputs at the
  padded pitch, summed at stride 1 along the columns (a stride-2 output
  keeps every second column): one long contiguous loop per tap, which LLVM
  vectorises (it does not vectorise stride-2 loads, and rows of 28-56
  columns are short loops). No layout copies. Measured (AMD EPYC VM, one
  thread, against channels-last): 16 channels of 112 x 112, 3 x 3 stride
  2: 248 -> 127 us; 72 of 56 x 56 stride 2: 218 -> 173 us; 88 of 28 x 28,
  stride 1: 163 -> 122 us.
* **Channels-last pixels** (narrower outputs, where rows are too short):
  the input goes channels-last first (one numpy copy, ``(N, H, W, C)``),
  and a loop computes each output pixel's channel vector: the bias, then
  for each tap inside the input (padding is the taps skipped, never a
  padded copy) the tap's weights times the input pixel's channels, added
  in place, the inner loop contiguous over channels. A second copy brings
  the result back to NCHW. Measured (one thread, against im2col): 240
  channels of 14 x 14, 5 x 5: 440 -> 144 us; 576 of 7 x 7: 350 -> 67 us.

The activation (ReLU) is applied afterwards in place. Both layouts sum in
the same order (the bias first, then the taps in row-major order; BLAS
sums in an order of its own), so results equal the im2col kernel's within
a few float32 ulps of each output's magnitude. NaN and infinities
propagate as IEEE arithmetic has them (pads are zeros added, or taps
skipped; no structural zeros multiply input cells, as the banded matmul's
do). Work is split over the kernel threads
(:func:`asyncrt.runtime._threads.run_parts`), by output rows or channels,
where it is large enough."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..runtime import _threads
from . import _jit
from ._common import Array

__all__ = (
    "MIN_CHANNELS",
    "MIN_WORK_PER_THREAD",
    "PLANAR_MIN_WIDTH",
    "bind_depthwise",
    "takes",
)

#: Fewer channels than this take the im2col or banded paths where the
#: output is narrower than :data:`PLANAR_MIN_WIDTH`: the channel vectors are
#: too short to pay for the channels-last copies (8 channels of 16 x 16 at
#: batch 32: 292 against 183 us); the planar loop needs no copies.
MIN_CHANNELS = 16

#: Multiply-adds each thread gets at least before a convolution is split
#: over threads: about 100 us of work (a hand-off costs tens of
#: microseconds, and BLAS threads may still be spinning on the cores).
MIN_WORK_PER_THREAD = 2_000_000

#: Outputs at least this wide are computed on the NCHW planes, along their
#: rows (no layout copies); narrower ones channels-last. One thread, 3 x 3
#: unless said: 8 channels of 16 x 16 at batch 2 5.8 us planar against 19.4
#: channels-last (and 17.8 by im2col); 64 of 14 x 14 19.9 against 26.7; 96
#: of 14 x 14, 5 x 5, 50.6 against 54.1; but at width 7, 64 channels 8.6
#: against 6.6 and 576 channels 68.5 against 43.3.
PLANAR_MIN_WIDTH = 8
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _depthwise_pixels(  # pragma: no cover - compiled by numba
    x: Any,
    w: Any,
    bias: Any,
    out: Any,
    first: int,
    last: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
) -> None:
    """Output rows ``first:last`` of ``out (N, OH, OW, C) = depthwise(x (N,
    H, W, C), w (KH, KW, C)) + bias (C,)``, all channels-last."""
    batch, height, width, channels = x.shape
    out_w = out.shape[2]
    k_h, k_w = w.shape[0], w.shape[1]
    # Plain indices, no views: numba counts every view's references
    # (atomics), which cost more than the arithmetic here (about 20%).
    for n in range(batch):
        for i in range(first, last):
            for j in range(out_w):
                for c in range(channels):
                    out[n, i, j, c] = bias[c]
                for kh in range(k_h):
                    row = i * stride_h - pad_h + kh * dilation_h
                    if row < 0 or row >= height:
                        continue
                    for kw in range(k_w):
                        column = j * stride_w - pad_w + kw * dilation_w
                        if column < 0 or column >= width:
                            continue
                        for c in range(channels):
                            out[n, i, j, c] += w[kh, kw, c] * x[n, row, column, c]


def _depthwise_planes(  # pragma: no cover - compiled by numba
    x: Any,
    w: Any,
    bias: Any,
    out: Any,
    plane: Any,
    line: Any,
    first: int,
    last: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
) -> None:
    """Channels ``first:last`` of ``out (N, C, OH, OW) = depthwise(x (N, C,
    H, W), w (C, KH, KW)) + bias (C,)``, on the NCHW planes.

    Each input plane is copied into ``plane``, a flat padded plane (its
    borders zero, never written here) of row pitch ``pitch``. Summed at
    stride 1 along the columns, a tap's contribution to a run of output
    rows is then one contiguous loop over ``line`` (the outputs at that
    pitch) against a shifted run of ``plane``: long loops over contiguous
    data that LLVM vectorises (it does not vectorise stride-2 loads, nor
    short rows well). With a row stride of 1 a run is the whole plane;
    otherwise it is one row. Every ``stride_w``-th column of ``line`` is
    the output.
    """
    batch, _, height, width = x.shape
    out_h, out_w = out.shape[2], out.shape[3]
    k_h, k_w = w.shape[1], w.shape[2]
    full = (out_w - 1) * stride_w + 1
    pitch = full + (k_w - 1) * dilation_w
    rows = (out_h - 1) * stride_h + (k_h - 1) * dilation_h + 1
    # The input cells inside the padded plane (the last may lie beyond it).
    used_h = min(height, rows - pad_h)
    used_w = max(0, min(width, pitch - pad_w))
    block = out_h if stride_h == 1 else 1  # output rows a run covers
    span = np.uint64(block * pitch)
    for n in range(batch):
        for c in range(first, last):
            for r in range(used_h):
                into = np.uint64((r + pad_h) * pitch + pad_w)
                for q in range(np.uint64(used_w)):
                    plane[into + q] = x[n, c, r, q]
            for i in range(0, out_h, block):
                for q in range(span):
                    line[q] = bias[c]
                for kh in range(k_h):
                    top = (i * stride_h + kh * dilation_h) * pitch
                    for kw in range(k_w):
                        tap = w[c, kh, kw]
                        # Unsigned indices: numba wraps negative signed
                        # ones around, which stops LLVM vectorising (8x).
                        start = np.uint64(top + kw * dilation_w)
                        for q in range(span):
                            line[q] += tap * plane[start + q]
                for b in range(block):
                    for j in range(out_w):
                        out[n, c, i + b, j] = line[b * pitch + j * stride_w]


def takes(xp: ModuleType, x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether a convolution of these arrays is depthwise and compiles:
    numpy, 2-D, one input and one output channel per group, float32 or
    float64, C-contiguous, at least :data:`MIN_CHANNELS` channels or an
    output :data:`PLANAR_MIN_WIDTH` wide, and the compiled engine
    available."""
    return bool(
        xp is np
        and _jit.available()
        and x.ndim == 4
        and w.ndim == 4
        and x.dtype in _DTYPES
        and x.dtype == w.dtype == out.dtype
        and w.shape[1] == 1
        and w.shape[0] == group == x.shape[1]
        and (x.shape[1] >= MIN_CHANNELS or out.shape[3] >= PLANAR_MIN_WIDTH)
        and all(a.flags.c_contiguous for a in (x, w, out))
    )


def bind_depthwise(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    relu: bool = False,
) -> Callable[[], None]:
    """The depthwise convolution of :func:`takes`' arrays as a call without
    arguments (compiled on the first binding of a process): its
    channels-last buffers made once.

    :param bias: ``(C,)`` or ``None``.
    :param begin: the pads before each spatial axis (those after follow
        from the shapes).
    """
    if out.shape[3] >= PLANAR_MIN_WIDTH:
        return _bind_planes(x, w, bias, out, (*strides, *begin, *dilations), relu)
    kernel = _jit.compile_kernel(_depthwise_pixels)
    n, channels = x.shape[:2]
    out_h, out_w = out.shape[2:]
    pixels = np.empty((n, *x.shape[2:], channels), x.dtype)
    result = np.empty((n, out_h, out_w, channels), x.dtype)
    taps = np.empty((*w.shape[2:], channels), x.dtype)
    shift = np.zeros(channels, x.dtype) if bias is None else bias
    source, weights = x.transpose(0, 2, 3, 1), w[:, 0].transpose(1, 2, 0)
    planar = result.transpose(0, 3, 1, 2)
    geometry = (*strides, *begin, *dilations)
    parts = [
        functools.partial(kernel, pixels, taps, shift, result, first, last, *geometry)
        for first, last in _shares(out, w, out_h)
    ]
    # compiled for these arrays' types now (weights and biases are read-only
    # parameters), not in the first run
    _jit.specialise(kernel, (pixels, taps, shift, result, 0, out_h, *geometry))
    compute = _together(parts)
    copyto, maximum = np.copyto, np.maximum

    def depthwise() -> None:
        copyto(taps, weights)  # parameters may be reloaded
        copyto(pixels, source)
        compute()
        copyto(out, planar)
        if relu:
            maximum(out, 0, out=out)

    return depthwise


def _bind_planes(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    geometry: tuple[int, ...],
    relu: bool,
) -> Callable[[], None]:
    """:func:`bind_depthwise` on the NCHW planes (no layout copies)."""
    kernel = _jit.compile_kernel(_depthwise_planes)
    channels = x.shape[1]
    out_h, out_w = out.shape[2:]
    k_h, k_w = w.shape[2:]
    stride_h, stride_w, _, _, dilation_h, dilation_w = geometry
    pitch = (out_w - 1) * stride_w + 1 + (k_w - 1) * dilation_w
    rows = (out_h - 1) * stride_h + (k_h - 1) * dilation_h + 1
    block = out_h if stride_h == 1 else 1
    taps = w.reshape(channels, k_h, k_w)
    shift = np.zeros(channels, x.dtype) if bias is None else bias
    shares = _shares(out, w, channels)
    # A run's last tap reads (k_w - 1) * dilation_w cells past the plane.
    planes = np.zeros((len(shares), rows * pitch + (k_w - 1) * dilation_w), x.dtype)
    lines = np.empty((len(shares), block * pitch), x.dtype)
    parts = [
        functools.partial(
            kernel, x, taps, shift, out, plane, line, first, last, *geometry
        )
        for plane, line, (first, last) in zip(planes, lines, shares, strict=True)
    ]
    _jit.specialise(
        kernel, (x, taps, shift, out, planes[0], lines[0], 0, channels, *geometry)
    )
    compute = _together(parts)
    maximum = np.maximum

    def depthwise() -> None:
        compute()
        if relu:
            maximum(out, 0, out=out)

    return depthwise


def _shares(out: Array, w: Array, extent: int) -> list[tuple[int, int]]:
    """``range(extent)`` cut into one ``(first, last)`` share per kernel
    thread the work pays for."""
    work = out.size * math.prod(w.shape[2:])
    threads = min(_threads.limits.threads, extent, work // MIN_WORK_PER_THREAD)
    share = -(-extent // max(threads, 1))
    return [(i, min(i + share, extent)) for i in range(0, extent, share)]


def _together(parts: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """One call running ``parts`` on the kernel threads (the first here)."""
    if len(parts) == 1:
        return parts[0]
    return functools.partial(_threads.run_parts, parts)
