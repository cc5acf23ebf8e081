"""Compiled row loops for the epilogue ops (numba, where it is installed).

Two loops over a 2-D float32 view, rows ``first:last``, generated as source
with :mod:`asyncrt.ops._jitmath`'s helpers and compiled once per machine
(:func:`asyncrt.ops._jit.compile_source`):

* ``bias_gelu(y, bias, first, last)``: ``y = gelu(y + bias)`` in place, the
  library's exact GELU (``gelu_erf_``): one pass after a GEMM instead of
  six (bias add, divide, erf, add, multiply, multiply).
* ``add_layer_norm(x, r, scale, shift, out, epsilon, first, last)``:
  ``out = layer_norm(x + r)`` over each row, in two passes over a row that
  stays in L1 (sum, then centred squares, then the affine map) instead of a
  residual add and six whole-array passes.

Sums run in eight float32 lanes (``acc[c % 8]``), which LLVM turns into one
vector register without fast-math (no reassociation it was not told); the
lanes are added at the end. numpy's row means (a BLAS dot) sum in another
order, so the normalised rows agree with the unfused kernels to float32
rounding (a few ulps of the result), not bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

from ..runtime import _threads
from . import _jit, _jitmath
from ._common import Array

__all__ = ("MIN_ELEMENTS_PER_THREAD", "bind_rows", "loop")

#: Elements each thread gets at least before a loop is split over threads
#: (as :data:`asyncrt.ops._jitfuse.MIN_ELEMENTS_PER_THREAD`).
MIN_ELEMENTS_PER_THREAD = 1 << 17

_HEADER = "@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)"

_LOOPS = f"""
{_HEADER}
def bias_gelu(y, bias, first, last):
    cols = y.shape[1]
    for r in range(first, last):
        for c in range(cols):
            y[r, c] = gelu_erf_(y[r, c] + bias[c])


{_HEADER}
def add_layer_norm(x, res, scale, shift, out, epsilon, first, last):
    cols = out.shape[1]
    whole = cols - cols % 8
    width = _F(cols)
    for r in range(first, last):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _ZERO
        for c in range(0, whole, 8):
            v0 = x[r, c] + res[r, c]
            v1 = x[r, c + 1] + res[r, c + 1]
            v2 = x[r, c + 2] + res[r, c + 2]
            v3 = x[r, c + 3] + res[r, c + 3]
            v4 = x[r, c + 4] + res[r, c + 4]
            v5 = x[r, c + 5] + res[r, c + 5]
            v6 = x[r, c + 6] + res[r, c + 6]
            v7 = x[r, c + 7] + res[r, c + 7]
            out[r, c] = v0
            out[r, c + 1] = v1
            out[r, c + 2] = v2
            out[r, c + 3] = v3
            out[r, c + 4] = v4
            out[r, c + 5] = v5
            out[r, c + 6] = v6
            out[r, c + 7] = v7
            a0 += v0
            a1 += v1
            a2 += v2
            a3 += v3
            a4 += v4
            a5 += v5
            a6 += v6
            a7 += v7
        total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        for c in range(whole, cols):
            v = x[r, c] + res[r, c]
            out[r, c] = v
            total += v
        mean = total / width
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _ZERO
        for c in range(0, whole, 8):
            d0 = out[r, c] - mean
            d1 = out[r, c + 1] - mean
            d2 = out[r, c + 2] - mean
            d3 = out[r, c + 3] - mean
            d4 = out[r, c + 4] - mean
            d5 = out[r, c + 5] - mean
            d6 = out[r, c + 6] - mean
            d7 = out[r, c + 7] - mean
            a0 += d0 * d0
            a1 += d1 * d1
            a2 += d2 * d2
            a3 += d3 * d3
            a4 += d4 * d4
            a5 += d5 * d5
            a6 += d6 * d6
            a7 += d7 * d7
        squares = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        for c in range(whole, cols):
            d = out[r, c] - mean
            squares += d * d
        inv = _ONE / np.sqrt(squares / width + epsilon)
        for c in range(cols):
            out[r, c] = ((out[r, c] - mean) * inv) * scale[c] + shift[c]
"""

_SOURCE = "\n".join(["import numba", "import numpy as np", _jitmath.SOURCE, _LOOPS])
_MODULE = "asyncrt_epilogue_" + hashlib.sha256(_SOURCE.encode()).hexdigest()[:20]


def loop(name: str) -> Callable[..., None]:
    """The compiled loop ``name`` (``"bias_gelu"`` or ``"add_layer_norm"``).

    :raises ModuleNotFoundError: if numba is not installed.
    """
    function: Callable[..., None] = _jit.compile_source(_MODULE, _SOURCE, name)
    return function


def bind_rows(
    kernel: Callable[..., None], arrays: tuple[Array, ...], rows: int, cols: int
) -> Callable[[], None]:
    """``kernel(*arrays, first, last)`` over all ``rows`` as a call without
    arguments, compiled for these arrays now and split over the kernel
    threads where each gets :data:`MIN_ELEMENTS_PER_THREAD` elements."""
    _jit.specialise(kernel, (*arrays, 0, rows))
    enough = rows * cols // MIN_ELEMENTS_PER_THREAD
    threads = min(_threads.limits.threads, rows, enough)
    if threads <= 1:
        return functools.partial(kernel, *arrays, 0, rows)
    share = -(-rows // threads)
    parts = [
        functools.partial(kernel, *arrays, r, min(r + share, rows))
        for r in range(0, rows, share)
    ]
    return functools.partial(_threads.run_parts, parts)
