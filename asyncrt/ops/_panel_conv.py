"""A convolution's GEMM, ``out (K, P) = W (K, D) @ X (D, P)`` per image,
with the weights packed once, in explicit LLVM vectors (float32), on
native threads.

A convolution in NCHW is a GEMM whose constant operand is on the left:
``W`` (output channels x input channels x taps) times the column matrix
``X`` (a 1x1 convolution's input plane itself, or im2col's columns), one
row of the result per output plane. :mod:`asyncrt.ops._panel_gemm` packs
a constant right operand; here ``W`` is packed into blocks of
:data:`ROWS` output channels, each ``(D, ROWS)`` contiguous
(:func:`pack`, shared by value), and the micro-kernel keeps 8 channels x
32 positions of the result in sixteen vector registers: per ``d``, two
vector loads of ``X``'s row and each channel's weight broadcast into two
fused multiply-adds. Positions left over take blocks of 16 and 8, the
last few a block of 8 ending at the run's end, or, where one or four are
left after a block of 16 (7 x 7 and 14 x 14 planes), are summed beside
it in the same pass, a vector of its 8 channels each; channels past
``K`` (the last block's zero padding) are not stored. The bias (one per
channel) and ReLU are added as blocks are stored
(:data:`asyncrt.ops._panel_gemm.COMMON_SOURCE`'s epilogue).

BLAS packs ``W`` on every call and hands the product to its threads, which
costs most at the small planes of a MobileNet's pointwise convolutions
(49 to 784 positions). Here the parts (images x blocks of channels x runs
of positions) go to a native team (:mod:`asyncrt.runtime._native_team`)
from :data:`asyncrt.ops._panel_gemm.MIN_PARALLEL_WORK` multiply-adds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..runtime import _native_team
from . import _packed
from ._common import Array
from ._panel_gemm import (
    BIAS_FLAG,
    COMMON_SOURCE,
    COMMON_VALUES,
    HARD_SWISH_FLAG,
    MIN_PARALLEL_WORK,
    RELU_FLAG,
    RESIDUAL_FLAG,
)
from ._vector_ir import compile_vectors

__all__ = ("ROWS", "bind", "pack")

#: Output channels a block computes (x 32 positions).
ROWS = 8
#: Partial sums of a lone position's column (a power of two): four
#: vectors of multiply-adds in flight hide their latency (a squeeze-
#: excitation's 576 -> 144 product 16 -> 5 us, one thread, 2-core VM).
COLUMN_SUMS = 4
#: Products deeper than this are summed by chunks of :data:`DEPTH_CHUNK`
#: rows of ``x``, the partial sums kept in ``out`` (each block's chain of
#: multiply-adds continued from them: the same bits; a lone position's
#: column adds its partial sums in another order). Unchunked, a block of
#: weights (``depth x ROWS``) and the columns it reads outgrow the cache
#: and come from memory once per block of positions; chunked, each
#: weight is read once. ResNet-18's 512 -> 512 channels at 7 x 7 (depth
#: 4608, 49 positions), two threads: 1.58 -> 1.13-1.19 ms (128 to 512
#: rows a chunk alike); 512 channels of 14 x 14 (depth 2304): 2.8 -> 2.2.
#: A chunk's blocks lie a block's weights apart, past what the hardware's
#: stream prefetch follows: each block prefetches the next one's rows as
#: it sums its own. In a model the weights come from memory (ResNet-18's
#: 46 MB outgrow the 32 MB L3): the 7 x 7 layer with a cold cache 1.51-1.74
#: -> 1.33-1.50 ms; ResNet-18 0.99-1.01x -> 0.88-0.95x ONNX Runtime's time
#: (three alternating runs each).
CHUNKED_DEPTH = 1024
DEPTH_CHUNK = 256
_LANES = 16
#: Positions a block of vectors covers.
_WIDE = 2 * _LANES
_FLOAT32 = np.dtype(np.float32)
_NO_BIAS = np.zeros(1, _FLOAT32)
#: The int64 slots of ``conv_claimed``'s data: the next part, parts,
#: images, K, D, P, channel blocks, flags, the addresses of the packed
#: weights, x (and its image stride, in floats), out (and its image
#: stride), bias and its length; the parts per image: runs of channel
#: blocks, runs of 32 positions; the row strides of x and out (floats);
#: the step from one image's packed weights to the next (floats: 0 where
#: every image takes the same); the scale of ``x``'s rows, its image step
#: and its length; the residual, its image and row steps and rows.
_SLOTS = 27

_SOURCE = (
    COMMON_SOURCE
    + """
SLOTS = {slots}
ROWS = {rows}
COLUMN_SUMS = {column_sums}
CHUNKED_DEPTH, DEPTH_CHUNK = {chunked_depth}, {depth_chunk}
SCALED = {scaled}  # each row d of x times scale[d] as it is loaded


def _conv_intrinsic(emit, chunked=False):
    # an intrinsic block_(w, x, out, bias, scale, res, kb, c0, flags)
    # (chunked: chunk_(..., flags, d0, d1)) of six float32 C-contiguous
    # arrays (3, 2, 2, 1, 1 and 2 dimensions) and intp, whose code
    # emit(context, builder, signature, args) writes
    def typed(arrays, ints):
        dims = (3, 2, 2, 1, 1, 2)
        if not all(_is_float_array(a, n) for a, n in zip(arrays, dims)):
            return None
        return types.void(*arrays, *[types.intp] * ints), emit

    if chunked:

        def chunk_(typingctx, w, x, out, bias, scale, res, kb, c0, flags, d0, d1):
            return typed((w, x, out, bias, scale, res), 5)

        return intrinsic(chunk_)

    def block_(typingctx, w, x, out, bias, scale, res, kb, c0, flags):
        return typed((w, x, out, bias, scale, res), 3)

    return intrinsic(block_)


def _block(vectors, lanes, columns=0):
    # an intrinsic block_(w, x, out, bias, scale, kb, c0, flags): out[8 kb :
    # 8 kb + ROWS, c0 : c0 + vectors * lanes] = w[kb] (D, ROWS) transposed
    # @ x[:, c0 : ...] (its rows scaled where SCALED), finished (_finish);
    # channels past out's rows are not stored; columns: as _chunk's
    emit = functools.partial(_emit_block, vectors, lanes, False, columns=columns)
    return _conv_intrinsic(emit)


def _chunk(vectors, lanes, columns=0):
    # an intrinsic chunk_(w, x, out, bias, scale, kb, c0, flags, d0, d1):
    # block_'s sums over d0:d1 only, added to out's where d0 > 0 (the sums
    # of 0:d0, stored unfinished), finished where d1 is the depth; lanes 0:
    # the lone position's column; columns: that many positions after the
    # vectors' summed beside them, each the block's channels in a vector
    if lanes:
        emit = functools.partial(_emit_block, vectors, lanes, True, columns=columns)
    else:
        emit = functools.partial(_emit_column, chunked=True)
    return _conv_intrinsic(emit, chunked=True)


def _scaled(b, e, value, scale_, d):
    # value (x's row d, a vector or a float) times scale[d] where SCALED:
    # the product a squeeze-excitation would have stored, rounded alike
    if not SCALED:
        return value
    factor = b.load(b.gep(scale_.data, [d]))
    if isinstance(value.type, ir.VectorType):
        factor = e.spread(factor)
    return b.fmul(value, factor)


def _emit_block(
    vectors, lanes, chunked, context, builder, signature, args, columns=0
):
    b = builder
    e = _Emit(context, builder, lanes)
    w_, x_, out_, bias_, scale_, res_ = e.arrays(signature, args, 6)
    kb, c0, flags = args[6:9]
    # (the arrays' second axes are their row strides)
    depth, width = cgutils.unpack_tuple(b, x_.shape, 2)
    d0, d1 = args[9:11] if chunked else (e.const(0), depth)
    fma = _fma(b, e.vector)
    sums = [
        [cgutils.alloca_once_value(b, e.splat(0.0)) for _ in range(vectors)]
        for _ in range(ROWS)
    ]
    # the lone columns after the vectors: a vector of the block's channels
    # each, one multiply-add a row (a pass of their own per column cost
    # ResNet-18's 7 x 7 layers, 48 positions and one, 11 % more time)
    lone = _LoneColumns(context, b, columns, c0, vectors * lanes) if columns else None
    if chunked:  # the sums so far, where this is not the first chunk
        channels, out_width = cgutils.unpack_tuple(b, out_.shape, 2)
        with b.if_then(b.icmp_signed("!=", d0, e.const(0))):
            for r in range(ROWS):
                channel = b.add(b.mul(kb, e.const(ROWS)), e.const(r))
                with b.if_then(b.icmp_signed("<", channel, channels), likely=True):
                    start = b.add(b.mul(channel, out_width), c0)
                    for v in range(vectors):
                        cell = b.add(start, e.const(v * lanes))
                        b.store(e.load(out_, cell), sums[r][v])
            if lone is not None:
                lone.resume(out_, kb)
    block = b.mul(b.mul(kb, depth), e.const(ROWS))
    # by chunks, the next block's rows d0:d1 lie a block's weights further
    # on, where the hardware's stream prefetch does not look: fetched ahead
    # while these are summed
    following = b.mul(depth, e.const(ROWS)) if chunked else None
    with cgutils.for_range_slice(b, d0, d1, e.const(1)) as (d, _):
        row = b.add(b.mul(d, width), c0)
        xs = [
            _scaled(b, e, e.load(x_, b.add(row, e.const(v * lanes))), scale_, d)
            for v in range(vectors)
        ]
        at = b.add(block, b.mul(d, e.const(ROWS)))
        if following is not None:
            e.prefetch(w_, b.add(at, following))
        for r in range(ROWS):
            weight = b.load(b.gep(w_.data, [b.add(at, e.const(r))]))
            weight = e.spread(weight)
            for v in range(vectors):
                slot = sums[r][v]
                b.store(b.call(fma, [weight, xs[v], b.load(slot)]), slot)
        if lone is not None:
            lone.add_row(w_, x_, scale_, at, row, d)
    rows = lambda r: [b.load(slot) for slot in sums[r]]  # noqa: E731
    if chunked:  # unfinished (no bias, no activation) before the last chunk
        flags = b.select(b.icmp_signed("==", d1, depth), flags, e.const(0))
    _store_rows(b, e, (out_, bias_, res_), (kb, c0, flags), rows)
    if lone is not None:
        lone.store(out_, bias_, res_, kb, flags)
    return None


class _LoneColumns:
    # columns positions c0 + first ...: the block's ROWS channels of each
    # summed in one vector (the packed weights of a row d are contiguous),
    # x[d, c] broadcast; finished as vectors of channels
    def __init__(self, context, builder, columns, c0, first):
        self.b = b = builder
        self.one = _Emit(context, builder, 1)
        self.across = _Emit(context, builder, ROWS)
        self.vector = self.across.vector
        self.fma = _fma(b, self.vector)
        self.zero = ir.Constant(self.vector, [ir.Constant(ir.FloatType(), 0.0)] * ROWS)
        self.sums = [cgutils.alloca_once_value(b, self.zero) for _ in range(columns)]
        self.offsets = [first + t for t in range(columns)]
        self.cells = [b.add(c0, self.one.const(o)) for o in self.offsets]

    def resume(self, out_, kb):
        # the sums so far from out (a chunk past the first)
        b = self.b
        channels, width = cgutils.unpack_tuple(b, out_.shape, 2)
        rows = _block_channels(b, self.one, kb, channels)
        for slot, cell in zip(self.sums, self.cells):
            cell_of = lambda c, cell=cell: b.add(b.mul(c, width), cell)  # noqa: E731
            b.store(_gather(b, self.one, self.zero, out_, rows, cell_of), slot)

    def add_row(self, w_, x_, scale_, at, row, d):
        # row d's term of every column (at: the block's weights of d; row:
        # x's cell of d at c0)
        b = self.b
        pointer = b.bitcast(b.gep(w_.data, [at]), self.vector.as_pointer())
        weights = b.load(pointer, align=4)
        for slot, offset in zip(self.sums, self.offsets):
            x = b.load(b.gep(x_.data, [b.add(row, self.one.const(offset))]))
            x = _scaled(b, self.one, x, scale_, d)
            total = b.call(self.fma, [weights, self.across.spread(x), b.load(slot)])
            b.store(total, slot)

    def store(self, out_, bias_, res_, kb, flags):
        # each column finished (_finish, lanes the channels) and stored
        b, one, i32 = self.b, self.one, ir.IntType(32)
        channels, width = cgutils.unpack_tuple(b, out_.shape, 2)
        res_width = cgutils.unpack_tuple(b, res_.shape, 2)[1]
        rows = _block_channels(b, one, kb, channels)
        (biases,) = cgutils.unpack_tuple(b, bias_.shape, 1)
        bias_rows = _block_channels(b, one, kb, biases)
        gather = functools.partial(_gather, b, one, self.zero)
        shift_of = lambda: gather(bias_, bias_rows, lambda c: c)  # noqa: E731
        for slot, cell in zip(self.sums, self.cells):
            at = lambda c, cell=cell: b.add(b.mul(c, res_width), cell)  # noqa: E731
            residual_of = lambda at=at: gather(res_, rows, at)  # noqa: E731
            value = _finish(b, self.across, b.load(slot), shift_of, flags, residual_of)
            for r, (channel, inside) in enumerate(rows):
                with b.if_then(inside, likely=True):
                    lane = b.extract_element(value, ir.Constant(i32, r))
                    cell_at = b.add(b.mul(channel, width), cell)
                    b.store(lane, b.gep(out_.data, [cell_at]))


def _block_channels(b, e, kb, limit):
    # (channel, whether it is below limit) for each of block kb's rows
    first = b.mul(kb, e.const(ROWS))
    channels = [b.add(first, e.const(r)) for r in range(ROWS)]
    return [(c, b.icmp_signed("<", c, limit)) for c in channels]


def _gather(b, e, zero, array, channels, cell_of):
    # a vector (zero's type) of array[cell_of(channel)] for the channels,
    # 0 where a channel is outside
    gathered = zero
    for r, (channel, inside) in enumerate(channels):
        safe = b.select(inside, channel, e.const(0))
        value = b.load(b.gep(array.data, [cell_of(safe)]))
        value = b.select(inside, value, ir.Constant(ir.FloatType(), 0.0))
        gathered = b.insert_element(gathered, value, ir.Constant(ir.IntType(32), r))
    return gathered


def _store_rows(b, e, arrays, at, rows):
    # out[8 kb + r, c0 : ...] = rows(r) (vectors of e's lanes, one after
    # another), finished (_finish: the residual's cells added where flags
    # say), for the block's channels inside out
    out_, bias_, res_ = arrays
    kb, c0, flags = at
    channels, out_width = cgutils.unpack_tuple(b, out_.shape, 2)
    res_width = cgutils.unpack_tuple(b, res_.shape, 2)[1]
    lanes = e.vector.count
    k0 = b.mul(kb, e.const(ROWS))
    for r in range(ROWS):
        channel = b.add(k0, e.const(r))
        with b.if_then(b.icmp_signed("<", channel, channels), likely=True):
            start = b.add(b.mul(channel, out_width), c0)
            shift_of = lambda c=channel: e.spread(  # noqa: E731
                b.load(b.gep(bias_.data, [c]))
            )
            res_start = b.add(b.mul(channel, res_width), c0)
            for v, value in enumerate(rows(r)):
                cell = e.const(v * lanes)
                residual_of = functools.partial(e.load, res_, b.add(res_start, cell))
                value = _finish(b, e, value, shift_of, flags, residual_of)
                e.store(value, out_, b.add(start, cell))


def _emit_column(context, builder, signature, args, chunked=False):
    # out[8 kb : 8 kb + ROWS, c0] for one position: the block's ROWS
    # weights of each d are one contiguous vector, times x[d, c0]
    # broadcast; COLUMN_SUMS sums of every COLUMN_SUMS-th d (a chain of
    # dependent multiply-adds waits on each one's latency: a squeeze-
    # excitation's 576 x 144 product took 16 us summed in one), added
    # pairwise at the end
    b = builder
    e = _Emit(context, builder, 1)
    across = _Emit(context, builder, ROWS)  # (vectors of a block's channels)
    vector = across.vector
    w_, x_, out_, bias_, scale_, res_ = e.arrays(signature, args, 6)
    kb, c0, flags = args[6:9]
    depth, width = cgutils.unpack_tuple(b, x_.shape, 2)
    d0, d1 = args[9:11] if chunked else (e.const(0), depth)
    fma = _fma(b, vector)
    zero = ir.Constant(vector, [ir.Constant(ir.FloatType(), 0.0)] * ROWS)
    sums = [cgutils.alloca_once_value(b, zero) for _ in range(COLUMN_SUMS)]
    block = b.mul(b.mul(kb, depth), e.const(ROWS))
    if chunked:  # the sums so far (in the first partial sum), past chunk one
        channels, out_width = cgutils.unpack_tuple(b, out_.shape, 2)
        with b.if_then(b.icmp_signed("!=", d0, e.const(0))):
            rows = _block_channels(b, e, kb, channels)
            cell_of = lambda c: b.add(b.mul(c, out_width), c0)  # noqa: E731
            b.store(_gather(b, e, zero, out_, rows, cell_of), sums[0])

    def add_term(d, slot):
        x = b.load(b.gep(x_.data, [b.add(b.mul(d, width), c0)]))
        x = _scaled(b, e, x, scale_, d)
        at = b.gep(w_.data, [b.add(block, b.mul(d, e.const(ROWS)))])
        weights = b.load(b.bitcast(at, vector.as_pointer()), align=4)
        b.store(b.call(fma, [weights, across.spread(x), b.load(slot)]), slot)

    groups = b.sdiv(b.sub(d1, d0), e.const(COLUMN_SUMS))
    with cgutils.for_range(b, groups) as loop:
        first = b.add(d0, b.mul(loop.index, e.const(COLUMN_SUMS)))
        for k, slot in enumerate(sums):
            add_term(b.add(first, e.const(k)), slot)
    tail = b.add(d0, b.mul(groups, e.const(COLUMN_SUMS)))
    with cgutils.for_range_slice(b, tail, d1, e.const(1)) as (d, _):
        add_term(d, sums[0])
    values = [b.load(slot) for slot in sums]
    while len(values) > 1:
        values = [b.fadd(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    total = values[0]
    i32 = ir.IntType(32)

    def rows(r):  # lane r of the sums, as a vector of one lane
        lane = b.extract_element(total, ir.Constant(i32, r))
        undefined = ir.Constant(e.vector, ir.Undefined)
        return [b.insert_element(undefined, lane, ir.Constant(i32, 0))]

    if chunked:  # unfinished (no bias, no activation) before the last chunk
        flags = b.select(b.icmp_signed("==", d1, depth), flags, e.const(0))
    _store_rows(b, e, (out_, bias_, res_), (kb, c0, flags), rows)
    return None


# 32 positions a block; those left, 16 then 8 at once, the last few by a
# block of 8 that ends at the run's end (its first cells computed again,
# alike), one at a time in runs narrower than 8; one left after 16 (a
# 7 x 7 plane's 49 positions, 56 lanes of work that way) beside it
block_wide_, block_16_ = _block(2, 16), _block(1, 16)
block_8_ = _block(1, 8)
block_1_ = _conv_intrinsic(_emit_column)
block_17_ = _block(1, 16, 1)  # (see chunk_17_)
chunk_wide_, chunk_16_, chunk_8_ = _chunk(2, 16), _chunk(1, 16), _chunk(1, 8)
chunk_1_ = _chunk(1, 0)
# a block of 16 and lone columns after it, in one pass over the rows: a
# 7 x 7 plane's 49 positions are 32 + 16 and 1, a 14 x 14 plane's 196 are
# 5 x 32 + 16 + 16 and 4 (a pass of their own cost each such column as
# much as 8-10 % of the product: 7 x 7 x 512 -> 512, 1.30 -> 1.21 ms)
chunk_17_, chunk_20_ = _chunk(1, 16, 1), _chunk(1, 16, 4)


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def conv_gemm(w, x, out, bias, scale, res, flags, kb_first, kb_last, first, last):
    # out[8 kb_first : 8 kb_last, first:last] of W @ x, W packed into w,
    # finished as flags say: a block of weights stays in cache over the
    # positions; no cell outside first:last is written
    depth = x.shape[0]
    if depth > CHUNKED_DEPTH:
        conv_chunks(w, x, out, bias, scale, res, flags, kb_first, kb_last, first, last)
        return
    for kb in range(kb_first, kb_last):
        c = first
        while c + 32 <= last:
            block_wide_(w, x, out, bias, scale, res, kb, c, flags)
            c += 32
        if c + 17 == last:
            block_17_(w, x, out, bias, scale, res, kb, c, flags)
            c = last
        if c + 16 <= last:
            block_16_(w, x, out, bias, scale, res, kb, c, flags)
            c += 16
        if c + 8 <= last:
            block_8_(w, x, out, bias, scale, res, kb, c, flags)
            c += 8
        if c < last and last - first >= 8:
            block_8_(w, x, out, bias, scale, res, kb, last - 8, flags)
        elif c < last:
            for p in range(c, last):
                block_1_(w, x, out, bias, scale, res, kb, p, flags)


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def conv_chunks(w, x, out, bias, scale, res, flags, kb_first, kb_last, first, last):
    # conv_gemm by chunks of DEPTH_CHUNK rows of x: a chunk of x stays in
    # cache over every block of weights, each block's chunk over the
    # positions, and each weight is read from memory once
    depth = x.shape[0]
    for d0 in range(0, depth, DEPTH_CHUNK):
        d1 = min(depth, d0 + DEPTH_CHUNK)
        for kb in range(kb_first, kb_last):
            c = first
            # (4 past the blocks of 32: the last one goes as 16 and 16)
            wide_end = last - 36 if (last - first) % 32 == 4 else last
            while c + 32 <= wide_end:
                chunk_wide_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c += 32
            if c + 36 == last:
                chunk_16_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c += 16
            if c + 20 == last:
                chunk_20_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c = last
            elif c + 17 == last:
                chunk_17_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c = last
            if c + 16 <= last:
                chunk_16_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c += 16
            if c + 8 <= last:
                chunk_8_(w, x, out, bias, scale, res, kb, c, flags, d0, d1)
                c += 8
            # (a block ending at the run's end would add this chunk twice
            # to the cells it shares with the one before)
            for p in range(c, last):
                chunk_1_(w, x, out, bias, scale, res, kb, p, flags, d0, d1)


@team_kernel
def conv_claimed(data):
    # conv_gemm on a native team: data's slots (SLOTS) hold the shapes and
    # addresses; each thread takes parts until none is left: an image's run
    # of channel blocks x run of strips (32 positions each, the last one
    # also those left over: every run but of a narrow plane is 32 or more)
    d = numba.carray(slots_(data), SLOTS)
    parts, images, channels, depth, width = d[1], d[2], d[3], d[4], d[5]
    blocks, flags = d[6], d[7]
    x_step, out_step, block_parts, strip_parts = d[10], d[12], d[15], d[16]
    bias = numba.carray(floats_(d[13]), d[14])
    strips = max(1, width // 32)
    per_image = block_parts * strip_parts
    while True:
        i = claim_(data)
        if i >= parts:
            return
        image, rest = i // per_image, i % per_image
        bp, sp = rest // strip_parts, rest % strip_parts
        # rows of their strides (d[17], d[18]), the columns past width unread;
        # a stack's image takes its own weights (d[19] floats further on)
        w = numba.carray(floats_(d[8] + 4 * image * d[19]), (blocks, depth, ROWS))
        x = numba.carray(floats_(d[9] + 4 * image * x_step), (depth, d[17]))
        out = numba.carray(floats_(d[11] + 4 * image * out_step), (channels, d[18]))
        first = 32 * (strips * sp // strip_parts)
        last = 32 * (strips * (sp + 1) // strip_parts)
        if sp == strip_parts - 1:
            last = width
        kb_first, kb_last = blocks * bp // block_parts, blocks * (bp + 1) // block_parts
        scale = numba.carray(floats_(d[20] + 4 * image * d[21]), d[22])
        # (a residual's rows of its stride d[25]; without one, a cell)
        res = numba.carray(floats_(d[23] + 4 * image * d[24]), (d[26], d[25]))
        conv_gemm(w, x, out, bias, scale, res, flags, kb_first, kb_last, first, last)
"""
)


@functools.cache
def _kernel_address(scaled: bool = False) -> int:
    """The address of ``void conv_claimed(void *data)``, compiled (or
    loaded from numba's disk cache); ``scaled``: the variant that scales
    ``x``'s rows as it loads them."""
    values = {**COMMON_VALUES, "slots": _SLOTS, "rows": ROWS, "scaled": scaled}
    values["column_sums"] = COLUMN_SUMS
    values["chunked_depth"] = CHUNKED_DEPTH
    values["depth_chunk"] = DEPTH_CHUNK
    kernel: Any = compile_vectors(
        "asyncrt_panel_conv", _SOURCE, "conv_claimed", **values
    )
    return int(kernel.address)


def pack(w: Array) -> Array:
    """``w`` ``(K, D)`` as ``(ceil(K / ROWS), D, ROWS)`` float32 blocks, the
    last block's channels past ``K`` zero; a stack ``(N, K, D)`` as ``(N,
    ceil(K / ROWS), D, ROWS)``, each matrix packed alike."""
    if w.ndim == 3:
        return np.stack([pack(matrix) for matrix in w])
    channels, depth = w.shape
    blocks = -(-channels // ROWS)
    padded = np.zeros((blocks * ROWS, depth), _FLOAT32)
    padded[:channels] = w
    return np.ascontiguousarray(padded.reshape(blocks, ROWS, depth).transpose(0, 2, 1))


def takes(w: Array, x: Array, out: Array, bias: Array | None = None) -> bool:
    """Whether :func:`bind` takes ``out[n] = w @ x[n] (+ bias)``: numpy
    float32, ``w`` a non-empty C-contiguous ``(K, D)`` matrix (or a stack
    ``(N, K, D)``: ``out[n] = w[n] @ x[n]``), ``x`` ``(N, D, P)`` and
    ``out`` ``(N, K, P)`` with contiguous rows (any row and image strides:
    a chunk of a column matrix, of an output's planes), ``bias`` ``(K,)``
    C-contiguous."""
    matrices = (w,) if bias is None else (w, bias)
    return (
        all(isinstance(a, np.ndarray) and a.dtype == _FLOAT32 for a in (w, x, out))
        and all(a.flags.c_contiguous for a in matrices)
        and (bias is None or (isinstance(bias, np.ndarray) and bias.dtype == _FLOAT32))
        and (bias is None or bias.shape == w.shape[-2:-1])
        and (w.ndim == 2 or (w.ndim == 3 and w.shape[0] == x.shape[0]))
        and w.size > 0
        and x.ndim == out.ndim == 3
        and x.shape[0] == out.shape[0]
        and x.shape[1] == w.shape[-1]
        and out.shape[1] == w.shape[-2]
        and x.shape[2] == out.shape[2]
        and _rows_contiguous(x)
        and _rows_contiguous(out)
    )


def _rows_contiguous(a: Array) -> bool:
    """Whether ``a`` (3-D) has unit steps along its rows, and rows and
    images that do not overlap (steps in whole floats)."""
    images, rows, cols = a.shape
    image_step, row_step, col_step = a.strides
    return (
        (col_step == a.itemsize or cols <= 1)
        and all(step % a.itemsize == 0 and step >= 0 for step in a.strides)
        and (rows <= 1 or row_step >= cols * a.itemsize)
        and (images <= 1 or image_step >= rows * max(row_step, cols * a.itemsize))
    )


#: The epilogue's flag of each activation.
_ACTIVATION_FLAGS = {"none": 0, "relu": RELU_FLAG, "hard_swish": HARD_SWISH_FLAG}


def bind(
    w: Array,
    x: Array,
    out: Array,
    *,
    bias: Array | None = None,
    activation: str = "none",
    scale: Array | None = None,
    residual: Array | None = None,
) -> Callable[[], None]:
    """``out[n] = w @ x[n]`` (a stack of weights: ``w[n] @ x[n]``) for
    every image ``n`` (:func:`takes` holds; ``w``'s values fixed for the
    binding's life: packed now), ``+ bias``
    per channel then the activation as blocks are stored, as a call
    without arguments.

    :param bias: ``(K,)`` float32, C-contiguous, read each call.
    :param activation: ``"none"``, ``"relu"`` or ``"hard_swish"``.
    :param scale: ``(N, D)`` float32, C-contiguous, read each call: ``x[n]``'s
        row ``d`` times ``scale[n, d]`` (rounded) before the product (a
        squeeze-excitation's gates).
    :param residual: shaped as ``out`` (:func:`takes`' row layout), read
        each call: added after the bias, before the activation (a residual
        block's ``Add``, in its order: the same bits).
    """
    kind = "panel_conv_stack" if w.ndim == 3 else "panel_conv"
    packed = _packed.shared(kind, w, pack)
    return bind_packed(
        packed,
        w.shape[-2],
        x,
        out,
        bias=bias,
        activation=activation,
        scale=scale,
        residual=residual,
    )


def bind_packed(
    packed: Array,
    channels: int,
    x: Array,
    out: Array,
    *,
    bias: Array | None = None,
    activation: str = "none",
    scale: Array | None = None,
    residual: Array | None = None,
) -> Callable[[], None]:
    """:func:`bind` of weights :func:`pack` made: ``packed`` (a stack's
    with one matrix an image) of ``channels`` output channels; :func:`takes`
    holds for the weights it was made of."""
    if scale is not None and scale.shape != x.shape[:2]:
        raise ValueError(f"a scale of {scale.shape} for x of {x.shape}")
    if residual is not None and not (
        residual.shape == out.shape
        and residual.dtype == _FLOAT32
        and _rows_contiguous(residual)
    ):
        raise ValueError(f"a residual of {residual.shape} for out of {out.shape}")
    run = _native_team.launcher(_kernel_address(scale is not None))
    _native_team.use()
    stacked = packed.ndim == 4
    images, depth, width = x.shape
    blocks = packed.shape[-3]
    shift = _NO_BIAS if bias is None else bias
    if activation not in _ACTIVATION_FLAGS:
        raise ValueError(f"unknown activation {activation!r}")
    flags = (0 if bias is None else BIAS_FLAG) | _ACTIVATION_FLAGS[activation]
    flags |= 0 if residual is None else RESIDUAL_FLAG
    x_steps, out_steps = (s // 4 for s in x.strides), (s // 4 for s in out.strides)
    x_image, x_row, _ = x_steps
    out_image, out_row, _ = out_steps
    slots = [0, 0, images, channels, depth, width, blocks, flags]
    slots += [packed.ctypes.data, x.ctypes.data, x_image, out.ctypes.data]
    slots += [out_image, shift.ctypes.data, shift.size, 1, 1]
    slots += [x_row if depth > 1 else width, out_row if channels > 1 else width]
    slots.append(packed[0].size if stacked else 0)
    factors = _NO_BIAS if scale is None else scale
    slots += [factors.ctypes.data, 0 if scale is None else depth, factors.shape[-1]]
    if residual is None:
        slots += [_NO_BIAS.ctypes.data, 0, 1, 1]  # (never read)
    else:
        res_image, res_row, _ = (step // 4 for step in residual.strides)
        slots += [residual.ctypes.data, res_image]
        slots += [res_row if channels > 1 else width, channels]
    data = np.array(slots, np.int64)
    address = data.ctypes.data
    # (the addresses in data stay valid)
    held = (packed, x, out, shift, factors, residual)
    work = images * channels * depth * width
    large = work >= MIN_PARALLEL_WORK
    strips = max(1, width // _WIDE)

    splits: dict[int, tuple[int, int]] = {}  # by the parts wanted

    def product() -> None:
        if not held[2].size:
            return
        threads, wanted, crowded = _native_team.share(large, work)
        split = splits.get(wanted)
        if split is None:
            split = splits[wanted] = _split(images, blocks, strips, wanted)
        block_parts, strip_parts = split
        data[0], data[1] = 0, images * block_parts * strip_parts
        data[15], data[16] = block_parts, strip_parts
        run(address, threads, crowded)

    return product


def _split(images: int, blocks: int, strips: int, wanted: int) -> tuple[int, int]:
    """``(block_parts, strip_parts)``: each image's runs of channel blocks
    and of strips of positions for ``wanted`` parts, the split whose
    largest part, times the rounds of parts a thread takes, is least (ties:
    the fewest runs of blocks, so that each thread reads the fewest
    columns). Cutting 3 blocks in two gave one thread two of them: 72 -> 24
    channels of 28 x 28 scaled 1.4x on two threads instead of 2x."""
    per_image = -(-wanted // images)
    best: tuple[int, int, int] | None = None
    for block_parts in range(1, min(blocks, per_image) + 1):
        strip_parts = min(strips, -(-per_image // block_parts))
        largest = -(-blocks // block_parts) * -(-strips // strip_parts)
        rounds = -(-images * block_parts * strip_parts // wanted)
        cost = largest * rounds
        if best is None or cost < best[0]:
            best = (cost, block_parts, strip_parts)
    assert best is not None
    return best[1], best[2]
