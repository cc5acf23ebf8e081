"""2-D max and average pooling along the NCHW planes, in explicit LLVM
vectors.

The planar loop (:mod:`asyncrt.ops._depthwise`) pools a strided window by
copying each plane's columns into phases first (one phase per column
stride), then taking the maxima along contiguous runs: two passes over
the input. Here a numba intrinsic (:mod:`asyncrt.ops._vector_ir`) takes
a row of :func:`asyncrt.ops._dwvector.lanes` outputs at once straight
from the planes: for each tap, one vector load at unit stride, or at
stride 2 two loads and a shuffle that keeps every other lane; rows
outside the input count as -inf (a select, no branch). Columns whose
windows reach past the row's ends (the pads) take a scalar loop.

Maxima of rows of a vector or more take two steps instead: each output
row's window rows folded into one row of column maxima (a vector load of
each input row per vector of columns), its pads -inf, then that row's
taps at the column stride: ``KH + KW`` loads per output vector where the
windows take ``KH x KW`` (stride 2: twice as many). ResNet's 3 x 3
stride-2 pooling of 64 planes of 112 x 112, two threads: 273 -> 118 us.

Results: each window's maximum as ``np.maximum`` folds it: NaN if any
input of the window is NaN; of equal zeros either sign may come out, as
the folds' order decides. Or each window's sum, taps in row-major order
(pads add nothing), times the output cell's scale in the same pass (an
average's ``1 / count``): within float32 rounding of numpy's folds, which
add in another order; inf + -inf is NaN. float32, unit dilation, column
strides 1 and 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _jitmath, _team_parts
from ._common import Array
from ._vector_ir import compile_vectors

__all__ = ("MIN_WORK_PER_THREAD", "bind", "takes")

#: Window cells a kernel thread compares at least before the pooling is
#: split over threads (a hand-off costs tens of microseconds).
MIN_WORK_PER_THREAD = 2_000_000

_SOURCE = (
    "\n".join(_jitmath.head()[1:])
    + """
KH, KW, SH, SW, LANES = {geometry}
REDUCE = "{reduce}"


def _maximum(builder, best, v):
    # np.maximum: best unless v is larger or NaN (best NaN stays)
    keep = builder.or_(
        builder.fcmp_ordered(">=", best, v),
        builder.fcmp_unordered("uno", best, best),
    )
    return builder.select(keep, best, v)


def _strided_load(builder, e, source, at):
    # LANES cells of source from at, SW apart: at stride 2, every other
    # lane of two loads (at and at + LANES - 1: the second ends on the
    # last cell, never past it)
    if SW == 1:
        return e.load(source, at)
    low = e.load(source, at)
    high = e.load(source, builder.add(at, e.const(LANES - 1)))
    masks = ir.VectorType(ir.IntType(32), LANES)
    every_other = [2 * k if 2 * k < LANES else 2 * k + 1 for k in range(LANES)]
    return builder.shuffle_vector(low, high, ir.Constant(masks, every_other))


def _plane_row(builder, e, plane, row, height, width):
    # (whether row lies inside the plane, the flat cell where it starts:
    # row 0's where it does not)
    inside = builder.and_(
        builder.icmp_signed(">=", row, e.const(0)),
        builder.icmp_signed("<", row, height),
    )
    safe = builder.select(inside, row, e.const(0))
    return inside, e.index((e.index((plane, height), safe), width))


@intrinsic
def pool_block_(typingctx, x, scale, out, plane, i, j0, top, left):
    # out[plane, i, j0:j0 + LANES]: each window's maximum (its rows outside
    # x as -inf), or its sum (as 0) times scale[i, j0:j0 + LANES]; every
    # column the window reads lies inside x's rows
    arrays = ((x, 3), (scale, 2), (out, 3))
    if not all(_is_float_array(a, ndim) for a, ndim in arrays):
        return None

    def codegen(context, builder, signature, args):
        e = _Emit(context, builder, LANES)
        source, factors, target = e.arrays(signature, args, 3)
        plane, i, j0, top, left = args[3:]
        _, height, width = cgutils.unpack_tuple(builder, source.shape, 3)
        _, out_h, out_w = cgutils.unpack_tuple(builder, target.shape, 3)
        summing = REDUCE == "sum"
        lowest = e.splat(0.0 if summing else float("-inf"))
        first_column = builder.sub(builder.mul(j0, e.const(SW)), left)
        best = lowest
        for a in range(KH):
            row = builder.sub(e.index((i, e.const(SH)), e.const(a)), top)
            inside, start = _plane_row(builder, e, plane, row, height, width)
            start = builder.add(start, first_column)
            for b in range(KW):
                v = _strided_load(builder, e, source, builder.add(start, e.const(b)))
                v = builder.select(inside, v, lowest)
                if summing:
                    best = builder.fadd(best, v)
                else:
                    best = _maximum(builder, best, v)
        if summing:
            best = builder.fmul(best, e.load(factors, e.index((i, out_w), j0)))
        cell = e.index((e.index((plane, out_h), i), out_w), j0)
        e.store(best, target, cell)
        return context.get_dummy_value()

    intp = types.intp
    return types.none(x, scale, out, intp, intp, intp, intp, intp), codegen


@intrinsic
def column_block_(typingctx, x, row, plane, r0, j0, left):
    # row[left + j0 : left + j0 + LANES]: the maximum of x's rows r0 to
    # r0 + KH - 1 (those outside x as -inf) at columns j0 ...
    arrays = ((x, 3), (row, 1))
    if not all(_is_float_array(a, ndim) for a, ndim in arrays):
        return None

    def codegen(context, builder, signature, args):
        e = _Emit(context, builder, LANES)
        source, target = e.arrays(signature, args, 2)
        plane, r0, j0, left = args[2:]
        _, height, width = cgutils.unpack_tuple(builder, source.shape, 3)
        lowest = e.splat(float("-inf"))
        best = lowest
        for a in range(KH):
            r = builder.add(r0, e.const(a))
            inside, start = _plane_row(builder, e, plane, r, height, width)
            v = e.load(source, builder.add(start, j0))
            best = _maximum(builder, best, builder.select(inside, v, lowest))
        e.store(best, target, builder.add(left, j0))
        return context.get_dummy_value()

    intp = types.intp
    return types.none(x, row, intp, intp, intp, intp), codegen


@intrinsic
def row_block_(typingctx, row, out, plane, i, j0):
    # out[plane, i, j0:j0 + LANES]: the maximum of KW cells of row at
    # stride SW from j0 * SW (row: a window's column maxima, its pads
    # -inf), as pool_block_'s taps of one row
    arrays = ((row, 1), (out, 3))
    if not all(_is_float_array(a, ndim) for a, ndim in arrays):
        return None

    def codegen(context, builder, signature, args):
        e = _Emit(context, builder, LANES)
        source, target = e.arrays(signature, args, 2)
        plane, i, j0 = args[2:]
        _, out_h, out_w = cgutils.unpack_tuple(builder, target.shape, 3)
        first_column = builder.mul(j0, e.const(SW))
        taps = [
            _strided_load(builder, e, source, builder.add(first_column, e.const(b)))
            for b in range(KW)
        ]
        best = taps[0]
        for v in taps[1:]:
            best = _maximum(builder, best, v)
        cell = e.index((e.index((plane, out_h), i), out_w), j0)
        e.store(best, target, cell)
        return context.get_dummy_value()

    intp = types.intp
    return types.none(row, out, intp, intp, intp), codegen


@numba.njit(inline="always", error_model="numpy")
def window_(x, scale, plane, i, j, top, left):
    # one output of pool_block_, in the same order
    height, width = x.shape[1], x.shape[2]
    best = _ZERO if REDUCE == "sum" else _F(-np.inf)
    for a in range(KH):
        r = i * SH + a - top
        if r < 0 or r >= height:
            continue
        for b in range(KW):
            c = j * SW + b - left
            if 0 <= c < width:
                if REDUCE == "sum":
                    best = best + x[plane, r, c]
                else:
                    best = max_(best, x[plane, r, c])
    return best * scale[i, j] if REDUCE == "sum" else best


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, scale, out, first, last, top, left):
    # planes first:last of out (P, OH, OW) = pooling of x (P, H, W)
    if REDUCE == "max" and min(x.shape[2], out.shape[2]) >= LANES:
        separable_max(x, out, first, last, top, left)
        return
    width = x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    # the vector blocks: their columns from j0 * SW - left >= 0 to
    # (j0 + LANES - 1) * SW + KW - 1 - left inside the row; the last block
    # may overlap the one before (its outputs are computed twice, alike)
    low = -(-left // SW)
    high = (width - 1 + left - (LANES - 1) * SW - (KW - 1)) // SW
    last_block = min(high, out_w - LANES)
    for plane in range(first, last):
        for i in range(out_h):
            j = 0
            if last_block >= low:
                while j < low:
                    out[plane, i, j] = window_(x, scale, plane, i, j, top, left)
                    j += 1
                while j < last_block + LANES:
                    j0 = min(j, last_block)
                    pool_block_(x, scale, out, plane, i, j0, top, left)
                    j = j0 + LANES
            while j < out_w:
                out[plane, i, j] = window_(x, scale, plane, i, j, top, left)
                j += 1


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def separable_max(x, out, first, last, top, left):
    # kernel's maxima, a window's rows folded first (each input row's
    # cells in turn, unit stride) into a row of column maxima whose pads
    # are -inf, then that row's KW taps at the column stride: KH + KW
    # vector loads per output vector where pool_block_ takes KH x KW (SW
    # 2: twice over); the same maxima (folded in another order: of equal
    # zeros either sign may come out, as with np.maximum's folds)
    width = x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    # the row reaches the last block's second load (LANES - 1 past its
    # last tap's column), -inf past the input's columns
    span = max(left + width, (out_w - 1) * SW + KW + (LANES - 1) * SW)
    row = np.full(span, -np.inf, np.float32)
    for plane in range(first, last):
        for i in range(out_h):
            r0 = i * SH - top
            j = 0
            while j < width:  # (rows of a vector or more)
                j0 = min(j, width - LANES)
                column_block_(x, row, plane, r0, j0, left)
                j = j0 + LANES
            j = 0
            while j < out_w:
                j0 = min(j, out_w - LANES)
                row_block_(row, out, plane, i, j0)
                j = j0 + LANES
"""
)


@functools.cache
def _kernel(geometry: tuple[int, ...], reduce: str) -> Callable[..., None]:
    """The loop for ``(KH, KW, SH, SW, LANES)`` and ``reduce`` (``"max"``
    or ``"sum"``), compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_poolvector", _SOURCE, "kernel", geometry=geometry, reduce=reduce
    )


def takes(
    x: Array, out: Array, strides: tuple[int, ...], dilations: tuple[int, ...]
) -> bool:
    """Whether :func:`bind` pools these arrays: numpy float32, 2-D,
    C-contiguous, unit dilation, column stride 1 or 2, the compiled engine
    available."""
    return bool(
        isinstance(x, np.ndarray)
        and isinstance(out, np.ndarray)
        and x.ndim == 4
        and x.dtype == out.dtype == np.float32
        and x.flags.c_contiguous
        and out.flags.c_contiguous
        and len(strides) == 2
        and strides[1] in (1, 2)
        and all(d == 1 for d in dilations)
        and _jit.available()
    )


def bind(
    x: Array,
    out: Array,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    scale: Array | float | None = None,
) -> Callable[[], None]:
    """Pooling of :func:`takes`' arrays as a call without arguments,
    compiled now: each window's maximum, or with ``scale`` its sum (pads
    count zero) times ``scale``.

    :param kernel: the window's rows and columns.
    :param begin: the pads before the rows and the columns.
    :param scale: a number, or one per output cell ``(..., OH, OW)``
        (average pooling's ``1 / count``).
    """
    n, c, height, width = x.shape
    planes = x.reshape(n * c, height, width)
    pooled = out.reshape(n * c, *out.shape[2:])
    reduce = "max" if scale is None else "sum"
    factors = np.empty(out.shape[2:], np.float32)  # read by "sum" only
    if scale is not None:
        factors[...] = scale
    loop = _kernel((*kernel, *strides, _dwvector.lanes()), reduce)
    work = out.size * kernel[0] * kernel[1]
    shares = _team_parts.shares(n * c, work, MIN_WORK_PER_THREAD)
    return _jit.bind_parts(
        loop, (planes, factors, pooled), shares, trailing=begin, work=work
    )
