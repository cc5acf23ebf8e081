"""Stacks of float32 GEMMs split over a native team, each part one
single-threaded BLAS call.

OpenBLAS splits each call over its own threads, which spin for about 0.1 s
after it, and waits for all of them: a second pool of spinning threads
beside the native team that runs asyncrt's packed GEMMs
(:mod:`asyncrt.runtime._native_team`) takes its cores, and each pool's
helpers wait for the other's (MobileNetV3 with its pointwise convolutions
on the team and its classifier on OpenBLAS: 8 ms a run instead of 2.2).
So while the team is in use every product runs on it: the packed kernels
(:mod:`asyncrt.ops._panel_gemm`, :mod:`asyncrt.ops._panel_conv`) for
parameters, and here everything else: the stack's matrices (and row
blocks of them, where there are fewer matrices than threads) are parts,
each computed by ``cblas_sgemm`` on the thread that takes it, with
OpenBLAS held to one thread of its own
(:attr:`ThreadLimits.blas_on_team
<asyncrt.runtime._threads.ThreadLimits>`). No barrier per matrix: a stack
of attention heads or Winograd's 36 products goes over the threads in one
hand-off.

``cblas_sgemm`` is the one in numpy's OpenBLAS (the ``scipy_openblas64_``
build's ``scipy_cblas_sgemm64_``, or an LP64 ``cblas_sgemm``), found
through threadpoolctl; without it, :func:`available` is false and callers
keep ``numpy.matmul``.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import threadpoolctl

from ..runtime import _native_team
from . import _jit
from ._common import Array
from ._vector_ir import CLAIMS, compile_vectors

__all__ = ("available", "bind", "matmul", "takes")

_FLOAT32 = np.dtype(np.float32)
#: Rows a part gets at least when matrices are split in row blocks.
MIN_ROWS_PER_PART = 16
#: Stacks of fewer multiply-adds run on the calling thread (one BLAS call
#: a matrix): a team launch costs a few microseconds.
MIN_TEAM_WORK = 200_000
#: :func:`matmul` binds its arrays per call (about 10 us): smaller
#: products take ``numpy.matmul``.
MIN_CALL_WORK = 1_000_000
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
#: data's int64 slots: the next part, parts, row parts a matrix, m, n, k,
#: trans a, trans b, lda, ldb, ldc, the addresses of a, b, c, of the
#: offsets table (a, b, c in elements, per matrix) and of cblas_sgemm, a's
#: step a row of op(a), the steps from one matrix of the stack to the next
#: of a, b and c (elements), whether the table is used (else the steps),
#: whether parts are blocks of columns (else of rows), b's step a column.
_SLOTS = 23

_SOURCE = """
{claims}

SLOTS = {slots}
WIDE = {wide}  # cblas_sgemm's integers are 64-bit (an ILP64 build)


@intrinsic
def sgemm_(typingctx, function, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc):
    # cblas_sgemm(RowMajor, trans_a, trans_b, m, n, k, 1, a, lda, b, ldb, 0,
    # c, ldc) at the address function (every argument an int64)
    sig = types.void(*(types.int64,) * 12)

    def codegen(context, builder, signature, args):
        b = builder
        index = ir.IntType(64 if WIDE else 32)
        enum, real = ir.IntType(32), ir.FloatType()
        floats = real.as_pointer()
        kind = ir.FunctionType(
            ir.VoidType(),
            [enum, enum, enum, index, index, index, real, floats, index]
            + [floats, index, real, floats, index],
        )
        function, trans_a, trans_b, m, n, k, a, lda, b_, ldb, c, ldc = args
        call = b.inttoptr(function, kind.as_pointer())

        def small(v, t):
            return b.trunc(v, t) if t.width < 64 else v

        b.call(
            call,
            [
                ir.Constant(enum, 101),
                small(trans_a, enum),
                small(trans_b, enum),
                small(m, index),
                small(n, index),
                small(k, index),
                ir.Constant(real, 1.0),
                b.inttoptr(a, floats),
                small(lda, index),
                b.inttoptr(b_, floats),
                small(ldb, index),
                ir.Constant(real, 0.0),
                b.inttoptr(c, floats),
                small(ldc, index),
            ],
        )
        return None

    return sig, codegen


@team_kernel
def team_gemm(data):
    # each thread takes parts until none is left: a matrix of the stack,
    # or a block of its rows (of its columns, where d[21] says so)
    d = numba.carray(slots_(data), SLOTS)
    columns, column_step = d[21] != 0, d[22]
    parts, row_parts, m, n, k = d[1], d[2], d[3], d[4], d[5]
    trans_a, trans_b, lda, ldb, ldc = d[6], d[7], d[8], d[9], d[10]
    table = d[20] != 0
    offsets = numba.carray(ints_(d[14]), 3 * (parts // row_parts) if table else 3)
    row_step = d[16]
    while True:
        i = claim_(data)
        if i >= parts:
            return
        item, block = i // row_parts, i % row_parts
        extent = n if columns else m
        first = extent * block // row_parts
        last = extent * (block + 1) // row_parts
        if last == first:
            continue
        if table:
            at = 3 * item
            a_at, b_at, c_at = offsets[at], offsets[at + 1], offsets[at + 2]
        else:
            a_at, b_at, c_at = item * d[17], item * d[18], item * d[19]
        if columns:
            a = d[11] + 4 * a_at
            b = d[12] + 4 * (b_at + first * column_step)
            c = d[13] + 4 * (c_at + first)
            rows, cols = m, last - first
        else:
            a = d[11] + 4 * (a_at + first * row_step)
            b = d[12] + 4 * b_at
            c = d[13] + 4 * (c_at + first * ldc)
            rows, cols = last - first, n
        sgemm_(d[15], trans_a, trans_b, rows, cols, k, a, lda, b, ldb, c, ldc)
"""


@functools.cache
def _sgemm() -> tuple[int, bool] | None:
    """``cblas_sgemm``'s address in numpy's OpenBLAS and whether its
    integers are 64-bit, or ``None``."""
    for library in threadpoolctl.ThreadpoolController().lib_controllers:
        if library.internal_api != "openblas":
            continue
        try:
            handle = ctypes.CDLL(library.filepath)
        except OSError:
            continue
        for name, wide in (
            ("scipy_cblas_sgemm64_", True),
            ("cblas_sgemm64_", True),
            ("cblas_sgemm", False),
        ):
            function = getattr(handle, name, None)
            if function is not None:
                address = ctypes.cast(function, ctypes.c_void_p).value
                if address:
                    return int(address), wide
    return None


@functools.cache
def available() -> bool:
    """Whether stacks of GEMMs run on the team here (numba installed, a
    ``cblas_sgemm`` found)."""
    return _jit.available() and _sgemm() is not None


@functools.cache
def _launcher(wide: bool) -> Callable[..., None]:
    """``team_gemm`` compiled (or loaded from numba's disk cache), as
    :func:`asyncrt.runtime._native_team.launcher` runs it."""
    kernel: Any = compile_vectors(
        "asyncrt_team_blas",
        _SOURCE,
        "team_gemm",
        claims=CLAIMS,
        slots=_SLOTS,
        wide=int(wide),
    )
    return _native_team.launcher(int(kernel.address))


def _layout(x: Array) -> tuple[int, int, int] | None:
    """``(trans, ld, row step)`` in elements for a matrix view ``x`` (its
    last two axes) as BLAS reads it, or ``None`` where neither axis has a
    unit stride."""
    rows, cols = x.shape[-2:]
    row_stride, col_stride = (s // x.itemsize for s in x.strides[-2:])
    if col_stride == 1 or cols == 1:
        ld = row_stride if rows > 1 else max(cols, 1)
        return _NO_TRANS, max(ld, cols, 1), max(ld, cols, 1)
    if row_stride == 1 or rows == 1:
        ld = col_stride if cols > 1 else max(rows, 1)
        return _TRANS, max(ld, rows, 1), 1
    return None


def takes(a: Array, b: Array, out: Array) -> bool:
    """Whether :func:`bind` takes ``out = a @ b``: numpy float32 stacks of
    matrices (``a`` and ``b`` broadcast to ``out``'s stack), each matrix
    read with a unit stride along one of its axes, ``out``'s rows
    contiguous, no empty axis, :func:`available`."""
    if not (
        all(isinstance(x, np.ndarray) and x.dtype == _FLOAT32 for x in (a, b, out))
        and a.ndim >= 2
        and b.ndim >= 2
        and out.ndim == max(a.ndim, b.ndim)
        and a.shape[-1] == b.shape[-2]
        and out.shape[-2:] == (a.shape[-2], b.shape[-1])
        and out.size > 0
        and a.shape[-1] > 0
        and all(s % 4 == 0 for x in (a, b, out) for s in x.strides)
        and (out.strides[-1] == 4 or out.shape[-1] == 1)
    ):
        return False
    try:
        stack = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return False
    return (
        stack == out.shape[:-2]
        and _layout(a) is not None
        and _layout(b) is not None
        and available()
    )


def _offsets(x: Array, stack: tuple[int, ...]) -> Array:
    """Each stacked matrix's first element, in elements from ``x``'s."""
    steps = np.zeros(stack, np.int64)
    lead = x.ndim - 2
    for axis, size in enumerate(x.shape[:-2]):
        if size > 1:
            at = axis + len(stack) - lead
            shape = [1] * len(stack)
            shape[at] = size
            steps = steps + (np.arange(size) * (x.strides[axis] // 4)).reshape(shape)
    return steps.reshape(-1)


_NO_TABLE = np.zeros(3, np.int64)


def _steps(a: Array, b: Array, out: Array) -> tuple[int, int, int] | None:
    """The element steps from one matrix of the stack to the next for
    ``a``, ``b`` and ``out``, where the stack is one axis after dropping
    those of size one (0 for an operand broadcast along it), or ``None``."""
    stack = [i for i, size in enumerate(out.shape[:-2]) if size > 1]
    if len(stack) > 1:
        return None
    if not stack:
        return 0, 0, 0
    axis = stack[0]
    steps = []
    for x in (a, b, out):
        at = axis - (out.ndim - x.ndim)
        steps.append(x.strides[at] // 4 if at >= 0 and x.shape[at] > 1 else 0)
    return steps[0], steps[1], steps[2]


#: Products :func:`matmul` bound lately, by their arrays' addresses,
#: shapes and strides (the arrays themselves not held: a call passes live
#: arrays, and an entry is only used for arrays at those addresses), or
#: ``None`` for numpy's; the least recently used go past
#: :data:`BOUND_BY_CALL`.
_by_call: collections.OrderedDict[tuple[Any, ...], Callable[[], None] | None] = (
    collections.OrderedDict()
)
_by_call_lock = threading.Lock()
BOUND_BY_CALL = 64


def matmul(a: Array, b: Array, *, out: Array) -> None:
    """``numpy.matmul(a, b, out=out)``, on the team where :func:`takes`
    holds and the product is large enough to split; for kernels that make
    their operands per call (a column matrix in a thread's scratch): bound
    once per layout and address (:data:`BOUND_BY_CALL` kept), a lookup of
    a few microseconds after."""
    if not (
        type(a) is np.ndarray
        and type(b) is np.ndarray
        and type(out) is np.ndarray
        and a.shape[-1] * out.size >= MIN_CALL_WORK
    ):
        np.matmul(a, b, out=out)
        return
    key = (
        a.ctypes.data, a.shape, a.strides, a.dtype.char,
        b.ctypes.data, b.shape, b.strides, b.dtype.char,
        out.ctypes.data, out.shape, out.strides, out.dtype.char,
    )  # fmt: skip
    with _by_call_lock:
        known = key in _by_call
        found = _by_call.get(key)
        if known:
            _by_call.move_to_end(key)
    if not known:
        found = _bind(a, b, out, hold=False) if takes(a, b, out) else None
        with _by_call_lock:
            _by_call[key] = found
            while len(_by_call) > BOUND_BY_CALL:
                _by_call.popitem(last=False)
    if found is None:
        np.matmul(a, b, out=out)
    else:
        found()


def bind(a: Array, b: Array, out: Array) -> Callable[[], None]:
    """``out = a @ b`` (:func:`takes` holds) as a call without arguments:
    the stack's matrices (or row blocks) over the kernel threads on a
    native team, each one ``cblas_sgemm`` call; the arrays' storage is
    read anew each call."""
    return _bind(a, b, out, hold=True)


def _bind(a: Array, b: Array, out: Array, hold: bool) -> Callable[[], None]:
    """:func:`bind`; ``hold``: the call keeps the arrays alive (else its
    caller does, as :func:`matmul`'s)."""
    found = _sgemm()
    assert found is not None  # (takes says so)
    address, wide = found
    run = _launcher(wide)
    _native_team.use()
    stack = out.shape[:-2]
    count = math.prod(stack)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    trans_a, lda, row_step = _layout(a) or (0, 0, 0)
    trans_b, ldb, _ = _layout(b) or (0, 0, 0)
    ldc = out.strides[-2] // 4 if m > 1 else n
    steps = _steps(a, b, out)
    if steps is None:
        offsets = np.stack(
            [_offsets(a, stack), _offsets(b, stack), _offsets(out, stack)], axis=1
        ).reshape(-1)
        table, steps = np.ascontiguousarray(offsets, np.int64), (0, 0, 0)
    else:
        table = _NO_TABLE
    slots = [0, 0, 1, m, n, k, trans_a, trans_b, lda, ldb, max(ldc, n, 1)]
    slots += [a.ctypes.data, b.ctypes.data, out.ctypes.data]
    slots += [table.ctypes.data, address, row_step, *steps, int(table is not _NO_TABLE)]
    # blocks of columns where there are more than rows: each thread then
    # packs its own share of b (as blocks of rows, each would pack all of
    # it: a stem convolution's 64 x 147 x 896 chunks 2.0 -> 3.0 ms)
    columns = n > m
    slots += [int(columns), ldb if trans_b == _TRANS else 1]
    # (the addresses in the slots stay valid while the arrays live)
    held = (a, b, out, table) if hold else (table,)
    return _Product(run, np.array(slots, np.int64), held, count, m * n * k)


class _Product:
    """A bound stack of GEMMs: its slots, and what keeps their addresses
    valid."""

    __slots__ = (
        "_address",
        "_count",
        "_data",
        "_held",
        "_large",
        "_most_blocks",
        "_run",
        "_work",
    )

    def __init__(
        self,
        run: Callable[..., None],
        data: Array,
        held: tuple[Array, ...],
        count: int,
        work: int,
    ) -> None:
        self._run, self._data, self._held, self._count = run, data, held, count
        self._address = int(data.ctypes.data)
        self._work = count * work
        self._large = self._work >= MIN_TEAM_WORK
        extent = int(data[4] if data[21] else data[3])  # (columns or rows)
        self._most_blocks = max(1, extent // MIN_ROWS_PER_PART)

    def __call__(self) -> None:
        data, count = self._data, self._count
        threads, wanted, crowded = _native_team.share(self._large, self._work)
        row_parts = min(self._most_blocks, max(1, -(-wanted // count)))
        data[0], data[1], data[2] = 0, count * row_parts, row_parts
        self._run(self._address, threads, crowded)
