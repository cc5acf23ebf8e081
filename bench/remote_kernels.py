"""Kernels for ``bench_remote.py``, in a module of their own: the Dask
workers import it by name (a kernel defined in ``__main__`` cannot run on a
remote device)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import asyncrt

#: How long one ``nap`` lasts, seconds.
NAP = 0.05


def nothing(*_: object) -> None:
    """The empty function both sides of the launch benchmark run."""


@asyncrt.register_func("nap", kinds=("cpu",))
def nap(x: Any, out: Any) -> None:
    """Sleep :data:`NAP` s (off the GIL, like I/O or a device), then copy."""
    time.sleep(NAP)
    np.copyto(out, x)
