"""Stacks of small float32 products over strided views (attention's heads:
``Q K^T`` and ``P V``), in explicit vectors, on the native team.

A transformer's attention multiplies, for every batch and head, a few
dozen rows by a few dozen columns: MiniLM's ``(64, 32) @ (32, 64)`` 24
times a layer. One BLAS call a head (:mod:`asyncrt.ops._team_blas`) pays
its packing and dispatch per head: 5-6 us for 131k multiply-adds, a
fifth of a core's peak. Here one compiled loop takes the heads of a share:
for each, ``B`` is read where it is when its rows are contiguous (``V``),
else copied into the share's scratch (``K^T``: 2048 floats), by tiles of
lanes x lanes transposed in registers where its columns are contiguous
(``K``'s rows: a strided copy took a load a cell; GPT-2's ``Q K^T`` of
100 x 64 heads 161-166 -> 125 us a layer, MiniLM's 44 -> 39-41);
then blocks of rows of ``C`` are summed in registers, a vector of ``C``'s
columns per register, each ``a[m, k]`` spread over the lanes times a row
of ``B`` (fused multiply-adds), and stored (masked past ``C``'s width).

The operands are the views' base arrays, C-contiguous, read at the views'
strides (in elements): nothing is copied before the call, and the stack's
two batch axes (batch, head) may be permuted in memory, as attention's
head splits and merges leave them (``C``'s rows must be contiguous).

Results: each output is one chain of fused multiply-adds over ``k`` in
order: it differs from BLAS's blocked sums by float32 rounding. float32,
numpy, numba; anything else keeps :mod:`asyncrt.ops._team_blas`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _team_parts
from ._common import Array
from ._vector_ir import compile_vectors

__all__ = ("MAX_SIDE", "MIN_WORK_PER_THREAD", "bind", "takes")

#: ``C``'s widths and ``A``'s depths at most (attention's sequence and head
#: sizes): wider products take BLAS, whose blocking wins there.
MAX_SIDE = 256
#: Multiply-adds each thread of the part pool gets at least before the
#: heads are split over it (the native team's threshold:
#: :data:`asyncrt.ops._team_parts.MIN_TEAM_WORK`).
MIN_WORK_PER_THREAD = 2_000_000
_FLOAT32 = np.dtype(np.float32)

_SOURCE = """
LANES, VECTORS, ROWS = {shape}


def _typed(a, b, c):
    return all(_is_float_array(x, 1) for x in (a, b, c))


def _block(rows, masked):
    # an intrinsic (a, b, c, a0, sam, sak, b0, sbk, c0, scm, depth, width):
    # c[c0 + r scm + n] = sum over k of a[a0 + r sam + k sak] b[b0 + k sbk
    # + n], for r < rows and n < width (all of VECTORS * LANES unless
    # masked), the sums in registers
    def block_(typingctx, a, b, c, a0, sam, sak, b0, sbk, c0, scm, depth, width):
        if not _typed(a, b, c):
            return None

        def codegen(context, builder, signature, args):
            e = _Emit(context, builder, LANES)
            bb = builder
            a_, b_, c_ = e.arrays(signature, args, 3)
            a0, sam, sak, b0, sbk, c0, scm, depth, width = args[3:]
            fma = cgutils.get_or_insert_function(
                bb.module,
                ir.FunctionType(e.vector, [e.vector] * 3),
                f"llvm.fma.v{LANES}f32",
            )
            masks = [
                e.lanes_between(e.const(v * LANES), width) if masked else None
                for v in range(VECTORS)
            ]
            slots = [
                [cgutils.alloca_once_value(bb, e.splat(0.0)) for _ in range(VECTORS)]
                for _ in range(rows)
            ]
            starts = [e.index(a0, (e.const(r), sam)) for r in range(rows)]
            with cgutils.for_range(bb, depth, intp=e.intp) as loop:
                k = loop.index
                row = e.index(b0, (k, sbk))
                columns = []
                for v in range(VECTORS):
                    at = bb.add(row, e.const(v * LANES))
                    if masked:
                        columns.append(e.masked_load(b_, at, masks[v]))
                    else:
                        columns.append(e.load(b_, at))
                for r in range(rows):
                    cell = bb.add(starts[r], bb.mul(k, sak))
                    x = e.spread(bb.load(bb.gep(a_.data, [cell])))
                    for v in range(VECTORS):
                        slot = slots[r][v]
                        bb.store(bb.call(fma, [x, columns[v], bb.load(slot)]), slot)
            for r in range(rows):
                start = e.index(c0, (e.const(r), scm))
                for v in range(VECTORS):
                    at = bb.add(start, e.const(v * LANES))
                    value = bb.load(slots[r][v])
                    if masked:
                        e.masked_store(value, c_, at, masks[v])
                    else:
                        e.store(value, c_, at)
            return context.get_dummy_value()

        return types.none(a, b, c, *[types.intp] * 9), codegen

    return intrinsic(block_)


block_rows_, block_rows_masked_ = _block(ROWS, False), _block(ROWS, True)
block_one_, block_one_masked_ = _block(1, False), _block(1, True)


@intrinsic
def transposed_(typingctx, b, packed, b0, sbn, n0, k0, depth, width):
    # packed[k * width + n] = b[b0 + n sbn + k] for the tile of LANES
    # columns n from n0 and LANES rows k from k0 (those inside depth and
    # width): LANES loads along b's contiguous rows, transposed in
    # registers, LANES stores (a strided copy would take one load a cell)
    if not all(_is_float_array(x, 1) for x in (b, packed)):
        return None

    def codegen(context, builder, signature, args):
        e = _Emit(context, builder, LANES)
        bb = builder
        source, target = e.arrays(signature, args, 2)
        b0, sbn, n0, k0, depth, width = args[2:]
        along_k = e.lanes_between(k0, depth)
        last = bb.sub(width, e.const(1))
        rows = []
        for i in range(LANES):  # (columns past width repeat the last)
            n = bb.add(n0, e.const(i))
            n = bb.select(bb.icmp_signed("<", n, width), n, last)
            rows.append(e.masked_load(source, e.index(b0, (n, sbn), k0), along_k))
        along_n = e.lanes_between(n0, width)
        for j, column in enumerate(e.transpose(rows)):
            k = bb.add(k0, e.const(j))
            with bb.if_then(bb.icmp_signed("<", k, depth), likely=True):
                e.masked_store(column, target, e.index((k, width), n0), along_n)
        return context.get_dummy_value()

    return types.none(b, packed, *[types.intp] * 6), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def products(a, b, c, packed, geometry, first, last):
    # heads first:last of c = a @ b, every operand a flat base array read
    # at the strides in geometry: heads, rows, depth, width; a's steps by
    # head (two batch axes), row, depth; b's by head, depth, column; c's
    # by head, row (its columns contiguous); packed: this share's scratch
    inner, rows, depth, width = geometry[0], geometry[1], geometry[2], geometry[3]
    sa0, sa1, sam, sak = geometry[4], geometry[5], geometry[6], geometry[7]
    sb0, sb1, sbk, sbn = geometry[8], geometry[9], geometry[10], geometry[11]
    sc0, sc1, scm = geometry[12], geometry[13], geometry[14]
    masked = width != VECTORS * LANES
    for g in range(first, last):
        g0 = g // inner
        g1 = g - g0 * inner
        a0 = g0 * sa0 + g1 * sa1
        b0 = g0 * sb0 + g1 * sb1
        c0 = g0 * sc0 + g1 * sc1
        if sbn == 1:
            source, base, step = b, b0, sbk
        else:  # b's rows strided (K^T): copied into the scratch first
            if sbk == 1:  # by tiles, transposed in registers
                for n0 in range(0, width, LANES):
                    for k0 in range(0, depth, LANES):
                        transposed_(b, packed, b0, sbn, n0, k0, depth, width)
            else:
                for k in range(depth):
                    for n in range(width):
                        packed[k * width + n] = b[b0 + k * sbk + n * sbn]
            source, base, step = packed, 0, width
        m = 0
        while m + ROWS <= rows:
            at_a, at_c = a0 + m * sam, c0 + m * scm
            if masked:
                block_rows_masked_(a, source, c, at_a, sam, sak, base, step, at_c,
                                   scm, depth, width)
            else:
                block_rows_(a, source, c, at_a, sam, sak, base, step, at_c, scm,
                            depth, width)
            m += ROWS
        while m < rows:
            at_a, at_c = a0 + m * sam, c0 + m * scm
            if masked:
                block_one_masked_(a, source, c, at_a, sam, sak, base, step, at_c,
                                  scm, depth, width)
            else:
                block_one_(a, source, c, at_a, sam, sak, base, step, at_c, scm,
                           depth, width)
            m += 1
"""


def _steps(view: Array, base: Array) -> tuple[int, ...] | None:
    """``view``'s strides in elements of ``base`` (C-contiguous), or
    ``None`` where ``view`` is not a view into it."""
    if not (isinstance(base, np.ndarray) and base.flags.c_contiguous):
        return None
    start, end = base.ctypes.data, base.ctypes.data + base.nbytes
    if not start <= view.ctypes.data < end or any(s % 4 for s in view.strides):
        return None
    return tuple(s // 4 for s in view.strides)


def takes(left: Array, right: Array, result: Array, bases: tuple[Array, ...]) -> bool:
    """Whether :func:`bind` multiplies these views of ``bases`` (``a``,
    ``b``, ``out``: C-contiguous float32): stacks of one or two batch axes
    of the same extents, ``result``'s rows contiguous, sides at most
    :data:`MAX_SIDE`, the compiled engine available."""
    views = (left, right, result)
    return bool(
        all(isinstance(v, np.ndarray) and v.dtype == _FLOAT32 for v in views)
        and all(isinstance(v, np.ndarray) and v.dtype == _FLOAT32 for v in bases)
        and 3 <= left.ndim == right.ndim == result.ndim <= 4
        and left.shape[:-2] == right.shape[:-2] == result.shape[:-2]
        and left.shape[-1] == right.shape[-2]
        and result.shape[-2:] == (left.shape[-2], right.shape[-1])
        and result.size > 0
        and left.shape[-1] <= MAX_SIDE
        and right.shape[-1] <= MAX_SIDE
        and (result.shape[-1] == 1 or result.strides[-1] == 4)
        and all(_steps(v, b) is not None for v, b in zip(views, bases, strict=True))
        and _jit.available()
    )


@functools.cache
def _kernel(vectors: int) -> Callable[..., None]:
    """The loop for ``C`` widths of ``vectors`` vectors, compiled (or
    loaded from numba's disk cache)."""
    lanes = _dwvector.lanes()
    # rows of C a block keeps in registers: about sixteen accumulators
    shape = (lanes, vectors, max(1, min(8, 16 // vectors)))
    return compile_vectors("asyncrt_batched_gemm", _SOURCE, "products", shape=shape)


def bind(
    left: Array, right: Array, result: Array, bases: tuple[Array, Array, Array]
) -> Callable[[], None]:
    """``result = left @ right`` over the stack (:func:`takes` holds) as a
    call without arguments: the heads split over the kernel threads."""
    a, b, out = bases
    steps = [
        _steps(v, base) for v, base in zip((left, right, result), bases, strict=True)
    ]
    # (two batch axes: a missing one of extent 1)
    full = [s if len(s) == 4 else (0, *s) for s in steps if s is not None]
    batch = left.shape[:-2] if left.ndim == 4 else (1, *left.shape[:-2])
    rows, depth = left.shape[-2:]
    width = right.shape[-1]
    offsets = [
        (v.ctypes.data - base.ctypes.data) // 4
        for v, base in zip((left, right, result), bases, strict=True)
    ]
    a_steps, b_steps, c_steps = full
    # (c's columns are contiguous: its last step is 1)
    geometry = np.array(
        [batch[1], rows, depth, width, *a_steps, *b_steps, *c_steps[:3]], np.int64
    )
    heads = batch[0] * batch[1]
    lanes = _dwvector.lanes()
    kernel = _kernel(-(-width // lanes))
    work = heads * rows * depth * width
    shares = _team_parts.shares(heads, work, MIN_WORK_PER_THREAD)
    packed = np.empty((len(shares), depth * width), np.float32)
    # the flat bases from each view's first element (offsets into them)
    flats = [
        base.reshape(-1)[offset:]
        for base, offset in zip((a, b, out), offsets, strict=True)
    ]
    return _jit.bind_parts(
        kernel,
        (*flats, packed, geometry),
        shares,
        per_part=frozenset({3}),
        work=work,
    )
