"""What the kernels written in explicit LLVM vectors share (numba
intrinsics in generated modules: :mod:`asyncrt.ops._dwvector`,
:mod:`asyncrt.ops._poolvector`).

LLVM vectorises numba's loops only where it can prove that arrays do not
overlap, and numba marks none ``noalias``: a loop that reads several
arrays and writes one checks the overlap at run time (or stays scalar),
and cannot keep values in registers across its stores. An intrinsic
writes the vectors itself. :data:`PREAMBLE` starts every such module:
its imports, a type check for float32 C-contiguous arrays, and ``_Emit``,
the IR for intp index arithmetic and unaligned vector loads and stores at
flat element indices.
"""

from __future__ import annotations

__all__ = ("PREAMBLE",)

PREAMBLE = """
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


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
"""
