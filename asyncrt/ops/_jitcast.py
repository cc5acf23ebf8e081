"""float32 to float16 as a compiled loop over the bits (numba).

numpy converts float32 to float16 one element at a time in software
(2.5 ns an element on the 2-core AVX-512 VM: 9-11x the bytes floor), and
numba has no float16 type. Here the float32 bits (viewed as uint32) become
the float16 bits (viewed as uint16) by numpy's own algorithm
(``npy_floatbits_to_halfbits``: round to nearest even, overflow to
infinity, subnormals, NaN payloads kept and kept NaN) written with selects
instead of branches: every one of the 2**32 float32 values converts to
numpy's float16 bit for bit (checked exhaustively when it was written),
3.5x faster.

Where the CPU converts in hardware (x86's F16C, every x86-64 core since
2012), the loop is LLVM's ``fptrunc`` to half instead (``vcvtps2ph``, 16
values an instruction: 786k elements 546 -> 66 us, below the bytes
floor). It rounds as numpy does (to nearest even, the default mode): all
2**32 float32 values gave numpy's bits but the signalling NaNs, which the
instruction quiets. The loop notes whether it met a NaN (an OR that
vectorises) and only then gives NaNs numpy's bits (the payload's top
bits, not quieted) in a second pass (199 us with NaN). The kernel is
checked against numpy on specials when first compiled. Other CPUs, or a
numba told to compile for another (``NUMBA_CPU_NAME``), keep the bits
loop.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _jit

__all__ = ("bind_float32_to_half",)

Array = Any
#: Elements each kernel thread gets at least (as the epilogues: a cast
#: often follows a GEMM whose BLAS threads still spin).
MIN_ELEMENTS_PER_THREAD = 1 << 20


def bind_float32_to_half(a: Array, out: Array) -> Callable[[], None] | None:
    """``out[...] = a`` for float32 ``a`` and float16 ``out`` of one shape,
    both C-contiguous, as a compiled call; ``None`` for anything else or
    without numba."""
    if not _jit.takes_pair(a, out, "float32", "float16"):
        return None
    kernel = _hardware_kernel()
    source = a.reshape(-1)  # the floats for the CPU's conversion, else their bits
    if kernel is None:
        kernel, source = _jit.compile_kernel(_half_bits), source.view(np.uint32)
    arrays = (source, out.reshape(-1).view(np.uint16))
    return _jit.bind_rows(kernel, arrays, a.size, 1, MIN_ELEMENTS_PER_THREAD)


_HARDWARE_SOURCE = """
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def half_bits_(typingctx, x):
    # LLVM's fptrunc to half: the CPU's conversion (F16C's vcvtps2ph)
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def kernel(src, dst, first, last):
    u32 = np.uint32
    # slices, then unsigned indices from 0 (as _half_bits): LLVM vectorises
    source, target = src[first:last], dst[first:last]
    count = np.uint64(last - first)
    nans = u32(0)
    for i in range(count):
        v = source[i]
        target[i] = half_bits_(v)
        nans |= u32(v != v)
    if nans:  # numpy's NaN bits: the payload's top bits, not quieted
        for i in range(count):
            v = source[i]
            if v == v:
                continue
            f = np.float32(v).view(u32)
            nan = u32(0x7C00) + ((f & u32(0x007FFFFF)) >> u32(13))
            nan = nan + u32(1) if nan == u32(0x7C00) else nan
            target[i] = np.uint16(((f >> u32(16)) & u32(0x8000)) + nan)
"""


@functools.cache
def _hardware_kernel() -> Callable[..., None] | None:
    """The loop over the CPU's conversion, compiled and checked once, or
    ``None`` where the CPU has none or it does not give numpy's bits."""
    if os.environ.get("NUMBA_CPU_NAME"):
        return None  # compiling for another CPU: it may lack F16C
    try:
        binding = importlib.import_module("llvmlite.binding")  # numba's
        if not binding.get_host_cpu_features().get("f16c", False):
            return None
        digest = hashlib.sha256(_HARDWARE_SOURCE.encode()).hexdigest()[:20]
        kernel = _jit.compile_source(
            "asyncrt_half_" + digest, _HARDWARE_SOURCE, "kernel"
        )
        probe = np.array(
            [1.0, -0.0, 65504.0, 65520.0, 1e-8, 6e-8, 2.0**-25, np.inf, np.nan],
            np.float32,
        )
        signalling = np.array([0x7F800001, 0xFFC00001], np.uint32).view(np.float32)
        probe = np.concatenate([probe, signalling])
        got = np.empty(probe.shape, np.uint16)
        kernel(probe, got, 0, probe.size)
        with np.errstate(all="ignore"):
            want = probe.astype(np.float16).view(np.uint16)
    except Exception:  # no conversion: the bits loop serves
        return None
    return kernel if np.array_equal(got, want) else None


def _half_bits(
    src: Any, dst: Any, first: int, last: int
) -> None:  # pragma: no cover - compiled by numba
    u32 = np.uint32
    # slices, then unsigned indices from 0: numba wraps negative signed
    # indices, which stops LLVM vectorising (2.6x slower here)
    source, target = src[first:last], dst[first:last]
    for i in range(np.uint64(last - first)):
        f = u32(source[i])
        sign = (f >> u32(16)) & u32(0x8000)
        exponent = f & u32(0x7F800000)
        significand = f & u32(0x007FFFFF)
        # NaN keeps its payload's top bits, and stays NaN; else infinity
        nan = u32(0x7C00) + (significand >> u32(13))
        nan = nan + u32(1) if nan == u32(0x7C00) else nan
        is_nan = exponent == u32(0x7F800000) and significand != u32(0)
        huge = nan if is_nan else u32(0x7C00)
        # subnormal halves: the significand shifted by 1 to 11 more bits,
        # ties to even over every bit shifted out
        shift = u32(113) - min(exponent >> u32(23), u32(113))
        small = (u32(0x00800000) + significand) >> min(shift, u32(31))
        tie = (small & u32(0x3FFF)) == u32(0x1000) and (f & u32(0x7FF)) == u32(0)
        small = (small + (u32(0) if tie else u32(0x1000))) >> u32(13)
        # normal halves: a carry out of the significand moves the exponent
        # (to infinity past 65504)
        scaled = (exponent - min(exponent, u32(0x38000000))) >> u32(13)
        even = (significand & u32(0x3FFF)) == u32(0x1000)
        normal = scaled + ((significand + (u32(0) if even else u32(0x1000))) >> u32(13))
        low = small if exponent >= u32(0x33000000) else u32(0)
        middle = normal if exponent > u32(0x38000000) else low
        result = huge if exponent >= u32(0x47800000) else middle
        target[i] = np.uint16(sign + result)
