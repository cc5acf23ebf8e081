"""A 1 x 1 convolution and the depthwise convolution that reads it, one
loop: the expansion and the depthwise step of an inverted residual block
(MobileNetV2/V3, EfficientNet).

Apart, the expansion writes its output (NCHW) to memory, and the depthwise
loop (:mod:`asyncrt.ops._dwvector`) reads it back and transposes each block
of :func:`~asyncrt.ops._dwvector.lanes` channels into a channels-last plane
before its sums: on MobileNetV3's stride-2 layers the transposing copy
costs more than the sums, and inside a model the expanded tensor has left
the caches by the time it is read. Here each block's plane is computed in
place: for a few pixels at a time, the expansion's sums for the block's
channels are vectors (the block's weights of one input channel, times that
channel's pixel broadcast to every lane, fused multiply-adds over the
input channels), activated and stored into the plane's cells, and the
depthwise sums (:mod:`asyncrt.ops._dwvector`'s, unchanged) then read the
plane from L1. The expanded tensor is never made.

Results: the depthwise step's bits from a given plane are the depthwise
loop's; the expansion sums its input channels in order with fused
multiply-adds, another order and rounding than the GEMM's: the two steps
together equal the unfused kernels to float32 rounding. float32 only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..runtime import _threads
from . import _dwvector, _jit, _team_parts
from ._common import Array
from ._conv_epilogue import ACTIVATIONS
from ._vector_ir import compile_vectors

__all__ = ("bind", "takes")

_FLOAT32 = np.dtype(np.float32)

#: Pixels whose expansion sums are kept in registers at once: each input
#: channel's weight vector is loaded once for all of them.
CELLS = 16

_EXPAND_SOURCE = """
EXPAND_ACTIVATION = "{expand_activation}"
CELLS = 16


def _expansion(count):
    # an intrinsic: plane cells of ``count`` pixels of image n from p0 (row-
    # major over the input plane), lanes of channel block c0: the activated
    # 1 x 1 convolution of x (N, Cin, H, W) by wt (Cin, Cb) plus b1 (Cb,)
    def expand_(typingctx, x, wt, b1, xp, n, c0, p0, top, left):
        arrays = ((x, 4), (wt, 2), (b1, 1), (xp, 3))
        if not all(_is_float_array(a, ndim) for a, ndim in arrays):
            return None

        def codegen(context, builder, signature, args):
            e = _Emit(context, builder, LANES)
            b = builder
            source, weights, bias, plane = e.arrays(signature, args, 4)
            n, c0, p0, top, left = args[4:]
            _, inputs, height, width = cgutils.unpack_tuple(b, source.shape, 4)
            _, columns, stride = cgutils.unpack_tuple(b, plane.shape, 3)
            blocks = cgutils.unpack_tuple(b, weights.shape, 2)[1]
            cells = b.mul(height, width)
            start = e.load(bias, c0)
            sums = [cgutils.alloca_once_value(b, start) for _ in range(count)]
            first = e.index((e.index((n, inputs)), cells), p0)
            fma = cgutils.get_or_insert_function(
                b.module,
                ir.FunctionType(e.vector, [e.vector] * 3),
                f"llvm.fma.v{LANES}f32",
            )
            with cgutils.for_range(b, inputs) as loop:
                k = loop.index
                weight = e.load(weights, e.index((k, blocks), c0))
                row = e.index((k, cells), first)
                for j, total in enumerate(sums):
                    pixel = b.load(b.gep(source.data, [b.add(row, e.const(j))]))
                    product = [weight, e.spread(pixel), b.load(total)]
                    b.store(b.call(fma, product), total)
            cells = e.plane_cells(p0, width, top, left, columns, stride, count)
            for total, cell in zip(sums, cells):
                e.store(e.activate(b.load(total), EXPAND_ACTIVATION), plane, cell)
            return context.get_dummy_value()

        intp = types.intp
        signature = types.none(x, wt, b1, xp, intp, intp, intp, intp, intp)
        return signature, codegen

    return intrinsic(expand_)


expand_cells_ = _expansion(CELLS)
expand_cell_ = _expansion(1)


@_JIT
def kernel(x, wt, b1, xp, w, bias, out, first, last, top, left, bands):
    # parts first:last of out (N, C, OH, OW), a part a band of output rows
    # (bands a block) of a block of LANES channels: its rows' plane of the
    # expansion of x (N, Cin, H, W) by wt (Cin, Cb) and b1 (Cb,) computed
    # into xp (this share's (Hp, Wp, LANES) plane, the interior at top,
    # left), then the band's depthwise sums by w (KH * KW, Cb) and bias
    # (Cb,)
    batch, _, height, width = x.shape
    out_h, out_w = out.shape[2], out.shape[3]
    zero_pads(xp, top, left, height, width)
    for n in range(batch):
        for part in range(first, last):
            block = part // bands
            band = part - block * bands
            c0 = block * LANES
            i0 = band * out_h // bands
            i1 = (band + 1) * out_h // bands
            # the input rows the band's windows reach (the others are pads)
            h0 = max(0, i0 * SH - top)
            h1 = min(height, (i1 - 1) * SH + (KH - 1) * DH + 1 - top)
            p = h0 * width
            end = max(p, h1 * width)
            while p + CELLS <= end:
                expand_cells_(x, wt, b1, xp, n, c0, p, top, left)
                p += CELLS
            while p < end:
                expand_cell_(x, wt, b1, xp, n, c0, p, top, left)
                p += 1
            band_sums(xp, w, bias, out, n, c0, i0 * out_w, i1 * out_w)
"""


@functools.cache
def _kernel(
    geometry: tuple[int, ...], expand_activation: str, activation: str
) -> Callable[..., None]:
    """The loop for depthwise ``(KH, KW, SH, SW, DH, DW, LANES)`` and the
    two activations, compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_pwdw",
        _dwvector.SUMS_SOURCE + _EXPAND_SOURCE,
        "kernel",
        geometry=geometry,
        activation=activation,
        expand_activation=expand_activation,
        interleave=_dwvector.INTERLEAVE,
        cells=CELLS,
    )


def _bands(
    blocks: int,
    inputs: int,
    plane: tuple[int, int],
    out_plane: tuple[int, int],
    kernel: tuple[int, int],
    stride: int,
    dilation: int,
    top: int,
) -> int:
    """Bands of output rows each block of channels is cut into: where the
    blocks are too few to share out evenly over the cores (MobileNetV3's
    72 channels are 5 blocks: 3 and 2 on two cores), bands even the shares
    out, at the cost of the input rows two bands' windows both reach (their
    expansion computed twice). The count whose busiest core has the least
    work: its parts times a part's expansion (input rows) and sums (output
    rows), counted in multiply-adds of a block."""
    cores = _threads.available_cores()
    if cores < 2:
        return 1
    height, width = plane
    out_h, out_w = out_plane
    k_h, k_w = kernel

    def busiest(bands: int) -> float:
        parts = -(-blocks * bands // cores)
        rows_out = out_h / bands
        rows_in = min(height, (rows_out - 1) * stride + (k_h - 1) * dilation + 1)
        return parts * (rows_in * width * inputs + rows_out * out_w * k_h * k_w * 2)

    return min(range(1, min(4, out_h) + 1), key=busiest)


def takes(x: Array, w1: Array, w2: Array) -> bool:
    """Whether :func:`bind` computes these arrays' convolutions (float32,
    numba available)."""
    return bool(
        all(a.dtype == _FLOAT32 for a in (x, w1, w2))
        and x.ndim == 4
        and _jit.available()
    )


def bind(
    x: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
    out: Array,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    expand_activation: str = "none",
    activation: str = "none",
) -> Callable[[], None]:
    """``out (N, C, OH, OW)``: the depthwise convolution by ``w2 (C, 1, KH,
    KW)`` plus ``b2 (C,)`` of ``expand_activation(w1 @ x + b1)``, ``x (N,
    Cin, H, W)`` and ``w1 (C, Cin, 1, 1)``, then ``activation``; all
    C-contiguous float32, the weights and biases constant (copied once,
    into blocks). The loop is compiled now; its blocks of channels are
    split over the kernel threads where the work pays for it.

    :param begin: the depthwise step's pads before each spatial axis.
    """
    for name in (expand_activation, activation):
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}")
    _, inputs, height, width = x.shape
    channels = w1.shape[0]
    k_h, k_w = w2.shape[2:]
    out_h, out_w = out.shape[2:]
    vector = _dwvector.lanes()
    block_count = -(-channels // vector)
    blocks = block_count * vector
    rows, columns = _dwvector.plane_extent(
        x.shape, out.shape, w2.shape, strides, begin, dilations
    )
    # zeros past the last channel: the pad lanes' planes are zero, their
    # sums dropped
    expand = np.zeros((inputs, blocks), np.float32)
    expand[:, :channels] = w1.reshape(channels, inputs).T
    expand_bias = np.zeros(blocks, np.float32)
    expand_bias[:channels] = b1
    taps = np.zeros((k_h * k_w, blocks), np.float32)
    taps[:, :channels] = w2.reshape(channels, k_h * k_w).T
    shift = np.zeros(blocks, np.float32)
    shift[:channels] = b2
    kernel = _kernel(
        (k_h, k_w, *strides, *dilations, vector), expand_activation, activation
    )
    work = out.size * k_h * k_w + channels * inputs * height * width * x.shape[0]
    bands = _bands(
        block_count,
        inputs,
        (height, width),
        (out_h, out_w),
        (k_h, k_w),
        strides[0],
        dilations[0],
        begin[0],
    )
    # One share a core: a share's plane is reused by each of its blocks in
    # its core's cache (with four a core, MobileNetV3 took 1.09-1.10 ms a
    # run against 1.04-1.07 in alternating runs, two threads)
    shares = _team_parts.shares(
        block_count * bands, work, _dwvector.MIN_WORK_PER_THREAD, per_thread=1
    )
    shapes = ((len(shares), rows, columns, vector),)
    grid = np.empty((1, 1, 1), np.float32)
    call = (x, expand, expand_bias, grid, taps, shift, out, 0, 1, *begin, bands)
    _jit.specialise(kernel, call)
    arrays = (x, expand, expand_bias, None, taps, shift, out)
    return _dwvector.bind_on_planes(
        kernel, arrays, 3, shapes, shares, (*begin, bands), work
    )
