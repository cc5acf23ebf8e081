"""A network's stem convolution (one group, few inputs, at most a vector
of outputs: MobileNet's 3 -> 16 channels at stride 2) in explicit LLVM
vectors.

The planar loop (:mod:`asyncrt.ops._depthwise`) computes such a
convolution output plane by output plane, each plane re-reading every
input tap: 16 passes over the taps' phases (about 27 GMAC/s on the 2-core
VM). Here the outputs of one pixel are one vector of
:func:`asyncrt.ops._dwvector.lanes` channels: each tap's weights (a
vector over the outputs) stay in registers, and each output pixel is the
bias plus, per tap, that vector times the tap's input value (broadcast),
multiplied and added in one step where the CPU has FMA
(``llvm.fmuladd``). Interior pixels read their taps without checks; rows
and columns at the pads take a checked variant (taps outside the input
add zero). The result, channels-last, goes back to NCHW by the
depthwise module's tile copies, and the activation (ReLU, hard-swish)
follows in place.

Results: within float32 rounding of the other convolution paths (the
products fused with their sums where the CPU has FMA; the taps in order
input channel, row, column).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np

from ..runtime import _threads
from . import _dwvector, _jit, _scratch
from ._common import Array
from ._conv_epilogue import bind_bias_activation
from ._vector_ir import PREAMBLE

__all__ = ("MAX_TAPS", "MIN_PIXELS", "MIN_WORK_PER_THREAD", "bind", "takes")

#: Taps (input channels times kernel cells) at most: their weight vectors
#: stay in registers (32 on AVX-512; a 3 x 3 stem on RGB has 27).
MAX_TAPS = 32
#: Output pixels at least: a small image's pad rows and columns (the
#: checked taps) are too large a share (3 -> 16 channels of 17 x 23: 18 us
#: against the planar loop's 22, but 5 of 15 x 15 7 against 5; of 112 x
#: 112, 166 against 261).
MIN_PIXELS = 4096
#: Multiply-adds each kernel thread gets at least before the rows are split.
MIN_WORK_PER_THREAD = 2_000_000
_FLOAT32 = np.dtype(np.float32)

_SOURCE = (
    PREAMBLE
    + """
CIN, KH, KW, SH, SW, DH, DW, LANES = {geometry}


def _stem_pixels(context, builder, signature, args, checked):
    # result[n, i, j, :LANES] for j in j0:j1 (one row): the bias, then
    # each tap's weight vector times its input value
    e = _Emit(context, builder, LANES)
    x, taps, shift, result = e.arrays(signature, args, 4)
    n, i, j0, j1, top, left = args[4:]
    _, channels, height, width = cgutils.unpack_tuple(builder, x.shape, 4)
    _, out_h, out_w, stride = cgutils.unpack_tuple(builder, result.shape, 4)
    f32 = ir.FloatType()
    vector = e.vector
    fused = builder.module.declare_intrinsic(
        f"llvm.fmuladd.v{LANES}f32", (), ir.FunctionType(vector, [vector] * 3)
    )
    weights = [
        e.load(taps, e.const(t * LANES)) for t in range(CIN * KH * KW)
    ]
    start = e.load(shift, e.const(0))
    zero = ir.Constant(f32, 0.0)
    broadcast = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    undefined = ir.Constant(vector, ir.Undefined)
    first_lane = ir.Constant(ir.IntType(32), 0)
    rows = [
        builder.sub(e.index((i, e.const(SH)), e.const(a * DH)), top) for a in range(KH)
    ]
    with cgutils.for_range(builder, builder.sub(j1, j0), intp=e.intp) as column:
        j = builder.add(column.index, j0)
        total = start
        t = 0
        for ci in range(CIN):
            plane = e.index((n, channels), e.const(ci))
            for a in range(KH):
                row = rows[a]
                for b in range(KW):
                    col = builder.sub(e.index((j, e.const(SW)), e.const(b * DW)), left)
                    if checked:
                        inside = builder.and_(
                            builder.and_(
                                builder.icmp_signed(">=", row, e.const(0)),
                                builder.icmp_signed("<", row, height),
                            ),
                            builder.and_(
                                builder.icmp_signed(">=", col, e.const(0)),
                                builder.icmp_signed("<", col, width),
                            ),
                        )
                        r = builder.select(inside, row, e.const(0))
                        c = builder.select(inside, col, e.const(0))
                    else:
                        r, c = row, col
                    at = e.index((e.index((plane, height), r), width), c)
                    value = builder.load(builder.gep(x.data, [at]), align=4)
                    if checked:
                        value = builder.select(inside, value, zero)
                    lane = builder.insert_element(undefined, value, first_lane)
                    spread = builder.shuffle_vector(lane, undefined, broadcast)
                    total = builder.call(fused, [weights[t], spread, total])
                    t += 1
        cell = e.index((e.index((n, out_h), i), out_w), j)
        e.store(total, result, e.index((cell, stride)))
    return context.get_dummy_value()


def _typed(x, w, bias, out):
    arrays = ((x, 4), (w, 2), (bias, 1), (out, 4))
    return all(_is_float_array(a, ndim) for a, ndim in arrays)


@intrinsic
def stem_run_(typingctx, x, w, bias, out, n, i, j0, j1, top, left):
    # pixels whose every tap lies inside x: no checks
    if not _typed(x, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        return _stem_pixels(context, builder, signature, args, False)

    intp = types.intp
    return types.none(x, w, bias, out, intp, intp, intp, intp, intp, intp), codegen


@intrinsic
def stem_checked_(typingctx, x, w, bias, out, n, i, j0, j1, top, left):
    # pixels at the pads: taps outside x add zero
    if not _typed(x, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        return _stem_pixels(context, builder, signature, args, True)

    intp = types.intp
    return types.none(x, w, bias, out, intp, intp, intp, intp, intp, intp), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, w, bias, out, first, last, top, left):
    # rows first:last of out (N, OH, OW, LANES) = the stem of x (N, CIN, H, W)
    height, width = x.shape[2], x.shape[3]
    out_w = out.shape[2]
    # interior columns: j * SW - left >= 0 and j * SW + (KW - 1) * DW - left < width
    low = min(out_w, -(-left // SW))
    high = max(low, min(out_w, (width - 1 + left - (KW - 1) * DW) // SW + 1))
    for n in range(x.shape[0]):
        for i in range(first, last):
            r0 = i * SH - top
            if r0 >= 0 and r0 + (KH - 1) * DH < height:
                stem_checked_(x, w, bias, out, n, i, 0, low, top, left)
                stem_run_(x, w, bias, out, n, i, low, high, top, left)
                stem_checked_(x, w, bias, out, n, i, high, out_w, top, left)
            else:
                stem_checked_(x, w, bias, out, n, i, 0, out_w, top, left)
"""
)


@functools.cache
def _kernel(geometry: tuple[int, ...]) -> Callable[..., None]:
    """The loop for ``(CIN, KH, KW, SH, SW, DH, DW, LANES)``, compiled (or
    loaded from numba's disk cache)."""
    text = _SOURCE.replace("{geometry}", ", ".join(map(str, geometry)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    return _jit.compile_source("asyncrt_stemvector_" + digest, text, "kernel")


def takes(x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether :func:`bind` computes this convolution: numpy float32, 2-D,
    C-contiguous, one group, at most a vector of outputs and
    :data:`MAX_TAPS` taps, :data:`MIN_PIXELS` output pixels or more, the
    compiled engine available."""
    return bool(
        isinstance(x, np.ndarray)
        and isinstance(w, np.ndarray)
        and isinstance(out, np.ndarray)
        and x.ndim == w.ndim == out.ndim == 4
        and group == 1
        and x.dtype == w.dtype == out.dtype == np.float32
        and all(a.flags.c_contiguous for a in (x, w, out))
        and w.shape[0] <= _dwvector.lanes()
        and out.shape[2] * out.shape[3] >= MIN_PIXELS
        and w.shape[1] * w.shape[2] * w.shape[3] <= MAX_TAPS
        and _jit.available()
    )


def bind(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
    constant_weights: bool = False,
) -> Callable[[], None]:
    """The convolution ``out (N, M, OH, OW)`` of ``x (N, C, H, W)`` by ``w
    (M, C, KH, KW)`` (:func:`takes`) as a call without arguments, compiled
    now.

    :param begin: the pads before each spatial axis.
    :param constant_weights: ``w``'s values stay as they are while the
        binding lives: its copy as vectors is made once.
    """
    n, cin = x.shape[:2]
    outputs, _, k_h, k_w = w.shape
    out_h, out_w = out.shape[2:]
    lanes = _dwvector.lanes()
    if outputs > lanes:
        raise ValueError(f"{outputs} outputs: a vector holds {lanes}")
    taps = np.zeros((cin * k_h * k_w, lanes), np.float32)
    weights = w.reshape(outputs, -1).T  # (taps, outputs), input channel first
    shift = np.zeros(lanes, np.float32)
    own_weights, own_bias = taps[:, :outputs], shift[:outputs]
    loop = _kernel((cin, k_h, k_w, *strides, *dilations, lanes))
    shape = (n, out_h, out_w, lanes)
    work = out.size * cin * k_h * k_w
    shares = _threads.shares(out_h, work // MIN_WORK_PER_THREAD)
    _jit.specialise(
        loop, (x, taps, shift, np.empty((1, 1, 1, lanes), np.float32), 0, 1, *begin)
    )
    from_pixels = _dwvector.layout_copies()[1]
    _jit.specialise(from_pixels, (np.empty((1, 1, 1, 1), np.float32), out))
    activate = bind_bias_activation(np, out, None, out, activation)
    copyto = np.copyto
    borrowed = _scratch.Borrowed((shape,), _FLOAT32)
    views: list[object] = [None, None]  # the scratch array, the loop bound to it
    if constant_weights:
        copyto(own_weights, weights)

    def stem() -> None:
        if not constant_weights:
            copyto(own_weights, weights)
        if bias is not None:
            copyto(own_bias, bias)
        (result,) = borrowed()
        if views[0] is not result:  # bound again only if the scratch moved
            views[:] = [
                result,
                _jit.bind_parts(loop, (x, taps, shift, result), shares, trailing=begin),
            ]
        compute = views[1]
        compute()  # type: ignore[operator]
        from_pixels(result, out)
        activate()

    return stem
