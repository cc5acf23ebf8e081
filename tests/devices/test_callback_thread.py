"""A resource whose owner dies on a host-callback thread is destroyed later,
on an ordinary thread (CUDA forbids CUDA calls in host callbacks; the cuda
backend's completions use this for their events)."""

from __future__ import annotations

import threading
from typing import ClassVar

from devices._callback_thread import Graveyard

GRAVEYARD = Graveyard()


class Resource:
    """Records the thread it was destroyed on (as cudaEventDestroy would run)."""

    destroyed_on: ClassVar[list[str]] = []

    def __del__(self) -> None:
        Resource.destroyed_on.append(threading.current_thread().name)


class Owner:
    """Owns a resource, as a cuda completion owns its CUDA event."""

    def __init__(self) -> None:
        self.resource: Resource | None = Resource()

    def __del__(self) -> None:
        if self.resource is not None and GRAVEYARD.on_callback_thread:
            GRAVEYARD.keep(self.resource)


def _drop_on_a_callback_thread(owner: list[Owner]) -> None:
    def callback() -> None:
        GRAVEYARD.mark_callback_thread()
        owner.pop()  # the last reference goes here

    thread = threading.Thread(target=callback, name="host-callbacks")
    thread.start()
    thread.join()


def test_a_resource_is_not_destroyed_on_the_callback_thread() -> None:
    Resource.destroyed_on.clear()
    _drop_on_a_callback_thread([Owner()])
    assert Resource.destroyed_on == []
    assert len(GRAVEYARD) == 1
    GRAVEYARD.drain()
    assert Resource.destroyed_on == [threading.current_thread().name]
    assert len(GRAVEYARD) == 0


def test_elsewhere_a_resource_goes_with_its_owner() -> None:
    Resource.destroyed_on.clear()
    owner = [Owner()]
    assert not GRAVEYARD.on_callback_thread
    owner.pop()
    assert Resource.destroyed_on == [threading.current_thread().name]
    assert len(GRAVEYARD) == 0
