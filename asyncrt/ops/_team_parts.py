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
slots can point to and every other argument an integer or a float (passed
as int64 and float64); anything else keeps the part pool. The kernel runs
unchanged (its machine code specialised for these types inside the
``cfunc``), so results are those of the part pool's calls, bit for bit.
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

__all__ = (
    "MIN_TEAM_ELEMENTS",
    "MIN_TEAM_WORK",
    "SHARES_PER_THREAD",
    "bind",
    "kernel_of",
    "shares",
)

#: The slot intrinsic that points at an array of each dtype (CLAIMS').
_POINTERS = {
    np.dtype(np.float32): "floats_",
    np.dtype(np.float64): "doubles_",
    np.dtype(np.int64): "ints_",
    np.dtype(np.bool_): "bools_",
    np.dtype(np.uint8): "ubytes_",  # (float8 codes)
    np.dtype(np.uint32): "uints_",  # (float32s' bits)
    np.dtype(np.uint64): "ulongs_",  # (float64s' bits)
}
#: Work (multiply-adds, window cells) a kernel has at least before it is
#: split over the team: a few microseconds on one thread, a launch costing
#: 2.1 (2 cores).
MIN_TEAM_WORK = 100_000
#: Elements a pass over rows (a norm, a softmax, an epilogue) has at least
#: before it is split over the team. One thread against two on the 2-core
#: VM: a layer norm of 128 x 384 24 -> 18 us, a softmax of 1536 x 64 53 ->
#: 42, of 4800 x 100 301 -> 200, a layer norm of 400 x 768 148 -> 82.
MIN_TEAM_ELEMENTS = 32_768
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
    min_team_work: float | None = None,
    per_thread: int = SHARES_PER_THREAD,
) -> list[tuple[int, int]]:
    """``range(extent)`` cut into shares for :func:`asyncrt.ops._jit.bind_parts`:
    on the native team (where it runs here) once the ``work`` is
    ``min_team_work`` or more, up to ``per_thread`` a core; else one per
    kernel thread the work pays for on the part pool, ``min_pool_work``
    each (see :func:`asyncrt.runtime._threads.shares`).

    :param min_team_work: the team's threshold; default
        :data:`MIN_TEAM_WORK` (read at each call).
    :param per_thread: shares a core at most on the team (one where each
        share repeats some work)."""
    # (cut for every core: a binding outlives the thread limits of now;
    # each call takes as many threads as the limits give it then)
    cores = _threads.available_cores()
    least = MIN_TEAM_WORK if min_team_work is None else min_team_work
    if cores > 1 and work >= least and _native_team.teams_available():
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


#: How an argument travels in the slots: ``("array", intrinsic, ndim,
#: per_part)`` (its address, then its shape), ``("int",)`` or ``("bool",)``
#: (its value) or ``("float",)`` (its place among the floats, whose address
#: follows).
Arg = tuple[Any, ...]


def _wrapper_source(
    module: str, name: str, leading: tuple[Arg, ...], trailing: tuple[Arg, ...]
) -> str:
    """The ``claimed(data)`` cfunc for ``kernel_of(module, name)`` called as
    ``kernel(*leading, first, last, *trailing)``. Slots: the header, each
    argument's (:data:`Arg`), the address of the floats, then each share's
    bounds."""
    count = _slot_count((*leading, *trailing))
    float_count = max(1, sum(arg[0] == "float" for arg in (*leading, *trailing)))
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
        f"    floats = numba.carray(doubles_(d[{count - 1}]), {float_count})",
    ]
    slot, floats, values = _HEADER, 0, []
    for index, arg in enumerate((*leading, *trailing)):
        if arg[0] == "array":
            _, intrinsic, ndim, per_part = arg
            shape = ", ".join(f"d[{slot + 1 + axis}]" for axis in range(ndim))
            lines.append(
                f"    a{index} = numba.carray({intrinsic}(d[{slot}]), ({shape},))"
            )
            values.append(f"a{index}[p]" if per_part else f"a{index}")
            slot += 1 + ndim
        elif arg[0] == "int":
            values.append(f"d[{slot}]")
            slot += 1
        elif arg[0] == "bool":
            values.append(f"d[{slot}] != 0")
            slot += 1
        else:
            values.append(f"floats[{floats}]")
            floats += 1
            slot += 1
    bounds = [f"d[{count} + 2 * p]", f"d[{count} + 2 * p + 1]"]
    call = ", ".join([*values[: len(leading)], *bounds, *values[len(leading) :]])
    lines += [
        "    while True:",
        "        p = claim_(data)",
        "        if p >= shares:",
        "            return",
        f"        kernel_({call})",
    ]
    return PREAMBLE + CLAIMS + "\n".join(lines) + "\n"


def _slot_count(args: Sequence[Arg]) -> int:
    """Slots before the share table (whose length varies)."""
    return _HEADER + sum(1 + arg[2] if arg[0] == "array" else 1 for arg in args) + 1


@functools.cache
def _wrapper_address(
    module: str, name: str, leading: tuple[Arg, ...], trailing: tuple[Arg, ...]
) -> int:
    """The address of the compiled ``claimed`` cfunc (or loaded from numba's
    disk cache)."""
    text = _wrapper_source(module, name, leading, trailing)
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    wrapper: Any = _jit.compile_source(f"asyncrt_team_parts_{digest}", text, "claimed")
    return int(wrapper.address)


def _describe(value: Any, per_part: bool, shares: int) -> Arg | None:
    """How ``value`` travels in the slots (:data:`Arg`), or ``None`` where
    it cannot (the part pool then passes it)."""
    if isinstance(value, np.ndarray):
        intrinsic = _POINTERS.get(value.dtype)
        if (
            intrinsic is None
            or not value.flags.c_contiguous
            or value.ndim == 0
            or (per_part and value.shape[0] < shares)
        ):
            return None
        return ("array", intrinsic, value.ndim, per_part)
    if isinstance(value, (bool, np.bool_)):
        return ("bool",)
    if isinstance(value, (int, np.integer)):
        return ("int",)
    if isinstance(value, (float, np.floating)):
        return ("float",)
    return None


def bind(
    kernel: Any,
    arrays: tuple[Any, ...],
    shares: Sequence[tuple[int, int]],
    per_part: frozenset[int],
    trailing: tuple[Any, ...],
    work: float = float("inf"),
) -> Callable[[], None] | None:
    """``kernel(*arrays, first, last, *trailing)`` for every share on the
    native team, as a call without arguments; ``None`` where it does not
    apply (see the module docstring) and the part pool should run them.

    :param per_part: positions in ``arrays`` of scratch arrays with one row
        per share: share ``p`` gets row ``p``.
    :param work: the call's work, for :func:`asyncrt.runtime._native_team.share`
        (small work stays on the calling thread while the cores are crowded).
    """
    if not _native_team.teams_available() or len(shares) < 2:
        return None
    bound = _slots(kernel, arrays, shares, per_part, trailing)
    if bound is None:
        return None
    wrapper, data, held = bound
    run = _native_team.launcher(wrapper)
    _native_team.use()
    address = data.ctypes.data
    count = len(shares)

    def parts() -> None:
        data[0] = 0
        wanted, _, crowded = _native_team.share(True, work)
        run(address, min(count, wanted), crowded)

    parts.held = held  # type: ignore[attr-defined]
    return parts


def bind_alone(
    kernel: Any,
    arrays: tuple[Any, ...],
    share: tuple[int, int],
    trailing: tuple[Any, ...],
) -> Callable[[], None] | None:
    """``kernel(*arrays, first, last, *trailing)`` for one share, on the
    calling thread, through the same wrapper (:func:`bind`), as a call
    without arguments; ``None`` where the wrapper does not apply.

    numba's dispatcher checks the type of every argument on each call:
    with four arguments, 3.7 us against the cube of 4096 floats' 0.5.
    The wrapper is one ``ctypes`` call of a pointer (0.15 us), which
    matters for the many small kernels of a MobileNet or of a short
    sequence's encoder."""
    bound = _slots(kernel, arrays, (share,), frozenset(), trailing)
    if bound is None:
        return None
    wrapper, data, held = bound
    alone = _native_team.alone(wrapper)
    address = data.ctypes.data

    def call() -> None:
        data[0] = 0
        alone(address)

    call.held = held  # type: ignore[attr-defined]
    return call


def _slots(
    kernel: Any,
    arrays: tuple[Any, ...],
    shares: Sequence[tuple[int, int]],
    per_part: frozenset[int],
    trailing: tuple[Any, ...],
) -> tuple[int, Any, tuple[Any, ...]] | None:
    """The wrapper's address for these arguments, its data (the int64
    slots) and what must live as long as the addresses in them; ``None``
    where an argument cannot travel in the slots."""
    py_func = getattr(kernel, "py_func", None)
    if py_func is None:
        return None
    leading = [_describe(v, i in per_part, len(shares)) for i, v in enumerate(arrays)]
    following = [_describe(v, False, len(shares)) for v in trailing]
    described = (*leading, *following)
    if not all(described):
        return None
    wrapper = _wrapper_address(
        py_func.__module__,
        py_func.__name__,
        tuple(leading),
        tuple(following),
    )
    values = (*arrays, *trailing)
    floats = np.array(
        [
            float(v)
            for v, arg in zip(values, described, strict=True)
            if arg == ("float",)
        ]
        or [0.0]
    )
    slots = [0, len(shares)]
    for value, arg in zip(values, described, strict=True):
        if arg[0] == "array":  # type: ignore[index]
            slots += [value.ctypes.data, *value.shape]
        else:
            slots.append(int(value) if arg[0] in ("int", "bool") else 0)  # type: ignore[index]
    slots.append(floats.ctypes.data)
    for first, last in shares:
        slots += [first, last]
    data = np.array(slots, np.int64)
    return wrapper, data, (data, arrays, floats)
