"""Strided convolution as im2col by one copy per kernel tap, plus one GEMM.

numpy gathering a strided convolution's column matrix from a 6-D strided
view of the padded input (one ``ascontiguousarray``) walks it element by
element through six nested axes: the stem of a CNN (3 -> 16 channels,
3 x 3, stride 2 at 224 x 224) took 630 us for 10.8 MFLOP that BLAS
multiplies in 85. Here the padded input is first split into its phases
(the cells at each offset modulo the strides: four for stride 2, one
strided copy of the input in all), so that every kernel tap's cells are a
window of one phase, whose rows are contiguous; the column matrix ``cols
(N, C, *kernel, *out)`` is filled by one copy per tap from those windows.
Then ``W (group, M / group, K) @ cols`` writes the planned output
directly, the output positions (the long axis) last. With strides of 1
(large column matrices, see :mod:`asyncrt.ops.nn`) the padded input is
the one phase, and the GEMM covers the real output positions only (the
flat-plane im2col's also covers its padded rows' junk columns).

The column matrix is the same as numpy's gather makes, so results are the
same BLAS products. The padded input's borders are written once, its
interior every call. Scratch is kept by a binding where it fits in
``BOUND_SCRATCH_BYTES``, else borrowed from the calling thread per call
(:mod:`asyncrt.ops._scratch`: fresh megabytes per call are slow).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _common, _panel_conv, _scratch, _team_blas
from ._common import Array
from ._conv_epilogue import bind_bias_activation

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
    activation: str = "none",
    limit: float | None = None,
    constant_weights: bool = False,
) -> Callable[[], None]:
    """``out = activation(conv(x, w) + bias)`` (:mod:`._conv_epilogue`) as a
    call without arguments, bound to these arrays.

    :param x: ``(N, C, *spatial)``.
    :param w: ``(M, C / group, *kernel)``.
    :param bias: ``(M,)`` or ``None``.
    :param out: ``(N, M, *out_spatial)``, C-contiguous.
    :param begin: the pads before each spatial axis (the pads after follow
        from the shapes).
    :param limit: scratch kept by the binding at most (default
        ``BOUND_SCRATCH_BYTES``); more is allocated per call.
    :param constant_weights: ``w``'s values are fixed for the binding's
        life (a parameter): with the column matrix kept, one group and
        float32, the GEMM multiplies by weights packed once
        (:mod:`asyncrt.ops._panel_conv`).
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
    everything = (slice(None), slice(None))
    # With strides, the padded input is split into its phases first (the
    # cells at each offset modulo the stride, one strided copy of the input
    # in all): every tap's cells are then a window of one phase, rows of
    # contiguous cells, not a stride-2 walk per tap.
    # One tap (a 1x1 kernel) reads one strided window: copied straight into
    # the column matrix, no phase first.
    phased = any(s > 1 for s in strides) and len(taps) > 1
    # (only the phases some tap reads)
    phases = sorted(
        {
            tuple(t * d % s for t, d, s in zip(tap, dilations, strides, strict=True))
            for tap in taps
        }
    )
    phase_picks = [
        (*everything, *(slice(r, None, s) for r, s in zip(phase, strides, strict=True)))
        for phase in phases
    ]
    phase_shapes = [
        (
            n,
            c,
            *(
                -(-(e - r) // s)
                for e, r, s in zip(extents, phase, strides, strict=True)
            ),
        )
        for phase in phases
    ]

    def window(tap: tuple[int, ...]) -> tuple[int, tuple[slice, ...]]:
        """The tap's phase (its index) and its window of that phase; with
        no phases, 0 and its strided window of the padded input."""
        geometry = list(zip(tap, dilations, strides, out_spatial, strict=True))
        if not phased:
            return 0, (
                *everything,
                *(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, s, o in geometry),
            )
        phase = tuple(t * d % s for t, d, s, _ in geometry)
        return phases.index(phase), (
            *everything,
            *(slice(t * d // s, t * d // s + o) for t, d, s, o in geometry),
        )

    windows = [window(tap) for tap in taps]
    positions = math.prod(out_spatial)
    weights = w.reshape(group, m // group, -1)
    result = out.reshape(n, group, m // group, positions)
    bias_view = None if bias is None else bias.reshape(1, m, *(1,) * rank)
    cells = n * c * len(taps) * positions
    cells += n * c * math.prod(extents) * (int(pads) + int(phased))
    copyto, matmul = xp.copyto, (_team_blas.matmul if xp is np else xp.matmul)

    shapes = (
        *((padded_shape,) if pads else ()),
        *(phase_shapes if phased else ()),
        (n, c, *kernel, *out_spatial),
    )

    def copies(scratch: list[Array]) -> tuple[list[tuple[Array, Array]], Array]:
        """The copies a call makes into ``scratch`` (arrays of ``shapes``),
        in order (into the padded input, its phases, the column matrix's
        rows), and the column matrix."""
        padded = scratch[0] if pads else x
        steps = [(padded[inner], x)] if pads else []
        sources = [padded]
        if phased:
            sources = scratch[int(pads) : -1]
            steps += zip(sources, [padded[pick] for pick in phase_picks], strict=True)
        cols = scratch[-1]
        by_tap = cols.reshape(n, c, len(taps), *out_spatial)
        for i, (phase, window) in enumerate(windows):
            # (with strides of 1 the one phase is the padded input itself)
            steps.append((by_tap[:, :, i], sources[phase][window]))
        return steps, cols.reshape(n, group, -1, positions)

    epilogue = bind_bias_activation(xp, out, bias_view, out, activation)

    def compute(steps: list[tuple[Array, Array]], matrix: Array) -> None:
        for target, source in steps:
            copyto(target, source)
        matmul(weights, matrix, out=result)
        epilogue()

    if cells * x.itemsize <= limit:
        kept = [xp.empty(shape, dtype=x.dtype) for shape in shapes]
        if pads:
            kept[0].fill(0)  # the borders stay zero: only the interior is written
        prepared = copies(kept)
        steps, matrix = prepared
        flat = (matrix.reshape(n, -1, positions), result.reshape(n, -1, positions))
        if (
            constant_weights
            and group == 1
            and xp is np
            and _panel_conv.takes(weights[0], *flat, bias)
        ):
            # the bias and activation added as the blocks are stored
            multiply = _panel_conv.bind(
                weights[0],
                *flat,
                bias=bias,
                activation=activation,
            )

            def packed() -> None:
                for target, source in steps:
                    copyto(target, source)
                multiply()

            return packed

        def strided() -> None:
            compute(*prepared)

        return strided
    if xp is not np:

        def allocating() -> None:
            fresh = [xp.zeros(shape, dtype=x.dtype) for shape in shapes]
            compute(*copies(fresh))

        return allocating
    # The views into the thread's scratch, made again only if it moved.
    cache: list[Any] = [None, None, None]

    # The padded input's borders: one slab before and one after the
    # interior along each spatial axis.
    slabs = [
        (*everything, *(slice(None),) * axis, side)
        for axis, (b, e) in enumerate(zip(begin, spatial, strict=True))
        for side in (slice(0, b), slice(b + e, None))
    ]

    def borrowed() -> None:
        scratch = _scratch.borrow(shapes, x.dtype)
        key = scratch[-1].ctypes.data
        if cache[0] != key:
            borders = [scratch[0][slab] for slab in slabs] if pads else []
            cache[:] = [key, copies(scratch), borders]
        for border in cache[2]:
            border.fill(0)  # other kernels on this thread wrote over them
        compute(*cache[1])

    return borrowed
