"""Sliding windows over the spatial axes: the geometry convolution and
pooling share.

Inputs are ``(N, C, *spatial)``. The output's spatial shape is the caller's
(the planned output array's) and is the source of truth: ONNX's shape rules,
``ceil_mode`` included, have already decided it. From it and the attributes
we derive the padding, pad once, and take a strided *view* of every window
(:func:`numpy.lib.stride_tricks.sliding_window_view`): no copies until a
kernel reduces or gathers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ._common import Array

__all__ = (
    "Geometry",
    "bind_padded",
    "bind_reduce_windows",
    "pad_spatial",
    "reduce_windows",
    "windows",
)


@dataclass(frozen=True)
class Geometry:
    """Kernel extent, strides, dilations and padding of a window op.

    :ivar kernel: the window's size per spatial axis.
    :ivar strides: steps between windows.
    :ivar dilations: steps inside a window.
    :ivar pads: explicit pads, ``begin...`` then ``end...``, or ``None``.
    :ivar auto_pad: ONNX's ``NOTSET``, ``VALID``, ``SAME_UPPER`` or
        ``SAME_LOWER``.
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...] | None
    auto_pad: str

    def extent(self, axis: int) -> int:
        """The span of a dilated window along ``axis``."""
        return (self.kernel[axis] - 1) * self.dilations[axis] + 1

    def padding(
        self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Pads for these spatial shapes: ``(begin, end, reach)``.

        ``end`` is the explicit (or automatic) padding; ``reach`` extends it
        where ``ceil_mode`` lets the last window run past the padded input.
        Worked out once per shape (kernels call this on every run).
        """
        return _padding(self, tuple(in_shape), tuple(out_shape))


@functools.lru_cache(maxsize=256)
def _padding(
    geometry: Geometry, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    rank = len(in_shape)
    need = [
        (out - 1) * stride + geometry.extent(axis)
        for axis, (out, stride) in enumerate(
            zip(out_shape, geometry.strides, strict=True)
        )
    ]
    if geometry.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, n - i) for n, i in zip(need, in_shape, strict=True)]
        small = tuple(t // 2 for t in total)
        large = tuple(t - t // 2 for t in total)
        begin, end = (
            (small, large) if geometry.auto_pad == "SAME_UPPER" else (large, small)
        )
    elif geometry.auto_pad == "VALID" or geometry.pads is None:
        begin = end = (0,) * rank
    else:
        begin, end = geometry.pads[:rank], geometry.pads[rank:]
    reach = tuple(
        max(e, n - i - b) for n, i, b, e in zip(need, in_shape, begin, end, strict=True)
    )
    return begin, end, reach


def pad_spatial(
    xp: ModuleType,
    a: Array,
    begin: tuple[int, ...],
    end: tuple[int, ...],
    value: float | int,
) -> Array:
    """``a`` padded on its spatial axes with ``value`` (``a`` if no pads).

    One fill and one copy of the interior: ``numpy.pad`` costs tens of
    microseconds more per call, the whole of a small pooling kernel.
    """
    if not any(begin) and not any(end):
        return a
    shape = (
        *a.shape[:2],
        *(b + s + e for b, s, e in zip(begin, a.shape[2:], end, strict=True)),
    )
    padded = xp.full(shape, value, dtype=a.dtype)
    inner = (
        slice(None),
        slice(None),
        *(slice(b, b + s) for b, s in zip(begin, a.shape[2:], strict=True)),
    )
    padded[inner] = a
    return padded


def bind_padded(
    xp: ModuleType,
    a: Array,
    begin: tuple[int, ...],
    end: tuple[int, ...],
    value: float | int,
) -> tuple[Array, Callable[[], None] | None]:
    """A buffer holding ``a`` padded with ``value``, for a kernel bound to
    ``a``: the pads are filled once, and the returned call copies ``a``'s
    current values into the interior (``(a, None)`` without pads).
    """
    if not any(begin) and not any(end):
        return a, None
    padded = pad_spatial(xp, a, begin, end, value)
    inner = (
        slice(None),
        slice(None),
        *(slice(b, b + s) for b, s in zip(begin, a.shape[2:], strict=True)),
    )
    return padded, functools.partial(xp.copyto, padded[inner], a)


def windows(
    xp: ModuleType, padded: Array, geometry: Geometry, out_shape: tuple[int, ...]
) -> Array:
    """A view ``(N, C, *out_shape, *kernel)`` of the windows of ``padded``."""
    rank = len(out_shape)
    extents = tuple(geometry.extent(axis) for axis in range(rank))
    view = xp.lib.stride_tricks.sliding_window_view(
        padded, extents, axis=tuple(range(2, 2 + rank))
    )
    index = (
        slice(None),
        slice(None),
        *(
            slice(0, (o - 1) * s + 1, s)
            for o, s in zip(out_shape, geometry.strides, strict=True)
        ),
        *(slice(None, None, d) for d in geometry.dilations),
    )
    return view[index]


def window_count(geometry: Geometry) -> int:
    """How many elements a window holds."""
    return math.prod(geometry.kernel)


def reduce_windows(
    xp: ModuleType,
    padded: Array,
    geometry: Geometry,
    combine: Callable[..., Any],
    out: Array,
) -> None:
    """Fold every window of ``padded`` into ``out`` with the binary ufunc
    ``combine`` (``maximum``, ``add``).

    The fold is separable: one spatial axis at a time (outermost first),
    each a pass of ``kernel[axis] - 1`` whole-array calls over strided
    slices, so a ``k x k`` window costs ``2 (k - 1)`` calls instead of
    ``k * k`` (a 2x2 max pool: 2 calls, not 4), and never a reduction over
    a 6-D strided view, which numpy runs element by element (10-20x slower
    on the test CNN's pools). Each pass shrinks one axis to the output's,
    into scratch sized for it; the last writes ``out``. For ``add`` the
    sums are grouped per axis, which rounds differently from a flat
    left-to-right sum by a few ulps.
    """
    bind_reduce_windows(xp, padded, geometry, combine, out)()


def bind_reduce_windows(
    xp: ModuleType,
    padded: Array,
    geometry: Geometry,
    combine: Callable[..., Any],
    out: Array,
    before: Callable[[], None] | None = None,
    empty: Callable[[list[int]], Array] | None = None,
) -> Callable[[], None]:
    """:func:`reduce_windows` bound to these arrays (the strided views and
    the scratch between passes made once), after ``before`` (a
    :func:`bind_padded` refresh) if given.

    :param empty: makes the scratch between passes (one array of each
        shape asked for, each smaller than ``padded``, one fewer than the
        folded axes); default ``xp.empty`` in ``out``'s dtype.
    """
    out_spatial = tuple(out.shape[2:])
    # A one-cell axis needs no pass: its strided slice is a view.
    single = (
        slice(None),
        slice(None),
        *(
            _axis_slice(geometry, axis, 0, out_spatial[axis])
            if geometry.kernel[axis] == 1
            else slice(None)
            for axis in range(len(out_spatial))
        ),
    )
    source = padded[single]
    folded = [axis for axis, k in enumerate(geometry.kernel) if k > 1]
    passes: list[tuple[Array, list[Array]]] = []
    for axis in folded:
        shape = list(source.shape)
        shape[2 + axis] = out_spatial[axis]
        if axis == folded[-1]:
            target = out
        elif empty is not None:
            target = empty(shape)
        else:
            target = xp.empty(shape, dtype=out.dtype)
        views = [
            source[
                (slice(None),) * (2 + axis)
                + (_axis_slice(geometry, axis, k, out_spatial[axis]),)
            ]
            for k in range(geometry.kernel[axis])
        ]
        passes.append((target, views))
        source = target
    copyto = xp.copyto

    def fold() -> None:
        if before is not None:
            before()
        if not passes:
            copyto(out, source)
        for target, (first, second, *rest) in passes:
            combine(first, second, out=target)
            for view in rest:
                combine(target, view, out=target)

    return fold


def _axis_slice(geometry: Geometry, axis: int, offset: int, size: int) -> slice:
    """Kernel offset ``offset``'s cell of each of ``size`` windows along
    ``axis`` (none for ``size`` 0: a negative stop would wrap around)."""
    start = offset * geometry.dilations[axis]
    stride = geometry.strides[axis]
    return slice(start, start + (size - 1) * stride + 1 if size else start, stride)
