"""The pool that runs the parts of a split kernel at once.

A kernel split over the kernel threads (a compiled loop over blocks of
rows, a fused chain's blocks) hands its parts to :func:`run` and takes
part in the work itself. ``concurrent.futures``' pool made a future, a
condition and a queue round trip per part: a hand-off of empty parts cost
53 us on the 2-core VM and grew by 18 us a part on a 16-core machine (290
us for 16; numba's OpenMP pool takes 7). Here a call puts one token per
helper on a C queue (each wakes one waiting thread), every thread, the
caller too, takes the next part from a shared counter until none is
left, and whoever finishes the last part releases the caller: no object per
part, and the caller never waits for a thread that has not started (it
takes the parts itself; a token a helper reaches late finds nothing left).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ("run",)


class _Job:
    """One call's parts, taken one at a time by any thread."""

    __slots__ = ("_count", "_error", "_finished", "_lock", "_next", "_parts", "done")

    def __init__(self, parts: Sequence[Callable[[], Any]]) -> None:
        self._parts = parts
        self._count = len(parts)
        self._next = 0
        self._finished = 0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        #: Held until the last part has finished.
        self.done = threading.Lock()
        self.done.acquire()

    def work(self) -> None:
        """Run parts until none is left to take."""
        lock, parts, count = self._lock, self._parts, self._count
        while True:
            with lock:
                index = self._next
                self._next += 1
            if index >= count:
                return
            error = None
            try:
                parts[index]()
            except BaseException as raised:  # the caller raises it
                error = raised
            with lock:
                if self._error is None:
                    self._error = error
                self._finished += 1
                last = self._finished == count
            if last:
                self.done.release()

    def result(self) -> None:
        """Wait for every part to finish; raise the first part's error."""
        self.done.acquire()
        if self._error is not None:
            raise self._error


class _Pool:
    """Helper threads, started as calls need them, that take tokens (jobs)
    from one queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._helpers = 0
        self._pid = os.getpid()

    def run(
        self, parts: Sequence[Callable[[], Any]], threads: int | None = None
    ) -> None:
        helpers = len(parts) - 1 if threads is None else min(len(parts), threads) - 1
        if helpers < 1:
            for part in parts:
                part()
            return
        if self._helpers < helpers or self._pid != os.getpid():
            self._grow(helpers)
        job = _Job(parts)
        put = self._tokens.put
        for _ in range(helpers):
            put(job)
        job.work()
        job.result()

    def _grow(self, helpers: int) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child has no helpers
                self._tokens = queue.SimpleQueue()
                self._helpers, self._pid = 0, os.getpid()
            while self._helpers < helpers:
                self._helpers += 1
                thread = threading.Thread(
                    target=self._serve,
                    args=(self._tokens,),
                    name=f"kernel-parts-{self._helpers}",
                    daemon=True,  # idle in get(): nothing to finish at exit
                )
                thread.start()

    @staticmethod
    def _serve(tokens: queue.SimpleQueue[_Job]) -> None:
        while True:
            tokens.get().work()


_pool = _Pool()


def run(parts: Sequence[Callable[[], Any]], threads: int | None = None) -> None:
    """Run ``parts`` at once, on this thread and the pool's, and return when
    all have finished.

    :param threads: the threads that take the parts, this one among them
        (default: one a part); each takes the next part left until none is.
    :raises BaseException: the first exception a part raised (after every
        part has finished).
    """
    _pool.run(parts, threads)
