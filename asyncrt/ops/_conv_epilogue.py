"""A convolution's epilogue: the bias and the activation in one pass.

A convolution computed by a GEMM (im2col, the strided copies, the banded
matmul) writes its output without the bias; numpy then adds the bias in one
pass and applies the activation in another (ReLU), or a later node does
(HardSwish, which the ONNX importer now fuses into the Conv as ReLU). With
numba, :func:`add_bias_activation` does both in one compiled loop over the
output while it is in cache: ``out = activation(source + bias)``, the same
float operations in the same order as the numpy passes and the library's
``relu`` and ``hard_swish`` kernels, so the results are the same bits.

Activations (the Conv kernel's ``activation`` attribute):

* ``"none"``;
* ``"relu"``: ``max(v, 0)``, NaN kept (as ``np.maximum``), float32 and
  float64 compiled;
* ``"hard_swish"``: the library's ``hard_swish`` (``v * clip(v / 6 + 0.5,
  0, 1)`` in the array's precision), float32 compiled (its constants are
  float32's).

Other dtypes, layouts the loop does not take (more than two spatial axes,
a bias that is not one value per channel), cupy arrays, or no numba: the
numpy passes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _jit, _jitmath
from ._common import Array, quiet, relu_in_place

__all__ = (
    "ACTIVATIONS",
    "EXPRESSIONS",
    "activate_in_place",
    "add_bias_activation",
    "bind_bias_activation",
    "compiles",
    "split_activation",
    "warm",
)

#: The activations a convolution applies to its output.
ACTIVATIONS = ("none", "relu", "hard_swish")

#: Arrays smaller than this take the numpy passes (a compiled call's own
#: cost, about a microsecond, is more than they save).
COMPILED_MIN = 4096

#: Each activation of a value ``v`` in compiled source (with
#: :data:`asyncrt.ops._jitmath.SOURCE`); ``v < 0`` is false for NaN: kept,
#: as ``np.maximum`` keeps it.
EXPRESSIONS = {"none": "v", "relu": "0 if v < 0 else v", "hard_swish": "hswish_(v)"}
_DTYPES = {
    "none": (np.dtype(np.float32), np.dtype(np.float64)),
    "relu": (np.dtype(np.float32), np.dtype(np.float64)),
    "hard_swish": (np.dtype(np.float32),),
}


def compiles(activation: str, dtype: Any) -> bool:
    """Whether compiled loops apply ``activation`` to arrays of ``dtype``
    (as the library's kernel does)."""
    return np.dtype(dtype) in _DTYPES[activation]


def _source(activation: str, biased: bool) -> str:
    """``kernel(source, bias, out)``: 4-D ``out (N, M, A, B) =
    activation(source + bias[m])`` (``bias`` unread without one). The
    in-place form reads ``out`` itself: LLVM's overlap check, given one
    array as two, would take its scalar loop (62 against 10 us)."""
    value = "source[n, m, a, j] + shift" if biased else "source[n, m, a, j]"
    return "\n".join(
        [
            *_jitmath.head(),
            "@numba.njit(cache=True, nogil=True, error_model='numpy', "
            "boundscheck=False, inline='always')",
            "def apply(source, bias, out):",
            "    batch, channels, rows, columns = out.shape",
            "    for n in range(batch):",
            "        for m in range(channels):",
            "            shift = bias[m]" if biased else "            pass",
            "            for a in range(rows):",
            # unsigned: numba wraps negative signed indices (no vectors)
            "                for j in range(np.uint64(columns)):",
            f"                    v = {value}",
            f"                    out[n, m, a, j] = {EXPRESSIONS[activation]}",
            "",
            "@numba.njit(cache=True, nogil=True, error_model='numpy', "
            "boundscheck=False)",
            "def kernel(source, bias, out):",
            "    apply(source, bias, out)",
            "",
            "@numba.njit(cache=True, nogil=True, error_model='numpy', "
            "boundscheck=False)",
            "def in_place(bias, out):",
            "    apply(out, bias, out)",
            "",
        ]
    )


@functools.cache
def _kernel(activation: str, biased: bool, in_place: bool) -> Callable[..., None]:
    text = _source(activation, biased)
    module = "asyncrt_conv_epilogue_" + hashlib.sha256(text.encode()).hexdigest()[:20]
    return _jit.compile_source(module, text, "in_place" if in_place else "kernel")


def _planes(source: Array, out: Array) -> tuple[Array, Array]:
    """``source`` and ``out`` (of one shape, ``out`` C-contiguous) as 4-D
    views ``(N, M, A, B)`` of one shape: each plane one long row where
    both are C-contiguous."""
    if source.flags.c_contiguous:
        flat = (out.shape[0], out.shape[1], 1, -1)
        return source.reshape(flat), out.reshape(flat)
    if out.ndim == 3:  # (a unit axis is a view of any array)
        return source[:, :, None], out[:, :, None]
    return source, out


def _compiled(
    xp: ModuleType, source: Array, bias: Array | None, out: Array, activation: str
) -> tuple[Callable[..., None], tuple[Array, ...]] | None:
    """The compiled loop and its arguments for these arrays, or ``None``."""
    if (
        xp is not np
        or out.size < COMPILED_MIN
        or not compiles(activation, out.dtype)
        or source.dtype != out.dtype
        or source.shape != out.shape
        or not out.flags.c_contiguous
        or out.ndim not in (3, 4)
        or not _jit.available()
    ):
        return None
    channels = out.shape[1]
    if bias is not None and (
        bias.dtype != out.dtype
        or bias.size != channels
        or bias.ndim != out.ndim
        or bias.shape[1] != channels
    ):
        return None
    planes, into = _planes(source, out)
    # (without a bias, any array of the dtype: the loop does not read it)
    shift = into[0, :, 0, 0] if bias is None else np.ascontiguousarray(bias).ravel()
    if source is out:
        return _kernel(activation, bias is not None, True), (shift, into)
    return _kernel(activation, bias is not None, False), (planes, shift, into)


def add_bias_activation(
    xp: ModuleType,
    source: Array,
    bias: Array | None,
    out: Array,
    activation: str = "none",
) -> None:
    """``out = activation(source + bias)`` (``bias`` shaped to broadcast:
    one value per channel, axis 1; a copy without one, nothing if
    ``source`` is ``out`` and there is no activation)."""
    compiled = _compiled(xp, source, bias, out, activation)
    if compiled is not None:
        kernel, args = compiled
        kernel(*args)
        return
    if bias is not None:
        with quiet(xp):
            xp.add(source, bias, out)
    elif source is not out:
        xp.copyto(out, source)
    activate_in_place(xp, out, activation)


def bind_bias_activation(
    xp: ModuleType,
    source: Array,
    bias: Array | None,
    out: Array,
    activation: str = "none",
) -> Callable[[], None]:
    """:func:`add_bias_activation` of these arrays as a call without
    arguments: which loop, and its views, chosen once (a bound
    convolution's arrays are the same every run)."""
    if bias is None and source is out and activation == "none":
        return _nothing
    compiled = _compiled(xp, source, bias, out, activation)
    if compiled is not None:
        kernel, args = compiled
        return functools.partial(kernel, *args)
    return functools.partial(add_bias_activation, xp, source, bias, out, activation)


def split_activation(
    out: Array, activation: str
) -> tuple[str, Callable[[], None] | None]:
    """The activation a compiled convolution loop applies as it stores its
    sums, and the pass over ``out`` that follows it, if any: hard-swish
    always takes a pass of its own (its four constants, beside a loop's
    weight vectors, overflow the registers; in the loop it cost 3 -> 16
    channels of 112 x 112 278 us against 186, 72 channels of 56 x 56 at
    stride 2 104 against 69, where the pass takes 4-13 us), the same
    operations in the same order, so the same bits."""
    if activation != "hard_swish":
        return activation, None
    return "none", bind_bias_activation(np, out, None, out, activation)


def _nothing() -> None:
    return None


def activate_in_place(xp: ModuleType, out: Array, activation: str) -> None:
    """``out = activation(out)``, as the library's kernel of its name."""
    if activation == "relu":
        relu_in_place(xp, out)
    elif activation == "hard_swish":
        compiled = _compiled(xp, out, None, out, activation)
        if compiled is not None:
            kernel, args = compiled
            kernel(*args)
            return
        # the library's hard_swish, operation for operation
        with quiet(xp):
            ramp = xp.multiply(out, 1 / 6)
            xp.add(ramp, 0.5, ramp)
            xp.clip(ramp, 0, 1, out=ramp)
            xp.multiply(out, ramp, out)


def warm(xp: ModuleType, dtype: Any, activation: str, biased: bool) -> None:
    """Compile the loop for these arguments now, on arrays of both layouts
    (a run should not pay the compiler); nothing where it would not run."""
    if xp is not np or not compiles(activation, dtype) or not _jit.available():
        return
    big = np.zeros((1, 1, 2, COMPILED_MIN), dtype)
    bias = np.zeros((1, 1, 1, 1), dtype) if biased else None
    for source in (big, big[:, :, :, : COMPILED_MIN // 2 + 1]):
        out = np.empty(source.shape, dtype)
        for into in (out, big):  # out of place, and in place
            if _compiled(xp, source, bias, into, activation) is not None:
                add_bias_activation(xp, source, bias, into, activation)
