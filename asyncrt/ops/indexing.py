"""Indexing by tensors of indices: ``gather_nd``, ``scatter_nd``,
``scatter_elements`` and ``nonzero``.

Each is one fancy-indexing expression of the array namespace over index
arrays built once per call: no loop per index. Negative indices count from
the end of their axis, as ONNX allows; an index out of range fails the
kernel (``IndexError``), never reads or writes elsewhere. A scatter copies
its data into the output first, then writes the updates there (``none``:
assignment, where duplicate indices leave one of their updates, as ONNX
leaves it undefined) or folds them in with the reduction's ufunc
(``ufunc.at`` over the flat output, where it is fast: duplicates
accumulate, in index order; in rounds of distinct targets where the
namespace lacks it, as cupy lacks ``multiply.at``).

``nonzero``'s output shape depends on its input's values: the ONNX frontend
runs it on inputs known at import time, where that shape is known too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _jit
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
    # cupy has no ``multiply.at``: products are folded in rounds there.
    fold = _fold_in_rounds if xp is not np and reduction == "mul" else _fold_at

    def reduce(out: Array, keys: tuple[Array, ...], updates: Array) -> None:
        flat = out.reshape(-1) if out.flags.c_contiguous else xp.ravel(out)
        targets, values = _flat_targets(xp, out.shape, keys, updates)
        fold(xp, ufunc, flat, targets, values)
        if not out.flags.c_contiguous:  # ravel copied: write the result back
            out[...] = flat.reshape(out.shape)

    return reduce


def _flat_targets(
    xp: ModuleType, shape: tuple[int, ...], keys: tuple[Array, ...], updates: Array
) -> tuple[Array, Array]:
    """Each update's flat index into an output of ``shape``, and the updates
    flattened to match, one index per element: numpy's ``ufunc.at`` has a
    fast loop for one-dimensional indices only, and folds a slice per index
    5-20x slower (512 row updates of 256 floats: 1.1 ms against 0.2).
    Indices out of range raise ``IndexError`` here, on every namespace."""
    lead = shape[: len(keys)]
    keys = tuple(xp.broadcast_arrays(*keys))
    for axis, (key, size) in enumerate(zip(keys, lead, strict=True)):
        if key.size and (int(key.min()) < -size or int(key.max()) >= size):
            bad = key[(key < -size) | (key >= size)].reshape(-1)[0]
            raise IndexError(
                f"index {int(bad)} is out of bounds for axis {axis} with size {size}"
            )
    wrapped = tuple(xp.where(k < 0, k + n, k) for k, n in zip(keys, lead, strict=True))
    targets = xp.ravel_multi_index(wrapped, lead).reshape(-1)
    inner = math.prod(shape[len(keys) :])
    if inner > 1:  # each target is a slice: its elements' flat indices
        targets = (targets[:, None] * inner + xp.arange(inner)).reshape(-1)
    values = xp.broadcast_to(updates, (*keys[0].shape, *shape[len(keys) :]))
    return targets, values.reshape(-1)


def _fold_at(
    xp: ModuleType, ufunc: np.ufunc, flat: Array, targets: Array, values: Array
) -> None:
    """Fold ``values`` into ``flat[targets]`` with ``ufunc.at``: duplicates
    accumulate, in index order, as ONNX defines the reductions."""
    ufunc.at(flat, targets, values)


def _fold_in_rounds(
    xp: ModuleType, ufunc: np.ufunc, flat: Array, targets: Array, values: Array
) -> None:
    """``ufunc.at`` for a namespace without it: round ``r`` folds in each
    target's ``r``-th update (in index order), and within a round targets
    are distinct, so plain fancy indexing is exact. As many rounds as the
    most repeated target has updates."""
    if not targets.size:
        return
    order = xp.argsort(targets, kind="stable")
    ordered = targets[order]
    # Position of each update among those of its target: its index in the
    # sorted run minus where the run starts.
    run_rank = xp.arange(ordered.size) - xp.searchsorted(ordered, ordered)
    rank = xp.empty_like(run_rank)
    rank[order] = run_rank
    for r in range(int(run_rank.max()) + 1):
        chosen = rank == r
        picked = targets[chosen]
        flat[picked] = ufunc(flat[picked], values[chosen])


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
        if not a.ndim:  # a scalar has no coordinates: its output is (0, count)
            return
        if (
            xp is np
            and a.flags.c_contiguous
            and a.dtype.kind in "biuf"
            and out.dtype == np.int64
            and out.flags.c_contiguous
            and _jit.available()
        ):
            # one compiled pass (numpy's nonzero of 786k cells, then the
            # copies into out: 8.5 ms; this: well under one)
            rows = a.reshape(-1, a.shape[-1]) if a.size else a.reshape(0, 1)
            lead = np.array(a.shape[:-1], np.int64)
            _jit.compile_kernel(_nonzero_rows)(rows, lead, out)
            return
        for axis, coordinates in enumerate(xp.nonzero(a)):
            out[axis] = coordinates

    return nonzero


def _nonzero_rows(rows: Any, lead: Any, out: Any) -> None:  # pragma: no cover
    """``out[:, n]``: the coordinates of the ``n``-th nonzero cell (row-major
    order, as ``np.nonzero``) of an array viewed as ``rows`` (its last axis
    kept) whose leading axes are ``lead``; compiled by numba."""
    depth = lead.size
    at = np.zeros(depth, np.int64)  # the row's leading coordinates
    found = np.empty(rows.shape[1] + 1, np.int64)
    n = 0
    for r in range(rows.shape[0]):
        # Each column written, the count advanced by the test: no branch
        # (on random data a branch per cell mispredicts half the time).
        here = 0
        for j in range(rows.shape[1]):
            found[here] = j
            here += rows[r, j] != 0
        for d in range(depth):
            out[d, n : n + here] = at[d]
        out[depth, n : n + here] = found[:here]
        n += here
        d = depth - 1
        while d >= 0:  # the next row's coordinates: count up, carrying
            at[d] += 1
            if at[d] < lead[d]:
                break
            at[d] = 0
            d -= 1
