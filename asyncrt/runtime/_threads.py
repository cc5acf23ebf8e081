"""Kernel thread pools, coordinated with the cpu streams.

A cpu stream is one worker thread that runs kernels one after another. Some
kernels are multithreaded themselves: BLAS (numpy's ``matmul`` on OpenBLAS
or MKL), OpenMP runtimes, numexpr, and asyncrt's fused kernels (which split a
large tensor into blocks). ``S`` streams each running ``T``-threaded kernels
put ``S * T`` busy threads on the machine; past its ``C`` cores they only
take turns, and spinning BLAS threads make that much worse.

**Policy.** While an executor with ``S >= 1`` cpu compute streams is open,
every such pool gets ``T = max(1, C // S)`` threads, ``C`` being the cores
this process may run on (``os.sched_getaffinity``). With several executors
open, the smallest ``T`` asked for wins (the most parallel configuration
decides), so none of them oversubscribes. Limits are applied when an
executor is created (and, for ``"auto"``, when the runs in flight change:
below) and restored when the last one is closed: never per kernel call.
BLAS and OpenMP pools are set through threadpoolctl, numexpr's through
``numexpr.set_num_threads`` (if it is installed).

**Compiled kernels beside BLAS.** asyncrt's compiled kernels (fused
chains, depthwise and Winograd loops, norms, softmax) split their work
over :attr:`ThreadLimits.compiled_threads`. A native pool's helper
threads (BLAS, OpenMP) spin on the other cores for a while after each call
(OpenBLAS: about 0.1 s), so a part run on a pool thread beside one gets
about half a core: ``T`` equal parts finish in the time of ``2 / T`` of
the whole, no faster at ``T = 2``. So while an executor whose host
kernels call BLAS (:attr:`~asyncrt.runtime._compiled.CompiledGraph.host_blas`:
GEMMs, convolutions) holds a lease and a native pool is loaded, compiled
kernels split only over :data:`MIN_SPLIT_BESIDE_NATIVE` threads or more
(one with fewer); else over ``T``. A graph of elementwise work alone keeps
its split (W2's eight branches, fused, 1.6x faster on 2 cores). Measured
on 2 cores: two parts right after a GEMM took 1.37x the time of one;
MobileNetV3 (GEMMs between depthwise loops) ran 18% faster with its
compiled kernels unsplit, GPT-2 (GEMMs between fused epilogues) the same.
On 16 cores the split still pays (an encoder's softmax at batch 16: 2.9
-> 0.9 ms). Once BLAS is held to one thread and the products run on the
native team (below), the compiled kernels' shares run on that team too
(:mod:`asyncrt.ops._team_parts`), whose threads are the ones spinning.

**Runs in flight.** ``"auto"`` shares the cores among the runs in flight:
a run alone gets ``C // S`` threads per pool (one run's latency), and while
runs are in flight process-wide on ``B`` cpu streams in all (``S`` per run
of each executor) every ``"auto"`` executor's pools shrink to
``max(1, C // B)``, and grow back as runs end. So any number of concurrent
callers get at least one caller's throughput: on 2 cores, 4 contexts of a
MiniLM-size encoder with 2 BLAS threads each would put 8 threads on 2 cores
(OpenBLAS serializes concurrent multithreaded calls, and its threads spin
while they wait), and served half the requests per second that one caller
at a time got. The executor core counts its runs
(:meth:`ThreadLease.running`); a change costs one call per library into
its thread API, made only when the number changes. The pools shrink at
once but grow back only once runs have not overlapped for
:data:`GROW_BACK_SECONDS`: after a multithreaded call OpenBLAS's helper
threads spin for a while (about 0.1 s by default) before they sleep, so
growing back between the runs of a busy service (a batch that runs alone
for a moment) would wake them to spin beside the single-threaded runs (a
batcher's two concurrent batches of a MiniLM-size encoder ran 30% slower
so). numexpr's pool is not
resized per run (numexpr rebuilds its threads to resize): it keeps the
threads of one run alone.

**Busy neighbours.** A BLAS pool splits each call over its threads and
waits for every part: where other processes keep the cores busy, a part
whose thread is not running holds the call up while the helpers spin.
Beside two CPU-bound processes on the 2-core VM, MobileNetV3 took 252 ms
a run with two BLAS threads (one: 3.3 ms; ONNX Runtime: 6.6), ResNet-18
136 ms (one: 33). So ``"auto"`` pools take no more threads than the cores
other processes leave free, at least one
(:class:`~asyncrt.runtime._neighbours.BusyNeighbours`: the machine's CPU
time less this process's, measured over windows of a quarter second as
runs start and end); they grow back as the cores free up, after
:data:`GROW_BACK_SECONDS`. Meanwhile a large GEMM of a run alone splits
into row blocks over the part pool (:attr:`ThreadLimits.gemm_parts`),
whose threads take each other's blocks where BLAS's would wait: GPT-2
beside two such processes 60 -> 36-38 ms (ONNX Runtime 51-58).

**Products on the native team.** asyncrt's float32 products run on
GNU OpenMP's threads (:mod:`asyncrt.runtime._native_team`; the packed
kernels and one ``cblas_sgemm`` call a part), sized by ``threads``. Once
such a kernel is bound, BLAS's own pool is held to one thread while leases
are held (:meth:`ThreadLimits.put_blas_on_team`): two pools of spinning
threads on the same cores wait for each other's helpers. Compiled kernels
then split over ``threads`` again (the team's helpers spin only briefly:
ResNet-18 19.6 -> 18.7 ms on 2 cores, MobileNetV3 the same).

**Services.** ``kernel_threads="throughput"`` sizes the pools for
``R = max_contexts`` runs at once, whether they come or not:
``T = max(1, C // (S * R))`` (as ONNX Runtime servers set
``intra_op_num_threads=1`` and run sessions side by side); a run alone is
then slower than with ``"auto"``.

**Override.** ``graph_executor.create(..., kernel_threads=N)`` asks for ``N``
threads instead of the policy's; ``kernel_threads="keep"`` leaves every pool
as it is (for programs that manage threadpoolctl themselves, or that set
``OPENBLAS_NUM_THREADS`` lower than the policy would: ``"auto"`` sets the
pools to its number, up or down).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import threadpoolctl

from devices import get_api
from scheduler.plan import Copy, Launch, Plan

from . import _part_pool
from ._neighbours import BusyNeighbours

__all__ = (
    "GROW_BACK_SECONDS",
    "MIN_SPLIT_BESIDE_NATIVE",
    "ThreadLease",
    "ThreadLimits",
    "available_cores",
    "cpu_streams",
    "lease_for",
    "limits",
    "policy_threads",
    "run_parts",
    "running",
    "shares",
)


def available_cores() -> int:
    """How many cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def cpu_streams(plan: Plan) -> int:
    """The streams of ``plan`` whose kernels run on the host's cores (a host
    device's streams) and that run kernels (copies do not count)."""
    return sum(
        get_api(stream.device.kind).is_host
        and any(
            isinstance(step, Launch) and not isinstance(step, Copy)
            for step in stream.steps
        )
        for stream in plan.streams
    )


def policy_threads(streams: int, cores: int | None = None) -> int:
    """Threads per kernel pool for ``streams`` cpu streams: ``max(1, C // S)``.

    :param streams: cpu compute streams that run kernels at once (>= 1).
    :param cores: the cores to share; default :func:`available_cores`.
    :return: the threads each pool gets.
    :raises ValueError: if ``streams`` < 1.
    """
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    return max(1, (cores or available_cores()) // streams)


class ThreadLease:
    """One executor's claim on the kernel thread pools; see
    :meth:`ThreadLimits.acquire`.

    :ivar threads: the threads this lease asks for while no run is in flight.
    :ivar shared: whether it shares the cores with the runs in flight.
    """

    def __init__(
        self, owner: ThreadLimits, key: int, threads: int, shared: bool
    ) -> None:
        self._owner = owner
        self._key = key
        self.threads = threads
        self.shared = shared

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Count one run of this lease's executor as in flight while the
        block runs (thread-safe; the pools are resized if their share
        changes)."""
        return _Running(self._owner, self._key)

    def release(self) -> None:
        """Give the claim back (idempotent); the limits are recomputed."""
        self._owner._release(self._key)


class _Running:
    """A run in flight, counted while the block runs (a class, not a
    generator: it is entered twice per run, and a tiny model's run takes
    tens of microseconds)."""

    __slots__ = ("_key", "_owner")

    def __init__(self, owner: ThreadLimits, key: int) -> None:
        self._owner, self._key = owner, key

    def __enter__(self) -> None:
        self._owner._runs(self._key, 1)

    def __exit__(self, *exc: object) -> None:
        self._owner._runs(self._key, -1)


_NOT_COUNTED = contextlib.nullcontext()


def running(lease: ThreadLease | None) -> contextlib.AbstractContextManager[None]:
    """:meth:`ThreadLease.running` of ``lease``, or nothing without one."""
    return _NOT_COUNTED if lease is None else lease.running()


@dataclass
class _Claim:
    threads: int  # alone (no run in flight)
    streams: int  # cpu compute streams a run of its executor keeps busy
    shared: bool
    blas: bool = False  # its kernels call BLAS
    runs: int = 0


#: Compiled kernels split beside a native pool's spinning helpers only over
#: at least this many threads (see the module docstring).
MIN_SPLIT_BESIDE_NATIVE = 3

#: Seconds without overlapping runs before shared pools grow back.
GROW_BACK_SECONDS = 0.5


class ThreadLimits:
    """The process-wide thread limits of the kernel pools (see the module
    docstring); use the shared instance :data:`limits`.

    :param cores: the cores to share; default :func:`available_cores`.
    :param clock: the time, in seconds (tests pass their own).
    :param neighbours: the cores other processes keep busy (shared pools
        leave them alone); default measured from ``/proc/stat``.
    """

    def __init__(
        self,
        cores: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        neighbours: BusyNeighbours | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._cores = cores  # (None: the affinity's, read once when needed)
        self._clock = clock
        self._neighbours = BusyNeighbours() if neighbours is None else neighbours
        self._busy = 0  # cpu streams of the runs in flight
        # from the claims (_claims_changed)
        self._blas = False  # a claim's kernels call BLAS
        self._fewest = 0
        self._fewest_unshared: int | None = None
        self._fewest_shared: int | None = None
        self._shared_at = -float("inf")  # when runs last shared the pools
        self._claims: dict[int, _Claim] = {}
        self._next = 0
        self._pools = _Pools()
        self._applied: int | None = None
        self._numexpr_applied: int | None = None
        #: Threads per pool (1 when no lease).
        self.threads = 1
        #: Threads a compiled kernel may split its work over: ``threads``,
        #: or 1 where a BLAS or OpenMP pool of several threads shares the
        #: process (see the module docstring).
        self.compiled_threads = 1
        #: Parts a large GEMM splits into over the part pool, whose threads
        #: take each other's parts (1: none, BLAS's own threads split it):
        #: while other processes crowd the pools down to one thread, the
        #: threads the run would have had.
        self.gemm_parts = 1
        self._crowded_out = 1
        #: Whether products run on the native team (asyncrt.ops'
        #: ``_panel_gemm``, ``_panel_conv``, ``_team_blas``): BLAS's own pool
        #: is then held to one thread while leases are held, ``threads``
        #: sizing the team (see :meth:`put_blas_on_team`).
        self.blas_on_team = False

    def acquire(
        self,
        threads: int,
        *,
        streams: int = 1,
        shared: bool = False,
        blas: bool = False,
    ) -> ThreadLease:
        """Claim ``threads`` threads per pool until the lease is released.

        :param threads: the threads asked for while no run is in flight
            (>= 1).
        :param streams: the cpu compute streams one run keeps busy (>= 0).
        :param shared: give threads up while runs are in flight: at most
            ``max(1, cores // B)``, ``B`` the streams of every run in flight.
        :param blas: whether the claimant's kernels call BLAS (whose helper
            threads then spin beside compiled kernels' parts).
        :return: the lease.
        :raises ValueError: if ``threads`` < 1 or ``streams`` < 0.
        """
        if threads < 1:
            raise ValueError(f"kernel threads must be >= 1, got {threads}")
        if streams < 0:
            raise ValueError(f"streams must be >= 0, got {streams}")
        # Looking for the libraries takes about a millisecond: not under the
        # lock that runs starting on the event loop take.
        libraries = threadpoolctl.ThreadpoolController().lib_controllers
        with self._lock:
            key = self._next
            self._next += 1
            self._claims[key] = _Claim(threads, streams, shared, blas)
            self._claims_changed()
            self._neighbours.update()  # (a window starts, if none is open)
            if self._pools.add(libraries):  # loaded since: limit them too
                self._applied = None
            self._apply(numexpr=True)
        return ThreadLease(self, key, threads, shared)

    def put_blas_on_team(self) -> None:
        """From now on, in this process, hold BLAS's own pool to one thread
        while leases are held: products run on the native team
        (:mod:`asyncrt.runtime._native_team`), whose kernels call BLAS one
        thread a part. Two pools of spinning threads on the same cores
        wait for each other's helpers: MobileNetV3 took 8 ms a run instead
        of 2.2 with its classifier on OpenBLAS's two threads and its
        convolutions on the team."""
        with self._lock:
            if self.blas_on_team:
                return
            self.blas_on_team = True
            if self._applied is not None:
                self._pools.limit(1)
                self.compiled_threads = self.threads

    def _release(self, key: int) -> None:
        with self._lock:
            claim = self._claims.pop(key, None)
            if claim is not None:
                self._busy -= claim.streams * claim.runs
                self._claims_changed()
                self._apply(numexpr=True)

    def _runs(self, key: int, change: int) -> None:
        with self._lock:
            claim = self._claims.get(key)
            if claim is not None:  # else released while the run was in flight
                claim.runs += change
                self._busy += claim.streams * change
                self._apply(numexpr=False)

    def _claims_changed(self) -> None:
        """Derive what every run's :meth:`_apply` reads from the claims (a
        run starts and ends in a few microseconds: no loops there)."""
        claims = self._claims.values()
        self._blas = any(claim.blas for claim in claims)
        self._fewest = min((c.threads for c in claims), default=0)
        self._fewest_unshared = min(
            (c.threads for c in claims if not c.shared), default=None
        )
        self._fewest_shared = min((c.threads for c in claims if c.shared), default=None)

    def wanted(self) -> int | None:
        """The threads per pool the claims ask for now, or ``None`` for none
        (the pools may stay smaller for :data:`GROW_BACK_SECONDS`)."""
        if not self._claims:
            return None
        busy = self._busy
        if busy and self._cores is None:
            self._cores = available_cores()
        wanted = self._fewest_shared
        self._crowded_out = 1
        if wanted is not None and busy:
            cores = self._cores or 1
            spare = min(wanted, max(1, cores // busy))
            # no more than the cores other processes leave free
            free = max(1, int(cores - self._neighbours.update() + 0.5))
            wanted = min(spare, free)
            if free < spare:
                self._crowded_out = spare
        unshared = self._fewest_unshared
        if wanted is None or (unshared is not None and unshared < wanted):
            wanted = unshared
        return wanted

    def _split_gemms(self) -> None:
        # crowded down to one BLAS thread by other processes: large GEMMs
        # split over the part pool instead (its threads steal parts)
        crowded = self._crowded_out > 1 and self.threads == 1
        self.gemm_parts = self._crowded_out if crowded else 1

    def _apply(self, *, numexpr: bool) -> None:
        # Runs call this as they start and end (numexpr=False): the clock
        # is read only where the runs share the pools or they may grow back,
        # and nothing else is done where the size stays (a tiny model's run
        # takes tens of microseconds).
        wanted = self.wanted()
        if wanted is not None and self._applied is not None:
            sharing, growing = wanted < self._fewest, wanted > self._applied
            if sharing or growing:
                now = self._clock()
                if growing and now - self._shared_at < GROW_BACK_SECONDS:
                    wanted = self._applied  # runs overlapped just now: stay shared
                if sharing:
                    self._shared_at = now
        if wanted == self._applied and not numexpr:
            self._split_gemms()
            return
        if wanted != self._applied:
            if wanted is None:
                self._pools.restore()
            else:
                self._pools.limit(1 if self.blas_on_team else wanted)
            self.threads = 1 if wanted is None else wanted
            self._applied = wanted
        # Helpers of a native pool spin on the cores after each call of an
        # executor's BLAS kernels: compiled parts beside them get half a
        # core (module docstring). Not once BLAS is held to one thread: the
        # team's helpers spin briefly, and two parts then paid (ResNet-18
        # 19.6 -> 18.7 ms; GPT-2, MiniLM and MobileNetV3 within the noise)
        native = self._blas and self._pools.native() and not self.blas_on_team
        alone = self.threads < MIN_SPLIT_BESIDE_NATIVE
        self.compiled_threads = 1 if native and alone else self.threads
        self._split_gemms()
        if numexpr:  # sized for one run alone: see the module docstring
            single = min((c.threads for c in self._claims.values()), default=None)
            if single != self._numexpr_applied:
                self._pools.limit_numexpr(single)
                self._numexpr_applied = single


class _Pools:
    """The native thread pools (threadpoolctl's libraries and numexpr), each
    set straight through its library's call, and their sizes from before
    the first limit (restored when the last lease goes)."""

    def __init__(self) -> None:
        self._libraries: dict[str, Any] = {}  # path -> threadpoolctl controller
        self._original: dict[str, int] = {}
        self._numexpr_original: int | None = None

    def add(self, libraries: Sequence[Any]) -> bool:
        """Take threadpoolctl's controllers of the libraries loaded now.

        :return: whether there are new ones.
        """
        found = False
        for library in libraries:
            if library.filepath not in self._libraries:
                self._libraries[library.filepath] = library
                self._original[library.filepath] = library.num_threads
                found = True
        return found

    def native(self) -> bool:
        """Whether a native pool (BLAS, OpenMP) is under these limits."""
        return bool(self._libraries)

    def limit(self, threads: int) -> None:
        for library in self._libraries.values():
            _set_library_threads(library, threads)

    def restore(self) -> None:
        for path, library in self._libraries.items():
            _set_library_threads(library, self._original[path])
        self._libraries.clear()
        self._original.clear()

    def limit_numexpr(self, threads: int | None) -> None:
        if threads is None:
            if self._numexpr_original is not None:
                _set_numexpr_threads(self._numexpr_original)
                self._numexpr_original = None
            return
        before = _set_numexpr_threads(threads)
        if self._numexpr_original is None:
            self._numexpr_original = before


#: threadpoolctl 3.8 lets one Python thread at a time set a pthreads
#: OpenBLAS's pool, and ignores the others; the limits here change from any
#: thread (serialized by their lock), so each change takes control and
#: gives it back.
_CONTROLLING_THREAD = tuple(
    int(part) for part in threadpoolctl.__version__.split(".")[:2]
) >= (3, 8)


def _set_library_threads(library: Any, threads: int) -> None:
    if _CONTROLLING_THREAD and isinstance(library, threadpoolctl.OpenBLASController):
        threadpoolctl.OpenBLASController.clear_controlling_thread(force=True)
        try:
            library.set_num_threads(threads)
        finally:
            threadpoolctl.OpenBLASController.clear_controlling_thread()
    else:
        library.set_num_threads(threads)


@functools.cache
def _has_numexpr() -> bool:
    return importlib.util.find_spec("numexpr") is not None


def _set_numexpr_threads(threads: int) -> int | None:
    """Set numexpr's pool (if numexpr is installed).

    :return: its old size, or ``None`` without numexpr.
    """
    if not _has_numexpr():
        return None
    import numexpr

    return int(numexpr.set_num_threads(threads))


#: The process-wide limits.
limits = ThreadLimits()


def shares(extent: int, affordable: int) -> list[tuple[int, int]]:
    """``range(extent)`` cut into contiguous ``(first, last)`` shares, one
    per kernel thread the work pays for: at most :data:`limits`'
    ``compiled_threads``,
    ``extent`` and ``affordable`` (how many parts the work is worth), and
    always at least one (``(0, 0)`` for nothing)."""
    threads = max(1, min(limits.compiled_threads, extent, affordable))
    share = max(1, -(-extent // threads))
    return [(i, min(i + share, extent)) for i in range(0, extent, share)] or [(0, 0)]


def run_parts(parts: Sequence[Callable[[], Any]], threads: int | None = None) -> None:
    """Run ``parts`` at once: on this thread and the kernel threads' pool
    (:mod:`asyncrt.runtime._part_pool`), and wait for all of them.

    :param threads: how many threads take the parts, this one among them
        (default: one a part).
    :raises Exception: the first exception a part raised.
    """
    _part_pool.run(parts, threads)


def threads_for(
    cpu_streams: int, kernel_threads: int | str, concurrent_runs: int
) -> int | str:
    """The threads per kernel pool for an executor's configuration (see
    :func:`lease_for`), or ``"keep"`` for none to set. A process-backed
    executor's workers each get this number.

    :raises ValueError: for any other ``kernel_threads``.
    """
    if kernel_threads == "keep" or (
        kernel_threads in ("auto", "throughput") and cpu_streams < 1
    ):
        return "keep"
    if kernel_threads in ("auto", "throughput"):
        runs = max(1, concurrent_runs) if kernel_threads == "throughput" else 1
        return policy_threads(cpu_streams * runs)
    if isinstance(kernel_threads, int) and not isinstance(kernel_threads, bool):
        return kernel_threads
    raise ValueError(
        'kernel_threads must be "auto", "throughput", "keep" or an int >= 1, '
        f"got {kernel_threads!r}"
    )


def lease_for(
    cpu_streams: int,
    kernel_threads: int | str,
    concurrent_runs: int = 1,
    *,
    blas: bool = False,
) -> ThreadLease | None:
    """The lease an executor takes for its configuration.

    :param cpu_streams: the cpu compute streams of its plan.
    :param kernel_threads: ``"auto"`` (``max(1, C // S)`` for a run alone,
        shared among the runs in flight) or ``"throughput"``
        (``max(1, C // (S * R))``), neither of which takes a lease without
        cpu streams; ``"keep"`` (no lease: pools untouched); or a number of
        threads.
    :param concurrent_runs: ``R``, the runs that may be in flight at once.
    :param blas: whether its plan's host kernels call BLAS.
    :return: the lease, or ``None``.
    :raises ValueError: for any other ``kernel_threads``.
    """
    threads = threads_for(cpu_streams, kernel_threads, concurrent_runs)
    if not isinstance(threads, int):
        return None
    return limits.acquire(
        threads, streams=cpu_streams, shared=kernel_threads == "auto", blas=blas
    )
