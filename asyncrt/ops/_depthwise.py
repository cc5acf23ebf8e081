"""Depthwise 2-D convolution as a compiled kernel of its own.

A depthwise convolution (one input and one output channel per group, as
MobileNets and EfficientNets use) has a few multiply-adds per output
element: as a matmul it is a batch of one-row products (im2col copies
``Kh * Kw`` times the input for them), as numpy passes it is two calls per
kernel tap, and a loop over an NCHW plane runs along rows of 7 to 56
columns (too short to vectorise, strided for stride 2: 2-3 GFLOP/s here).
So the input goes channels-last first (one numpy copy, ``(N, H, W, C)``),
and a compiled loop (:mod:`asyncrt.ops._jit`) computes each output pixel's
channel vector: the bias, then for each tap inside the input (padding is
the taps skipped, never a padded copy) the tap's weights times the input
pixel's channels, added in place, the inner loop contiguous over channels
(vectorised by LLVM). A second copy brings the result back to NCHW, where
the activation (ReLU) is applied. Measured (AMD EPYC VM, one thread):
240 channels of 14 x 14, 5 x 5: 440 -> 144 us; 576 of 7 x 7: 350 -> 67 us;
72 of 56 x 56, 3 x 3 stride 2: 590 -> 200 us.

Results equal the im2col kernel's up to the order of the sums (the bias
first, then the taps in row-major order; BLAS sums in an order of its
own): within a few float32 ulps of each output's magnitude. NaN and
infinities propagate as IEEE arithmetic has them (no structural zeros, as
the banded matmul has). Output rows are split over the kernel threads
(:func:`asyncrt.runtime._threads.run_parts`) where the work is large
enough.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..runtime import _threads
from . import _jit
from ._common import Array

__all__ = ("MIN_CHANNELS", "MIN_WORK_PER_THREAD", "bind_depthwise", "takes")

#: Fewer channels than this take the im2col or banded paths: the channel
#: vectors are too short to pay for the layout copies (8 channels of 16 x
#: 16 at batch 32: 292 against 183 us).
MIN_CHANNELS = 16

#: Multiply-adds each thread gets at least before a convolution is split
#: over threads: about 100 us of work (a hand-off costs tens of
#: microseconds, and BLAS threads may still be spinning on the cores).
MIN_WORK_PER_THREAD = 2_000_000
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


def takes(xp: ModuleType, x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether a convolution of these arrays is depthwise and compiles:
    numpy, 2-D, one input and one output channel per group, float32 or
    float64, C-contiguous, at least :data:`MIN_CHANNELS` channels, and the
    compiled engine available."""
    return bool(
        xp is np
        and _jit.available()
        and x.ndim == 4
        and w.ndim == 4
        and x.dtype in _DTYPES
        and x.dtype == w.dtype == out.dtype
        and w.shape[1] == 1
        and w.shape[0] == group == x.shape[1] >= MIN_CHANNELS
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
    work = out.size * math.prod(w.shape[2:])
    threads = min(_threads.limits.threads, out_h, work // MIN_WORK_PER_THREAD)
    share = -(-out_h // max(threads, 1))
    parts = [
        functools.partial(
            kernel, pixels, taps, shift, result, i, min(i + share, out_h), *geometry
        )
        for i in range(0, out_h, share)
    ]
    # compiled for these arrays' types now (weights and biases are read-only
    # parameters), not in the first run
    _jit.specialise(kernel, (pixels, taps, shift, result, 0, out_h, *geometry))
    compute = (
        parts[0] if len(parts) == 1 else functools.partial(_threads.run_parts, parts)
    )
    copyto, maximum = np.copyto, np.maximum

    def depthwise() -> None:
        copyto(taps, weights)  # parameters may be reloaded
        copyto(pixels, source)
        compute()
        copyto(out, planar)
        if relu:
            maximum(out, 0, out=out)

    return depthwise
