"""A connection to a Dask cluster, as the ``remote`` backend uses it.

A :class:`Session` owns a *synchronous* ``distributed.Client`` (its event
loop runs on a thread of its own, so the streams can submit from their
threads, whatever loop — asyncio, trio or none — the caller runs) and knows
which worker, and which device of that worker, each ``remote:N`` is
(:class:`Target`).

Three guarantees live here:

* **Placement.** Every task goes to its target's worker and only there
  (``workers=[address]``, ``allow_other_workers=False``), under a unique key
  that names what it does (``asyncrt_matmul+tanh-<session>-<n>``), so the
  dashboard and Dask's own logs show asyncrt's work by name.
* **No hang.** Dask keeps a task pinned to a dead worker — and every task
  that needs its data — waiting for that worker for ever. So every wait the
  backend does names the workers the awaited task depends on (its own, and
  those of everything before it: the streams track this), and the session
  subscribes to each worker's events on the scheduler; when the scheduler
  removes a worker, the session marks it lost, refuses new work for it, and
  fires every wait that depended on it as lost at once
  (:meth:`Session.when_done`). Closing fires the rest. No waiter depends on
  a message from a dead process.
* **Text errors.** A failed task's exception is turned into
  :class:`~devices.errors.RemoteError` or
  :class:`~devices.errors.DeviceLostError` from its type name and message;
  nothing received is executed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import itertools
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._device import Device
from ._remote_ops import RemoteFailure
from .errors import (
    ClosedResourceError,
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    RemoteError,
)

__all__ = ("Session", "Target", "exception_of")

#: What a finished watch reports: the future's status ("finished", "error",
#: "cancelled", "lost"), or "lost" when the session gave up on it.
WatchCallback = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """Where a ``remote`` device lives.

    :ivar device: the device, ``remote:N``.
    :ivar worker: the address of the Dask worker that holds it.
    :ivar local: the device on that worker (``cpu:0``, or ``cuda:j``).
    :ivar name: the worker's name (for labels).
    :ivar memory: the worker's memory limit in bytes, if it has one.
    """

    device: Device
    worker: str
    local: Device
    name: str
    memory: int | None = None


class _Watch:
    """One callback, fired exactly once: when its future is done, or when a
    worker it depends on is lost (then with status "lost").

    :ivar workers: the workers whose loss means the future will never be
        done (its own, and those of everything it depends on).
    """

    __slots__ = ("callback", "fired", "lock", "workers")

    def __init__(self, workers: frozenset[str], callback: WatchCallback) -> None:
        self.workers = workers
        self.callback = callback
        self.fired = False
        self.lock = threading.Lock()

    def fire(self, status: str) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = True
        self.callback(status)


class Session:
    """A connection to a cluster: its targets, submissions and waits.

    Use :meth:`open`.

    :param client: a synchronous ``distributed.Client``.
    :param own_client: whether :meth:`close` closes the client.
    :param targets: the devices, ``remote:0`` first.
    :param timeout: seconds a scatter may wait for its worker.
    """

    def __init__(
        self,
        client: Any,
        own_client: bool,
        targets: Sequence[Target],
        timeout: float = 30.0,
    ) -> None:
        self.client = client
        self.targets = tuple(targets)
        self._own_client = own_client
        self._timeout = timeout
        self._token = uuid.uuid4().hex[:8]
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._lost: dict[str, str] = {}
        self._workers = tuple(dict.fromkeys(t.worker for t in self.targets))
        self._watches: set[_Watch] = set()

    # -- opening ---------------------------------------------------------

    @classmethod
    def open(
        cls,
        address_or_client: Any,
        *,
        security: Any = None,
        gpus: bool = False,
        min_workers: int = 1,
        timeout: float = 30.0,
    ) -> Session:
        """Connect, discover the workers, and start watching them.

        :param address_or_client: a scheduler address, or a ``Client``. A
            synchronous client is used as it is (and left open by
            :meth:`close`); for an asynchronous one the session opens its
            own synchronous client to the same scheduler, with its security.
        :param security: a ``distributed.security.Security`` (TLS), or
            ``None``; ignored when a client is given.
        :param gpus: one device per GPU of each worker (its ``GPU``
            resource), each worker's cpu otherwise.
        :param min_workers: wait until this many workers have joined.
        :param timeout: seconds to wait for the scheduler and the workers.
        :raises DeviceNotFoundError: if the scheduler cannot be reached or
            has no (GPU) workers.
        """
        client_class: Any = importlib.import_module("distributed").Client
        own = True
        try:
            client: Any
            if isinstance(address_or_client, client_class):
                given: Any = address_or_client
                if given.asynchronous:
                    client = client_class(
                        given.scheduler.address,
                        security=given.security,
                        timeout=timeout,
                        set_as_default=False,
                    )
                else:
                    client, own = given, False
            else:
                client = client_class(
                    address_or_client,
                    security=security,
                    timeout=timeout,
                    set_as_default=False,
                )
        except Exception as exc:  # refused, timed out, TLS misconfigured, ...
            _close_half_made(exc, client_class)
            hint = ""
            if str(address_or_client).startswith("tls://") and security is None:
                hint = " (a tls:// scheduler needs security=Security(...))"
            raise DeviceNotFoundError(
                f"cannot connect to the Dask scheduler at {address_or_client!r}: "
                f"{exc}{hint}"
            ) from exc
        try:
            if min_workers > 0:
                client.wait_for_workers(min_workers, timeout=timeout)
            session = cls(client, own, _discover(client, gpus), timeout)
            session._watch()
        except BaseException as exc:
            if own:
                client.close()
            if isinstance(exc, (OSError, TimeoutError)):
                raise DeviceNotFoundError(
                    f"the Dask cluster at {client.scheduler.address} did not "
                    f"answer: {exc}"
                ) from exc
            raise
        return session

    def _watch(self) -> None:
        for worker in self._workers:
            self.client.subscribe_topic(worker, self._handler(worker))
        # A worker that left before the subscription took effect.
        present = self.client.scheduler_info(n_workers=-1)["workers"]
        for worker in self._workers:
            if worker not in present:
                self._lose(worker, "had left the cluster before it was used")

    def _handler(self, worker: str) -> Callable[[Any], None]:
        def on_event(event: Any) -> None:
            message = event[1] if isinstance(event, tuple) and len(event) > 1 else {}
            if isinstance(message, dict) and message.get("action") == "remove-worker":
                how = "was closed" if message.get("expected") else "died"
                self._lose(worker, f"{how} (the scheduler removed it)")

        return on_event

    # -- state -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def lost_reason(self, worker: str) -> str | None:
        """Why ``worker`` is lost, or ``None`` while it is not."""
        return self._lost.get(worker)

    def any_lost(self, workers: frozenset[str]) -> bool:
        """Whether work depending on ``workers`` can no longer finish."""
        return self._closed or any(w in self._lost for w in workers)

    def _lose(self, worker: str, reason: str) -> None:
        """Mark ``worker`` lost and fire the watches that depend on it.

        Its tasks are not cancelled: Dask's cancellation walks dependents
        that this client may have let go of, and fails on them. Released
        futures are forgotten by the scheduler in due course instead.
        """
        with self._lock:
            if worker in self._lost:
                return
            self._lost[worker] = reason
            watches = [w for w in self._watches if worker in w.workers]
            self._watches.difference_update(watches)
        if watches:
            # Not on the client's event loop, where this handler runs: the
            # callbacks read futures, which waits on that loop.
            threading.Thread(
                target=_fire_all, args=(watches,), name="remote-lost", daemon=True
            ).start()

    def check(self, target: Target) -> None:
        """Raise if ``target`` cannot take work.

        :raises ClosedResourceError: if the session is closed.
        :raises DeviceLostError: if its worker is lost.
        """
        if self._closed:
            raise ClosedResourceError(
                f"{target.device}: the connection to the Dask cluster is closed"
            )
        if target.worker in self._lost:
            raise self.lost_error(target)

    # -- work ----------------------------------------------------------------

    def submit(
        self, target: Target, fn: Callable[..., Any], *args: Any, label: str
    ) -> Any:
        """Run ``fn(*args)`` on ``target``'s worker, and only there.

        :param label: what the task does, for its key (letters, digits, +, _).
        :return: the task's future.
        :raises ClosedResourceError: if the session is closed.
        :raises DeviceLostError: if the worker is lost.
        :raises DeviceError: if Dask refuses the task.
        """
        self.check(target)
        key = f"asyncrt_{label}-{self._token}-{next(self._keys)}"
        try:
            return self.client.submit(
                fn,
                *args,
                key=key,
                workers=[target.worker],
                allow_other_workers=False,
                pure=False,
            )
        except Exception as exc:  # the client was closed under us, ...
            raise DeviceError(
                f"{target.device}: Dask refused the task {key}: {exc}"
            ) from exc

    def when_done(
        self, future: Any, workers: frozenset[str], callback: WatchCallback
    ) -> None:
        """Call ``callback(status)`` once ``future`` is done, or once one of
        ``workers`` (those it depends on) is lost, or the session closes:
        exactly once, on Dask's callback thread or a thread of the session.
        Callbacks must be quick and must not wait on the cluster."""
        watch = _Watch(workers, callback)
        with self._lock:
            gone = self.any_lost(workers)
            if not gone:
                self._watches.add(watch)
        if gone:
            watch.fire("lost")
            return
        future.add_done_callback(lambda done: self._fire(watch, done.status))

    def _fire(self, watch: _Watch, status: str) -> None:
        with self._lock:
            self._watches.discard(watch)
        watch.fire(status)

    def wait(self, future: Any, target: Target, workers: frozenset[str]) -> None:
        """Block until ``future`` is done (or cannot be: see the module).

        :param workers: the workers it depends on.
        :raises RemoteError: if its task raised.
        :raises DeviceLostError: if a worker it depends on was lost first.
        """
        done = threading.Event()
        outcome: list[str] = []

        def finished(status: str) -> None:
            outcome.append(status)
            done.set()

        self.when_done(future, workers, finished)
        done.wait()
        error = self.error(future, target, outcome[0], workers)
        if error is not None:
            raise error

    def fetch(self, future: Any, target: Target, workers: frozenset[str]) -> Any:
        """The result of ``future``, brought straight from its worker.

        :raises RemoteError: if its task raised.
        :raises DeviceLostError: if a worker was lost first.
        """
        self.wait(future, target, workers)
        return self._abortable(
            self.client.gather(future, direct=True, asynchronous=True),
            target,
            workers,
        )

    def scatter(self, target: Target, data: Any) -> Any:
        """Send ``data`` straight to ``target``'s worker (not through the
        scheduler); blocks until it is there.

        :return: its future.
        :raises DeviceLostError: if the worker is lost.
        """
        self.check(target)
        coroutine = self.client.scatter(
            data,
            workers=[target.worker],
            direct=True,
            hash=False,
            timeout=self._timeout,
            asynchronous=True,
        )
        return self._abortable(coroutine, target, frozenset((target.worker,)))

    def _abortable(
        self, coroutine: Any, target: Target, workers: frozenset[str]
    ) -> Any:
        """Run one of the client's coroutines on its loop and wait for it,
        unless one of ``workers`` is lost first (Dask would wait for the lost
        data to come back)."""
        running = asyncio.run_coroutine_threadsafe(
            coroutine, self.client.loop.asyncio_loop
        )
        self.when_done_call(running, workers)
        try:
            return running.result()
        except concurrent.futures.CancelledError:
            raise self.lost_error(target, workers) from None
        except Exception as exc:
            if self.any_lost(workers):
                raise self.lost_error(target, workers) from exc
            raise DeviceError(
                f"{target.device}: moving bytes to or from worker "
                f"{target.worker} failed: {exc}"
            ) from exc

    def when_done_call(
        self, running: concurrent.futures.Future[Any], workers: frozenset[str]
    ) -> None:
        """Cancel ``running`` if one of ``workers`` is lost before it ends."""

        def cancel(status: str) -> None:
            running.cancel()

        watch = _Watch(workers, cancel)
        with self._lock:
            gone = self.any_lost(workers)
            if not gone:
                self._watches.add(watch)
        if gone:
            running.cancel()
            return
        running.add_done_callback(lambda _: self._forget(watch))

    def _forget(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    # -- errors ----------------------------------------------------------------

    def error(
        self, future: Any, target: Target, status: str, workers: frozenset[str]
    ) -> BaseException | None:
        """The error a fired watch means, or ``None`` for success."""
        if future.status == "finished":
            return None
        if future.status == "error":
            return self.remote_error(exception_of(future), target)
        return self.lost_error(target, workers)

    def remote_error(self, exc: BaseException | None, target: Target) -> BaseException:
        """Turn a task's exception into this package's errors (text only)."""
        if isinstance(exc, RemoteFailure):
            type_name, message = exc.type_name, exc.message
            trace = exc.remote_traceback
        else:
            type_name, message, trace = type(exc).__name__, str(exc), ""
        if type_name == "KilledWorker":
            return self.lost_error(target)
        return RemoteError(
            f"{type_name}: {message} (on {target.device}, worker {target.worker})",
            device=str(target.device),
            worker=target.worker,
            type_name=type_name,
            remote_traceback=trace,
        )

    def lost_error(
        self, target: Target, workers: frozenset[str] = frozenset()
    ) -> DeviceLostError:
        """The error for work on ``target`` (depending on ``workers``) that
        will never finish."""
        if self._closed:
            return DeviceLostError(
                f"{target.device}: the connection to the Dask cluster was closed",
                device=str(target.device),
                worker=target.worker,
            )
        reason = self._lost.get(target.worker)
        if reason is not None:
            return DeviceLostError(
                f"{target.device} is lost: its Dask worker {target.worker} {reason}",
                device=str(target.device),
                worker=target.worker,
            )
        for other in self.targets:
            why = self._lost.get(other.worker)
            if why is not None and (not workers or other.worker in workers):
                return DeviceLostError(
                    f"work on {target.device} depended on {other.device}, which is "
                    f"lost: its Dask worker {other.worker} {why}",
                    device=str(other.device),
                    worker=other.worker,
                )
        return DeviceLostError(
            f"work on {target.device} was cancelled by the Dask cluster",
            device=str(target.device),
            worker=target.worker,
        )

    # -- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Fail every waiter, stop taking work, close the client if the
        session opened it (which releases all its tasks). Idempotent.

        Tasks in flight on live workers are left to finish (a client passed
        in keeps them until their futures go)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches = list(self._watches)
            self._watches.clear()
        _fire_all(watches)
        for worker in self._workers:
            with contextlib.suppress(Exception):
                self.client.unsubscribe_topic(worker)
        if self._own_client:
            self.client.close()


def _fire_all(watches: list[_Watch]) -> None:
    for watch in watches:
        watch.fire("lost")


def _close_half_made(error: BaseException, client_class: Any) -> None:
    """Close the client whose constructor raised ``error``, if it got as far
    as starting its event loop's thread: distributed leaves that to the
    client's ``__del__``, whose close, at some later garbage collection,
    waits for the thread and can raise there (an unraisable error in
    whatever runs then). Closed now, errors of its own are ignored: the
    connection already failed."""
    trace = error.__traceback__
    while trace is not None:
        made: Any = trace.tb_frame.f_locals.get("self")
        if isinstance(made, client_class):
            with contextlib.suppress(Exception):
                made.close()
            return
        trace = trace.tb_next


def _discover(client: Any, gpus: bool) -> list[Target]:
    """The targets, ordered by worker address (then GPU index)."""
    workers: dict[str, Any] = client.scheduler_info(n_workers=-1)["workers"]
    targets: list[Target] = []
    for address in sorted(workers):
        info = workers[address]
        if gpus:
            count = int(info.get("resources", {}).get("GPU", 0))
            locals_ = [Device("cuda", j) for j in range(count)]
        else:
            locals_ = [Device("cpu", 0)]
        limit = info.get("memory_limit")
        for local in locals_:
            targets.append(
                Target(
                    device=Device("remote", len(targets)),
                    worker=address,
                    local=local,
                    name=str(info.get("name", address)),
                    memory=int(limit) if limit else None,
                )
            )
    if not targets:
        what = "advertises a GPU resource" if gpus else "has joined"
        raise DeviceNotFoundError(
            f"no worker of the Dask cluster at {client.scheduler.address} {what}"
        )
    return targets


def exception_of(future: Any) -> BaseException | None:
    """The exception of an erred future, or ``None`` if it cannot be read
    (the client is closing)."""
    try:
        exc: BaseException | None = future.exception(timeout=10)
    except Exception:
        return None
    return exc
