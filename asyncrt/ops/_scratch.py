"""Scratch memory a kernel call borrows from the thread it runs on.

A bound kernel keeps scratch of its own only up to
``BOUND_SCRATCH_BYTES`` (a run context holds it for every node at once);
larger convolutions used to allocate theirs per call. A fresh allocation
of megabytes is fresh pages from the operating system, and freeing them
unmaps them: with BLAS's threads on the other cores, each unmap
interrupts them to flush their TLBs. The 3 -> 16 stem convolution of
MobileNetV3 (2.6 MB of scratch) took 2.4 ms a call that way with two BLAS
threads, against 0.3 ms with one. Kernels on one thread run one after
another, so one buffer per thread, grown to the largest request and
reused, serves them all without any of that: memory is the largest
scratch of any kernel per kernel thread, not the sum over nodes.

The arrays handed out are valid until the next :func:`borrow` on the same
thread; a kernel takes them at the start of its call and never keeps them
past its end. Requests over :data:`MAX_BYTES` get fresh arrays instead.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ("MAX_BYTES", "Borrowed", "borrow")

#: A request larger than this many bytes is allocated afresh (and freed
#: after the call), not kept.
MAX_BYTES = 1 << 26
_ALIGN = 64  # a cache line: BLAS and vector loads prefer aligned rows
_local = threading.local()


def borrow(
    shapes: tuple[tuple[int, ...], ...], dtype: np.dtype[Any]
) -> list[np.ndarray[Any, Any]]:
    """Uninitialised C-contiguous arrays of ``shapes``, carved from this
    thread's scratch buffer.

    :param shapes: one shape per array.
    :param dtype: their element type.
    :return: the arrays, valid until the next call on this thread.
    """
    sizes = [int(np.prod(shape)) * dtype.itemsize for shape in shapes]
    spans = [-(-size // _ALIGN) * _ALIGN for size in sizes]
    total = sum(spans) + _ALIGN
    if total > MAX_BYTES:
        return [np.empty(shape, dtype) for shape in shapes]
    buffer: np.ndarray[Any, Any] | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < total:
        buffer = np.empty(total, np.uint8)
        _local.buffer = buffer
    start = -buffer.ctypes.data % _ALIGN
    arrays = []
    for shape, size, span in zip(shapes, sizes, spans, strict=True):
        arrays.append(buffer[start : start + size].view(dtype).reshape(shape))
        start += span
    return arrays


class Borrowed:
    """A kernel binding's scratch arrays: :func:`borrow` on the first call,
    then the same arrays for as long as the calling thread's buffer is the
    one they were carved from (a borrow costs several microseconds of
    shape arithmetic and views, per call of a kernel taking tens).

    Calling it returns the arrays (valid until the next borrow on the
    thread, as :func:`borrow`'s).
    """

    __slots__ = ("_arrays", "_buffer", "_dtype", "_shapes")

    def __init__(
        self, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype[Any]
    ) -> None:
        self._shapes = shapes
        self._dtype = dtype
        self._buffer: np.ndarray[Any, Any] | None = None
        self._arrays: list[np.ndarray[Any, Any]] = []

    def __call__(self) -> list[np.ndarray[Any, Any]]:
        buffer = getattr(_local, "buffer", None)
        if buffer is not None and buffer is self._buffer:
            return self._arrays
        arrays = borrow(self._shapes, self._dtype)
        carved = getattr(_local, "buffer", None)
        # fresh arrays (past MAX_BYTES) are not the thread's: never kept
        kept = carved is not None and _within(arrays[0], carved)
        self._buffer = carved if kept else None
        self._arrays = arrays
        return arrays


def _within(array: np.ndarray[Any, Any], buffer: np.ndarray[Any, Any]) -> bool:
    start = buffer.ctypes.data
    return bool(start <= array.ctypes.data < start + buffer.nbytes)
