"""Depthwise convolution along output rows in explicit vectors, on the NCHW
planes as they are: no layout copies, strides 1 and 2.

The planar loop (:mod:`asyncrt.ops._depthwise`) copies each plane's rows
into a zero-padded buffer by row phase, and at stride 2 sums every column
and keeps every second one (LLVM does not vectorise strided loads): about
4x its floor on MobileNetV3's stride-2 layers. The channels-last vectors
(:mod:`asyncrt.ops._dwvector`) copy the whole input channels-last first,
which costs as much as the sums where a plane is large (16 channels of
112 x 112: 39 of 61 us).

Here a numba intrinsic writes each output row's vector of :func:`lanes`
columns itself, reading the input planes where they are. At stride 1 a
tap is one unaligned load; at stride 2 two loads and one shuffle that
keeps their even lanes (one ``vpermt2ps``), the next tap the odd lanes of
the same loads. An input row under several output rows of a group is read
once for all of them: the loads, not the arithmetic, bound this loop (one
thread: 16 channels of 112 x 112 at stride 2, 68 -> 34 us; 72 of 56 x 56
at stride 2, 85 -> 43; 32 of 112 x 112 at stride 1, 378 -> 191, against
one pair of loads a tap and a row's taps loaded for each output row).
Rows whose taps all lie
inside the input take plain loads and stores, :data:`GROUP` rows at once
(their chains of dependent adds interleaved); rows and columns at the
borders take masked loads (lanes outside the input read as zero, never
touched) and masked stores.

Results: the bias first, then the taps in row-major order, each product
rounded before it is added (no fused multiply-add), pads adding zero
products, the activation (:data:`asyncrt.ops._conv_epilogue.EXPRESSIONS`:
ReLU, hard-swish) applied in the registers: the bits of
:mod:`asyncrt.ops._dwvector`. float32 only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _team_parts
from ._common import Array
from ._conv_epilogue import ACTIVATIONS
from ._vector_ir import compile_vectors

__all__ = ("GROUP", "MIN_WORK_PER_THREAD", "STRIDES", "bind", "takes")

#: Column strides the loads serve: one load a tap, or two and a shuffle.
STRIDES = (1, 2)
#: Output rows summed together where every tap is inside: one row's chain
#: of dependent adds alone leaves the adder waiting on its latency.
GROUP = 4
#: Multiply-adds each thread of the part pool gets at least before the
#: channels are split over it (the native team's threshold:
#: :data:`asyncrt.ops._team_parts.MIN_TEAM_WORK`).
MIN_WORK_PER_THREAD = 2_000_000

_SOURCE = """
KH, KW, SH, SW, DH, DW, LANES = {geometry}
ACTIVATION = "{activation}"
GROUP = 4{group}


class _Plane:
    # IR for one call: channel c of image n, its weights and bias spread
    # over the lanes, the columns j0:j0 + LANES of some output rows
    def __init__(self, context, builder, signature, args):
        e = self.e = _Emit(context, builder, LANES)
        b = self.b = builder
        self.x, w, bias, self.out = e.arrays(signature, args, 4)
        n, c, self.i, self.j0, self.top, self.left = args[4:]
        _, channels, self.height, self.width = cgutils.unpack_tuple(
            b, self.x.shape, 4
        )
        out_h, self.out_w = cgutils.unpack_tuple(b, self.out.shape, 4)[2:]
        first_tap = e.index((c, e.const(KH * KW)))
        self.weights = [
            e.spread(b.load(b.gep(w.data, [b.add(first_tap, e.const(t))])))
            for t in range(KH * KW)
        ]
        self.start = e.spread(b.load(b.gep(bias.data, [c])))
        image = e.index((n, channels), c)
        self.plane = e.index((image, self.height, self.width))
        self.out_plane = e.index((image, out_h, self.out_w))
        lanes = ir.VectorType(ir.IntType(32), LANES)
        self.even = ir.Constant(lanes, [2 * k for k in range(LANES)])
        self.odd = ir.Constant(lanes, [2 * k + 1 for k in range(LANES)])

    def cell(self, i):
        # the flat index of out[n, c, i, j0]
        return self.e.index(self.out_plane, (i, self.out_w), self.j0)

    def sums(self, rows, reach):
        # the activated sums of consecutive output rows `rows` at columns
        # j0:j0 + LANES; reach: what may lie past the input ("": nothing,
        # "columns", "rows": rows and columns), those taps read as zero.
        # Each input row under the group is read once for every output row
        # it serves (stride 2, 3 x 3: 9 rows for 4 outputs, not 12), and
        # each output still adds its taps in row-major order.
        e, b = self.e, self.b
        totals = [self.start] * len(rows)
        readers = {}
        for g in range(len(rows)):
            for a in range(KH):
                readers.setdefault(g * SH + a * DH, []).append((g, a))
        base = b.sub(e.index((rows[0], e.const(SH))), self.top)
        for offset in sorted(readers):
            r = b.add(base, e.const(offset))
            inside = None
            if reach == "rows":
                inside = b.and_(
                    b.icmp_signed(">=", r, e.const(0)),
                    b.icmp_signed("<", r, self.height),
                )
                r = b.select(inside, r, e.const(0))
            taps = self.row_taps(e.index(self.plane, (r, self.width)), reach, inside)
            for g, a in readers[offset]:
                for t in range(KW):
                    product = b.fmul(self.weights[a * KW + t], taps[t])
                    totals[g] = b.fadd(totals[g], product)
        return [e.activate(total, ACTIVATION) for total in totals]

    def row_taps(self, start, reach, row_inside):
        # the KW taps' input vectors of the input row at flat index start.
        # At stride 2 (undilated) taps t and t + 1 are the even and odd
        # lanes of one pair of loads: 4 loads for 3 taps, not 6
        e, b = self.e, self.b
        taps = []
        for t in range(KW):
            if SW == 2 and DW == 1 and t % 2:
                continue  # the odd lanes of tap t - 1's loads
            column = b.sub(e.index((self.j0, e.const(SW)), e.const(t * DW)), self.left)
            at = b.add(start, column)
            vectors = []
            for v in range(SW):
                if not reach:
                    vectors.append(e.load(self.x, b.add(at, e.const(v * LANES))))
                    continue
                mask = e.lanes_between(b.add(column, e.const(v * LANES)), self.width)
                if row_inside is not None:
                    mask = b.select(row_inside, mask, ir.Constant(mask.type, None))
                cell = b.add(at, e.const(v * LANES))
                vectors.append(e.masked_load(self.x, cell, mask))
            if SW == 1:
                taps.append(vectors[0])
                continue
            taps.append(b.shuffle_vector(vectors[0], vectors[1], self.even))
            if DW == 1 and t + 1 < KW:
                taps.append(b.shuffle_vector(vectors[0], vectors[1], self.odd))
        return taps


def _typed(x, w, bias, out):
    arrays = ((x, 4), (w, 4), (bias, 1), (out, 4))
    return all(_is_float_array(a, ndim) for a, ndim in arrays)


def _row_vectors(count, reach):
    # an intrinsic (x, w, bias, out, n, c, i, j0, top, left): out[n, c,
    # i:i + count, j0:j0 + LANES], reach as _Plane.sums has it; where
    # something may reach past x, only the lanes inside out's width stored
    def vectors_(typingctx, x, w, bias, out, n, c, i, j0, top, left):
        if not _typed(x, w, bias, out):
            return None

        def codegen(context, builder, signature, args):
            plane = _Plane(context, builder, signature, args)
            e = plane.e
            rows = [builder.add(plane.i, e.const(g)) for g in range(count)]
            mask = e.lanes_between(plane.j0, plane.out_w) if reach else None
            for i, total in zip(rows, plane.sums(rows, reach)):
                if mask is None:
                    e.store(total, plane.out, plane.cell(i))
                else:
                    e.masked_store(total, plane.out, plane.cell(i), mask)
            return context.get_dummy_value()

        return types.none(x, w, bias, out, *[types.intp] * 6), codegen

    return intrinsic(vectors_)


# GROUP rows every tap inside x; GROUP rows, columns reaching past it; a
# row anywhere
rows_ = _row_vectors(GROUP, "")
rows_masked_ = _row_vectors(GROUP, "columns")
row_edge_ = _row_vectors(1, "rows")


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, w, bias, out, first, last, top, left):
    # channels first:last of out (N, C, OH, OW), depthwise of x (N, C, H, W)
    # and w (C, 1, KH, KW) plus bias (C,)
    height, width = x.shape[2], x.shape[3]
    out_h, out_w = out.shape[2], out.shape[3]
    # rows low:high and columns below high_j read only cells inside x
    low = min(out_h, -(-top // SH))
    high = max(low, min(out_h, (height - 1 + top - (KH - 1) * DH) // SH + 1))
    low_j = -(-left // SW)
    for n in range(x.shape[0]):
        for c in range(first, last):
            for j0 in range(0, out_w, LANES):
                last_read = j0 * SW - left + (KW - 1) * DW + LANES * SW - 1
                whole = j0 + LANES <= out_w
                columns_inside = j0 >= low_j and last_read < width and whole
                i = 0
                while i < out_h:
                    if low <= i and i + GROUP <= high:
                        if columns_inside:
                            rows_(x, w, bias, out, n, c, i, j0, top, left)
                        else:
                            rows_masked_(x, w, bias, out, n, c, i, j0, top, left)
                        i += GROUP
                    else:
                        row_edge_(x, w, bias, out, n, c, i, j0, top, left)
                        i += 1
"""


def takes(x: Array, w: Array, strides: tuple[int, ...]) -> bool:
    """Whether :func:`bind` computes a depthwise convolution of these
    arrays: float32, column stride 1 or 2 (:func:`asyncrt.ops._depthwise.takes`
    checked the rest)."""
    return bool(
        x.dtype == np.float32
        and w.dtype == np.float32
        and strides[1] in STRIDES
        and _jit.available()
    )


@functools.cache
def _kernel(geometry: tuple[int, ...], activation: str) -> Callable[..., None]:
    """The loop for ``(KH, KW, SH, SW, DH, DW, LANES)`` and ``activation``,
    compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_dwrows",
        _SOURCE,
        "kernel",
        geometry=geometry,
        activation=activation,
        group=GROUP,
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
) -> Callable[[], None]:
    """The depthwise convolution ``out (N, C, OH, OW)`` of ``x (N, C, H, W)``
    and ``w (C, 1, KH, KW)`` (all C-contiguous float32) as a call without
    arguments, its loop compiled now, its channels split over the kernel
    threads where the work pays for it.

    :param begin: the pads before each spatial axis.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if strides[1] not in STRIDES:
        raise ValueError(f"column stride {strides[1]}: the loads serve {STRIDES}")
    channels = x.shape[1]
    k_h, k_w = w.shape[2:]
    geometry = (k_h, k_w, *strides, *dilations, _dwvector.lanes())
    kernel = _kernel(geometry, activation)
    shift = np.zeros(channels, np.float32)
    if bias is not None and bias.dtype == np.float32 and bias.flags.c_contiguous:
        shift = bias  # read where it is
    work = out.size * k_h * k_w
    shares = _team_parts.shares(channels, work, MIN_WORK_PER_THREAD)
    compute = _jit.bind_parts(
        kernel, (x, w, shift, out), shares, trailing=begin, work=work
    )
    if bias is None or shift is bias:
        return compute
    copyto, values = np.copyto, bias

    def depthwise() -> None:
        copyto(shift, values)  # (a strided view: its values as they are now)
        compute()

    return depthwise
