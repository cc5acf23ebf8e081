"""``where`` as one compiled select (numba).

numpy's ``where`` and masked ``copyto`` branch on every element: 4-5 ns an
element on random conditions, 8x the bytes floor. A compiled loop selects
without branching (``a if c else b`` vectorises to a blend), bit for bit.

The arrays are seen as ``(slabs, tile)``: the output's trailing axes that
every broadcast input spans make the tile, and each input is read whole
(``x[s, t]``), as one tile repeated over the slabs (``x[t]``: a causal
mask against a batch of attention scores) or as a scalar (``x[0]``).
Other broadcasts, and arrays that are not C-contiguous, take the numpy
kernel.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from . import _jit
from ._kernels import Bindable

__all__ = ("compiled_where",)

Array = Any
Role = Literal["full", "tile", "scalar"]
#: Elements each kernel thread gets at least (as the fused kernels).
MIN_ELEMENTS_PER_THREAD = 1 << 17
#: Elements a tile has at least where no input forces one: short inner
#: loops do not vectorise.
MIN_TILE = 1024
_DTYPES = frozenset({"float32", "float64", "int32", "int64"})
_READS = {"full": "{0}[s, t]", "tile": "{0}[t]", "scalar": "{0}[0]"}


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


def _role(shape: tuple[int, ...], out: tuple[int, ...]) -> Role:
    if math.prod(shape) == 1 and math.prod(out) != 1:
        return "scalar"
    return "full" if tuple(shape) == out else "tile"


def _source(roles: Sequence[Role]) -> str:
    c, a, b = (
        _READS[role].format(name) for role, name in zip(roles, "cab", strict=True)
    )
    return "\n".join(
        [
            "import numba",
            "",
            "@numba.njit(cache=True, nogil=True, error_model='numpy', "
            "boundscheck=False)",
            "def kernel(c, a, b, out, first, last):",
            "    tile = out.shape[1]",
            "    for s in range(first, last):",
            "        for t in range(tile):",
            f"            out[s, t] = {a} if {c} else {b}",
            "",
        ]
    )


def compiled_where(fallback: Callable[..., None]) -> Bindable:
    """``where(cond, a, b, out)`` compiled where numba is installed, the
    arrays C-contiguous, ``a``, ``b`` and ``out`` of one numeric dtype and
    ``cond`` boolean (see the module docstring); ``fallback`` otherwise."""

    def bind(cond: Array, a: Array, b: Array, out: Array) -> Callable[[], None]:
        arrays = (cond, a, b)
        axis = _tile([x.shape for x in arrays], out.shape)
        if (
            axis is None
            or not _jit.available()
            or out.dtype.name not in _DTYPES
            or cond.dtype.name != "bool"
            or a.dtype != out.dtype
            or b.dtype != out.dtype
            or not out.size
            or not all(x.flags.c_contiguous for x in (*arrays, out))
        ):
            return lambda: fallback(cond, a, b, out)
        tile = math.prod(out.shape[axis:])
        slabs = out.size // tile
        roles = [_role(x.shape, out.shape) for x in arrays]
        views = tuple(
            x.reshape(slabs, tile) if role == "full" else x.reshape(-1)
            for x, role in zip(arrays, roles, strict=True)
        )
        text = _source(roles)
        module = "asyncrt_where_" + hashlib.sha256(text.encode()).hexdigest()[:20]
        kernel = _jit.compile_source(module, text, "kernel")
        return _jit.bind_rows(
            kernel,
            (*views, out.reshape(slabs, tile)),
            slabs,
            tile,
            MIN_ELEMENTS_PER_THREAD,
        )

    def call(cond: Array, a: Array, b: Array, out: Array) -> None:
        bind(cond, a, b, out)()

    return Bindable(call, bind)
