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

The batch is processed in chunks whose column matrix stays under
:data:`CHUNK_BYTES`, which bounds the scratch memory (allocated once per
call); L2-sized chunks measured slower on the test CNN at batch 32 (the
per-chunk calls cost more than the cache saves).
"""

from __future__ import annotations

import itertools
import math
from types import ModuleType

from ._common import Array

__all__ = ("CHUNK_BYTES", "conv_stride1")

#: The column matrix of one chunk of the batch stays under this many bytes
#: (at least one image per chunk).
CHUNK_BYTES = 1 << 23


def conv_stride1(
    xp: ModuleType,
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
) -> None:
    """``out = conv(x, w) + bias`` for strides of 1.

    :param x: ``(N, C, *spatial)``.
    :param w: ``(M, C / group, *kernel)``.
    :param bias: ``(M,)`` or ``None``.
    :param out: ``(N, M, *out_spatial)``, C-contiguous.
    :param begin: the pads before each spatial axis (the pads after follow
        from the shapes).
    """
    n, c, *spatial = x.shape
    m, cg, *kernel = w.shape
    out_spatial = out.shape[2:]
    rank = len(spatial)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    # The padded plane: every window of every output position fits.
    padded = [o + e - 1 for o, e in zip(out_spatial, extents, strict=True)]
    pitch = [math.prod(padded[a + 1 :]) for a in range(rank)]
    offsets = [
        sum(k * d * p for k, d, p in zip(position, dilations, pitch, strict=True))
        for position in itertools.product(*(range(k) for k in kernel))
    ]
    length = out_spatial[0] * pitch[0]  # output positions, padded rows
    mg, taps = m // group, len(offsets)
    weights = w.reshape(group, mg, cg * taps)
    bias_view = None if bias is None else bias.reshape(1, m, *(1,) * rank)
    if taps == 1 and not any(begin) and list(spatial) == padded:
        cols = x.reshape(n, group, cg, length)
        xp.matmul(weights, cols, out=out.reshape(n, group, mg, length))
        if bias_view is not None:
            xp.add(out, bias_view, out)
        return
    plane = math.prod(padded)
    tail = max(offsets) + length - plane
    chunk = max(1, min(n, CHUNK_BYTES // max(1, c * taps * length * x.itemsize)))
    flat = xp.zeros((chunk, c, plane + max(0, tail)), dtype=x.dtype)
    inner = tuple(slice(b, b + s) for b, s in zip(begin, spatial, strict=True))
    grid = flat[:, :, :plane].reshape(chunk, c, *padded)
    cols = xp.empty((chunk, c, taps, length), dtype=x.dtype)
    result = xp.empty((chunk, group, mg, length), dtype=x.dtype)
    keep = (Ellipsis, *(slice(0, o) for o in out_spatial[1:]))
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        interior = (slice(0, size), slice(None), *inner)
        grid[interior] = x[start : start + size]
        for tap, offset in enumerate(offsets):
            cols[:size, :, tap] = flat[:size, :, offset : offset + length]
        got = result[:size]
        xp.matmul(weights, cols[:size].reshape(size, group, cg * taps, length), out=got)
        rows = got.reshape(size, m, out_spatial[0], *padded[1:])[keep]
        target = out[start : start + size]
        if bias_view is None:
            target[...] = rows
        else:
            xp.add(rows, bias_view, target)
