"""A compiled kernel's parts on the native team.

:func:`asyncrt.ops._jit.bind_parts` splits a compiled loop ``kernel(*arrays,
first, last, *trailing)`` into shares of its rows. On the part pool each
share is a Python call that a pool thread must wake for (30-60 us on the
2-core VM, as long as a depthwise convolution of MobileNetV3), and GNU
OpenMP's threads, still spinning after the products that ran on them
(:mod:`asyncrt.runtime._native_team`), take half a core from it. Here the
same shares run on that team: a ``cfunc`` generated once per kernel and
argument types rebuilds the arrays from their addresses and shapes (int64
slots), and every thread of the launch takes shares from an atomic counter
and calls the kernel for each, the GIL released.

It applies where every array is a C-contiguous numpy array of a dtype the
slots can point to and every trailing argument an integer; anything else
keeps the part pool. The kernel runs unchanged (its machine code
specialised for these types inside the ``cfunc``), so results are those of
the part pool's calls, bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime import _native_team, _threads
from . import _jit
from ._vector_ir import CLAIMS, PREAMBLE

__all__ = ("MIN_TEAM_WORK", "SHARES_PER_THREAD", "bind", "kernel_of", "shares")

#: The slot intrinsic that points at an array of each dtype (CLAIMS').
_POINTERS = {
    np.dtype(np.float32): "floats_",
    np.dtype(np.float64): "doubles_",
    np.dtype(np.int64): "ints_",
}
#: Work (multiply-adds, cells) a kernel has at least before it is split
#: over the team: a few microseconds on one thread, a launch costing 2.5.
MIN_TEAM_WORK = 100_000
#: Shares a kernel thread takes at most, one at a time, on the team: a
#: thread that the machine runs late leaves the rest of its work to the
#: others (a thread's shares cost an atomic add each).
SHARES_PER_THREAD = 4
#: Slots before the arrays: the next share to take, the shares.
_HEADER = 2


def shares(
    extent: int,
    work: float,
    min_pool_work: float,
    *,
    per_thread: int = SHARES_PER_THREAD,
) -> list[tuple[int, int]]:
    """``range(extent)`` cut into shares for :func:`asyncrt.ops._jit.bind_parts`:
    on the native team (where it runs here) once the ``work`` is
    :data:`MIN_TEAM_WORK` or more, up to ``per_thread`` a core
    (one where each share repeats some work); else one per kernel thread
    the work pays for on the part pool, ``min_pool_work`` each (see
    :func:`asyncrt.runtime._threads.shares`)."""
    # (cut for every core: a binding outlives the thread limits of now;
    # each call takes as many threads as the limits give it then)
    cores = _threads.available_cores()
    if cores > 1 and work >= MIN_TEAM_WORK and _native_team.teams_available():
        count = max(1, min(extent, per_thread * cores))
        return [(extent * i // count, extent * (i + 1) // count) for i in range(count)]
    return _threads.shares(extent, int(work // min_pool_work))


def kernel_of(module: str, name: str) -> Any:
    """The compiled kernel ``name`` of ``module``: the function itself where
    it is compiled (generated sources), else
    :func:`asyncrt.ops._jit.compile_kernel`'s."""
    function = getattr(importlib.import_module(module), name)
    return function if hasattr(function, "py_func") else _jit.compile_kernel(function)


@functools.cache
def _source_digest(module: str) -> str:
    """A digest of ``module``'s file: a changed kernel is a new wrapper (the
    wrapper's machine code, cached on disk, holds the kernel's)."""
    path = getattr(sys.modules[module], "__file__", None)
    text = Path(path).read_bytes() if path else module.encode()
    return hashlib.sha256(text).hexdigest()[:20]


def _wrapper_source(
    module: str, name: str, arrays: Sequence[tuple[str, int, bool]], trailing: int
) -> str:
    """The ``claimed(data)`` cfunc for ``kernel_of(module, name)`` over
    arrays ``(pointer intrinsic, ndim, per part)`` and ``trailing`` integer
    arguments (slot layout: :func:`_slots`)."""
    count = _slot_count(arrays, trailing)
    lines = [
        f"# kernel {module}.{name}, source {_source_digest(module)}",
        "from asyncrt.ops._team_parts import kernel_of",
        f"kernel_ = kernel_of({module!r}, {name!r})",
        "",
        "",
        "@team_kernel",
        "def claimed(data):",
        "    shares = slots_(data)[1]",
        f"    d = numba.carray(slots_(data), {count} + 2 * shares)",
    ]
    slot = _HEADER
    names = []
    for index, (pointer, ndim, per_part) in enumerate(arrays):
        shape = ", ".join(f"d[{slot + 1 + axis}]" for axis in range(ndim))
        lines.append(f"    a{index} = numba.carray({pointer}(d[{slot}]), ({shape},))")
        names.append(f"a{index}[p]" if per_part else f"a{index}")
        slot += 1 + ndim
    table = slot + trailing
    extra = [f"d[{slot + i}]" for i in range(trailing)]
    call = ", ".join([*names, f"d[{table} + 2 * p]", f"d[{table} + 2 * p + 1]", *extra])
    lines += [
        "    while True:",
        "        p = claim_(data)",
        "        if p >= shares:",
        "            return",
        f"        kernel_({call})",
    ]
    return PREAMBLE + CLAIMS + "\n".join(lines) + "\n"


def _slot_count(arrays: Sequence[tuple[str, int, bool]], trailing: int) -> int:
    """Slots before the share table (whose length varies)."""
    return _HEADER + sum(1 + ndim for _, ndim, _ in arrays) + trailing


@functools.cache
def _wrapper_address(
    module: str, name: str, arrays: tuple[tuple[str, int, bool], ...], trailing: int
) -> int:
    """The address of the compiled ``claimed`` cfunc (or loaded from numba's
    disk cache)."""
    text = _wrapper_source(module, name, arrays, trailing)
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    wrapper: Any = _jit.compile_source(f"asyncrt_team_parts_{digest}", text, "claimed")
    return int(wrapper.address)


def bind(
    kernel: Any,
    arrays: tuple[Any, ...],
    shares: Sequence[tuple[int, int]],
    per_part: frozenset[int],
    trailing: tuple[Any, ...],
) -> Callable[[], None] | None:
    """``kernel(*arrays, first, last, *trailing)`` for every share on the
    native team, as a call without arguments; ``None`` where it does not
    apply (see the module docstring) and the part pool should run them.

    :param per_part: positions in ``arrays`` of scratch arrays with one row
        per share: share ``p`` gets row ``p``.
    """
    if not _native_team.teams_available() or len(shares) < 2:
        return None
    py_func = getattr(kernel, "py_func", None)
    if py_func is None:
        return None
    described = []
    for index, array in enumerate(arrays):
        intrinsic = _POINTERS.get(getattr(array, "dtype", None))
        if (
            not isinstance(array, np.ndarray)
            or intrinsic is None
            or not array.flags.c_contiguous
            or array.ndim == 0
            or (index in per_part and array.shape[0] < len(shares))
        ):
            return None
        described.append((intrinsic, array.ndim, index in per_part))
    if not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in trailing
    ):
        return None
    wrapper = _wrapper_address(
        py_func.__module__, py_func.__name__, tuple(described), len(trailing)
    )
    slots = [0, len(shares)]
    for array in arrays:
        slots += [array.ctypes.data, *array.shape]
    slots += [int(v) for v in trailing]
    for first, last in shares:
        slots += [first, last]
    data = np.array(slots, np.int64)
    held = (data, arrays)  # (the addresses in data stay valid)
    run = _native_team.launcher(wrapper)
    _native_team.use()
    address = data.ctypes.data
    count = len(shares)

    def parts() -> None:
        data[0] = 0
        wanted, _, crowded = _native_team.share(True)
        run(address, min(count, wanted), crowded)

    parts.held = held  # type: ignore[attr-defined]
    parts.kernel = f"{py_func.__module__}.{py_func.__name__}"  # type: ignore[attr-defined]
    return parts
