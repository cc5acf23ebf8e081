"""Helpers every op module shares: checked attribute reads and quiet math."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from devices._dtype import is_extension

from . import _jit
from ._library import Attrs

__all__ = (
    "BOUND_SCRATCH_BYTES",
    "Array",
    "bind_all_finite",
    "calculable",
    "choice",
    "flag",
    "in_turn",
    "integer",
    "ints",
    "number",
    "opt_ints",
    "quiet",
    "relu_in_place",
)

#: A numpy or cupy array.
Array = Any
_NON_FINITE = ("inf", "-inf", "nan")
#: A kernel bound to its arrays (:class:`~asyncrt.Bindable`) keeps scratch
#: buffers of its own if together they fit in this many bytes; larger ones
#: are allocated per call, where the work dwarfs the allocation.
BOUND_SCRATCH_BYTES = 1 << 20


def _quiet_state() -> tuple[Any, Any] | None:
    """numpy 2's floating-point error state variable and its value inside
    ``errstate(all="ignore")``, or ``None`` where numpy keeps its error
    state otherwise (numpy 1.x)."""
    try:
        from numpy._core import _ufunc_config
    except ImportError:
        return None
    variable = getattr(_ufunc_config, "_extobj_contextvar", None)
    if variable is None:
        return None
    with np.errstate(all="ignore"):
        return variable, variable.get()


_QUIET_STATE = _quiet_state()
if _QUIET_STATE is not None:
    _set_state, _reset_state = _QUIET_STATE[0].set, _QUIET_STATE[0].reset
    _QUIET_VALUE = _QUIET_STATE[1]


class _Quiet:
    """``np.errstate(all="ignore")`` as two context variable calls: the
    error state's value is made once, not per kernel call (0.4 against
    1.6 us a call, the larger part of a small ufunc's time)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _set_state(_QUIET_VALUE)

    def __exit__(self, *exc: object) -> None:
        _reset_state(self._token)


def quiet(xp: ModuleType) -> contextlib.AbstractContextManager[Any]:
    """numpy's errstate keeping IEEE results (inf, nan) without warnings;
    ONNX defines them. cupy never warns, so it needs none."""
    if xp is not np:
        return contextlib.nullcontext()
    if _QUIET_STATE is None:
        return np.errstate(all="ignore")
    return _Quiet()


def bind_all_finite(a: np.ndarray[Any, Any]) -> Callable[[], bool]:
    """A call that tells whether the float numpy array ``a`` holds no NaN
    and no infinity (at the time of the call).

    Kernels whose matmul multiplies the input by structural zeros (a banded
    matrix, a pooling matrix) ask it, because ``inf * 0`` and ``nan * 0``
    are NaN: a non-finite input would reach outputs it does not feed. They
    take their exact path for such inputs. C-contiguous float32 arrays,
    where numba is installed, take one compiled pass (compiled here, not on
    a run: 1.8 -> 0.5 us for 2048 floats); others ``isfinite(a).all()``
    (faster than a min and a max reduction; ``dot(a, a)`` warns on
    overflow).
    """
    if a.dtype == np.float32 and a.flags.c_contiguous and _jit.available():
        kernel = _jit.compile_kernel(_finite_float32)
        flat = a.reshape(-1)
        _jit.specialise(kernel, (flat,))
        return functools.partial(kernel, flat)
    isfinite = np.isfinite
    return lambda: bool(isfinite(a).all())


def _finite_float32(x: Any) -> bool:  # pragma: no cover - compiled by numba
    """Whether flat float32 ``x`` holds no NaN and no infinity."""
    # x - x is 0 for a finite x and NaN otherwise; an integer OR of the
    # comparisons vectorises (a float reduction would not)
    bad = np.int32(0)
    for i in range(x.size):
        d = x[i] - x[i]
        bad |= np.int32(d != d)
    return bool(bad == 0)


def calculable(a: Array) -> Array:
    """``a``, or for the narrow formats of ``ml_dtypes`` (bfloat16, float8,
    ...), which numpy stores but cannot contract or reduce, ``a`` in
    float32: compute in it and round the result once into the output."""
    if is_extension(a.dtype.name):
        return a.astype(np.float32)
    return a


#: Smaller arrays take numpy's ``maximum`` (a compiled call's own cost).
COMPILED_RELU_MIN = 4096


def relu_in_place(xp: ModuleType, out: Array) -> None:
    """``out = max(out, 0)``, NaN kept as ``maximum`` keeps it:
    one compiled pass where numba is installed (numpy's float32
    ``maximum`` runs at a quarter of ``add``'s speed on the 2-core VM:
    226k floats 84 us against 21; the compiled loop 10)."""
    if (
        xp is np
        and out.size >= COMPILED_RELU_MIN
        and out.dtype in _RELU_DTYPES
        and out.flags.c_contiguous
        and _jit.available()
    ):
        _jit.compile_kernel(_relu_flat)(out.reshape(-1))
    else:
        xp.maximum(out, 0, out=out)


_RELU_DTYPES = _jit.FLOATS


def _relu_flat(a: Any) -> None:  # pragma: no cover - compiled by numba
    # Unsigned index: numba wraps negative signed ones, which stops LLVM
    # vectorising. ``v < 0`` is false for NaN: it is kept.
    for i in range(np.uint64(a.size)):
        v = a[i]
        a[i] = 0 if v < 0 else v


def ints(attrs: Attrs, key: str) -> tuple[int, ...]:
    """A list of integers.

    :raises ValueError: if it is missing or not a list of integers.
    """
    value = attrs.get(key)
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"attribute {key!r} must be a list of integers: {value!r}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ValueError(f"attribute {key!r} must hold integers: {value!r}")
    return tuple(value)


def opt_ints(attrs: Attrs, key: str) -> tuple[int, ...] | None:
    """A list of integers, or ``None`` where the attribute is null."""
    return None if attrs.get(key) is None else ints(attrs, key)


def number(attrs: Attrs, key: str) -> float:
    """A number (int or float; ``"inf"``, ``"-inf"`` or ``"nan"`` for the
    non-finite ones, which JSON cannot spell).

    :raises ValueError: if it is missing or not a number.
    """
    value = attrs.get(key)
    if value in _NON_FINITE:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"attribute {key!r} must be a number: {value!r}")
    return float(value)


def integer(attrs: Attrs, key: str) -> int:
    """An integer.

    :raises ValueError: if it is missing or not an integer.
    """
    value = attrs.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"attribute {key!r} must be an integer: {value!r}")
    return value


def flag(attrs: Attrs, key: str) -> bool:
    """A boolean.

    :raises ValueError: if it is missing or not a boolean.
    """
    value = attrs.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"attribute {key!r} must be true or false: {value!r}")
    return value


def choice(attrs: Attrs, key: str, options: Sequence[str]) -> str:
    """One of ``options``.

    :raises ValueError: if it is missing or not one of them.
    """
    value = attrs.get(key)
    if value not in options:
        raise ValueError(f"attribute {key!r} must be one of {list(options)}: {value!r}")
    return str(value)


def in_turn(calls: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """``calls`` one after another, as one call (the only one, itself):
    a bound kernel's blocks."""
    if len(calls) == 1:
        return calls[0]

    def run() -> None:
        for call in calls:
            call()

    return run
