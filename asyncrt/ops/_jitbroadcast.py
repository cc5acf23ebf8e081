"""Elementwise ops of broadcast arrays as one compiled loop (numba): the
ops numpy runs element by element.

* ``where``: numpy's ``where`` and masked ``copyto`` branch on every
  element, 4-5 ns an element on random conditions (8x the bytes floor); a
  compiled select (``a if c else b``) vectorises to a blend, bit for bit.
* int32 ``trunc_divide`` (ONNX's integer Div), ``floor_divide`` and ``mod``
  (ONNX's integer Mod): numpy's integer division checks signs and overflow
  per element (5.6-7.5 ns); here the quotient is the float64 quotient
  truncated or floored, which is exact for 32-bit integers (its rounding
  error, below ``2**-22 / |b|``, never crosses an integer: the true
  quotient is at least ``1 / |b|`` from the next one), vectorised. As in
  numpy, a zero divisor gives 0 and ``INT_MIN // -1`` wraps to ``INT_MIN``.
* float32 ``fmod`` (ONNX's Mod with ``fmod=1``): numpy calls libm's
  ``fmodf`` per element (15 ns: 27x the bytes floor). Where the quotient
  is below ``2**24`` and the divisor finite, ``a - trunc(a / b) * b`` in
  float64 is the exact remainder (the truncated float64 quotient is the
  true one, as for the integers above, and the product and difference are
  exact), its zero taking ``a``'s sign; a second pass gives the other
  elements (huge quotients, infinities, NaN, zero divisors) to ``fmodf``
  itself. Bit for bit numpy's (checked on 4M random bit patterns, every
  special pair and quotients one ulp from integers).

The arrays are seen as ``(slabs, tile)``: the output's trailing axes that
every broadcast input spans make the tile, and each input is read whole
(``x[s, t]``), as one tile repeated over the slabs (``x[t]``: a causal
mask against a batch of attention scores), as one value a slab (``x[s]``:
a squeeze-excitation's channel scales against the channels' planes) or as
a scalar (``x[0]``).
Other broadcasts, other dtypes and arrays that are not C-contiguous take
the numpy kernel.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from . import _jit, _jitmath
from ._kernels import Bindable

__all__ = (
    "compiled_float32",
    "compiled_fmod",
    "compiled_integer_division",
    "compiled_slab_binary",
    "compiled_where",
)

Array = Any
Role = Literal["full", "tile", "scalar", "slab"]
#: Elements each kernel thread gets at least: 1Mi, as the epilogues',
#: because these ops run right after GEMMs whose BLAS threads still spin
#: (the GPT-2-style decoder's causal Where, 320k elements, split at 128Ki:
#: 250 us a node against 155 unsplit, 2-core VM).
MIN_ELEMENTS_PER_THREAD = 1 << 20
#: Elements a tile has at least where no input forces one: short inner
#: loops do not vectorise.
MIN_TILE = 1024
_READS = {"full": "{0}[s, t]", "tile": "{0}[t]", "scalar": "{0}[0]", "slab": "{0}[s]"}
_NUMERIC = frozenset({"float32", "float64", "int32", "int64"})

#: Integer division by the float64 quotient (see the module docstring):
#: ``_Q`` the divisor with 1 for 0 (selected away after).
_INTEGER_HELPERS = """
@numba.njit(inline="always", error_model="numpy")
def _divisor(b):
    return np.float64(b) if b != 0 else np.float64(1.0)


@numba.njit(inline="always", error_model="numpy")
def trunc_div_(a, b):
    q = np.int32(np.int64(np.trunc(np.float64(a) / _divisor(b))))
    return q if b != 0 else np.int32(0)


@numba.njit(inline="always", error_model="numpy")
def floor_div_(a, b):
    q = np.int32(np.int64(np.floor(np.float64(a) / _divisor(b))))
    return q if b != 0 else np.int32(0)


@numba.njit(inline="always", error_model="numpy")
def floor_mod_(a, b):
    r = np.int32(a - floor_div_(a, b) * b)
    return r if b != 0 else np.int32(0)
"""
_INTEGER_EXPRESSIONS = {
    "trunc_divide": "trunc_div_({0}, {1})",
    "floor_divide": "floor_div_({0}, {1})",
    "mod": "floor_mod_({0}, {1})",
}


def _tile(shapes: Sequence[tuple[int, ...]], out: tuple[int, ...]) -> int | None:
    """The first axis of the tile: every input is whole, a scalar, or
    spans ``out[axis:]`` with ones before (one ``axis`` for all); ``None``
    if there is none."""
    axis = len(out)
    for shape in shapes:
        size = math.prod(shape)
        if size == 1 or tuple(shape) == out:
            continue
        trimmed = list(shape)
        while trimmed and trimmed[0] == 1:
            trimmed.pop(0)
        start = len(out) - len(trimmed)
        if start < 0 or tuple(trimmed) != out[start:]:
            return None
        if axis != len(out) and start != axis:
            return None  # tiles of two lengths
        axis = start
    if axis == len(out):  # whole arrays and scalars: a tile long enough to vectorise
        size = 1
        while axis and size < MIN_TILE:
            axis -= 1
            size *= out[axis]
    return axis


def _slab_axis(shapes: Sequence[tuple[int, ...]], out: tuple[int, ...]) -> int | None:
    """The first axis of the tile where some input spans ``out``'s axes
    before it with ones from it on (a value per slab: a channel's scale,
    ``(N, C, 1, 1)`` against ``(N, C, H, W)``) and every other input is
    whole or a scalar (one ``axis`` for all); ``None`` if there is none."""
    axis = None
    for shape in shapes:
        if math.prod(shape) == 1 or tuple(shape) == out:
            continue
        padded = (1,) * (len(out) - len(shape)) + tuple(shape)
        if len(padded) != len(out):
            return None
        start = len(out)
        while start and padded[start - 1] == 1 and out[start - 1] != 1:
            start -= 1
        if start == len(out) or padded[:start] != out[:start]:
            return None
        if axis is not None and start != axis:
            return None  # slabs of two sizes
        axis = start
    return axis


def _role(shape: tuple[int, ...], out: tuple[int, ...], slabs: bool = False) -> Role:
    if math.prod(shape) == 1 and math.prod(out) != 1:
        return "scalar"
    if tuple(shape) == out:
        return "full"
    return "slab" if slabs else "tile"


def _source(expression: str, roles: Sequence[Role], helpers: str) -> str:
    names = [f"i{k}" for k in range(len(roles))]
    reads = [_READS[role].format(name) for role, name in zip(roles, names, strict=True)]
    return "\n".join(
        [
            *_jitmath.head(helpers),
            _jitmath.KERNEL,
            f"def kernel({', '.join(names)}, out, first, last):",
            "    tile = out.shape[1]",
            "    for s in range(first, last):",
            "        for t in range(tile):",
            f"            out[s, t] = {expression.format(*reads)}",
            "",
        ]
    )


def _compiled(
    expression: str,
    accepts: Callable[..., bool],
    fallback: Callable[..., None],
    helpers: str = "",
) -> Bindable:
    """``expression`` (over ``{0}``, ``{1}``, ...) as the kernel
    ``kernel(*inputs, out)`` where numba is installed, ``accepts(*inputs,
    out)`` and every array is C-contiguous and broadcast as the module
    docstring says; ``fallback`` otherwise."""

    def bind(*arrays: Array) -> Callable[[], None]:
        *inputs, out = arrays
        shapes = [x.shape for x in inputs]
        axis = _tile(shapes, out.shape)
        slabs_axis = None if axis is not None else _slab_axis(shapes, out.shape)
        if axis is None:
            axis = slabs_axis
        if (
            axis is None
            or not out.size
            or not _jit.available()
            or not all(isinstance(x, np.ndarray) for x in arrays)  # not cupy's
            or not accepts(*arrays)
            or not all(x.flags.c_contiguous for x in arrays)
        ):
            if isinstance(fallback, Bindable):
                return fallback.bind(*arrays)
            return functools.partial(fallback, *arrays)
        tile = math.prod(out.shape[axis:])
        slabs = out.size // tile
        roles = [_role(x.shape, out.shape, slabs_axis is not None) for x in inputs]
        views = tuple(
            x.reshape(slabs, tile) if role == "full" else x.reshape(-1)
            for x, role in zip(inputs, roles, strict=True)
        )
        text = _source(expression, roles, helpers)
        module = "asyncrt_elementwise_" + hashlib.sha256(text.encode()).hexdigest()[:20]
        kernel = _jit.compile_source(module, text, "kernel")
        return _jit.bind_rows(
            kernel,
            (*views, out.reshape(slabs, tile)),
            slabs,
            tile,
            MIN_ELEMENTS_PER_THREAD,
        )

    def call(*arrays: Array) -> None:
        bind(*arrays)()

    return Bindable(call, bind)


def compiled_where(fallback: Callable[..., None]) -> Bindable:
    """``where(cond, a, b, out)`` compiled for a boolean ``cond`` and
    ``a``, ``b`` and ``out`` of one numeric dtype; ``fallback`` otherwise."""

    def accepts(cond: Array, a: Array, b: Array, out: Array) -> bool:
        return bool(
            cond.dtype == np.bool_
            and out.dtype.name in _NUMERIC
            and a.dtype == out.dtype
            and b.dtype == out.dtype
        )

    return _compiled("({1} if {0} else {2})", accepts, fallback)


def compiled_integer_division(name: str, fallback: Callable[..., None]) -> Bindable:
    """The int32 kernel ``name(a, b, out)`` (``"trunc_divide"``,
    ``"floor_divide"`` or ``"mod"``) compiled; ``fallback`` for every other
    dtype."""

    def accepts(a: Array, b: Array, out: Array) -> bool:
        return all(x.dtype == np.int32 for x in (a, b, out))

    return _compiled(_INTEGER_EXPRESSIONS[name], accepts, fallback, _INTEGER_HELPERS)


def compiled_float32(expression: str, fallback: Callable[..., None]) -> Bindable:
    """``expression`` (over ``{0}``, ``{1}``, ...; the helpers of
    :mod:`asyncrt.ops._jitmath` in scope) compiled for float32 arrays;
    ``fallback`` for every other dtype."""

    def accepts(*arrays: Array) -> bool:
        return all(x.dtype == np.float32 for x in arrays)

    return _compiled(expression, accepts, fallback, _jitmath.SOURCE)


def compiled_slab_binary(operator: str, fallback: Callable[..., None]) -> Bindable:
    """``a operator b`` for float32 arrays where one of them is a value per
    slab (:func:`_slab_axis`): numpy's broadcast loop over a ``(N, C, 1, 1)``
    scale took 23 us for 72 channels of 28 x 28 (about 5x its bytes floor,
    2-core VM), the compiled one, split on the native team, a few; one IEEE
    operation an element, so bit for bit numpy's. ``fallback`` (the numpy
    ufunc) for every other case."""

    def accepts(*arrays: Array) -> bool:
        *inputs, out = arrays
        return all(x.dtype == np.float32 for x in arrays) and (
            _slab_axis([x.shape for x in inputs], out.shape) is not None
        )

    return _compiled(f"({{0}} {operator} {{1}})", accepts, fallback)


def compiled_fmod(fallback: Callable[..., None]) -> Bindable:
    """``fmod(a, b, out)`` for float32 arrays of one shape (``b`` may be a
    scalar), C-contiguous, compiled (see the module docstring); ``fallback``
    otherwise."""

    def bind(a: Array, b: Array, out: Array) -> Callable[[], None]:
        if not (
            _jit.takes_pair(a, out, "float32", "float32")
            and b.dtype == np.float32
            and (b.shape == out.shape or b.size == 1)
            and b.flags.c_contiguous
        ):
            return lambda: fallback(a, b, out)
        kernel = _jit.compile_kernel(_fmod_rows)
        divisor = b.reshape(-1) if b.shape == out.shape else b.reshape(1)
        return _jit.bind_rows(
            kernel,
            (a.reshape(-1), divisor, out.reshape(-1)),
            out.size,
            1,
            MIN_ELEMENTS_PER_THREAD,
        )

    def call(a: Array, b: Array, out: Array) -> None:
        bind(a, b, out)()

    return Bindable(call, bind)


def _fmod_rows(
    a: Any, b: Any, out: Any, first: int, last: int
) -> None:  # pragma: no cover - compiled by numba
    whole = b.size > 1
    x_all, y_all, r_all = a[first:last], b[first:last] if whole else b, out[first:last]
    slow = 0
    for i in range(np.uint64(last - first)):
        x = np.float64(x_all[i])
        y = np.float64(y_all[i] if whole else y_all[0])
        q = x / y
        r = x - np.trunc(q) * y
        r_all[i] = np.float32(r if r != 0.0 else math.copysign(0.0, x))
        slow += 0 if (abs(q) < 16777216.0 and abs(y) < np.inf) else 1
    if slow:  # quotients past 2**24, infinities, NaN, zero divisors
        for i in range(np.uint64(last - first)):
            x = np.float64(x_all[i])
            y = np.float64(y_all[i] if whole else y_all[0])
            if not (abs(x / y) < 16777216.0 and abs(y) < np.inf):
                r_all[i] = np.fmod(x_all[i], y_all[i] if whole else y_all[0])
