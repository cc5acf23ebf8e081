"""Keeping device resources from dying on a host-callback thread.

CUDA forbids CUDA calls on the thread that runs host functions
(``cudaLaunchHostFunc``), and destroying a CUDA event is one: cupy's
``Event.__del__`` then fails with ``cudaErrorNotPermitted``. A callback that
completes a point in a stream may drop the last reference to the object that
owns such an event. That object's finaliser hands the resource to a
:class:`Graveyard` instead, and the next ordinary thread that calls
:meth:`Graveyard.drain` destroys it.

A callback thread is known by its OS thread id, not by a ``threading.local``
mark: the driver's thread enters Python through ``PyGILState_Ensure``, which
may make a fresh thread state (and so fresh thread-local data) for each
callback, so a mark left by one callback is gone in the next.
"""

from __future__ import annotations

import threading

__all__ = ("Graveyard",)


class Graveyard:
    """Resources kept alive until a thread that may destroy them drains them."""

    __slots__ = ("_callback_threads", "_kept")

    def __init__(self) -> None:
        self._callback_threads: frozenset[int] = frozenset()
        self._kept: list[object] = []

    def mark_callback_thread(self) -> None:
        """Record that the calling thread runs host callbacks (for good: the
        driver keeps its threads for them)."""
        ident = threading.get_ident()
        if ident not in self._callback_threads:
            # Copy-on-write: readers on other threads see one set or the other.
            self._callback_threads = self._callback_threads | {ident}

    @property
    def on_callback_thread(self) -> bool:
        """Whether the calling thread was marked as a host-callback thread."""
        return threading.get_ident() in self._callback_threads

    def keep(self, resource: object) -> None:
        """Hold ``resource`` until the next :meth:`drain`."""
        self._kept.append(resource)  # list.append is atomic

    def drain(self) -> None:
        """Drop every kept resource, on the calling thread (never a callback
        thread's job)."""
        while self._kept:
            self._kept.pop()

    def __len__(self) -> int:
        return len(self._kept)
