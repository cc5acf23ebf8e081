"""GEMMs of a constant matrix packed into column panels, in explicit LLVM
vectors (float32), on native threads.

A transformer serving one request multiplies a few rows of activations
(``M`` = batch x sequence, often 16 to a few hundred) by weight matrices
of a million floats or more. BLAS packs ``B`` on every call, and at such
``M`` the packing and the hand-off to its threads cost as much as the
multiply-adds: numpy's OpenBLAS ran MiniLM's ``(16, 384) @ (384, 1536)``
at 63-69 GFLOP/s on two cores, its weights coming from memory as they do
inside a model. ONNX Runtime packs its weights once, when the session is
made.

Here ``B``, a parameter, is packed once when the kernel is bound
(:func:`pack`, shared by value: :func:`asyncrt.ops._packed.shared`) into
panels of :data:`PANEL` columns, each ``(K, PANEL)`` contiguous, so a call
streams it once in order. The micro-kernel keeps a block of :data:`ROWS`
rows x :data:`PANEL` columns of ``C`` in sixteen vector registers and,
for each ``k``, loads two vectors of the panel and broadcasts each row's
``a[m, k]`` into two fused multiply-adds: 116 GFLOP/s on one core of the
2-core AVX-512 VM with warm caches, its FMA peak.

**Epilogue.** A bias and ReLU are applied to each block as it is stored
(``matmul_bias``'s ``activation="relu"``): the bits of the passes that
would follow the product, without them.

**Threads.** The kernel is a numba ``cfunc`` run on a native team
(:mod:`asyncrt.runtime._native_team`: GNU OpenMP's threads, without the
GIL: a hand-off of microseconds, where the part pool's costs 45-70 us, as
long as such a GEMM). Its threads take parts from a shared counter: one
run of panels (of row blocks, for fewer panels) each, over
:attr:`ThreadLimits.threads <asyncrt.runtime._threads.ThreadLimits.threads>`
threads (what BLAS would have had), from :data:`MIN_PARALLEL_WORK`
multiply-adds; while other processes crowd the kernel threads down to one,
several runs a thread on the part pool (``gemm_parts`` threads), so one
the machine does not run leaves its parts to the others.

**Accuracy.** Each output is one fused multiply-add chain over ``k`` in
order: it differs from BLAS's sums (blocked, in another order) by float32
rounding, about 1e-6 of the output's magnitude. Non-finite values
propagate as in any sum of products (the panels' zero padding is never
stored: every store, and every load of the bias, is masked to the lanes
inside the output's width; with every lane in, as fast as a plain one. A
scalar loop over the last panel's lanes instead made the kernel take 6 s
to compile, 2 s so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..runtime import _native_team
from . import _jit, _packed
from ._common import Array
from ._vector_ir import CLAIMS, compile_vectors

__all__ = ("MAX_DEPTH", "PANEL", "ROWS", "bind", "pack", "takes", "takes_bias")

#: Columns of ``B`` a panel holds: two vectors of 16 float32 lanes.
PANEL = 32
#: Rows of ``C`` a micro-kernel block keeps in registers (x 2 vectors).
ROWS = 8
#: The most rows of ``B`` taken: a panel (``depth x PANEL`` floats, 512
#: KiB at this depth) stays in a core's L2 cache while row blocks pass.
MAX_DEPTH = 4096
#: Products of fewer multiply-adds run on the calling thread: a launch on
#: numba's pool costs a few microseconds, and two threads first beat one
#: at about this much work (2-core VM: 16 x 256 x 256, 1M, took 20 us on
#: one thread and 15 on two; 4 x 256 x 256 6 us and 7).
MIN_PARALLEL_WORK = 500_000
_LANES = 16
_FLOAT32 = np.dtype(np.float32)
#: The epilogue's flags (``COMMON_SOURCE``'s ``BIAS``, ``RELU`` and
#: ``HARD_SWISH``): the bias added, then ReLU or hard-swish (the
#: operations of :func:`asyncrt.ops._jitmath`'s ``hswish_``, in its order:
#: the bits of the pass after the product).
BIAS_FLAG, RELU_FLAG, HARD_SWISH_FLAG = 1, 2, 4
#: The convolution's epilogue also adds a residual (after the bias, before
#: the activation: ``Conv -> Add [-> Relu]``'s order, so its bits).
RESIDUAL_FLAG = 8
#: The int64 slots of ``gemm_claimed``'s data: the next part, parts, m,
#: depth, width, panels, flags, the addresses of a, panels, out and bias,
#: the bias's length.
_SLOTS = 12
#: The bias argument of a product without one (never read).
_NO_BIAS = np.zeros(1, _FLOAT32)

#: What the panel kernels' generated modules share (this one's and
#: :mod:`asyncrt.ops._panel_conv`'s): the team's intrinsics, the epilogue
#: and fused multiply-adds (loads, masks and broadcasts: ``_Emit``'s).
COMMON_SOURCE = """
import functools

{claims}

BIAS, RELU, HARD_SWISH = {bias}, {relu}, {hard_swish}  # the epilogue's flags
RESIDUAL = {residual}


def _splat_like(v, value):
    # value in every lane of v's type (or v's scalar type)
    scalar = ir.Constant(ir.FloatType(), value)
    if isinstance(v.type, ir.VectorType):
        return ir.Constant(v.type, [scalar] * v.type.count)
    return scalar


def _finish(b, e, value, shift_of, flags, residual_of=None):
    # value + shift_of() where flags has BIAS (the bias loaded there only),
    # + residual_of() where it has RESIDUAL (and residual_of is given),
    # then max(value, 0) where it has RELU (NaN kept, as np.maximum), or
    # hard-swish where it has HARD_SWISH: x * clip(x * SIXTH + 0.5, 0, 1),
    # a product then a sum (no fused multiply-add), NaN kept, as hswish_
    biased = b.icmp_signed("!=", b.and_(flags, e.const(BIAS)), e.const(0))
    rectified = b.icmp_signed("!=", b.and_(flags, e.const(RELU)), e.const(0))
    swished = b.icmp_signed("!=", b.and_(flags, e.const(HARD_SWISH)), e.const(0))
    slot = cgutils.alloca_once_value(b, value)
    with b.if_then(biased):
        b.store(b.fadd(b.load(slot), shift_of()), slot)
    if residual_of is not None:
        summed = b.icmp_signed("!=", b.and_(flags, e.const(RESIDUAL)), e.const(0))
        with b.if_then(summed):
            b.store(b.fadd(b.load(slot), residual_of()), slot)
    with b.if_then(rectified):
        v = b.load(slot)
        zero = ir.Constant(v.type, None)
        b.store(b.select(b.fcmp_ordered("<", v, zero), zero, v), slot)
    with b.if_then(swished):
        v = b.load(slot)
        zero, one = _splat_like(v, 0.0), _splat_like(v, 1.0)
        t = b.fadd(b.fmul(v, _splat_like(v, SIXTH)), _splat_like(v, 0.5))
        t = b.select(b.fcmp_ordered("<", t, zero), zero, t)
        t = b.select(b.fcmp_ordered(">", t, one), one, t)
        b.store(b.fmul(v, t), slot)
    return b.load(slot)


def _block_intrinsic(ndims, emit):
    # an intrinsic block_(first, second, out, bias, i, j, flags) of four
    # float32 C-contiguous arrays of these ndims and three intp, whose code
    # emit(context, builder, signature, args) writes
    def block_(typingctx, first, second, out, bias, i, j, flags):
        arrays = (first, second, out, bias)
        if not all(_is_float_array(a, n) for a, n in zip(arrays, ndims)):
            return None
        sig = types.void(*arrays, types.intp, types.intp, types.intp)
        return sig, emit

    return intrinsic(block_)


def _fma(b, vector):
    # llvm.fma for vectors of this type
    return cgutils.get_or_insert_function(
        b.module,
        ir.FunctionType(vector, [vector] * 3),
        f"llvm.fma.v{vector.count}f32",
    )


"""

_SOURCE = (
    COMMON_SOURCE
    + """
SLOTS = {slots}
ROWS, VECTORS = {rows}, {vectors}
LANES = {lanes}
PANEL = VECTORS * LANES


def _block(rows):
    # an intrinsic block_(a, panels, out, bias, m0, p, flags): out[m0 : m0 +
    # rows, PANEL p : PANEL (p + 1)] = a[m0 : m0 + rows] @ panels[p],
    # finished (_finish), the columns past out's width not stored
    return _block_intrinsic((2, 3, 2, 1), functools.partial(_emit_block, rows))


def _emit_block(rows, context, builder, signature, args):
    b = builder
    e = _Emit(context, builder, LANES)
    a_, panels_, out_, bias_ = e.arrays(signature, args, 4)
    m0, p, flags = args[4:]
    depth = cgutils.unpack_tuple(b, a_.shape, 2)[1]
    width = cgutils.unpack_tuple(b, out_.shape, 2)[1]
    fma = _fma(b, e.vector)
    # accumulators in stack slots: LLVM keeps them in registers
    sums = [
        [cgutils.alloca_once_value(b, e.splat(0.0)) for _ in range(VECTORS)]
        for _ in range(rows)
    ]
    starts = [b.mul(b.add(m0, e.const(r)), depth) for r in range(rows)]
    panel = e.index((p, depth, e.const(PANEL)))
    with cgutils.for_range(b, depth) as loop:
        k = loop.index
        at = b.add(panel, b.mul(k, e.const(PANEL)))
        column = [
            e.load(panels_, b.add(at, e.const(v * LANES))) for v in range(VECTORS)
        ]
        for r in range(rows):
            x = e.spread(b.load(b.gep(a_.data, [b.add(starts[r], k)])))
            for v in range(VECTORS):
                slot = sums[r][v]
                b.store(b.call(fma, [x, column[v], b.load(slot)]), slot)
    col0 = b.mul(p, e.const(PANEL))
    # the lanes inside out's width: every store and bias load masked (as
    # fast as plain ones where all lanes are in; the last panel of a width
    # not a multiple of PANEL has fewer)
    masks = [
        e.lanes_between(b.add(col0, e.const(v * LANES)), width)
        for v in range(VECTORS)
    ]
    for r in range(rows):
        start = b.add(e.index((b.add(m0, e.const(r)), width)), col0)
        for v in range(VECTORS):
            at = e.const(v * LANES)
            column = b.add(col0, at)
            shift_of = functools.partial(e.masked_load, bias_, column, masks[v])
            value = _finish(b, e, b.load(sums[r][v]), shift_of, flags)
            e.masked_store(value, out_, b.add(start, at), masks[v])
    return None


# ROWS rows a block; the rows left, four at once, then one at a time
block_rows_, block_4_, block_1_ = _block(ROWS), _block(4), _block(1)


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def gemm(a, panels, out, bias, flags, first, last, top, bottom):
    # out[top:bottom, PANEL first : PANEL last] of a @ B, B packed into
    # panels, finished as flags say: a panel stays in cache over the rows
    for p in range(first, last):
        m0 = top
        while m0 + ROWS <= bottom:
            block_rows_(a, panels, out, bias, m0, p, flags)
            m0 += ROWS
        if m0 + 4 <= bottom:
            block_4_(a, panels, out, bias, m0, p, flags)
            m0 += 4
        for m in range(m0, bottom):
            block_1_(a, panels, out, bias, m, p, flags)


@team_kernel
def gemm_claimed(data):
    # gemm on a native team: data's slots (SLOTS) hold the arrays' shapes
    # and addresses; each thread takes parts until none is left: runs of
    # panels, or of row blocks where there are fewer panels than parts
    d = numba.carray(slots_(data), SLOTS)
    parts, m, depth, width, count, flags = d[1], d[2], d[3], d[4], d[5], d[6]
    a = numba.carray(floats_(d[7]), (m, depth))
    panels = numba.carray(floats_(d[8]), (count, depth, PANEL))
    out = numba.carray(floats_(d[9]), (m, width))
    bias = numba.carray(floats_(d[10]), d[11])
    blocks = (m + ROWS - 1) // ROWS
    while True:
        i = claim_(data)
        if i >= parts:
            return
        if count >= parts:
            first, last = count * i // parts, count * (i + 1) // parts
            gemm(a, panels, out, bias, flags, first, last, 0, m)
        else:
            top = ROWS * (blocks * i // parts)
            bottom = min(m, ROWS * (blocks * (i + 1) // parts))
            gemm(a, panels, out, bias, flags, 0, count, top, bottom)
"""
)

#: :data:`COMMON_SOURCE`'s values.
COMMON_VALUES: dict[str, Any] = {
    "claims": CLAIMS,
    "bias": BIAS_FLAG,
    "relu": RELU_FLAG,
    "hard_swish": HARD_SWISH_FLAG,
    "residual": RESIDUAL_FLAG,
}


@functools.cache
def _kernel_address() -> int:
    """The address of ``void gemm_claimed(void *data)``, compiled (or
    loaded from numba's disk cache)."""
    values = {
        **COMMON_VALUES,
        "slots": _SLOTS,
        "rows": ROWS,
        "vectors": PANEL // _LANES,
        "lanes": _LANES,
    }
    kernel: Any = compile_vectors(
        "asyncrt_panel_gemm", _SOURCE, "gemm_claimed", **values
    )
    return int(kernel.address)


def pack(w: Array) -> Array:
    """``w`` ``(K, N)`` as ``(ceil(N / PANEL), K, PANEL)`` float32 panels,
    the last one's columns past ``N`` zero."""
    depth, width = w.shape
    count = -(-width // PANEL)
    padded = np.zeros((depth, count * PANEL), _FLOAT32)
    padded[:, :width] = w
    return np.ascontiguousarray(padded.reshape(depth, count, PANEL).transpose(1, 0, 2))


def takes(a: Array, b: Array, out: Array) -> bool:
    """Whether ``out = a @ b`` runs here: numpy float32, ``b`` a non-empty
    matrix of at most :data:`MAX_DEPTH` rows, ``a`` and ``out``
    C-contiguous stacks of rows that are one matrix each as views, numba
    installed."""
    return (
        _jit.available()
        and all(isinstance(x, np.ndarray) and x.dtype == _FLOAT32 for x in (a, b, out))
        and b.ndim == 2
        and b.size > 0
        and b.shape[0] <= MAX_DEPTH
        and a.ndim >= 2
        and a.flags.c_contiguous
        and out.flags.c_contiguous
        and a.shape[-1] == b.shape[0]
        and out.shape == (*a.shape[:-1], b.shape[1])
    )


def takes_bias(bias: Array, out: Array) -> bool:
    """Whether :func:`bind` takes ``bias`` for ``out``: ``(N,)`` float32,
    C-contiguous, ``N`` the output's last axis."""
    return (
        isinstance(bias, np.ndarray)
        and bias.dtype == _FLOAT32
        and bias.shape == out.shape[-1:]
        and bias.flags.c_contiguous
    )


def bind(
    a: Array,
    b: Array,
    out: Array,
    *,
    bias: Array | None = None,
    relu: bool = False,
) -> Callable[[], None]:
    """``out = a @ b`` (:func:`takes` holds; ``b``'s values fixed for the
    binding's life: packed now) as a call without arguments; ``+ bias``,
    then ``max(., 0)``, applied to each block as it is stored (as the
    passes ``add`` and ``maximum`` after the product would: the same bits).

    :param bias: ``(N,)`` float32, C-contiguous (:func:`takes_bias`), read
        each call.
    :param relu: apply ReLU (NaN stays NaN).
    """
    run = _native_team.launcher(_kernel_address())
    _native_team.use()
    panels = _packed.shared("panel_gemm", b, pack)
    rows, cols = a.reshape(-1, a.shape[-1]), out.reshape(-1, out.shape[-1])
    shift = _NO_BIAS if bias is None else bias
    m, depth, count = rows.shape[0], rows.shape[1], panels.shape[0]
    flags = (0 if bias is None else BIAS_FLAG) | (RELU_FLAG if relu else 0)
    data = np.array(
        [0, 1, m, depth, cols.shape[1], count, flags]
        + [x.ctypes.data for x in (rows, panels, cols, shift)]
        + [shift.size],
        np.int64,
    )
    address = data.ctypes.data
    held = (rows, panels, cols, shift)  # (the addresses in data stay valid)
    work = m * depth * cols.shape[1]
    large = work >= MIN_PARALLEL_WORK
    most = max(count, -(-m // ROWS))  # (runs of panels, or row blocks)

    def product() -> None:
        if not held[0].size:
            return
        threads, parts, crowded = _native_team.share(large, work)
        parts = min(parts, most)
        data[0], data[1] = 0, parts
        run(address, min(threads, parts), crowded)

    return product
