"""Indexing by tensors of indices: ``gather_nd``, ``scatter_nd``,
``scatter_elements`` and ``nonzero``.

Each is one fancy-indexing expression of the array namespace over index
arrays built once per call: no loop per index. Negative indices count from
the end of their axis, as ONNX allows; an index out of range fails the
kernel (``IndexError``), never reads or writes elsewhere. A scatter copies
its data into the output first, then writes the updates there (``none``:
assignment, where duplicate indices leave one of their updates, as ONNX
leaves it undefined) or folds them in with the reduction's ufunc
(``ufunc.at``: duplicates accumulate, in index order; on numpy over the
flat output, where ``ufunc.at`` is fast).

``nonzero``'s output shape depends on its input's values: the ONNX frontend
runs it on inputs known at import time, where that shape is known too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import numpy as np

from ._common import Array, choice, integer
from ._library import Attrs, builtin, define

__all__ = ()

Kernel = Callable[..., None]

#: A scatter's reduction and the ufunc that folds duplicates (``none``:
#: plain assignment).
REDUCTIONS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter(
    xp: ModuleType, reduction: str
) -> Callable[[Array, tuple[Array, ...], Array], None]:
    """``out[keys] = updates``, or folded in with the reduction's ufunc
    (``keys`` index ``out``'s leading axes; the rest are whole slices)."""
    if reduction == "none":

        def assign(out: Array, keys: tuple[Array, ...], updates: Array) -> None:
            out[keys] = updates

        return assign
    ufunc = getattr(xp, REDUCTIONS[reduction])

    def reduce(out: Array, keys: tuple[Array, ...], updates: Array) -> None:
        if xp is np and out.flags.c_contiguous:
            _fold_flat(ufunc, out, keys, updates)
        else:
            ufunc.at(out, keys, updates)

    return reduce


def _fold_flat(
    ufunc: np.ufunc, out: Array, keys: tuple[Array, ...], updates: Array
) -> None:
    """``ufunc.at(out, keys, updates)`` on the flat output, one index per
    element: numpy's ``ufunc.at`` has a fast loop for one-dimensional
    indices only, and folds a slice per index 5-20x slower (512 row
    updates of 256 floats: 1.1 ms against 0.2). The updates are applied in
    index order, as ONNX defines the reductions."""
    lead = out.shape[: len(keys)]
    keys = tuple(np.broadcast_arrays(*keys))
    for axis, (key, size) in enumerate(zip(keys, lead, strict=True)):
        if key.size and (key.min() < -size or key.max() >= size):
            bad = key[(key < -size) | (key >= size)].flat[0]
            raise IndexError(
                f"index {bad} is out of bounds for axis {axis} with size {size}"
            )
    wrapped = tuple(np.where(k < 0, k + n, k) for k, n in zip(keys, lead, strict=True))
    targets = np.ravel_multi_index(wrapped, lead).reshape(-1)
    inner = math.prod(out.shape[len(keys) :])
    if inner > 1:  # each target is a slice: its elements' flat indices
        targets = (targets[:, None] * inner + np.arange(inner)).reshape(-1)
    values = np.broadcast_to(updates, (*keys[0].shape, *out.shape[len(keys) :]))
    ufunc.at(out.reshape(-1), targets, values.reshape(-1))


@define("gather_nd")
def _gather_nd(xp: ModuleType, attrs: Attrs) -> Kernel:
    batch_dims = integer(attrs, "batch_dims")
    if batch_dims < 0:
        raise ValueError(f"batch_dims must be >= 0: {batch_dims}")

    def gather_nd(data: Array, indices: Array, out: Array) -> None:
        depth = indices.shape[-1]
        batches = math.prod(data.shape[:batch_dims])
        rows = data.reshape(batches, *data.shape[batch_dims:])
        count = math.prod(indices.shape[batch_dims:-1])
        picks = indices.reshape(batches, count, depth)
        batch = xp.arange(batches).reshape(-1, 1)
        keys = (batch, *(picks[..., i] for i in range(depth)))
        # (batches, picks, *slice): each pick is a slice of the rows
        picked = rows[keys]
        if not depth:
            picked = xp.broadcast_to(picked, (batches, picks.shape[1], *rows.shape[1:]))
        xp.copyto(out, picked.reshape(out.shape))

    return gather_nd


@define("scatter_nd")
def _scatter_nd(xp: ModuleType, attrs: Attrs) -> Kernel:
    scatter = _scatter(xp, choice(attrs, "reduction", ("none", *REDUCTIONS)))

    def scatter_nd(data: Array, indices: Array, updates: Array, out: Array) -> None:
        xp.copyto(out, data)
        keys = tuple(indices[..., i] for i in range(indices.shape[-1]))
        scatter(out, keys, updates)

    return scatter_nd


@define("scatter_elements")
def _scatter_elements(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")
    scatter = _scatter(xp, choice(attrs, "reduction", ("none", *REDUCTIONS)))

    def scatter_elements(
        data: Array, indices: Array, updates: Array, out: Array
    ) -> None:
        xp.copyto(out, data)
        # Every update's coordinates: its own, with ``axis`` taken from
        # ``indices`` (open grids broadcast, no full index arrays).
        rank = indices.ndim
        keys = [
            xp.arange(n).reshape((1,) * i + (n,) + (1,) * (rank - i - 1))
            for i, n in enumerate(indices.shape)
        ]
        keys[axis] = indices
        scatter(out, tuple(keys), updates)

    return scatter_elements


@builtin("nonzero")
def _nonzero(xp: ModuleType) -> Kernel:
    def nonzero(a: Array, out: Array) -> None:
        if a.ndim:  # a scalar has no coordinates: its output is (0, count)
            for axis, coordinates in enumerate(xp.nonzero(a)):
                out[axis] = coordinates

    return nonzero
