"""Strided convolution as im2col by one copy per kernel tap, plus one GEMM.

numpy gathering a strided convolution's column matrix from a 6-D strided
view of the padded input (one ``ascontiguousarray``) walks it element by
element through six nested axes: the stem of a CNN (3 -> 16 channels,
3 x 3, stride 2 at 224 x 224) took 630 us for 10.8 MFLOP that BLAS
multiplies in 85. Here the column matrix ``cols (N, C, *kernel, *out)``
is filled by one copy per kernel tap, each a strided view of the padded
input whose rows are the tap's cells at the strides (numpy's 2-D strided
copy loop: 2-3x faster than the 6-D gather, and faster than a compiled
loop, which LLVM does not vectorise for stride-2 loads). Then ``W (group,
M / group, K) @ cols`` writes the planned output directly, the output
positions (the long axis) last.

The column matrix is the same as numpy's gather makes, so results are the
same BLAS products. The padded input's borders are written once, its
interior every call. Scratch is kept by a binding where it fits in
``BOUND_SCRATCH_BYTES``, else allocated per call.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from types import ModuleType

from . import _common
from ._common import Array, add_bias_relu

__all__ = ("bind_strided",)


def bind_strided(
    xp: ModuleType,
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    relu: bool = False,
    limit: float | None = None,
) -> Callable[[], None]:
    """``out = conv(x, w) + bias`` (then ``max(out, 0)`` if ``relu``) as a
    call without arguments, bound to these arrays.

    :param x: ``(N, C, *spatial)``.
    :param w: ``(M, C / group, *kernel)``.
    :param bias: ``(M,)`` or ``None``.
    :param out: ``(N, M, *out_spatial)``, C-contiguous.
    :param begin: the pads before each spatial axis (the pads after follow
        from the shapes).
    :param limit: scratch kept by the binding at most (default
        ``BOUND_SCRATCH_BYTES``); more is allocated per call.
    """
    if limit is None:
        limit = _common.BOUND_SCRATCH_BYTES
    n, c, *spatial = x.shape
    m = w.shape[0]
    kernel, out_spatial = w.shape[2:], out.shape[2:]
    rank = len(kernel)
    # The padded input reaches the last window's last cell (not beyond).
    reach = [
        (o - 1) * s + (k - 1) * d + 1
        for o, s, k, d in zip(out_spatial, strides, kernel, dilations, strict=True)
    ]
    extents = [max(r, b + e) for r, b, e in zip(reach, begin, spatial, strict=True)]
    padded_shape = (n, c, *extents)
    pads = any(begin) or extents != list(spatial)
    inner = (
        slice(None),
        slice(None),
        *(slice(b, b + e) for b, e in zip(begin, spatial, strict=True)),
    )
    taps = list(itertools.product(*(range(k) for k in kernel)))
    picks = [
        (
            slice(None),
            slice(None),
            *(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(tap, dilations, out_spatial, strides, strict=True)
            ),
        )
        for tap in taps
    ]
    positions = math.prod(out_spatial)
    weights = w.reshape(group, m // group, -1)
    result = out.reshape(n, group, m // group, positions)
    bias_view = None if bias is None else bias.reshape(1, m, *(1,) * rank)
    cells = n * c * (math.prod(padded_shape[2:]) * pads + len(taps) * positions)
    copyto, matmul = xp.copyto, xp.matmul

    def buffers() -> tuple[Array, Array, list[Array]]:
        """The padded input (borders zero), the column matrix and its
        rows' views, one per tap."""
        padded = xp.zeros(padded_shape, dtype=x.dtype) if pads else x
        cols = xp.empty((n, c, *kernel, *out_spatial), dtype=x.dtype)
        by_tap = cols.reshape(n, c, len(taps), *out_spatial)
        return padded, cols, [by_tap[:, :, i] for i in range(len(taps))]

    def compute(padded: Array, cols: Array, rows: list[Array]) -> None:
        if pads:
            copyto(padded[inner], x)
        for row, pick in zip(rows, picks, strict=True):
            copyto(row, padded[pick])
        matmul(weights, cols.reshape(n, group, -1, positions), out=result)
        add_bias_relu(xp, out, bias_view, out, relu)

    if cells * x.itemsize <= limit:
        kept = buffers()

        def strided() -> None:
            compute(*kept)

        return strided

    def allocating() -> None:
        compute(*buffers())

    return allocating
