"""Kernels for the process-backed executor's tests.

They live in a module of their own, not in a test file, because worker
processes import them by name (``worker_imports``), as they would any
installed kernel module. Each behaves like ReLU unless its input's first
element is above :data:`TRIGGER`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import asyncrt
from devices.errors import OutOfMemoryError

#: An input whose first element exceeds this makes the kernels misbehave.
TRIGGER = 10.0
#: The longest :func:`nap_relu` sleeps.
NAP_SECONDS = 0.5
#: If this environment variable names a file, :func:`nap_relu` creates it as
#: it starts to nap (so a test in another process knows the nap is under
#: way).
NAP_STARTED = "ASYNCRT_TEST_NAP_STARTED"


@asyncrt.register_func("test_nap_relu", kinds=("cpu", "sim"))
def nap_relu(x: Any, out: Any) -> None:
    """ReLU; when triggered, first sleeps 10 ms per unit of ``x[0]`` above
    :data:`TRIGGER`, at most :data:`NAP_SECONDS`."""
    if x[0] > TRIGGER:
        mark = os.environ.get(NAP_STARTED)
        if mark:
            Path(mark).touch()
        time.sleep(min(NAP_SECONDS, float(x[0] - TRIGGER) * 0.01))
    np.maximum(x, 0, out=out)


@asyncrt.register_func("test_boom_relu", kinds=("cpu", "sim"))
def boom_relu(x: Any, out: Any) -> None:
    """ReLU; raises ``ValueError`` when triggered."""
    if x[0] > TRIGGER:
        raise ValueError(f"boom on purpose at {float(x[0])}")
    np.maximum(x, 0, out=out)


@asyncrt.register_func("test_fail_on_zero", kinds=("cpu", "sim"))
def fail_on_zero(x: Any, out: Any) -> None:
    """ReLU; raises ``ValueError`` when ``x[0]`` is zero (as for an
    all-zero input)."""
    if x[0] == 0:
        raise ValueError("zero input on purpose")
    np.maximum(x, 0, out=out)


@asyncrt.register_func("test_oom_relu", kinds=("cpu", "sim"))
def oom_relu(x: Any, out: Any) -> None:
    """ReLU; raises the device's out-of-memory error when triggered."""
    if x[0] > TRIGGER:
        raise OutOfMemoryError("cpu:0", 1 << 40, 1 << 20)
    np.maximum(x, 0, out=out)


@asyncrt.register_func("test_async_relu", kinds=("cpu",))
async def async_relu(x: Any, out: Any) -> None:
    """ReLU as a coroutine kernel (run on the worker's event loop); naps
    like :func:`nap_relu` when triggered."""
    if x[0] > TRIGGER:
        await anyio.sleep(min(NAP_SECONDS, float(x[0] - TRIGGER) * 0.01))
    np.maximum(x, 0, out=out)
