"""Depthwise convolution channels-last, in explicit vectors of channels.

The planar loop (:mod:`asyncrt.ops._depthwise`) vectorises along an
output row, which is too short on a late layer's 14 x 14 or 7 x 7 planes;
numba's channels-last loop vectorises along the channels but keeps every
sum in memory, because LLVM cannot prove that the output does not overlap
the weights (numba marks no array ``noalias``), and reloads the weights
for every pixel: 17-28 GFLOP/s on the 2-core VM. Here a numba intrinsic
writes the loop nest in LLVM vectors itself: for each block of
:func:`lanes` channels, every tap's weights are loaded once into vector
registers, and each output pixel's block is the bias plus the taps'
products summed in a register, one load per tap: 55-76 GFLOP/s on the same
shapes (mnv3's 5 x 5 layers).

Layout: each block of channels is copied channels-last into a zero-padded
plane of its own (rows x columns x lanes), so every tap of every pixel is
one unaligned vector load and no pixel needs a bounds check. The copy
moves tiles of :data:`COPY_TILE` channels by as many cells, transposed in
registers (another intrinsic): numpy's transposing copy cost as much as
the sums, and up to 5x more where the planes are a few KiB apart. Each
share of the blocks has one plane (a few KiB: 18 x 18 x 16 floats for a
5 x 5 kernel over 14 x 14), the next block copied over the last, so the
sums read from L1; the pads are zeroed once a call (scratch other kernels
wrote over: the calling thread's, :mod:`asyncrt.ops._scratch`). A plane
of all the channels (pixels a channel count apart) took 352 KiB for 240
channels of 14 x 14 and went through L2 on every call: that layer, one
thread, 48 -> 45 us alone, and 68 -> 55 us with the caches flushed
before each call, as inside a model. The outputs go straight into NCHW: a block
of channels is computed for a vector of output cells (row-major over the
plane) at a time, and the cells' vectors, transposed in registers, are
runs of each channel's plane (240 channels of 14 x 14: 64 -> 55 us
against a channels-last result copied back). ReLU and hard-swish are
applied to each sum in its register, as
:data:`asyncrt.ops._conv_epilogue.EXPRESSIONS` has them (the same
operations in the same order: the pass's bits). A pass over each block's
planes after the sums, which numba left scalar, cost more than the sums
(240 channels of 14 x 14, 5 x 5, one thread: 89 us against 54 in the
registers). MobileNetV3 (one thread) ran 6% faster with this path than
with the planar loop and numba's channels-last loop, before the direct
stores.

Results: the bias first, then the taps in row-major order, each product
rounded before it is added (no fused multiply-add), as the other
depthwise loops sum; pads add zero products, as im2col's do. float32
only; float64 keeps numba's loop.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _jit, _jitmath, _scratch, _team_parts
from ._common import Array
from ._conv_epilogue import ACTIVATIONS
from ._vector_ir import compile_vectors

__all__ = ("MIN_WORK_PER_THREAD", "bind", "lanes", "takes")

#: Multiply-adds each thread of the part pool gets at least before a
#: convolution's channel blocks are split over it (a hand-off costs tens of
#: microseconds); on the native team, :data:`asyncrt.ops._team_parts.MIN_TEAM_WORK`
#: in all.
MIN_WORK_PER_THREAD = 2_000_000

_FLOAT32 = np.dtype(np.float32)


#: The depthwise sums from a block's plane (``block_sums``, ``band_sums``,
#: ``zero_pads``):
#: what :mod:`asyncrt.ops._pointwise_depthwise` shares.
SUMS_SOURCE = (
    "\n".join(_jitmath.head()[1:])
    + """
KH, KW, SH, SW, DH, DW, LANES = {geometry}
INTERLEAVE = {interleave}
ACTIVATION = "{activation}"


class _Cells:
    # IR for one call: a block of LANES channels from c0, its weights and
    # bias loaded, and the output cells' sums
    def __init__(self, context, builder, signature, args):
        e = self.e = _Emit(context, builder, LANES)
        self.b = builder
        self.x, taps, shift, self.out = e.arrays(signature, args, 4)
        self.n, self.c0, self.q0 = args[4:7]
        self.rows, self.width, self.stride = cgutils.unpack_tuple(
            builder, self.x.shape, 3
        )
        self.out_w = cgutils.unpack_tuple(builder, self.out.shape, 4)[3]
        blocks = cgutils.unpack_tuple(builder, taps.shape, 2)[1]
        self.weights = [
            e.load(taps, e.index((e.const(t), blocks), self.c0)) for t in range(KH * KW)
        ]
        self.start = e.load(shift, self.c0)
        row, column = self.width, self.stride  # elements a row, a pixel
        self.offsets = [
            e.index((e.const(a * DH), row, column), (e.const(b * DW), column))
            for a in range(KH)
            for b in range(KW)
        ]

    def row_column(self):
        # the output row and column of cell q0
        i = self.b.sdiv(self.q0, self.out_w)
        return i, self.b.sub(self.q0, self.b.mul(i, self.out_w))

    def corner(self, i, j):
        # the flat index of output cell (i, j)'s first tap in the block's
        # plane
        e = self.e
        row = e.index((i, e.const(SH)))
        pixel = e.index((row, self.width), (j, e.const(SW)))
        return e.index((pixel, self.stride))

    def sums(self, corners):
        # the activated sums of the cells at these corners, their chains
        # interleaved tap by tap: one cell's 25 dependent adds alone fill
        # the scheduler and leave the adder waiting on their latency
        b = self.b
        totals = [self.start] * len(corners)
        for weight, offset in zip(self.weights, self.offsets):
            for k, corner in enumerate(corners):
                tap = self.e.load(self.x, b.add(corner, offset))
                totals[k] = b.fadd(totals[k], b.fmul(weight, tap))
        return [self.e.activate(total, ACTIVATION) for total in totals]



def _typed(xp, w, bias, out):
    arrays = ((xp, 3), (w, 2), (bias, 1), (out, 4))
    return all(_is_float_array(a, ndim) for a, ndim in arrays)


@intrinsic
def block_run_(typingctx, xp, w, bias, out, n, c0, q0):
    # out[n, c0:c0 + LANES, cells q0:q0 + LANES] (cells row-major over the
    # output plane): LANES cells' sums, transposed in registers into runs
    # of each channel's plane, stored straight into NCHW
    if not _typed(xp, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        cells = _Cells(context, builder, signature, args)
        e = cells.e
        i, j = cells.row_column()
        corners = []
        for _ in range(LANES):
            corners.append(cells.corner(i, j))
            j = builder.add(j, e.const(1))
            wrap = builder.icmp_signed("==", j, cells.out_w)
            j = builder.select(wrap, e.const(0), j)
            i = builder.select(wrap, builder.add(i, e.const(1)), i)
        sums = []
        for g in range(0, LANES, INTERLEAVE):
            sums += cells.sums(corners[g : g + INTERLEAVE])
        e.store_runs(sums, cells.out, cells.n, cells.c0, cells.q0)
        return context.get_dummy_value()

    intp = types.intp
    return types.none(xp, w, bias, out, intp, intp, intp), codegen


@intrinsic
def block_cell_(typingctx, xp, w, bias, out, n, c0, q):
    # out[n, c0:c0 + LANES, cell q]: one cell, each channel stored alone
    if not _typed(xp, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        cells = _Cells(context, builder, signature, args)
        (total,) = cells.sums([cells.corner(*cells.row_column())])
        cells.e.store_lanes(total, cells.out, cells.n, cells.c0, cells.q0)
        return context.get_dummy_value()

    intp = types.intp
    return types.none(xp, w, bias, out, intp, intp, intp), codegen


_JIT = numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)


@_JIT
def zero_pads(xp, top, left, height, width):
    # the cells of the plane xp (rows, columns, LANES) outside its interior
    # (height x width at top, left): scratch other kernels wrote over
    rows, columns = xp.shape[0], xp.shape[1]
    for r in range(rows):
        inside = top <= r < top + height
        q = 0
        while q < columns:
            if inside and q == left:
                q = left + width
                continue
            for c in range(LANES):
                xp[r, q, c] = 0.0
            q += 1


@_JIT
def band_sums(xp, w, bias, out, n, c0, q0, q1):
    # out[n, c0:c0 + LANES] (the channels it has) at cells q0:q1 (row-major
    # over the output plane) from the block's plane
    q = q0
    while q + LANES <= q1:
        block_run_(xp, w, bias, out, n, c0, q)
        q += LANES
    while q < q1:
        block_cell_(xp, w, bias, out, n, c0, q)
        q += 1


@_JIT
def block_sums(xp, w, bias, out, n, c0):
    # every cell of out[n, c0:c0 + LANES]
    band_sums(xp, w, bias, out, n, c0, 0, out.shape[2] * out.shape[3])


"""
)

_COPY_SOURCE = """
TILE = {tile}


@_JIT
def kernel(x, xp, w, bias, out, first, last, top, left):
    # channel blocks first:last (of LANES channels) of out (N, C, OH, OW)
    # from x (N, C, H, W): each block's channels copied into xp (Hp, Wp,
    # LANES: this share's own channels-last plane of one block, the
    # interior at top, left) then summed while hot; w (KH * KW, Cb), bias
    # (Cb,): Cb channels in whole blocks. Blocks are independent: a team's
    # threads each take some, each share its own plane.
    batch, channels, height, width = x.shape
    cells = height * width
    whole = cells - cells % TILE
    last_channel = channels - 1
    zero_pads(xp, top, left, height, width)
    for n in range(batch):
        for block in range(first, last):
            c0 = block * LANES
            for t0 in range(0, LANES, TILE):
                for p0 in range(0, whole, TILE):
                    tile_in_(x, xp, n, c0 + t0, t0, p0, top, left)
            for p in range(whole, cells):
                h = p // width
                q = p - h * width
                for c in range(LANES):
                    xp[top + h, left + q, c] = x[n, min(c0 + c, last_channel), h, q]
            block_sums(xp, w, bias, out, n, c0)
"""


_TILE_SOURCE = """


@intrinsic
def tile_in_(typingctx, x, pixels, n, c0, lane0, p0, top, left):
    # x[n, c0:c0 + TILE] at plane cells p0:p0 + TILE -> lanes lane0:lane0 +
    # TILE of their pixels of ``pixels`` (one block's channels-last plane,
    # the interior at top, left); channels past the last repeat it (into
    # pad lanes, whose sums are dropped)
    if not (_is_float_array(x, 4) and _is_float_array(pixels, 3)):
        return None

    def codegen(context, builder, signature, args):
        e = _Emit(context, builder, TILE)
        source, target = e.arrays(signature, args, 2)
        n, c0, lane0, p0, top, left = args[2:]
        _, channels, height, width = cgutils.unpack_tuple(builder, source.shape, 4)
        _, columns, stride = cgutils.unpack_tuple(builder, target.shape, 3)
        plane = builder.mul(height, width)
        last = builder.sub(channels, e.const(1))
        loaded = []
        for k in range(TILE):
            c = builder.add(c0, e.const(k))
            c = builder.select(builder.icmp_signed("<", c, channels), c, last)
            plane_start = e.index((e.index((n, channels), c), plane), p0)
            loaded.append(e.load(source, plane_start))
        cells = e.plane_cells(p0, width, top, left, columns, stride, TILE)
        for pixel, cell in zip(e.transpose(loaded), cells):
            e.store(pixel, target, builder.add(cell, lane0))
        return context.get_dummy_value()

    intp = types.intp
    return types.none(x, pixels, intp, intp, intp, intp, intp, intp), codegen
"""


#: Channels and cells the layout copies move as one tile, transposed in
#: registers: 8 x 8 beat 16 x 16 (three shuffle stages, not four) on the
#: 2-core AVX-512 VM, and both beat numpy's transposing copies (240
#: channels of 14 x 14: 11 and 8 us in and out, against 14 and 15; 96 of
#: 28 x 28, planes 3 KiB apart: 14 and 10 against 24 and 47).
COPY_TILE = 8


#: Output cells whose sums are emitted tap by tap together: one cell's
#: chain of dependent adds alone fills the scheduler while each waits on
#: the last. 240 channels of 14 x 14, 5 x 5, one thread: 46 -> 38 us for
#: the sums with 4 (2: 44, 8: 39, 16: 42; more cells keep more sums in
#: registers beside the 25 weight vectors).
INTERLEAVE = 4


@functools.cache
def lanes() -> int:
    """Channels a vector holds: 16 where the CPU has AVX-512 (32 vector
    registers: a 5 x 5 kernel's 25 weight vectors stay in registers), 8
    otherwise (LLVM splits wider vectors for any CPU, so the choice is
    speed, never correctness)."""
    if os.environ.get("NUMBA_CPU_NAME"):
        return 8  # compiled for another CPU
    try:
        binding = importlib.import_module("llvmlite.binding")  # numba's
        return 16 if binding.get_host_cpu_features().get("avx512f", False) else 8
    except Exception:  # pragma: no cover - llvmlite comes with numba
        return 8


@functools.cache
def _kernel(geometry: tuple[int, ...], activation: str) -> Callable[..., None]:
    """The loop for ``(KH, KW, SH, SW, DH, DW, LANES)`` and ``activation``
    (in the registers), compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_dwvector",
        SUMS_SOURCE + _COPY_SOURCE + _TILE_SOURCE,
        "kernel",
        geometry=geometry,
        activation=activation,
        tile=COPY_TILE,
        interleave=INTERLEAVE,
    )


def plane_extent(
    x_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
) -> tuple[int, int]:
    """The rows and columns of a block's channels-last plane for NCHW
    shapes: as far as the last output's last tap reaches (or the input's
    end, past it), the interior at ``begin``, the pads zero."""
    height, width = x_shape[2:]
    out_h, out_w = out_shape[2:]
    k_h, k_w = w_shape[2:]
    rows = max(
        begin[0] + height, (out_h - 1) * strides[0] + (k_h - 1) * dilations[0] + 1
    )
    columns = max(
        begin[1] + width, (out_w - 1) * strides[1] + (k_w - 1) * dilations[1] + 1
    )
    return rows, columns


def takes(x: Array, w: Array) -> bool:
    """Whether :func:`bind` computes a depthwise convolution of these
    arrays (float32; :func:`asyncrt.ops._depthwise.takes` checked the
    rest)."""
    return bool(x.dtype == np.float32 and w.dtype == np.float32 and _jit.available())


def bind(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    constant_weights: bool = False,
    constant_bias: bool = False,
) -> Callable[[], None]:
    """The depthwise convolution ``out (N, C, OH, OW)`` of ``x (N, C, H, W)``
    and ``w (C, 1, KH, KW)`` (all C-contiguous float32) as a call without
    arguments, its loop compiled now, its blocks of channels split over the
    kernel threads where the work pays for it
    (:func:`asyncrt.ops._team_parts.shares`).

    :param begin: the pads before each spatial axis.
    :param constant_weights: ``w``'s values stay as they are while the
        binding lives: its channels-last copy is made once.
    :param constant_bias: so do ``bias``'s (copied once: a call of a
        model's run finds numpy's code cold, a copy then 2-4 us).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    channels = x.shape[1]
    k_h, k_w = w.shape[2:]
    vector = lanes()
    block_count = -(-channels // vector)
    blocks = block_count * vector
    rows, columns = plane_extent(x.shape, out.shape, w.shape, strides, begin, dilations)
    taps = np.zeros((k_h * k_w, blocks), np.float32)
    weights = w.reshape(channels, k_h * k_w).T
    shift = np.zeros(blocks, np.float32)
    own_weights, own_bias = taps[:, :channels], shift[:channels]
    kernel = _kernel((k_h, k_w, *strides, *dilations, vector), activation)
    work = out.size * k_h * k_w
    shares = _team_parts.shares(block_count, work, MIN_WORK_PER_THREAD)
    # each share's own plane of one block of channels (a few KiB: in L1)
    shapes = ((len(shares), rows, columns, vector),)
    # Compiled now for arrays of the types a call borrows (their sizes do
    # not matter to the compiler).
    grid = np.empty((1, 1, 1), np.float32)
    _jit.specialise(kernel, (x, grid, taps, shift, out, 0, 1, *begin))
    copyto = np.copyto
    if constant_weights:
        copyto(own_weights, weights)
    per_call_bias = None if constant_bias else bias  # copied each call
    if bias is not None and constant_bias:
        copyto(own_bias, bias)

    compute = bind_on_planes(
        kernel, (x, None, taps, shift, out), 1, shapes, shares, begin, work
    )

    def depthwise() -> None:
        if not constant_weights:
            copyto(own_weights, weights)  # an input's values change per run
        if per_call_bias is not None:
            copyto(own_bias, per_call_bias)
        compute()

    return depthwise


def bind_on_planes(
    kernel: Callable[..., None],
    arrays: tuple[Any, ...],
    position: int,
    shapes: tuple[tuple[int, ...], ...],
    shares: list[tuple[int, int]],
    trailing: tuple[Any, ...],
    work: float,
) -> Callable[[], None]:
    """``kernel(*arrays, first, last, *trailing)`` over ``shares``
    (:func:`asyncrt.ops._jit.bind_parts`), ``arrays[position]`` each
    share's plane: the calling thread's scratch of ``shapes`` (one row a
    share), borrowed on each call, the loop bound again only where the
    scratch moved."""
    borrowed = _scratch.Borrowed(shapes, _FLOAT32)
    views: list[Any] = [None, None]  # the scratch array, the loop bound to it

    def on_planes() -> None:
        (planes,) = borrowed()
        if views[0] is not planes:
            bound = (*arrays[:position], planes, *arrays[position + 1 :])
            views[:] = [
                planes,
                _jit.bind_parts(
                    kernel,
                    bound,
                    shares,
                    per_part=frozenset({position}),
                    trailing=trailing,
                    work=work,
                ),
            ]
        compute = views[1]
        compute()

    return on_planes
