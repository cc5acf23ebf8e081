"""Depthwise 2-D convolution as one matmul per channel with a banded matrix.

Row ``i`` of one output plane is ``sum over kh`` of padded input row
``i + kh * dh`` times a banded ``(P, W)`` matrix holding that kernel row's
taps on its diagonals (``P`` the padded width, ``W`` the output's). Stacking
the kernel rows, a channel's whole output is ``L (N * H, Kh * P) @ B (Kh *
P, W)``, where ``L`` repeats each padded row ``Kh`` times: a copy of
``Kh``, not ``Kh * Kw``, times the input, and every channel is one
well-shaped BLAS call instead of ``N`` one-row ones. The matrix has
``P / Kw`` times the multiply-adds of the convolution (zeros), so this
pays only for narrow planes.

Measured on the AVX-512 VM (3x3, stride 1, pads 1; against the im2col
path of :mod:`asyncrt.ops._im2col`): 276 -> 156 us for 32 x 8 planes of
16 x 16 (the test CNN at batch 32), 193 -> 127 us for 8 x 32 of 14 x 14,
834 -> 694 us for 8 x 32 of 28 x 28; a tie at ``N * H`` of 14 or 28 rows;
389 -> 444 us (slower) for one 56 x 56 image. Dense and grouped
convolutions lose (their im2col matmul is already well shaped), so only
depthwise ones (one input and one output channel per group) come here.

Channels are laid out channel-major for the matmul, so the input goes in
and the output comes out through one transposing copy each; the bias add
rides on the second, and the weights are written into ``B``'s diagonals
through one strided view every call (parameters may be reloaded). The
band's zeros multiply every input cell of a row, so an input holding NaN or
infinity takes the im2col path instead (an ``isfinite`` pass a call
decides it).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np

from ._common import Array, bind_all_finite
from ._conv_epilogue import bind_bias_activation

__all__ = ("MAX_PADDED_WIDTH", "MIN_ROWS", "bind_banded", "takes")

#: Padded rows at most this wide: beyond, the band's zeros cost more than
#: im2col's copies (measured at 58 for 56-wide planes).
MAX_PADDED_WIDTH = 32
#: At least this many output rows (``N * H``) per channel's matmul: below,
#: the extra copies cost what the matmul saves (a tie at 14-32 rows).
MIN_ROWS = 64


def takes(
    xp: ModuleType,
    x: Array,
    w: Array,
    out: Array,
    group: int,
    dilations: tuple[int, ...],
) -> bool:
    """Whether a stride-1 convolution of these shapes takes this path:
    numpy, 2-D, depthwise, narrow planes and enough rows."""
    if xp is not np or x.ndim != 4 or x.dtype != out.dtype:
        return False
    n, c = x.shape[:2]
    m, cg, _, kw = w.shape
    padded_width = out.shape[3] + (kw - 1) * dilations[1]
    return bool(
        cg == 1
        and m == group == c
        and kw > 1
        and padded_width <= MAX_PADDED_WIDTH
        and n * out.shape[2] >= MIN_ROWS
    )


def bind_banded(
    xp: ModuleType,
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    limit: float,
    exact: Callable[[], None],
) -> Callable[[], None] | None:
    """The depthwise convolution of :func:`takes`' shapes, bound to these
    arrays, or ``None`` if its scratch would not fit in ``limit`` bytes.
    An input holding NaN or infinity runs ``exact`` (the same convolution
    without the band) instead: the band's zeros would spread it along its
    rows (``inf * 0`` is NaN).

    :param x: ``(N, C, H_in, W_in)``.
    :param w: ``(C, 1, Kh, Kw)``.
    :param bias: ``(C,)`` or ``None``.
    :param out: ``(N, C, H, W)``, C-contiguous.
    :param begin: the pads before each spatial axis.
    """
    n, c, h_in, w_in = x.shape
    kh, kw = w.shape[2:]
    h, width = out.shape[2:]
    dh, dw = dilations
    rows = h + (kh - 1) * dh  # the padded plane
    pitch = width + (kw - 1) * dw
    item = x.itemsize
    scratch = item * (
        c * n * rows * pitch  # padded planes
        + c * n * h * kh * pitch  # L
        + c * kh * pitch * width  # B
        + c * n * h * width  # the matmul's result
    )
    if scratch > limit:
        return None
    # Channel-major padded planes; their borders stay zero.
    planes = xp.zeros((c, n, rows, pitch), dtype=x.dtype)
    top, left = begin
    interior = planes[:, :, top : top + h_in, left : left + w_in]
    source = x.transpose(1, 0, 2, 3)
    # L[c, n, i, k, p] = planes[c, n, i + k * dh, p]: each row kh times.
    s_c, s_n, s_row, s_col = planes.strides
    repeated = np.lib.stride_tricks.as_strided(
        planes, (c, n, h, kh, pitch), (s_c, s_n, s_row, dh * s_row, s_col)
    )
    lhs = xp.empty((c, n, h, kh, pitch), dtype=x.dtype)
    matrix = lhs.reshape(c, n * h, kh * pitch)
    # B[c, k * P + kw * dw + j, j] = w[c, 0, k, kw]: a diagonal per tap.
    band = xp.zeros((c, kh * pitch, width), dtype=x.dtype)
    b_c, b_row, b_col = band.strides
    diagonals = np.lib.stride_tricks.as_strided(
        band, (c, kh, kw, width), (b_c, pitch * b_row, dw * b_row, b_row + b_col)
    )
    taps = w.reshape(c, kh, kw, 1)
    result = xp.empty((c, n * h, width), dtype=x.dtype)
    planar = result.reshape(c, n, h, width).transpose(1, 0, 2, 3)
    bias_view = None if bias is None else bias.reshape(1, c, 1, 1)
    copyto, matmul = xp.copyto, xp.matmul
    epilogue = bind_bias_activation(xp, planar, bias_view, out, activation)
    finite = bind_all_finite(x)

    def banded() -> None:
        if not finite():
            exact()
            return
        copyto(diagonals, taps)
        copyto(interior, source)
        copyto(lhs, repeated)
        matmul(matrix, band, out=result)
        epilogue()

    return banded
