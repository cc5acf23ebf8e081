"""What the kernels written in explicit LLVM vectors share (numba
intrinsics in generated modules: :mod:`asyncrt.ops._dwvector`,
:mod:`asyncrt.ops._poolvector`).

LLVM vectorises numba's loops only where it can prove that arrays do not
overlap, and numba marks none ``noalias``: a loop that reads several
arrays and writes one checks the overlap at run time (or stays scalar),
and cannot keep values in registers across its stores. An intrinsic
writes the vectors itself. :data:`PREAMBLE` starts every such module
(:func:`compile_vectors` puts it there): its imports, a type check for
float32 C-contiguous arrays, and ``_Emit``, the IR for intp index
arithmetic, unaligned vector loads and stores at flat element indices,
NCHW stores of a vector's lanes or a tile's runs, register transposes and
the convolutions' activations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _jit

__all__ = ("CLAIMS", "PREAMBLE", "compile_vectors")

PREAMBLE = """
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

SIXTH = {sixth}  # float32(1 / 6), as hard-swish has it


def _is_float_array(a, ndim):
    return (
        isinstance(a, types.Array) and a.dtype == types.float32
        and a.ndim == ndim and a.layout == "C"
    )


class _Emit:
    # LLVM IR for one intrinsic: integer arithmetic on intp, and vectors of
    # LANES float32 read and written at flat element indices of arrays
    def __init__(self, context, builder, lanes):
        self.b = builder
        self.context = context
        self.intp = context.get_value_type(types.intp)
        self.vector = ir.VectorType(ir.FloatType(), lanes)

    def arrays(self, signature, args, count):
        # the first count arguments' array structures (data, shape)
        return [
            self.context.make_array(t)(self.context, self.b, a)
            for t, a in zip(signature.args[:count], args[:count])
        ]

    def const(self, value):
        return ir.Constant(self.intp, value)

    def splat(self, value):
        lanes = self.vector.count
        return ir.Constant(self.vector, [ir.Constant(ir.FloatType(), value)] * lanes)

    def index(self, *terms):
        # terms: a sum of values and (value, factor, ...) products
        total = None
        for term in terms:
            if isinstance(term, tuple):
                product = term[0]
                for factor in term[1:]:
                    product = self.b.mul(product, factor)
                term = product
            total = term if total is None else self.b.add(total, term)
        return total

    def address(self, array, index):
        element = self.b.gep(array.data, [index])
        return self.b.bitcast(element, self.vector.as_pointer())

    def load(self, array, index):
        return self.b.load(self.address(array, index), align=4)

    def store(self, value, array, index):
        self.b.store(value, self.address(array, index), align=4)

    def prefetch(self, array, index):
        # llvm.prefetch of the cache line of array's flat cell index (a
        # read, kept in every level); it never faults, past the end too
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            self.b.module,
            ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0",
        )
        pointer = self.b.bitcast(self.b.gep(array.data, [index]), i8p)
        flags = [ir.Constant(i32, value) for value in (0, 3, 1)]
        self.b.call(function, [pointer, *flags])

    def spread(self, value):
        # the float value in every lane
        i32 = ir.IntType(32)
        lane = self.b.insert_element(
            ir.Constant(self.vector, ir.Undefined), value, ir.Constant(i32, 0)
        )
        zeros = ir.Constant(ir.VectorType(i32, self.vector.count), None)
        return self.b.shuffle_vector(lane, lane, zeros)

    def lanes_between(self, start, end):
        # a mask of the lanes l with 0 <= start + l < end (intp values)
        i64 = ir.IntType(64)
        count = self.vector.count
        vector = ir.VectorType(i64, count)
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), count), None)

        def spread(value):
            lane = self.b.insert_element(
                ir.Constant(vector, ir.Undefined), value, self.const(0)
            )
            return self.b.shuffle_vector(lane, lane, zeros)

        cells = self.b.add(spread(start), ir.Constant(vector, list(range(count))))
        return self.b.and_(
            self.b.icmp_signed(">=", cells, ir.Constant(vector, [0] * count)),
            self.b.icmp_signed("<", cells, spread(end)),
        )

    def masked_load(self, array, index, mask):
        # array's flat cells from index under mask, zero in the other lanes
        # (which are not read: they may lie outside the array)
        function = cgutils.get_or_insert_function(
            self.b.module,
            ir.FunctionType(
                self.vector,
                [self.vector.as_pointer(), ir.IntType(32), mask.type, self.vector],
            ),
            f"llvm.masked.load.v{self.vector.count}f32.p0",
        )
        four = ir.Constant(ir.IntType(32), 4)
        pointer = self.address(array, index)
        return self.b.call(function, [pointer, four, mask, self.splat(0.0)])

    def masked_store(self, value, array, index, mask):
        # value's lanes under mask into array's flat cells from index
        function = cgutils.get_or_insert_function(
            self.b.module,
            ir.FunctionType(
                ir.VoidType(),
                [self.vector, self.vector.as_pointer(), ir.IntType(32), mask.type],
            ),
            f"llvm.masked.store.v{self.vector.count}f32.p0",
        )
        four = ir.Constant(ir.IntType(32), 4)
        self.b.call(function, [value, self.address(array, index), four, mask])

    def plane_cells(self, p0, width, top, left, columns, stride, count):
        # the flat indices, in a channels-last plane (rows x columns x
        # stride, its interior at top, left), of count consecutive pixels
        # from p0, row-major over an interior width wide
        b = self.b
        h = b.sdiv(p0, width)
        w = b.sub(p0, b.mul(h, width))
        cells = []
        for _ in range(count):
            cell = self.index((self.index(top, h), columns), left, w)
            cells.append(self.index((cell, stride)))
            w = b.add(w, self.const(1))
            wrap = b.icmp_signed("==", w, width)
            w = b.select(wrap, self.const(0), w)
            h = b.select(wrap, b.add(h, self.const(1)), h)
        return cells

    def plane(self, out, n, channel):
        # the flat index of out[n, channel, 0, 0] (4-D, NCHW)
        _, channels, height, width = cgutils.unpack_tuple(self.b, out.shape, 4)
        return self.index((self.index((n, channels), channel), height, width))

    def _each_channel(self, out, n, c0, store):
        # store(k, plane start) for each lane k whose channel c0 + k out has
        channels = cgutils.unpack_tuple(self.b, out.shape, 4)[1]
        for k in range(self.vector.count):
            channel = self.b.add(c0, self.const(k))
            inside = self.b.icmp_signed("<", channel, channels)
            with self.b.if_then(inside, likely=True):
                store(k, self.plane(out, n, channel))

    def store_lanes(self, vector, out, n, c0, cell):
        # lane k of vector into out[n, c0 + k] at flat cell of its plane
        def store(k, start):
            value = self.b.extract_element(vector, ir.Constant(ir.IntType(32), k))
            at = self.b.gep(out.data, [self.b.add(start, cell)])
            self.b.store(value, at, align=4)

        self._each_channel(out, n, c0, store)

    def store_runs(self, vectors, out, n, c0, cell):
        # vectors[p]: channels c0.. of plane cell + p; transposed, each
        # channel's run of cells into out[n, c0 + k] from flat cell
        runs = self.transpose(vectors)

        def store(k, start):
            self.store(runs[k], out, self.b.add(start, cell))

        self._each_channel(out, n, c0, store)

    def activate(self, v, activation):
        # the library's expressions (_conv_epilogue.EXPRESSIONS), lane-wise:
        # "none", "relu", "hard_swish"
        b = self.b

        def clamp_below(v, bound):  # bound if v < bound, else v (NaN stays)
            return b.select(b.fcmp_ordered("<", v, bound), bound, v)

        if activation == "relu":
            return clamp_below(v, self.splat(0.0))
        if activation == "hard_swish":
            t = b.fadd(b.fmul(v, self.splat(SIXTH)), self.splat(0.5))
            t = clamp_below(t, self.splat(0.0))
            one = self.splat(1.0)
            t = b.select(b.fcmp_ordered(">", t, one), one, t)
            return b.fmul(v, t)
        return v

    def transpose(self, rows):
        # rows[r][c] -> rows[c][r] for a square tile of vectors: stage s
        # swaps bit s of the row index with bit s of the column index, two
        # two-source shuffles per pair of rows
        lanes = self.vector.count
        masks = ir.VectorType(ir.IntType(32), lanes)
        rows = list(rows)
        s = 1
        while s < lanes:
            low = [c if not c & s else lanes + c - s for c in range(lanes)]
            high = [c + s if not c & s else lanes + c for c in range(lanes)]
            for r in range(lanes):
                if r & s:
                    continue
                one, other = rows[r], rows[r | s]
                low_mask, high_mask = ir.Constant(masks, low), ir.Constant(masks, high)
                rows[r] = self.b.shuffle_vector(one, other, low_mask)
                rows[r | s] = self.b.shuffle_vector(one, other, high_mask)
            s <<= 1
        return rows
"""
PREAMBLE = PREAMBLE.replace("{sixth}", repr(float(np.float32(1 / 6))))


#: What a kernel run on a native team (:mod:`asyncrt.runtime._native_team`)
#: needs: ``team_kernel``, its decorator (a ``cfunc`` taking one pointer,
#: cached), and intrinsics over its argument, which points to int64
#: slots: ``slots_(data)`` (the pointer as int64 slots; with
#: ``numba.carray``, an array of them), ``floats_(address)``,
#: ``doubles_(address)``, ``ints_(address)``, ``ubytes_(address)``,
#: ``uints_(address)`` and ``ulongs_(address)`` (a slot holding an
#: address, as a float32, float64, int64, uint8, uint32 or uint64 pointer
#: for ``numba.carray``) and
#: ``claim_(data)`` (slot 0 plus one, atomically: the old value, the next
#: part to take).
CLAIMS = """
team_kernel = numba.cfunc(
    types.void(types.voidptr),
    cache=True,
    nopython=True,
    error_model="numpy",
    boundscheck=False,
)


def _address_as(numba_type, llvm_type):
    # an intrinsic: a slot holding an address, as a pointer to this type
    def pointer_(typingctx, address):
        sig = types.CPointer(numba_type)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], llvm_type.as_pointer())

        return sig, codegen

    return intrinsic(pointer_)


ints_ = _address_as(types.int64, ir.IntType(64))
floats_ = _address_as(types.float32, ir.FloatType())
doubles_ = _address_as(types.float64, ir.DoubleType())
bools_ = _address_as(types.boolean, ir.IntType(8))  # (numpy's: a byte each)
ubytes_ = _address_as(types.uint8, ir.IntType(8))
uints_ = _address_as(types.uint32, ir.IntType(32))
ulongs_ = _address_as(types.uint64, ir.IntType(64))


@intrinsic
def slots_(typingctx, data):
    sig = types.CPointer(types.int64)(types.voidptr)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64).as_pointer())

    return sig, codegen


@intrinsic
def claim_(typingctx, data):
    sig = types.int64(types.voidptr)

    def codegen(context, builder, signature, args):
        counter = builder.bitcast(args[0], ir.IntType(64).as_pointer())
        one = ir.Constant(ir.IntType(64), 1)
        return builder.atomic_rmw("add", counter, one, "monotonic")

    return sig, codegen
"""


def compile_vectors(
    prefix: str, source: str, function: str, **values: Any
) -> Callable[..., Any]:
    """``function`` of :data:`PREAMBLE` plus ``source``, each ``{name}`` in
    ``source`` replaced by ``values[name]`` (tuples as comma-separated
    items), compiled (or loaded from numba's disk cache): one module per
    distinct text, named ``prefix`` and its digest."""
    text = source
    for name, value in values.items():
        item = ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)
        text = text.replace("{" + name + "}", item)
    text = PREAMBLE + text
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    return _jit.compile_source(f"{prefix}_{digest}", text, function)
