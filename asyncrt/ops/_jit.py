"""The optional compiled engine: numba (on llvmlite), where it is installed.

Kernels that numpy can only express as many whole-array passes (a depthwise
convolution is two passes per kernel tap; hard-swish four) are written once
as plain Python loops over arrays in modules of their own, and compiled here
by numba on first use: one pass over memory, vectorised by LLVM. Without
numba (it is the ``jit`` extra, not a dependency) or with :data:`enabled`
cleared, every such kernel takes its numpy path, which computes the same
results (see each kernel for its tolerance).

What the compiled kernels promise:

* **No fast-math.** They are compiled without ``fastmath``: LLVM may not
  reassociate sums or assume no NaN or infinity, so IEEE special values
  propagate as in numpy, and a loop's result differs from numpy's passes
  only where it sums in a different order (documented per kernel).
* **numpy's error model**: a division by zero is inf or NaN, never an
  exception.
* **No GIL**: a compiled call releases it, so kernels split their work
  over :func:`asyncrt.runtime._threads.run_parts` (the fused kernels' pool,
  sized by the cpu streams' share of the cores) and run truly in parallel.
* **Compiled once per machine**: ``cache=True`` keeps the machine code on
  disk (numba's cache: ``__pycache__`` beside the kernel's module, or
  ``NUMBA_CACHE_DIR``), so another process loads it instead of compiling.

Costs (AMD EPYC VM, 2 cores): ``import numba`` 0.5-0.6 s, paid on the
first compiled kernel a process makes (never by ``import asyncrt``); a
kernel's cold compilation 0.3-1 s per dtype, loading it from the disk cache
10-30 ms; numba and llvmlite add about 210 MB to an installation.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading
from collections.abc import Callable
from typing import Any

__all__ = ("available", "compile_kernel", "enabled")

#: Whether compiled kernels are used where numba is installed (tests clear
#: it to run the numpy paths).
enabled = True
_lock = threading.Lock()


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def available() -> bool:
    """Whether kernels may compile: numba is installed and :data:`enabled`."""
    return enabled and _installed()


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    numba = importlib.import_module("numba")
    jitted: Callable[..., Any] = numba.njit(
        cache=True, nogil=True, error_model="numpy", boundscheck=False
    )(function)
    return jitted


def compile_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` compiled by numba (once per process; its machine code
    from the disk cache where another process made it).

    :param function: a module-level function numba can compile (its module
        file is the cache's key).
    :raises ModuleNotFoundError: if numba is not installed.
    """
    with _lock:  # numba's dispatcher creation is not thread-safe
        return _compiled(function)
