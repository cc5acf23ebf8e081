"""The plan cache: one built executor per shape signature, bounded, built once.

An executor of a symbolic graph serves every shape the model accepts by
building, per *signature* (the concrete input shapes and the values of the
shape-valued inputs), a static executor core: specialization, planning,
kernel resolution. :class:`PlanCache` keeps those builds:

* **Bounded.** At most ``max_plans`` entries, least recently used evicted
  first; an evicted entry is handed to ``evict`` (which lets its runs in
  flight finish). Ten thousand signatures in a row hold at most
  ``max_plans`` builds.
* **Single flight.** The first request of a new signature starts its build;
  requests that bring the same signature meanwhile wait for that one build,
  not for builds of their own.
* **Off the event loop.** A build runs on a thread of its own; the requests
  await its completion without blocking the loop or polling
  (:func:`devices._event.wait_completion`). A request cancelled while it
  waits leaves the build running: its result is cached for the next one.
* **No half-built entries.** A build that raises is not cached; every
  request waiting for it gets its error, and the next request of that
  signature tries again.
* **Visible.** :attr:`PlanCache.stats` counts hits, misses, requests that
  joined a build in flight, builds, failures and evictions, and the build
  times.

The cache is driven from one event loop; :meth:`PlanCache.get_sync` serves
callers without one (it builds on the calling thread).
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from devices._event import Completion, wait_completion

from ..errors import ClosedResourceError

__all__ = ("CacheStats", "PlanCache")

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class CacheStats:
    """What a plan cache has done so far.

    :ivar size: signatures cached now.
    :ivar max_plans: the bound on ``size``.
    :ivar hits: requests served by a cached build.
    :ivar misses: requests that started a build.
    :ivar joined: requests that waited for a build another request started.
    :ivar builds: builds that succeeded.
    :ivar failures: builds that raised (nothing cached).
    :ivar evictions: builds dropped to keep the bound.
    :ivar build_seconds: the total time spent building (successful builds).
    :ivar last_build_seconds: the latest successful build's time, or 0.
    """

    size: int
    max_plans: int
    hits: int
    misses: int
    joined: int
    builds: int
    failures: int
    evictions: int
    build_seconds: float
    last_build_seconds: float

    def summary(self) -> str:
        """The figures as two lines of text."""
        mean = self.build_seconds / self.builds if self.builds else 0.0
        return (
            f"plans {self.size} cached of at most {self.max_plans}, "
            f"{self.evictions} evicted\n"
            f"requests {self.hits} hits, {self.misses} misses, {self.joined} joined "
            f"a build in flight; builds {self.builds} ({1e3 * mean:.1f} ms each on "
            f"average, last {1e3 * self.last_build_seconds:.1f} ms), "
            f"{self.failures} failed"
        )

    def __str__(self) -> str:
        return self.summary()


class _Build(Generic[T]):
    """One build in flight (or finished, not yet collected)."""

    __slots__ = ("completion", "error", "seconds", "value")

    def __init__(self) -> None:
        self.completion = Completion()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0


class PlanCache(Generic[T, P]):
    """Builds by signature; see the module docstring.

    :param build: makes the entry of a signature from the request that
        brought it first (runs off the loop).
    :param max_plans: the most entries kept (>= 1).
    :param evict: called with each entry dropped (eviction or close).
    """

    def __init__(
        self,
        build: Callable[[Hashable, P], T],
        max_plans: int,
        evict: Callable[[T], None],
    ) -> None:
        self._build = build
        self._max = max_plans
        self._evict = evict
        self._ready: collections.OrderedDict[Hashable, T] = collections.OrderedDict()
        self._building: dict[Hashable, _Build[T]] = {}
        self._closed = False
        self._hits = self._misses = self._joined = 0
        self._builds = self._failures = self._evictions = 0
        self._seconds = self._last = 0.0

    @property
    def stats(self) -> CacheStats:
        """The counts and times so far."""
        return CacheStats(
            size=len(self._ready),
            max_plans=self._max,
            hits=self._hits,
            misses=self._misses,
            joined=self._joined,
            builds=self._builds,
            failures=self._failures,
            evictions=self._evictions,
            build_seconds=self._seconds,
            last_build_seconds=self._last,
        )

    def entries(self) -> list[T]:
        """The cached entries, least recently used first."""
        return list(self._ready.values())

    def peek(self) -> T | None:
        """The most recently used entry, if any (not counted as a use)."""
        return next(reversed(self._ready.values()), None)

    async def get(self, key: Hashable, request: P) -> T:
        """The entry of ``key``, built off the loop on first sight (from
        ``request``).

        :raises ClosedResourceError: if the cache is or gets closed.
        :raises Exception: whatever the build raised.
        """
        found = self._hit(key)
        if found is not None:
            return found
        build, first = self._claim(key)
        if first:
            thread = threading.Thread(
                target=self._run, args=(key, request, build), name="asyncrt-plan-build"
            )
            thread.daemon = True  # a build never holds the interpreter open
            thread.start()
        await wait_completion(build.completion)
        return self._collect(key, build)

    def get_sync(self, key: Hashable, request: P) -> T:
        """:meth:`get` for a caller without an event loop: builds on the
        calling thread (or waits, blocking, for a build in flight)."""
        found = self._hit(key)
        if found is not None:
            return found
        build, first = self._claim(key)
        if first:
            self._run(key, request, build)
        else:
            build.completion.wait()
        return self._collect(key, build)

    def close(self) -> None:
        """Drop every entry (``evict`` each); builds in flight are dropped
        when they finish. Idempotent."""
        self._closed = True
        while self._ready:
            _, entry = self._ready.popitem(last=False)
            self._evict(entry)
        for build in list(self._building.values()):
            build.completion.add_callback(functools.partial(self._drop_done, build))

    def _hit(self, key: Hashable) -> T | None:
        if self._closed:
            raise ClosedResourceError("this executor is closed")
        found = self._ready.get(key)
        if found is not None:
            self._ready.move_to_end(key)
            self._hits += 1
        return found

    def _claim(self, key: Hashable) -> tuple[_Build[T], bool]:
        """The build of ``key`` in flight, or a new one; and whether it is new
        (the caller then runs it)."""
        build = self._building.get(key)
        if build is not None:
            self._joined += 1
            return build, False
        self._misses += 1
        build = self._building[key] = _Build()
        return build, True

    def _run(self, key: Hashable, request: P, build: _Build[T]) -> None:
        start = time.perf_counter()
        try:
            build.value = self._build(key, request)
        except BaseException as exc:  # handed to every waiter
            build.error = exc
        build.seconds = time.perf_counter() - start
        build.completion.set(None)

    def _collect(self, key: Hashable, build: _Build[T]) -> T:
        """Move a finished build into the cache (exactly once: the first
        waiter to wake does it) and return its entry or raise its error."""
        if self._building.get(key) is build:
            del self._building[key]
            if build.error is not None:
                self._failures += 1
            elif self._closed:
                self._drop_late(build)
            else:
                self._builds += 1
                self._seconds += build.seconds
                self._last = build.seconds
                assert build.value is not None
                self._ready[key] = build.value
                while len(self._ready) > self._max:
                    _, old = self._ready.popitem(last=False)
                    self._evictions += 1
                    self._evict(old)
        if build.error is not None:
            raise build.error
        if self._closed:
            raise ClosedResourceError("this executor was closed while it built a plan")
        assert build.value is not None
        return build.value

    def _drop_done(self, build: _Build[T], _: Completion) -> None:
        self._drop_late(build)

    def _drop_late(self, build: _Build[T]) -> None:
        if build.value is not None:
            value, build.value = build.value, None
            self._evict(value)
