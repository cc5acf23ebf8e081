"""Stride-1 convolution as im2col over *flat* padded planes, then one BLAS call.

Pad each ``(n, c)`` plane once and flatten it. For stride 1, the input cell
under kernel offset ``k`` of output position ``p`` is ``p + offset[k]`` in
that flat plane, if the output is laid out with the padded plane's row
length (its last ``extent - 1`` columns of every row are then junk). So
every row of the column matrix is one *contiguous* slice of the flat plane:
``prod(kernel)`` plain copies build it, instead of numpy walking a 6-D
strided view element by element (3-5x slower on the test CNN), and depthwise
convolutions become a batched matmul too, instead of ``2 * prod(kernel)``
whole-array passes. The matmul writes an output with padded rows; one copy
(fused with the bias add) keeps the real columns.

A 1x1 kernel without padding needs neither the pad nor the column matrix:
the input already is it, and the matmul writes the planned output directly.

The column matrix is one copy: a strided view of the flat planes whose
axes are the kernel's (each stepping by its dilated row pitch) and the
output positions, copied in one call instead of one per kernel offset.
Everything that depends only on the shapes (pads, pitches, offsets, chunk
size) is worked out once per shape (:func:`_layout`, cached), not per call.

The batch is processed in chunks whose column matrix stays under
:data:`CHUNK_BYTES`, which bounds the scratch memory (allocated once per
call); L2-sized chunks measured slower on the test CNN at batch 32 (the
per-chunk calls cost more than the cache saves).

:func:`bind_stride1` does the same on arrays that never change (a run
context's): the views and scratch buffers are made once, and a call is the
four or five array calls alone (half the time of a small model's conv).
Scratch kept per binding is bounded by ``BOUND_SCRATCH_BYTES``; larger
convolutions borrow the calling thread's scratch per call
(:mod:`asyncrt.ops._scratch`: fresh megabytes per call are slow).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from . import _banded, _common, _scratch, _team_blas
from ._common import Array
from ._conv_epilogue import add_bias_activation, bind_bias_activation

__all__ = ("CHUNK_BYTES", "bind_stride1", "conv_stride1")

#: The column matrix of one chunk of the batch stays under this many bytes
#: (at least one image per chunk).
CHUNK_BYTES = 1 << 23


@dataclass(frozen=True)
class _Layout:
    """How one stride-1 convolution's shapes map onto flat padded planes."""

    padded: tuple[int, ...]  # the padded plane's spatial shape
    plane: int  # its size, and the flat buffer's row length beyond it
    row: int  # the flat buffer's row length (plane plus the tail)
    length: int  # output positions, padded rows
    taps: tuple[int, ...]  # the kernel's shape
    tap_steps: tuple[int, ...]  # each kernel axis's step in the flat plane
    inner: tuple[slice, ...]  # the input's place in the padded plane
    keep: tuple[Any, ...]  # the real columns of a padded-row output (a key)
    chunk: int  # images per chunk
    direct: bool  # a 1x1 kernel without padding: the input is the matrix


@functools.lru_cache(maxsize=256)
def _layout(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    out_spatial: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    itemsize: int,
    chunk_bytes: int,
) -> _Layout:
    n, c, *spatial = x_shape
    kernel = w_shape[2:]
    rank = len(spatial)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    # The padded plane: every window of every output position fits.
    padded = tuple(o + e - 1 for o, e in zip(out_spatial, extents, strict=True))
    pitch = [math.prod(padded[a + 1 :]) for a in range(rank)]
    steps = tuple(d * p for d, p in zip(dilations, pitch, strict=True))
    reach = sum((k - 1) * step for k, step in zip(kernel, steps, strict=True))
    length = out_spatial[0] * pitch[0]
    plane = math.prod(padded)
    taps = math.prod(kernel)
    return _Layout(
        padded=padded,
        plane=plane,
        row=plane + max(0, reach + length - plane),
        length=length,
        taps=tuple(kernel),
        tap_steps=steps,
        inner=tuple(slice(b, b + s) for b, s in zip(begin, spatial, strict=True)),
        keep=(Ellipsis, *(slice(0, o) for o in out_spatial[1:])),
        chunk=max(1, min(n, chunk_bytes // max(1, c * taps * length * itemsize))),
        direct=taps == 1 and not any(begin) and tuple(spatial) == padded,
    )


def _windows(xp: ModuleType, flat: Array, layout: _Layout) -> Array:
    """``(chunk, C, *kernel, length)``: every kernel offset's run of output
    positions, a read-only strided view of ``flat`` (C-contiguous)."""
    item = flat.itemsize
    shape = (*flat.shape[:2], *layout.taps, layout.length)
    strides = (*flat.strides[:2], *(item * s for s in layout.tap_steps), item)
    if xp is np:
        return np.ndarray(shape, flat.dtype, buffer=flat, strides=strides)
    view: Array = xp.lib.stride_tricks.as_strided(flat, shape, strides)
    return view


def _setup(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
) -> tuple[_Layout, Array, Array | None]:
    """The layout, the weights as ``(group, M / group, K)`` and the bias as
    ``(1, M, 1, ...)`` (``None`` without one)."""
    out_spatial = out.shape[2:]
    layout = _layout(
        x.shape,
        w.shape,
        out_spatial,
        tuple(begin),
        tuple(dilations),
        x.itemsize,
        CHUNK_BYTES,
    )
    m = w.shape[0]
    weights = w.reshape(group, m // group, -1)
    bias_view = None if bias is None else bias.reshape(1, m, *(1,) * len(out_spatial))
    return layout, weights, bias_view


def conv_stride1(
    xp: ModuleType,
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    banded: bool = True,
) -> None:
    """``out = activation(conv(x, w) + bias)`` for strides of 1 (the bias
    and activation in one pass over each chunk while it is in cache:
    :mod:`asyncrt.ops._conv_epilogue`).

    :param x: ``(N, C, *spatial)``.
    :param w: ``(M, C / group, *kernel)``.
    :param bias: ``(M,)`` or ``None``.
    :param out: ``(N, M, *out_spatial)``, C-contiguous.
    :param begin: the pads before each spatial axis (the pads after follow
        from the shapes).
    :param banded: whether depthwise convolutions may take the banded
        matmul (its own fallback for non-finite inputs says no).
    """
    whole = bind_stride1(
        xp,
        x,
        w,
        bias,
        out,
        group,
        begin,
        dilations,
        activation=activation,
        limit=math.inf,
        banded=banded,
    )
    if whole is not None:  # the batch in one chunk: the bound call, made now
        whole()
        return
    n, c = x.shape[:2]
    m = w.shape[0]
    out_spatial = out.shape[2:]
    layout, weights, bias_view = _setup(x, w, bias, out, group, begin, dilations)
    length, mg = layout.length, m // group
    chunk = layout.chunk
    flat = xp.zeros((chunk, c, layout.row), dtype=x.dtype)
    grid = flat[:, :, : layout.plane].reshape(chunk, c, *layout.padded)
    view = _windows(xp, flat, layout)
    cols = xp.empty(view.shape, dtype=x.dtype)
    result = xp.empty((chunk, group, mg, length), dtype=x.dtype)
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        interior = (slice(0, size), slice(None), *layout.inner)
        grid[interior] = x[start : start + size]
        cols[:size] = view[:size]
        got = result[:size]
        xp.matmul(weights, cols[:size].reshape(size, group, -1, length), out=got)
        rows = got.reshape(size, m, out_spatial[0], *layout.padded[1:])[layout.keep]
        add_bias_activation(xp, rows, bias_view, out[start : start + size], activation)


def bind_stride1(
    xp: ModuleType,
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    limit: float | None = None,
    banded: bool = True,
) -> Callable[[], None] | None:
    """:func:`conv_stride1` on these arrays, every time: a call without
    arguments, or ``None`` where the batch takes several chunks (or a
    banded matmul's scratch does not fit in ``limit``). Scratch that fits
    in ``limit`` bytes (default ``BOUND_SCRATCH_BYTES``) is the binding's
    own; more is borrowed from the calling thread per call
    (:mod:`asyncrt.ops._scratch`; ``None`` off numpy). Depthwise
    convolutions of narrow planes take a banded matmul instead
    (:mod:`asyncrt.ops._banded`)."""
    if limit is None:
        limit = _common.BOUND_SCRATCH_BYTES
    if banded and _banded.takes(xp, x, w, out, group, dilations):
        exact = functools.partial(
            conv_stride1,
            xp,
            x,
            w,
            bias,
            out,
            group,
            begin,
            dilations,
            activation=activation,
            banded=False,
        )
        # Scratch as bounded as im2col's chunks, bound or not.
        call = _banded.bind_banded(
            xp,
            x,
            w,
            bias,
            out,
            begin,
            dilations,
            activation=activation,
            limit=min(limit, CHUNK_BYTES),
            exact=exact,
        )
        if call is not None or limit < CHUNK_BYTES:
            # Without room to keep the band, the plain call makes it.
            return call
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    out_spatial = out.shape[2:]
    layout, weights, bias_view = _setup(x, w, bias, out, group, begin, dilations)
    length, mg = layout.length, m // group
    copyto, matmul = xp.copyto, (_team_blas.matmul if xp is np else xp.matmul)
    if layout.direct:
        cols = x.reshape(n, group, cg, length)
        result = out.reshape(n, group, mg, length)

        epilogue = bind_bias_activation(xp, out, bias_view, out, activation)

        def direct() -> None:
            matmul(weights, cols, out=result)
            epilogue()

        return direct
    if layout.chunk < n:
        return None
    shapes = ((n, c, layout.row), (n, c, *layout.taps, length), (n, group, mg, length))
    inner = (slice(None), slice(None), *layout.inner)
    rows_shape = (n, m, out_spatial[0], *layout.padded[1:])

    def views(flat: Array, cols: Array, result: Array) -> tuple[Array, ...]:
        """The views a call copies through, over these buffers."""
        grid = flat[:, :, : layout.plane].reshape(n, c, *layout.padded)
        return (
            grid[inner],
            _windows(xp, flat, layout),
            cols.reshape(n, group, -1, length),
            result.reshape(rows_shape)[layout.keep],
        )

    scratch = x.itemsize * sum(math.prod(shape) for shape in shapes)
    if scratch > limit:
        if xp is not np:
            return None
        # The views into the thread's scratch, made again only if it moved.
        cache: list[Any] = [None, None]

        def borrowed() -> None:
            flat, cols, result = _scratch.borrow(shapes, x.dtype)
            if cache[0] != flat.ctypes.data:
                cache[:] = [flat.ctypes.data, views(flat, cols, result)]
            interior, view, matrix, rows = cache[1]
            flat.fill(0)  # other kernels on this thread wrote over the pads
            copyto(interior, x)
            copyto(cols, view)
            matmul(weights, matrix, out=result)
            add_bias_activation(xp, rows, bias_view, out, activation)

        return borrowed
    # The padded planes' borders stay zero: only their interior is written.
    flat = xp.zeros(shapes[0], dtype=x.dtype)
    cols = xp.empty(shapes[1], dtype=x.dtype)
    result = xp.empty(shapes[2], dtype=x.dtype)
    interior, view, matrix, rows = views(flat, cols, result)
    epilogue = bind_bias_activation(xp, rows, bias_view, out, activation)

    def padded() -> None:
        copyto(interior, x)
        copyto(cols, view)
        matmul(weights, matrix, out=result)
        epilogue()

    return padded
