"""Joining requests into one batch and splitting its outputs back: pure
numpy, no event loop.

A batch is the requests' arrays laid end to end along each input's batch
axis, then padded up to the batch size the batcher chose by repeating the
last real row (a row the model already accepted, so padding never feeds a
kernel values it has not seen: no zeros into a ``log``, no empty attention
mask). Where the batcher pads lengths too (:class:`~asyncrt.serving.Padding`),
every request's array is first widened along its length axis to the
batch's length with the input's pad value. Each output is cut back into
one fresh array per request: its rows, and, for the outputs the padding
trims, its own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ("join", "split")

Array = np.ndarray[Any, Any]


def _index(ndim: int, axis: int, part: slice) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[axis] = part
    return tuple(index)


def join(
    parts: Sequence[Array],
    axis: int,
    size: int,
    *,
    length_axis: int | None = None,
    length: int = 0,
    pad_value: Any = 0,
) -> Array:
    """One input of a batch: ``parts`` end to end along ``axis``, padded to
    ``size`` rows by repeating the last row.

    :param parts: each request's array of this input (same dtype; the same
        shape but on ``axis`` and ``length_axis``).
    :param axis: the batch axis.
    :param size: the batch's rows (at least the parts' rows together).
    :param length_axis: the axis padded to ``length`` with ``pad_value``,
        or ``None``.
    :param length: the batch's length along ``length_axis``.
    :param pad_value: what fills each part's padded positions.
    :return: a new C-contiguous array.
    """
    first = parts[0]
    shape = list(first.shape)
    shape[axis] = size
    if length_axis is not None:
        shape[length_axis] = length
    padded = length_axis is not None and any(
        part.shape[length_axis] != length for part in parts
    )
    out = (
        np.full(shape, pad_value, first.dtype)
        if padded
        else np.empty(shape, first.dtype)
    )
    row = 0
    for part in parts:
        rows = part.shape[axis]
        index = list(_index(out.ndim, axis, slice(row, row + rows)))
        if length_axis is not None:
            index[length_axis] = slice(0, part.shape[length_axis])
        out[tuple(index)] = part
        row += rows
    if row < size:  # repeat the last real row
        last = out[_index(out.ndim, axis, slice(row - 1, row))]
        out[_index(out.ndim, axis, slice(row, size))] = last
    return out


def split(
    output: Array,
    axis: int,
    rows: Sequence[int],
    *,
    length_axis: int | None = None,
    lengths: Sequence[int] = (),
) -> list[Array]:
    """One output of a batch, cut back into a fresh array per request.

    :param output: the batch's output.
    :param axis: its batch axis.
    :param rows: each request's rows, in the batch's order (the padding
        rows after them are dropped).
    :param length_axis: the axis cut back to each request's length, or
        ``None``.
    :param lengths: each request's length (with ``length_axis``).
    :return: a C-contiguous copy per request.
    """
    pieces = []
    start = 0
    for index, count in enumerate(rows):
        where = list(_index(output.ndim, axis, slice(start, start + count)))
        if length_axis is not None:
            where[length_axis] = slice(0, lengths[index])
        pieces.append(np.array(output[tuple(where)], order="C", copy=True))
        start += count
    return pieces
