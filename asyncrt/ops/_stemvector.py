"""A network's stem convolution (one group, few inputs, at most a vector
of outputs: MobileNet's 3 -> 16 channels at stride 2) in explicit LLVM
vectors.

The planar loop (:mod:`asyncrt.ops._depthwise`) computes such a
convolution output plane by output plane, each plane re-reading every
input tap: 16 passes over the taps' phases (about 27 GMAC/s on the 2-core
VM). Here the outputs of one pixel are one vector of
:func:`asyncrt.ops._dwvector.lanes` channels: each output pixel is the
bias plus, per tap, the tap's weights (a vector over the outputs) times
the tap's input value (broadcast), multiplied and added in one step where
the CPU has FMA (``llvm.fmuladd``), then activated in the register (ReLU;
hard-swish over each output row once it is summed, while its cells are in
L1). Interior pixels go a vector of them at a time, tap by tap: each
tap's weights are loaded once for the block's pixels, whose sums stay in
registers (emitted pixel by pixel, with every tap's weights held in
registers beside them, the sums were spilled to the stack: 3 -> 16
channels of 112 x 112, one thread, 188 -> 158 us). The last interior
pixels of a row are a block overlapping the one before where they are at
least half a vector (they went a pixel at a time, with checked taps and
lone stores: 158 -> 122 us, 88 % of the sgemm peak). The blocks' vectors,
transposed in registers, are runs of each output plane, stored straight
into the NCHW output (no channels-last buffer, no copy). Pixels whose
taps reach the pads take a checked variant (taps outside the input add
zero) that stores each channel alone.

Results: within float32 rounding of the other convolution paths (the
products fused with their sums where the CPU has FMA; the taps in order
input channel, row, column).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _jitmath, _team_parts
from ._common import Array
from ._conv_epilogue import ACTIVATIONS, split_activation
from ._vector_ir import compile_vectors

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

_SOURCE = (
    "\n".join(_jitmath.head()[1:])
    + """
CIN, KH, KW, SH, SW, DH, DW, LANES = {geometry}
ACTIVATION = "{activation}"
AFTER = "{after}"  # hard-swish over each output row once it is summed


class _Stem:
    # IR for one call: the weights and bias loaded, the rows of the taps
    def __init__(self, context, builder, signature, args):
        e = self.e = _Emit(context, builder, LANES)
        self.b = builder
        self.x, taps, shift, self.out = e.arrays(signature, args, 4)
        self.taps = taps
        self.n, self.i, self.j0, self.j1, top, self.left = args[4:]
        _, self.channels, self.height, self.width = cgutils.unpack_tuple(
            builder, self.x.shape, 4
        )
        self.out_w = cgutils.unpack_tuple(builder, self.out.shape, 4)[3]
        vector = e.vector
        self.fused = builder.module.declare_intrinsic(
            f"llvm.fmuladd.v{LANES}f32", (), ir.FunctionType(vector, [vector] * 3)
        )
        self.weights = [e.load(taps, e.const(t * LANES)) for t in range(CIN * KH * KW)]
        self.start = e.load(shift, e.const(0))
        self.rows = [
            builder.sub(e.index((self.i, e.const(SH)), e.const(a * DH)), top)
            for a in range(KH)
        ]

    def pixel(self, j, checked):
        # the activated vector of out[n, :, i, j]: the bias, then each tap's
        # weights times its input value (broadcast), taps outside x zero
        e, b = self.e, self.b
        zero = ir.Constant(ir.FloatType(), 0.0)
        undefined = ir.Constant(e.vector, ir.Undefined)
        spread = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        first_lane = ir.Constant(ir.IntType(32), 0)
        total = self.start
        t = 0
        for ci in range(CIN):
            plane = e.index((self.n, self.channels), e.const(ci))
            for a in range(KH):
                row = self.rows[a]
                for tap in range(KW):
                    col = b.sub(e.index((j, e.const(SW)), e.const(tap * DW)), self.left)
                    if checked:
                        inside = b.and_(
                            b.and_(
                                b.icmp_signed(">=", row, e.const(0)),
                                b.icmp_signed("<", row, self.height),
                            ),
                            b.and_(
                                b.icmp_signed(">=", col, e.const(0)),
                                b.icmp_signed("<", col, self.width),
                            ),
                        )
                        r = b.select(inside, row, e.const(0))
                        c = b.select(inside, col, e.const(0))
                    else:
                        r, c = row, col
                    at = e.index((e.index((plane, self.height), r), self.width), c)
                    value = b.load(b.gep(self.x.data, [at]), align=4)
                    if checked:
                        value = b.select(inside, value, zero)
                    lane = b.insert_element(undefined, value, first_lane)
                    broadcast = b.shuffle_vector(lane, undefined, spread)
                    total = b.call(self.fused, [self.weights[t], broadcast, total])
                    t += 1
        return e.activate(total, ACTIVATION)

    def block(self, j0):
        # the activated vectors of out[n, :, i, j0:j0 + LANES], every tap
        # inside x: tap by tap, each tap's weights loaded once for the
        # LANES pixels' sums (kept in registers; the weights of all taps
        # beside them would not fit, and their sums were spilled)
        e, b = self.e, self.b
        totals = [self.start] * LANES
        taps = self.taps
        first = b.sub(e.index((j0, e.const(SW))), self.left)  # pixel j0's column
        t = 0
        for ci in range(CIN):
            plane = e.index((self.n, self.channels), e.const(ci))
            for a in range(KH):
                row = e.index((e.index((plane, self.height), self.rows[a]), self.width))
                start = b.gep(self.x.data, [b.add(row, first)])
                for tap in range(KW):
                    weight = e.load(taps, e.const(t * LANES))
                    for p in range(LANES):
                        at = b.gep(start, [e.const(p * SW + tap * DW)])
                        value = b.load(at, align=4)
                        terms = [weight, e.spread(value), totals[p]]
                        totals[p] = b.call(self.fused, terms)
                    t += 1
        return [e.activate(total, ACTIVATION) for total in totals]

    def cell(self, j):
        # the flat index of (i, j) in an output plane
        return self.e.index((self.i, self.out_w), j)


def _typed(x, w, bias, out):
    arrays = ((x, 4), (w, 2), (bias, 1), (out, 4))
    return all(_is_float_array(a, ndim) for a, ndim in arrays)


@intrinsic
def stem_pixels_(typingctx, x, w, bias, out, n, i, j0, j1, top, left):
    # out[n, :, i, j0:j1], a pixel at a time, each output channel stored
    # alone; taps outside x add zero (the pads)
    if not _typed(x, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        stem = _Stem(context, builder, signature, args)
        e = stem.e
        count = builder.sub(stem.j1, stem.j0)
        with cgutils.for_range(builder, count, intp=e.intp) as column:
            j = builder.add(column.index, stem.j0)
            total = stem.pixel(j, checked=True)
            e.store_lanes(total, stem.out, stem.n, e.const(0), stem.cell(j))
        return context.get_dummy_value()

    intp = types.intp
    return types.none(x, w, bias, out, intp, intp, intp, intp, intp, intp), codegen


@intrinsic
def stem_block_(typingctx, x, w, bias, out, n, i, j0, j1, top, left):
    # out[n, :, i, j0:j0 + LANES] (j1 unused), every tap inside x: the
    # pixels' vectors transposed in registers into runs of each channel
    if not _typed(x, w, bias, out):
        return None

    def codegen(context, builder, signature, args):
        stem = _Stem(context, builder, signature, args)
        e = stem.e
        pixels = stem.block(stem.j0)
        e.store_runs(pixels, stem.out, stem.n, e.const(0), stem.cell(stem.j0))
        return context.get_dummy_value()

    intp = types.intp
    return types.none(x, w, bias, out, intp, intp, intp, intp, intp, intp), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, w, bias, out, first, last, top, left):
    # rows first:last of out (N, M, OH, OW) = the stem of x (N, CIN, H, W)
    height, width = x.shape[2], x.shape[3]
    out_w = out.shape[3]
    # interior columns: j * SW - left >= 0 and j * SW + (KW - 1) * DW - left < width
    low = min(out_w, -(-left // SW))
    high = max(low, min(out_w, (width - 1 + left - (KW - 1) * DW) // SW + 1))
    for n in range(x.shape[0]):
        for i in range(first, last):
            r0 = i * SH - top
            if r0 < 0 or r0 + (KH - 1) * DH >= height:
                stem_pixels_(x, w, bias, out, n, i, 0, out_w, top, left)
            else:
                stem_pixels_(x, w, bias, out, n, i, 0, low, top, left)
                j = low
                while j + LANES <= high:
                    stem_block_(x, w, bias, out, n, i, j, j + LANES, top, left)
                    j += LANES
                if 2 * (high - j) >= LANES and high - low >= LANES:
                    # the last interior pixels as a block overlapping the
                    # one before (its pixels stored again, the same
                    # values), not a pixel at a time: the checked taps
                    # and lone stores cost more than the block's repeats
                    stem_block_(x, w, bias, out, n, i, high - LANES, high, top, left)
                    j = high
                stem_pixels_(x, w, bias, out, n, i, j, out_w, top, left)
            if AFTER == "hard_swish":  # (the row's cells still in L1)
                row = np.uint64(i)
                for m in range(np.uint64(out.shape[1])):
                    for q in range(np.uint64(out_w)):
                        out[n, m, row, q] = hswish_(out[n, m, row, q])
"""
)


@functools.cache
def _kernel(
    geometry: tuple[int, ...], activation: str, after: str = "none"
) -> Callable[..., None]:
    """The loop for ``(CIN, KH, KW, SH, SW, DH, DW, LANES)``, ``activation``
    (in the registers) and ``after`` (``"hard_swish"``: over the rows once
    summed), compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_stemvector",
        _SOURCE,
        "kernel",
        geometry=geometry,
        activation=activation,
        after=after,
    )


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
    constant_bias: bool = False,
) -> Callable[[], None]:
    """The convolution ``out (N, M, OH, OW)`` of ``x (N, C, H, W)`` by ``w
    (M, C, KH, KW)`` (:func:`takes`) as a call without arguments, compiled
    now.

    :param begin: the pads before each spatial axis.
    :param constant_weights: ``w``'s values stay as they are while the
        binding lives: its copy as vectors is made once.
    :param constant_bias: so do ``bias``'s (copied once).
    """
    cin = x.shape[1]
    outputs, _, k_h, k_w = w.shape
    out_h = out.shape[2]
    lanes = _dwvector.lanes()
    if outputs > lanes:
        raise ValueError(f"{outputs} outputs: a vector holds {lanes}")
    taps = np.zeros((cin * k_h * k_w, lanes), np.float32)
    weights = w.reshape(outputs, -1).T  # (taps, outputs), input channel first
    shift = np.zeros(lanes, np.float32)
    own_weights, own_bias = taps[:, :outputs], shift[:outputs]
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    # hard-swish is not applied in the registers (split_activation) but by
    # the loop over each output row once summed: the pass's bits
    inside, after = split_activation(out, activation)
    rows_after = "none" if after is None else activation
    loop = _kernel((cin, k_h, k_w, *strides, *dilations, lanes), inside, rows_after)
    work = out.size * cin * k_h * k_w
    shares = _team_parts.shares(out_h, work, MIN_WORK_PER_THREAD)
    compute = _jit.bind_parts(
        loop, (x, taps, shift, out), shares, trailing=begin, work=work
    )
    copyto = np.copyto
    if constant_weights:
        copyto(own_weights, weights)
    if bias is not None and constant_bias:
        copyto(own_bias, bias)
    per_call_bias = None if constant_bias else bias  # copied each call
    if constant_weights and per_call_bias is None:
        return compute  # (nothing to copy first)

    def stem() -> None:
        if not constant_weights:
            copyto(own_weights, weights)  # an input's values change per run
        if per_call_bias is not None:
            copyto(own_bias, per_call_bias)
        compute()

    return stem
