"""Kernels for the remote-device tests.

They live in a module of their own, not in a test file, because the Dask
workers import them by name (as they would any installed kernel module).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import asyncrt

#: The name of the ``distributed.Event`` that :func:`hang` sets once running.
HANG_STARTED = "asyncrt-test-hang-started"


def increment(kind: str, x: Any) -> None:
    """A raw remote function: ``x += 1`` on the worker."""
    np.add(x, 1, x)


def doze(kind: str, *arrays: Any) -> None:
    """A raw remote function that takes a second."""
    time.sleep(1)


def fail(kind: str, *arrays: Any) -> None:
    """A raw remote function that always raises."""
    raise ValueError("failed on purpose")


@asyncrt.register_func("boom", kinds=("cpu",))
def boom(x: Any, out: Any) -> None:
    """A kernel that raises."""
    raise ValueError("boom on purpose")


@asyncrt.register_func("hang", kinds=("cpu",))
def hang(x: Any, out: Any) -> None:
    """A kernel that says it started, then runs for a minute (until its
    worker is killed)."""
    from distributed import Event

    Event(HANG_STARTED).set()
    time.sleep(60)
    out[...] = x
