"""Softmax over narrow rows (a vector's lanes or fewer: attention over a
short sequence), a group of rows at a time, in explicit LLVM vectors.

The row loops (:mod:`asyncrt.ops._epijit`) walk a row at a time, and rows
narrower than LLVM's unrolled vector loop (64 floats) run its scalar
remainder: 96 rows of 16, the scores of 6 heads over a sequence of 16,
took 1.4 us, 2.1 masked and scaled, for 0.5 us of bytes. Here a group of
:func:`asyncrt.ops._dwvector.lanes` rows, each one vector, stays in
registers from its load to its store: each row's maximum and its
exponentials' sum across the lanes come out of one tree of two-source
shuffles for the whole group (lane ``i`` of the result is row ``i``'s),
and each row's shift and scale are that lane spread over a vector. 1.25
and 1.4 us, the call included (2-core AVX-512 VM).

Each row is shifted by its maximum; ``exp`` is
:mod:`asyncrt.ops._jitmath`'s ``exp_`` for non-positive arguments, lane-
wise, with results below ``e^-87`` (subnormal in float32) flushed to zero.
A row with a NaN, or an infinite maximum, comes out NaN (the shift makes
NaN), as the numpy passes make it; a row of ``-inf`` too. The sums add in
a tree order, so results agree with the row loops within float32
rounding, not bit for bit.

Before the softmax each row may be scaled and masked as it is loaded
(``MODE``): ``"plain"``, ``"add"`` (``x * scale + mask`` or ``x / scale
+ mask``, the mask's row for each row given by an index: a broadcast mask
is not expanded) or ``"where"`` (``fill`` where the condition's byte is
not ``KEEP``, else the scaled value): attention's scores in one pass. A
division by a power of two is the product by its reciprocal (the same
bits, a tenth of the cost).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _jitmath, _team_parts
from ._common import Array
from ._vector_ir import compile_vectors

__all__ = ("bind", "takes")


_SOURCE = (
    "\n".join(_jitmath.head()[1:])
    + """
MODE, DIVIDE, KEEP, LANES = {settings}
# the exponential's constants (the helpers above), as floats for the IR
LOG2E, LN2_HI, LN2_LO = float(_LOG2E), float(_LN2_HI), float(_LN2_LO)
EXP_P = tuple(float(c) for c in _EXP_P)
EXP_FLUSH = float(_EXP_FLUSH)


def _exp_nonpositive(e, v):
    # _jitmath's exp_nonpositive_ (v <= 0 or NaN: a row shifted by its
    # maximum) lane-wise, operation for operation
    b = e.b
    vector = e.vector
    ints = ir.VectorType(ir.IntType(32), vector.count)
    suffix = f"v{vector.count}f32"
    fmuladd = cgutils.get_or_insert_function(
        b.module, ir.FunctionType(vector, [vector] * 3), f"llvm.fmuladd.{suffix}"
    )
    floor = cgutils.get_or_insert_function(
        b.module, ir.FunctionType(vector, [vector]), f"llvm.floor.{suffix}"
    )
    flushed = b.fcmp_ordered("<", v, e.splat(EXP_FLUSH))
    x = b.select(flushed, e.splat(0.0), v)
    n = b.call(floor, [b.call(fmuladd, [x, e.splat(LOG2E), e.splat(0.5)])])
    minus = b.fneg(n)
    r = b.call(fmuladd, [minus, e.splat(LN2_HI), x])
    r = b.call(fmuladd, [minus, e.splat(LN2_LO), r])
    p = b.call(fmuladd, [e.splat(EXP_P[0]), r, e.splat(EXP_P[1])])
    for term in EXP_P[2:]:
        p = b.call(fmuladd, [p, r, e.splat(term)])
    y = b.fadd(b.call(fmuladd, [p, b.fmul(r, r), r]), e.splat(1.0))
    # 2^n from its exponent bits (n >= -126 here: one factor)
    k = b.fptosi(n, ints)
    bits = b.shl(b.add(k, ir.Constant(ints, [127] * vector.count)),
                 ir.Constant(ints, [23] * vector.count))
    y = b.fmul(y, b.bitcast(bits, vector))
    y = b.select(flushed, e.splat(0.0), y)
    return b.select(b.fcmp_unordered("uno", v, v), v, y)


def _bytes_held(e, array, index, mask):
    # whether each of array's bytes from flat index is nonzero, under mask
    b = e.b
    count = e.vector.count
    octets = ir.VectorType(ir.IntType(8), count)
    function = cgutils.get_or_insert_function(
        b.module,
        ir.FunctionType(
            octets, [octets.as_pointer(), ir.IntType(32), mask.type, octets]
        ),
        f"llvm.masked.load.v{count}i8.p0",
    )
    pointer = b.bitcast(b.gep(array.data, [index]), octets.as_pointer())
    one = ir.Constant(ir.IntType(32), 1)
    loaded = b.call(function, [pointer, one, mask, ir.Constant(octets, None)])
    return b.icmp_unsigned("!=", loaded, ir.Constant(octets, None))


def _reduce_rows(e, vectors, combine):
    # lane i of the result: combine folded over vectors[i]'s lanes (a tree
    # of two-source shuffles: LANES vectors of one row each, then half as
    # many of two rows' half-folded lanes, ...)
    b = e.b
    masks = ir.VectorType(ir.IntType(32), LANES)
    partials = LANES
    while len(vectors) > 1:
        half = partials // 2
        rows = LANES // partials
        first = [x * LANES + q * partials + j for x in (0, 1) for q in range(rows)
                 for j in range(half)]
        second = [i + half for i in first]
        folded = []
        for one, other in zip(vectors[0::2], vectors[1::2]):
            low = b.shuffle_vector(one, other, ir.Constant(masks, first))
            high = b.shuffle_vector(one, other, ir.Constant(masks, second))
            folded.append(combine(low, high))
        vectors, partials = folded, half
    return vectors[0]


def _lane(e, vector, i):
    # lane i of vector in every lane
    masks = ir.VectorType(ir.IntType(32), LANES)
    return e.b.shuffle_vector(vector, vector, ir.Constant(masks, [i] * LANES))


def _group(divide):
    # the intrinsic for scores scaled by division (divide) or by product

    @intrinsic
    def group_(typingctx, x, aux, aux_rows, out, scale, fill, r0, count):
        # the softmax of rows r0:r0 + count (count <= LANES) of x into out,
        # rows of at most LANES
        if not (_is_float_array(x, 2) and _is_float_array(out, 2)):
            return None

        def codegen(context, b, signature, args):
            e = _Emit(context, b, LANES)
            xs, auxs, rows_of, outs = e.arrays(signature, args, 4)
            c0, f0, r0, count = args[4:]
            width = cgutils.unpack_tuple(b, xs.shape, 2)[1]
            columns = e.lanes_between(e.const(0), width)
            scale, fill = e.spread(c0), e.spread(f0)
            zero = e.splat(0.0)

            def larger(one, other):
                return b.select(b.fcmp_ordered(">", one, other), one, other)

            def score(row):
                # the row as the softmax reads it (-inf past its end)
                v = e.masked_load(xs, b.mul(row, width), columns)
                if MODE != "plain":
                    v = b.fdiv(v, scale) if divide else b.fmul(v, scale)
                    at = b.mul(b.load(b.gep(rows_of.data, [row])), width)
                    if MODE == "add":
                        v = b.fadd(v, e.masked_load(auxs, at, columns))
                    else:
                        held = _bytes_held(e, auxs, at, columns)
                        v = b.select(b.not_(held) if KEEP else held, fill, v)
                return b.select(columns, v, e.splat(float("-inf")))

            # the group's rows: missing ones repeat the last (and store its
            # values again: every row is loaded before any is stored)
            last = b.sub(count, e.const(1))
            rows = []
            for i in range(LANES):
                here = b.icmp_signed("<", e.const(i), count)
                rows.append(b.add(r0, b.select(here, e.const(i), last)))
            scores = [score(row) for row in rows]
            top = _reduce_rows(e, scores, larger)
            shifted = [b.fsub(v, _lane(e, top, i)) for i, v in enumerate(scores)]
            powers = [
                b.select(columns, _exp_nonpositive(e, v), zero) for v in shifted
            ]
            inverse = b.fdiv(e.splat(1.0), _reduce_rows(e, powers, b.fadd))
            for i, (row, power) in enumerate(zip(rows, powers)):
                value = b.fmul(power, _lane(e, inverse, i))
                e.masked_store(value, outs, b.mul(row, width), columns)
            return context.get_dummy_value()

        intp = types.intp
        f32 = types.float32
        sig = types.none(x, aux, aux_rows, out, f32, f32, intp, intp)
        return sig, codegen

    return group_


divided_ = _group(True)
multiplied_ = _group(False)


@numba.njit(inline="always", error_model="numpy")
def power_of_two_(c):
    # whether c is a power of two whose reciprocal is a normal float32 (then
    # x / c is x * (1 / c), bit for bit)
    bits = _F(c).view(_I)
    exponent = (bits >> 23) & 255
    return (bits & 8388607) == 0 and 1 <= exponent <= 253


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, aux, aux_rows, out, scale, fill, first, last):
    # rows first:last of out: the softmax of x's, LANES rows at a time
    c0, f0 = _F(scale[0]), _F(fill[0])
    exact = DIVIDE and power_of_two_(c0)
    for r0 in range(first, last, LANES):
        count = min(LANES, last - r0)
        if DIVIDE and not exact:
            divided_(x, aux, aux_rows, out, c0, f0, r0, count)
        else:
            factor = _ONE / c0 if DIVIDE else c0
            multiplied_(x, aux, aux_rows, out, factor, f0, r0, count)
"""
)


@functools.cache
def _kernel(mode: str, divide: bool, keep: bool, lanes: int) -> Callable[..., None]:
    """The loop for ``mode`` (``"plain"``, ``"add"``, ``"where"``), its flags
    and vectors of ``lanes``, compiled (or loaded from numba's disk
    cache)."""
    return compile_vectors(
        "asyncrt_softvector",
        _SOURCE,
        "kernel",
        settings=(repr(mode), divide, keep, lanes),
    )


def takes(x: Array, out: Array) -> bool:
    """Whether :func:`bind` takes these rows: numpy float32 matrices of one
    shape, C-contiguous, wider than half a vector's lanes and at most as
    wide as a vector (narrower rows would leave most of each lane idle:
    1000 rows of 3 took 8.2 us against the row loop's 4.1), at least half a
    group of them, numba available."""
    return bool(
        isinstance(x, np.ndarray)
        and isinstance(out, np.ndarray)
        and x.ndim == out.ndim == 2
        and x.shape == out.shape
        and _dwvector.lanes() // 2 < x.shape[1] <= _dwvector.lanes()
        and x.shape[0] >= _dwvector.lanes() // 2
        and x.dtype == out.dtype == np.float32
        and x.flags.c_contiguous
        and out.flags.c_contiguous
        and _jit.available()
    )


def bind(
    x: Array,
    out: Array,
    *,
    split_elements: int,
    mode: str = "plain",
    aux: Array | None = None,
    aux_rows: Array | None = None,
    scale: Array | None = None,
    fill: Array | None = None,
    divide: bool = False,
    keep: bool = False,
) -> Callable[[], None]:
    """The softmax of :func:`takes`' rows ``x`` into ``out`` (``x`` may be
    ``out``) as a call without arguments, compiled now, the rows split over
    the kernel threads from ``split_elements`` elements.

    :param mode: ``"plain"``; ``"add"``: ``x * scale + aux[aux_rows[r]]``
        for row ``r`` (``x / scale`` with ``divide``), ``aux`` float32;
        ``"where"``: ``fill`` where ``aux[aux_rows[r]] != keep``, else the
        scaled value, ``aux`` boolean.
    :param aux: ``(R, width)``, C-contiguous; ``aux_rows``: int64, one per
        row of ``x``.
    :param scale: ``fill``: float32, one element each.
    """
    rows, width = x.shape
    if aux is None or aux_rows is None:
        aux, aux_rows = np.zeros((1, width), np.float32), np.zeros(rows, np.int64)
    one = np.ones(1, np.float32)
    scale = one if scale is None else scale.reshape(-1)
    fill = one if fill is None else fill.reshape(-1)
    shares = _team_parts.shares(
        rows, x.size, split_elements, min_team_work=_team_parts.MIN_TEAM_ELEMENTS
    )
    return _jit.bind_parts(
        _kernel(mode, divide, keep, _dwvector.lanes()),
        (x, aux, aux_rows, out, scale, fill),
        shares,
        work=x.size,
    )
