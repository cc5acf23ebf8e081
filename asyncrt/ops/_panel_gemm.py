"""GEMMs of a constant matrix packed into column panels, in explicit LLVM
vectors (float32), on numba's native thread pool.

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

**Threads.** The panels are split over :attr:`ThreadLimits.threads
<asyncrt.runtime._threads.ThreadLimits.threads>` parts (the threads BLAS
would have had) by a ``prange`` on numba's threading layer, whose threads
run without the GIL: a hand-off costs microseconds where the part pool's
(:mod:`asyncrt.runtime._part_pool`) costs 45-70 us, as long as such a
GEMM. Only layers that are safe to enter from several threads at once
(OpenMP, TBB) are used: under numba's ``workqueue`` layer, and in a
process forked after the pool started (GNU OpenMP does not survive a
fork), the kernel runs on the calling thread alone.

**Accuracy.** Each output is one fused multiply-add chain over ``k`` in
order: it differs from BLAS's sums (blocked, in another order) by float32
rounding, about 1e-6 of the output's magnitude. Non-finite values
propagate as in any sum of products (the panels' zero padding is never
stored).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..runtime import _threads
from . import _jit, _packed
from ._common import Array
from ._vector_ir import compile_vectors

__all__ = ("MAX_DEPTH", "PANEL", "ROWS", "bind", "pack", "takes")

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

_SOURCE = """
import functools

ROWS, VECTORS = {rows}, {vectors}
LANES = {lanes}
PANEL = VECTORS * LANES


def _store_lanes(b, e, totals, out_, start, count):
    # the first count lanes of the vectors totals, in turn, from flat start
    i32 = ir.IntType(32)
    for v, total in enumerate(totals):
        for lane in range(LANES):
            column = e.const(v * LANES + lane)
            with b.if_then(b.icmp_signed("<", column, count)):
                value = b.extract_element(total, ir.Constant(i32, lane))
                b.store(value, b.gep(out_.data, [b.add(start, column)]))


def _block(rows):
    # an intrinsic block_(a, panels, out, m0, p): out[m0 : m0 + rows,
    # PANEL p : PANEL (p + 1)] = a[m0 : m0 + rows] @ panels[p], the columns
    # past out's width not stored
    def block_(typingctx, a, panels, out, m0, p):
        if not (
            _is_float_array(a, 2) and _is_float_array(panels, 3)
            and _is_float_array(out, 2)
        ):
            return None
        sig = types.void(a, panels, out, types.intp, types.intp)
        return sig, functools.partial(_emit_block, rows)

    return intrinsic(block_)


def _emit_block(rows, context, builder, signature, args):
    b = builder
    e = _Emit(context, builder, LANES)
    a_, panels_, out_ = e.arrays(signature, args, 3)
    m0, p = args[3:]
    depth = cgutils.unpack_tuple(b, a_.shape, 2)[1]
    width = cgutils.unpack_tuple(b, out_.shape, 2)[1]
    i32 = ir.IntType(32)
    fma = cgutils.get_or_insert_function(
        b.module,
        ir.FunctionType(e.vector, [e.vector] * 3),
        f"llvm.fma.v{LANES}f32",
    )
    # accumulators in stack slots: LLVM keeps them in registers
    sums = [
        [cgutils.alloca_once_value(b, e.splat(0.0)) for _ in range(VECTORS)]
        for _ in range(rows)
    ]
    starts = [b.mul(b.add(m0, e.const(r)), depth) for r in range(rows)]
    panel = e.index((p, depth, e.const(PANEL)))
    splat = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)
    empty = ir.Constant(e.vector, ir.Undefined)
    with cgutils.for_range(b, depth) as loop:
        k = loop.index
        at = b.add(panel, b.mul(k, e.const(PANEL)))
        column = [
            e.load(panels_, b.add(at, e.const(v * LANES))) for v in range(VECTORS)
        ]
        for r in range(rows):
            x = b.load(b.gep(a_.data, [b.add(starts[r], k)]))
            x = b.insert_element(empty, x, ir.Constant(i32, 0))
            x = b.shuffle_vector(x, x, splat)
            for v in range(VECTORS):
                slot = sums[r][v]
                b.store(b.call(fma, [x, column[v], b.load(slot)]), slot)
    col0 = b.mul(p, e.const(PANEL))
    whole = b.icmp_signed("<=", b.add(col0, e.const(PANEL)), width)
    for r in range(rows):
        start = b.add(e.index((b.add(m0, e.const(r)), width)), col0)
        totals = [b.load(sums[r][v]) for v in range(VECTORS)]
        with b.if_else(whole, likely=True) as (full, cut):
            with full:
                for v, total in enumerate(totals):
                    e.store(total, out_, b.add(start, e.const(v * LANES)))
            with cut:  # the last panel of a width not a multiple of PANEL
                _store_lanes(b, e, totals, out_, start, b.sub(width, col0))
    return None


# ROWS rows a block, and the rows left by halves
block_rows_, block_4_, block_2_, block_1_ = (_block(r) for r in (ROWS, 4, 2, 1))


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def gemm(a, panels, out, first, last, top, bottom):
    # out[top:bottom, PANEL first : PANEL last] of a @ B, B packed into
    # panels: a panel stays in cache over the rows
    for p in range(first, last):
        m0 = top
        while m0 + ROWS <= bottom:
            block_rows_(a, panels, out, m0, p)
            m0 += ROWS
        if ROWS > 4 and m0 + 4 <= bottom:
            block_4_(a, panels, out, m0, p)
            m0 += 4
        if m0 + 2 <= bottom:
            block_2_(a, panels, out, m0, p)
            m0 += 2
        if m0 < bottom:
            block_1_(a, panels, out, m0, p)


@numba.njit(
    cache=True, nogil=True, error_model="numpy", boundscheck=False, parallel=True
)
def gemm_parts(a, panels, out, parts):
    # gemm over parts contiguous runs of panels (of row blocks where there
    # are fewer panels than parts), one a thread of numba's pool (as many
    # threads as numba.set_num_threads set on this thread)
    count, m = panels.shape[0], a.shape[0]
    blocks = (m + ROWS - 1) // ROWS
    for i in numba.prange(parts):
        if count >= parts:
            gemm(a, panels, out, count * i // parts, count * (i + 1) // parts, 0, m)
        else:
            top = ROWS * (blocks * i // parts)
            bottom = min(m, ROWS * (blocks * (i + 1) // parts))
            gemm(a, panels, out, 0, count, top, bottom)
"""


@functools.cache
def _kernels() -> tuple[Callable[..., None], Callable[..., None]]:
    """``gemm(a, panels, out, first, last)`` and ``gemm_parts(a, panels,
    out, parts)``, compiled (or loaded from numba's disk cache)."""
    values = {"rows": ROWS, "vectors": PANEL // _LANES, "lanes": _LANES}
    return (
        compile_vectors("asyncrt_panel_gemm", _SOURCE, "gemm", **values),
        compile_vectors("asyncrt_panel_gemm", _SOURCE, "gemm_parts", **values),
    )


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


def bind(a: Array, b: Array, out: Array, crowded_blocks: int = 1) -> Callable[[], None]:
    """``out = a @ b`` (:func:`takes` holds; ``b``'s values fixed for the
    binding's life: packed now) as a call without arguments.

    :param crowded_blocks: runs of panels a thread to split into over the
        part pool while other processes crowd the kernel threads down to
        one (:attr:`~asyncrt.runtime._threads.ThreadLimits.gemm_parts`:
        its threads take each other's runs, where a ``prange``'s static
        shares wait for a thread the machine is not running); 1: never.
    """
    gemm, gemm_parts = _kernels()
    panels = _packed.shared("panel_gemm", b, pack)
    rows, cols = a.reshape(-1, a.shape[-1]), out.reshape(-1, out.shape[-1])
    m, count = rows.shape[0], panels.shape[0]
    limits = _threads.limits
    split = m * rows.shape[1] * b.shape[1] >= MIN_PARALLEL_WORK
    most = min(max(count, -(-m // ROWS)), _pool_threads()) if split else 1
    set_threads = _set_threads()
    if most > 1:
        _parallel_ok()  # numba's pool started now, not on the first run
    whole = functools.partial(gemm, rows, panels, cols, 0, count, 0, m)
    runs = min(count, crowded_blocks)

    def crowded(parts: int) -> None:
        edges = [count * i // (parts * runs) for i in range(parts * runs + 1)]
        _threads.run_parts(
            [
                functools.partial(gemm, rows, panels, cols, first, last, 0, m)
                for first, last in itertools.pairwise(edges)
                if last > first
            ],
            parts,
        )

    def product() -> None:
        if m == 0:
            return
        crowding = limits.gemm_parts
        if crowding > 1 and runs > 1:
            crowded(crowding)
            return
        parts = min(limits.threads, most)
        if parts > 1 and _parallel_ok():
            set_threads(parts)  # (this thread's team; numba's call)
            gemm_parts(rows, panels, cols, parts)
        else:
            whole()

    return product


def _numba() -> Any:
    return importlib.import_module("numba")


def _pool_threads() -> int:
    """The threads of numba's pool (``NUMBA_NUM_THREADS``: the cores)."""
    return int(_numba().config.NUMBA_NUM_THREADS)


def _set_threads() -> Callable[[int], None]:
    """numba's ``set_num_threads``: the team of this thread's launches."""
    set_threads: Callable[[int], None] = _numba().set_num_threads
    return set_threads


_first_lock = threading.Lock()
#: The process that started numba's pool, and whether its layer takes
#: launches from several threads at once.
_started: tuple[int, bool] | None = None


def _parallel_ok() -> bool:
    """Whether :func:`bind`'s calls may launch on numba's pool: the first
    launch (on one thread, under a lock) starts it; a layer that is not
    thread-safe, or a process forked after it started, keeps every call on
    its own thread."""
    global _started
    started = _started
    if started is None:
        with _first_lock:
            if _started is None:
                _started = (os.getpid(), _start_pool())
            started = _started
    return started[1] and started[0] == os.getpid()


def _start_pool() -> bool:
    numba = _numba()
    _, gemm_parts = _kernels()
    one = np.zeros((1, 1), _FLOAT32)
    parts = min(2, _pool_threads())
    numba.set_num_threads(parts)
    gemm_parts(
        one, np.zeros((2, 1, PANEL), _FLOAT32), np.zeros((1, 1), _FLOAT32), parts
    )
    return numba.threading_layer() in ("omp", "tbb")
