"""Reductions, arg-reductions, softmax and friends, scans and top-k.

Axes arrive normalised (non-negative, sorted) from the importer; ``null``
axes mean every axis. Reductions over an empty set give the reduction's
identity, as ONNX defines (``-inf`` for max, ``0`` for a sum, ...).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _epijit, _jit
from ._builtin import bind_softmax_last_axis, exact_sums, softmax_last_axis
from ._common import Array, choice, flag, integer, ints, opt_ints, quiet
from ._kernels import Bindable
from ._library import Attrs, define

__all__ = ()

Kernel = Callable[..., None]
_KINDS = (
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "l1",
    "l2",
    "log_sum",
    "log_sum_exp",
    "sum_square",
)


def _lowest(dtype: np.dtype[Any], highest: bool) -> float | int:
    """The identity of max (``highest`` false) or min over ``dtype``."""
    if dtype.kind == "f":
        return np.inf if highest else -np.inf
    if dtype.kind == "b":
        return highest
    info = np.iinfo(dtype)
    return info.max if highest else info.min


@define("reduce")
def _reduce(xp: ModuleType, attrs: Attrs) -> Kernel:
    kind = choice(attrs, "kind", _KINDS)
    axes = opt_ints(attrs, "axes")
    keepdims = flag(attrs, "keepdims")

    def reduce(a: Array, out: Array) -> None:
        axis = tuple(range(a.ndim)) if axes is None else axes
        empty = any(a.shape[i] == 0 for i in axis)
        with quiet(xp):
            if kind in ("max", "min") and empty:
                out[...] = _lowest(a.dtype, highest=kind == "min")
            elif kind in ("max", "min"):
                # Not ``out=``: cupy 14's CUB reduction fails on it for min
                # (a TypeError comparing the output with a dtype); the
                # result is one small temporary either way.
                xp.copyto(out, getattr(xp, kind)(a, axis=axis, keepdims=keepdims))
            elif kind in ("sum", "prod", "mean"):
                getattr(xp, kind)(a, axis=axis, keepdims=keepdims, out=out)
            elif kind == "l1":
                xp.sum(xp.abs(a), axis=axis, keepdims=keepdims, out=out)
            elif kind in ("l2", "sum_square"):
                xp.sum(a * a, axis=axis, keepdims=keepdims, out=out)
                if kind == "l2":
                    xp.sqrt(out, out)
            elif kind == "log_sum":
                xp.sum(a, axis=axis, keepdims=keepdims, out=out)
                xp.log(out, out)
            else:  # log_sum_exp, shifted by the maximum so exp cannot overflow
                top = a.max(axis=axis, keepdims=True) if not empty else None
                if top is not None:
                    top = xp.where(xp.isfinite(top), top, 0)
                    total = xp.exp(a - top).sum(axis=axis, keepdims=True)
                    result = xp.log(total) + top
                    out[...] = result if keepdims else result.reshape(out.shape)
                else:
                    out[...] = -np.inf

    def bind(a: Array, out: Array) -> Callable[[], None]:
        """The common reductions of numpy floats as one bound ufunc call
        (the axes resolved once): a small array's reduce costs its call
        overhead, 5-7 us of it in :func:`reduce`'s dispatch and errstate."""
        axis = tuple(range(a.ndim)) if axes is None else tuple(axes)
        if (
            xp is not np
            or a.dtype.kind != "f"
            or out.dtype != a.dtype
            or any(a.shape[i] == 0 for i in axis)
        ):
            return functools.partial(reduce, a, out)
        if kind not in ("sum", "mean", "max", "min"):
            return functools.partial(reduce, a, out)
        count = math.prod(a.shape[i] for i in axis)
        rows = compiled_rows(a, out, axis, count, kind)
        if rows is not None:
            return rows
        if kind in ("max", "min"):  # no warnings to silence: NaN propagates
            ufunc = np.maximum if kind == "max" else np.minimum
            return functools.partial(
                ufunc.reduce, a, axis=axis, keepdims=keepdims, out=out
            )
        add, divide = np.add.reduce, np.true_divide

        def sums() -> None:
            with quiet(np):  # inf, as IEEE
                add(a, axis=axis, keepdims=keepdims, out=out)
                if kind == "mean":  # as numpy's mean: the sum, then / count
                    divide(out, count, out=out, casting="unsafe")

        return sums

    return Bindable(reduce, bind)


#: Arrays of at most this many elements reduce their trailing axes in a
#: compiled loop (:func:`compiled_rows`), larger ones by numpy's
#: ``add.reduce`` (pairwise; its call and ``errstate`` cost 3-4 us) or
#: ``maximum.reduce`` / ``minimum.reduce`` (2.7 us for 16 rows of 384).
MAX_COMPILED_SUM = 1 << 16


def compiled_rows(
    a: Array, out: Array, axis: tuple[int, ...], count: int, kind: str
) -> Callable[[], None] | None:
    """A float32 sum, mean, maximum or minimum over ``a``'s trailing
    ``axis`` as one compiled loop over its rows (:mod:`asyncrt.ops._epijit`'s
    ``row_sums`` and ``row_extremes``), or ``None`` where numpy's reduction
    serves: large arrays, other dtypes or axes, strided arrays, other
    devices' arrays, no numba. The rows sum in vector lanes (numpy's sum is
    pairwise): within float32 rounding of numpy's, not bit for bit; the
    extremes are exact (NaN where a row has one, as numpy's)."""
    trailing = tuple(range(a.ndim - len(axis), a.ndim))
    if not (
        _jit.available()
        and isinstance(a, np.ndarray)  # cupy's arrays look alike
        and isinstance(out, np.ndarray)
        and a.dtype == out.dtype == np.float32
        and 0 < a.size <= MAX_COMPILED_SUM
        and tuple(sorted(axis)) == trailing
        and a.flags.c_contiguous
        and out.flags.c_contiguous
    ):
        return None
    rows = a.size // count
    if kind in ("max", "min"):
        arrays = (a.reshape(rows, count), out.reshape(rows), kind == "max")
        return _epijit.bind_rows(_epijit.loop("row_extremes"), arrays, rows, count)
    divisor = np.float32(count if kind == "mean" else 1)
    arrays = (a.reshape(rows, count), out.reshape(rows), divisor)
    return _epijit.bind_rows(_epijit.loop("row_sums"), arrays, rows, count)


@define("arg_reduce")
def _arg_reduce(xp: ModuleType, attrs: Attrs) -> Kernel:
    largest = choice(attrs, "kind", ("max", "min")) == "max"
    axis = integer(attrs, "axis")
    keepdims = flag(attrs, "keepdims")
    last = flag(attrs, "select_last_index")

    def arg_reduce(a: Array, out: Array) -> None:
        source = xp.flip(a, axis) if last else a
        found = (source.argmax if largest else source.argmin)(axis=axis, keepdims=True)
        if last:
            found = a.shape[axis] - 1 - found
        out[...] = found if keepdims else found.reshape(out.shape)

    return arg_reduce


@define("softmax")
def _softmax(xp: ModuleType, attrs: Attrs) -> Kernel:
    axes = ints(attrs, "axes")
    log = flag(attrs, "log")

    def by_rows(a: Array) -> bool:
        return bool(
            xp is np
            and not log
            and tuple(axes) == (a.ndim - 1,)
            and a.dtype in (np.float32, np.float64)
            and a.size
        )

    def softmax(a: Array, out: Array) -> None:
        if not a.size:
            return  # nothing to normalise (and no maximum of nothing)
        if by_rows(a):
            softmax_last_axis(a, out)
            return
        with quiet(xp):
            xp.subtract(a, a.max(axis=axes, keepdims=True), out)
            if log:
                out -= xp.log(exact_sums(xp.exp(out), axes))
            else:
                xp.exp(out, out)
                xp.divide(out, exact_sums(out, axes), out)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        if by_rows(a):
            return bind_softmax_last_axis(a, out)
        return functools.partial(softmax, a, out)

    return Bindable(softmax, bind)


@define("hardmax")
def _hardmax(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")
    coerce = flag(attrs, "coerce_2d")  # opsets < 13: axes axis.. as one

    def hardmax(a: Array, out: Array) -> None:
        if coerce:
            rows = math.prod(a.shape[:axis])
            flat, target = a.reshape(rows, -1), out.reshape(rows, -1)
            pick_axis = 1
        else:
            flat, target, pick_axis = a, out, axis
        found = flat.argmax(axis=pick_axis, keepdims=True)
        target[...] = 0
        xp.put_along_axis(target, found, 1, axis=pick_axis)

    return hardmax


@define("cumsum")
def _cumsum(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")
    exclusive = flag(attrs, "exclusive")
    reverse = flag(attrs, "reverse")

    def cumsum(a: Array, out: Array) -> None:
        source = xp.flip(a, axis) if reverse else a
        total = xp.cumsum(source, axis=axis, dtype=out.dtype)
        if exclusive:
            shifted = xp.zeros_like(total)
            body = [slice(None)] * a.ndim
            head = list(body)
            body[axis], head[axis] = slice(1, None), slice(None, -1)
            shifted[tuple(body)] = total[tuple(head)]
            total = shifted
        out[...] = xp.flip(total, axis) if reverse else total

    def bind(a: Array, out: Array) -> Callable[[], None]:
        along = axis % a.ndim if a.ndim else 0
        inner = a.size // a.shape[along] if a.ndim and a.shape[along] else 0
        if xp is not np or along == a.ndim - 1 or a.dtype != out.dtype:
            return functools.partial(cumsum, a, out)
        if _compiles_cumsum(a, out):
            return _bind_compiled_cumsum(a, out, along, exclusive, reverse)
        if inner < CUMSUM_MIN_SLICE:
            return functools.partial(cumsum, a, out)
        return _bind_cumsum_slices(a, out, along, exclusive, reverse)

    return Bindable(cumsum, bind)


#: Cumulative sums along an axis other than the last run as one vector add
#: per step where each step adds at least this many elements: numpy's
#: ``cumsum`` walks such an axis element by element (8 x 128 x 768 along
#: the 128: 7.1 ms, 25x the bytes floor), a step's add is vectorised.
CUMSUM_MIN_SLICE = 64


_CUMSUM_DTYPES = tuple(map(np.dtype, (np.float32, np.float64, np.int32, np.int64)))


def _compiles_cumsum(a: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
    """Whether :func:`_bind_compiled_cumsum` takes these arrays: C-contiguous,
    of a float or 32/64-bit integer type, with numba installed."""
    return bool(
        a.dtype in _CUMSUM_DTYPES
        and a.size
        and a.flags.c_contiguous
        and out.flags.c_contiguous
        and _jit.available()
    )


def _cumsum_steps(  # pragma: no cover - compiled by numba
    a: Any, out: Any, exclusive: bool, reverse: bool
) -> None:
    """Running sums of ``a (outer, steps, inner)`` along its middle axis,
    each step's row added to the previous sum, in numpy's order (``out``'s
    bits are ``np.cumsum``'s); an exclusive sum's second row is a copy of
    the first input row, as the sliced kernel makes it."""
    outer, steps, inner = a.shape
    width = np.uint64(inner)
    for o in range(outer):
        for k in range(steps):
            s = steps - 1 - k if reverse else k
            before = s + 1 if reverse else s - 1
            target = out[o, s]
            if k == 0:
                if exclusive:
                    for i in range(width):
                        target[i] = 0
                else:
                    source = a[o, s]
                    for i in range(width):
                        target[i] = source[i]
            elif exclusive and k == 1:
                source = a[o, before]
                for i in range(width):
                    target[i] = source[i]
            else:
                previous = out[o, before]
                source = a[o, before] if exclusive else a[o, s]
                for i in range(width):
                    target[i] = previous[i] + source[i]


def _bind_compiled_cumsum(
    a: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    axis: int,
    exclusive: bool,
    reverse: bool,
) -> Callable[[], None]:
    """:func:`_bind_cumsum_slices`' sums as one compiled loop (numba): no
    call per step (2 x 64 x 384 along the 64: 70 us of calls, 5x the
    bytes floor), the same additions in the same order."""
    shape = (
        math.prod(a.shape[:axis]),
        a.shape[axis],
        math.prod(a.shape[axis + 1 :]),
    )
    kernel = _jit.compile_kernel(_cumsum_steps)
    args = (a.reshape(shape), out.reshape(shape), exclusive, reverse)
    _jit.specialise(kernel, args)
    return functools.partial(kernel, *args)


def _slice(a: np.ndarray[Any, Any], axis: int, index: int) -> np.ndarray[Any, Any]:
    """The view of ``a`` at ``index`` along ``axis``."""
    key: tuple[slice | int, ...] = (*(slice(None),) * axis, index)
    return a[key]


def _bind_cumsum_slices(
    a: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    axis: int,
    exclusive: bool,
    reverse: bool,
) -> Callable[[], None]:
    """``out`` = the running sums of ``a`` along ``axis``, one slice added
    to the previous sum per step: the additions of numpy's ``cumsum`` in
    its order, so the same values bit for bit."""
    order = range(a.shape[axis] - 1, -1, -1) if reverse else range(a.shape[axis])
    sources = [_slice(a, axis, i) for i in order]
    targets = [_slice(out, axis, i) for i in order]
    add, copyto = np.add, np.copyto

    def run() -> None:
        if not targets:
            return
        if exclusive:
            targets[0].fill(0)
            if len(targets) > 1:
                copyto(targets[1], sources[0])
            for k in range(2, len(targets)):
                add(targets[k - 1], sources[k - 1], out=targets[k])
            return
        copyto(targets[0], sources[0])
        for k in range(1, len(targets)):
            add(targets[k - 1], sources[k], out=targets[k])

    return run


@define("topk")
def _topk(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")
    largest = flag(attrs, "largest")

    def topk(a: Array, values: Array, indices: Array) -> None:
        k = values.shape[axis]
        size = a.shape[axis]
        if largest:
            # A stable ascending sort of the reversed axis, read backwards:
            # descending values, equal values in ascending index order.
            order = xp.argsort(xp.flip(a, axis), axis=axis, kind="stable")
            order = size - 1 - xp.flip(order, axis)
        else:
            order = xp.argsort(a, axis=axis, kind="stable")
        chosen = xp.take(order, xp.arange(k), axis=axis)
        indices[...] = chosen
        values[...] = xp.take_along_axis(a, chosen, axis=axis)

    return topk
