"""Native threads for compiled kernels: GNU OpenMP's team, entered through
ctypes.

A kernel split over the part pool (:mod:`asyncrt.runtime._part_pool`)
hands its parts to Python threads: each must take the GIL to start, and on
the 2-core VM a sleeping one wakes 30-60 us later, as long as a GEMM of a
served request. Here a compiled kernel is a numba ``cfunc`` taking one
pointer, ``work(data)``, and :func:`launcher` runs it on ``threads``
native threads at once (the caller is one of them) with the GIL released.
The threads take parts from a counter in ``data`` (an atomic add:
``claim_`` in :data:`asyncrt.ops._vector_ir.CLAIMS`) until none is left,
so a thread the machine does not run for a while leaves its parts to the
others.

The threads are the process's spinning team (:mod:`._spin_team`: helpers
started once, an empty launch about 0.8 us on 2 cores, and a helper that
comes late is not waited for), or, where another launch holds it or it is
not available here, a GNU OpenMP team (``GOMP_parallel``: 1.6-2.6 us, and
its closing barrier waits for every thread).

numba's own ``parallel=True`` runs on the same OpenMP runtime, but each
such function compiles its callees again (a GEMM's: 8 s cold, against 2.0
for the cfunc) and its layer may be ``workqueue``, which takes one
launching thread at a time. GNU OpenMP takes launches from any number of
threads at once (each a team of its own). It does not survive a fork: in
a process forked after this module first launched a team, and where
libgomp is not found, :func:`launcher`'s calls run ``work`` on the calling
thread alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from . import _part_pool, _threads
from . import _spin_team as _spin

__all__ = (
    "CROWDED_MIN_WORK",
    "CROWDED_PARTS_PER_THREAD",
    "alone",
    "launcher",
    "share",
    "teams_available",
    "use",
)

#: Parts a thread while other processes crowd the cores: a thread the
#: machine does not run holds up only the part it took.
CROWDED_PARTS_PER_THREAD = 4
#: Work (multiply-adds, or a loop's cells) below which a kernel runs on the
#: calling thread alone while other processes crowd the cores: a pool
#: thread wakes tens of microseconds late, when the caller has done most
#: of it, and the hand-off costs more than the help (MobileNetV3 beside a
#: busy neighbour: 2.6 -> 2.2 ms, its kernels 10-50 us each).
CROWDED_MIN_WORK = 4_000_000

_WORK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_lock = threading.Lock()
_parallel: Any = None  # GOMP_parallel, once looked up
_looked_up = False
#: The process that first launched a team (None: none has).
_launched_in: int | None = None


def _gomp_parallel() -> Any:
    """libgomp's ``GOMP_parallel(fn, data, num_threads, flags)``, or
    ``None`` where libgomp is not found."""
    global _parallel, _looked_up
    with _lock:
        if not _looked_up:
            _looked_up = True
            name = ctypes.util.find_library("gomp") or "libgomp.so.1"
            try:
                function: Any = ctypes.CDLL(name).GOMP_parallel
            except (OSError, AttributeError):
                function = None
            else:
                function.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_void_p,
                    ctypes.c_uint,
                    ctypes.c_uint,
                ]
                function.restype = None
            _parallel = function
        return _parallel


def teams_available() -> bool:
    """Whether :func:`launcher`'s calls may run on several threads here."""
    global _launched_in
    if _gomp_parallel() is None:
        return False
    pid = os.getpid()
    if _launched_in is None:
        _launched_in = pid
    return _launched_in == pid


def share(large: bool, work: float = float("inf")) -> tuple[int, int, bool]:
    """How the next call of a kernel shares its work under the thread
    limits: ``(threads, parts, crowded)``. A small product (not ``large``)
    runs on the calling thread; a large one on the kernel threads, a part
    each, or while other processes crowd the cores
    (:attr:`ThreadLimits.gemm_parts
    <asyncrt.runtime._threads.ThreadLimits.gemm_parts>`) on the part pool,
    :data:`CROWDED_PARTS_PER_THREAD` parts a thread (pass ``crowded`` on to
    :func:`launcher`'s call). A kernel takes fewer parts where its work
    has fewer. While crowded, ``work`` below :data:`CROWDED_MIN_WORK` runs
    on the calling thread."""
    if not large:
        return 1, 1, False
    limits = _threads.limits
    crowding = limits.gemm_parts
    if crowding > 1:
        if work < CROWDED_MIN_WORK:
            return 1, 1, False
        return crowding, CROWDED_PARTS_PER_THREAD * crowding, True
    return limits.threads, limits.threads, False


def use() -> None:
    """Say that a kernel bound now runs on the team: where teams run here,
    BLAS's own pool is held to one thread from now on
    (:meth:`ThreadLimits.put_blas_on_team
    <asyncrt.runtime._threads.ThreadLimits.put_blas_on_team>`)."""
    if not _threads.limits.blas_on_team and teams_available():
        _threads.limits.put_blas_on_team()


def alone(address: int) -> Callable[[int], None]:
    """``call(data)``: the compiled ``void work(void *data)`` at ``address``
    on the calling thread (a ``ctypes`` call, the GIL released)."""
    work: Callable[[int], None] = _WORK(address)
    return work


def _spin_team() -> _spin.SpinTeam | None:
    """The process's spinning team (:mod:`._spin_team`: a launch of
    about 0.8 us where OpenMP's takes 1.6-2.6), made on first use with a
    helper for every other core, or ``None`` (one core, no team here, or
    none on this platform)."""
    cores = _threads.available_cores()
    if cores < 2 or not teams_available():
        return None
    return _spin.team(cores - 1)


def launcher(address: int) -> Callable[..., None]:
    """``run(data, threads, crowded=False)``: the compiled ``void
    work(void *data)`` at ``address`` called on ``threads`` threads at
    once (the caller among them), or on the caller alone where teams are
    not available (see the module docstring) or ``threads`` <= 1; returns
    when every call has.

    ``crowded``: other processes keep the cores busy. A team's threads all
    join before the launch returns, so one the machine does not run holds
    it up (2 CPU-bound neighbours on 2 cores: a MiniLM encoder's run 2.7 ->
    96 ms). Then the calls go to the part pool
    (:mod:`asyncrt.runtime._part_pool`) instead, whose caller never waits
    for a thread that has not started: it takes the work itself.

    ``work`` must not raise (a cfunc's errors are not propagated) and must
    share the work through ``data`` (each thread calls it with the same
    pointer).
    """
    alone = _WORK(address)
    getpid = os.getpid
    spin = _spin_team()

    def run(data: int, threads: int, crowded: bool = False) -> None:
        if threads <= 1:
            alone(data)
        elif _launched_in == getpid() and not crowded:
            # (the common case without the lookup's lock); the spinning
            # team's launch returns 1 where another launch holds it
            if spin is None or spin.call(spin.address, address, data, threads):
                _parallel(address, data, threads, 0)
        elif crowded:
            _part_pool.run([functools.partial(alone, data)] * threads, threads)
        elif teams_available():
            _gomp_parallel()(address, data, threads, 0)
        else:
            alone(data)

    return run
