"""A watchdog for tests of async code: is the event loop ever held?

:class:`LoopWatch` watches a section of a test in two ways:

* **Where heavy work runs** (deterministic): it records the thread of every
  call to the operations that must never run on the event loop's thread —
  building a run context (allocation, streams, kernel binding), compiling a
  graph (planning), specializing a symbolic graph, a device allocation, and
  the blocking waits (``Completion.wait``, ``Stream.synchronize``) — and
  fails if one ran on the loop's thread.
* **How long the loop is held** (a backstop): a ticker coroutine sleeps a
  millisecond at a time and records the longest gap between its wake-ups;
  the watch fails if a gap exceeds ``max_gap`` seconds. Shared CI machines
  are noisy, so this bound is generous (a blocked loop is held for the whole
  of a build or a remote round trip, far longer); the first check is the
  precise one.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from asyncrt.runtime import _compiled, _context
from devices import _event, _stream
from devices._api import DeviceAPI

#: (owner, attribute) of every operation that must run off the loop.
WATCHED: tuple[tuple[Any, str], ...] = (
    (_context.RunContext, "__init__"),
    (_compiled, "compile_graph"),
    (DeviceAPI, "alloc"),
    (_event.Completion, "wait"),
    (_stream.Stream, "synchronize"),
)


class LoopWatch:
    """Records what ran on the loop's thread and the loop's longest stall."""

    def __init__(self, max_gap: float) -> None:
        self.max_gap = max_gap
        self.loop_thread = threading.get_ident()
        self.on_loop: list[str] = []
        self.longest = 0.0

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.loop_thread:
                self.on_loop.append(name)
            return function(*args, **kwargs)

        return watched

    async def tick(self) -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def check(self) -> None:
        assert not self.on_loop, f"ran on the event loop's thread: {self.on_loop}"
        assert self.longest <= self.max_gap, (
            f"the event loop was held for {self.longest * 1e3:.0f} ms"
        )


@asynccontextmanager
async def loop_watch(
    monkeypatch: pytest.MonkeyPatch, max_gap: float = 0.5
) -> AsyncIterator[LoopWatch]:
    """Watch the section inside ``async with``; fail if the loop was held."""
    watch = LoopWatch(max_gap)
    for owner, name in WATCHED:
        original = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, watch.wrap(f"{owner.__name__}.{name}", original)
        )
    # The executor imports compile_graph by name: watch those references too.
    from asyncrt.runtime import _core

    monkeypatch.setattr(
        _core, "compile_graph", watch.wrap("compile_graph", _core.compile_graph)
    )
    # The interpreter's own pauses are not the runtime's: late in the whole
    # suite a full garbage collection walks every object the earlier tests
    # left alive (a 679 ms gap once, on a cold CI run). Collect now and
    # freeze what survives, so collections inside the watch scan only the
    # objects it makes.
    gc.collect()
    gc.freeze()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.tick)
            try:
                yield watch
            finally:
                tg.cancel_scope.cancel()
    finally:
        gc.unfreeze()
    watch.check()
