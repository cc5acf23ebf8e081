"""Events: points in a stream's work that other streams and the host wait on.

An :class:`Event` follows CUDA's (and CuPy's) meaning: ``stream.record(ev)``
marks the point in ``stream``'s queue reached so far; the event completes when
the stream gets there. Another stream orders itself after that point with
``other.wait_event(ev)`` (TVM's SyncStreamFromTo), the host blocks on it with
:meth:`Event.synchronize`, and a coroutine awaits it with :meth:`Event.wait`,
which parks the task until a worker thread wakes the event loop: no polling,
no blocked loop.

Every record makes a fresh :class:`Completion`; a wait captures the completion
current at the time of the wait, so re-recording an event never confuses an
earlier waiter (as in CUDA).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import sniffio

from .errors import StreamError

__all__ = ("Completion", "Event", "call_soon_threadsafe_factory")

_Callback = Callable[["Completion"], None]


class Completion:
    """One recorded point in a stream's work: done once, maybe with an error.

    Thread-safe. Callbacks run on the thread that completes it (or at once, on
    the caller's thread, if it already completed).
    """

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_time")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._callbacks: list[_Callback] = []
        self._time = 0.0

    @property
    def done(self) -> bool:
        """Whether the stream has reached this point."""
        return self._done.is_set()

    @property
    def error(self) -> BaseException | None:
        """The failure carried by this point, if any (valid once done)."""
        return self._error

    @property
    def time(self) -> float:
        """When the stream reached this point, host ``perf_counter`` seconds
        (by the device's clock where it models one; valid once done)."""
        return self._time

    def set(self, error: BaseException | None = None, at: float | None = None) -> None:
        """Mark done; run the callbacks. Called once, by the stream.

        :param error: the failure this point carries, if any.
        :param at: when the stream reached it (default: now), for a device
            that keeps a clock of its own (the simulated accelerator).
        """
        with self._lock:
            self._time = time.perf_counter() if at is None else at
            self._error = error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_callback(self, callback: _Callback) -> None:
        """Run ``callback(self)`` when done (now, if already done)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until done; return whether it is."""
        return self._done.wait(timeout)


def _done_completion() -> Completion:
    completion = Completion()
    completion.set()
    return completion


def call_soon_threadsafe_factory() -> Callable[[Callable[[], object]], None]:
    """Return a function that schedules a callback on the running event loop
    from any thread, without blocking that thread.

    Works under asyncio and trio (the two loops anyio runs on).
    """
    library = sniffio.current_async_library()
    if library == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def trio_soon(callback: Callable[[], object]) -> None:
            # RunFinishedError: the loop is gone, nobody is left to wake.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(callback)

        return trio_soon
    import asyncio

    loop = asyncio.get_running_loop()

    def asyncio_soon(callback: Callable[[], object]) -> None:
        # RuntimeError: the loop is closed, nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback)

    return asyncio_soon


async def wait_completion(completion: Completion) -> None:
    """Await ``completion`` without blocking the event loop or polling.

    The worker thread that completes it schedules the wake-up on the loop
    (``call_soon_threadsafe`` / trio's token). Each loop gets its native
    primitive: this sits on every run's path, and a generic event costs a
    measurable fraction of a small graph's run.
    """
    if completion.done:
        return
    if sniffio.current_async_library() == "asyncio":
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake_asyncio(_: Completion) -> None:
            # RuntimeError: the loop is closed, nobody is left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future)

        completion.add_callback(wake_asyncio)
        await future
        return
    woken = anyio.Event()
    soon = call_soon_threadsafe_factory()
    completion.add_callback(lambda _: soon(woken.set))
    await woken.wait()


def _resolve(future: Any) -> None:
    if not future.done():  # a cancelled waiter left it cancelled
        future.set_result(None)


class Event:
    """A synchronisation point recorded on a :class:`~devices.Stream`.

    A new event that was never recorded counts as complete (CUDA semantics).
    Record it with ``stream.record(event)``.

    :param name: a label used in error messages and traces.
    """

    __slots__ = ("_completion", "_stream_label", "name")

    _NEVER_RECORDED = _done_completion()

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._completion = Event._NEVER_RECORDED
        self._stream_label = ""

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        where = f" on {self._stream_label}" if self._stream_label else ""
        return f"<Event {self.name or hex(id(self))}{where} {state}>"

    def _rearm(self, stream_label: str, completion: Completion) -> None:
        """Start a new record; called by the stream that records it."""
        if not self._completion.done:
            raise StreamError(
                f"{self!r} is still pending and cannot be recorded again",
                stream_label,
            )
        self._completion = completion
        self._stream_label = stream_label

    @property
    def completion(self) -> Completion:
        """The completion of the latest record (for streams and executors)."""
        return self._completion

    @property
    def done(self) -> bool:
        """Whether the recording stream has reached this event (CuPy's
        ``Event.done``; TVM's query)."""
        return self._completion.done

    def query(self) -> bool:
        """Same as :attr:`done`."""
        return self._completion.done

    def synchronize(self, timeout: float | None = None) -> None:
        """Block the calling thread until the event completes.

        :param timeout: seconds to wait at most; ``None`` waits for ever.
        :raises TimeoutError: if ``timeout`` passes first.
        :raises StreamError: if work before the event failed.
        """
        completion = self._completion
        if not completion.wait(timeout):
            raise TimeoutError(f"{self!r} did not complete in {timeout} s")
        self._raise_if_failed(completion)

    async def wait(self) -> None:
        """Wait for the event without blocking the event loop.

        The waiting task sleeps until the stream's worker wakes the loop.
        Cancelling the wait leaves the stream's work running.

        :raises StreamError: if work before the event failed.
        """
        completion = self._completion
        await wait_completion(completion)
        self._raise_if_failed(completion)

    def _raise_if_failed(self, completion: Completion) -> None:
        error = completion.error
        if error is not None:
            if isinstance(error, StreamError):
                raise error
            raise StreamError(
                f"work recorded before {self!r} failed: {error!r}",
                self._stream_label,
            ) from error
