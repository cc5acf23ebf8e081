"""Convolutions of few input channels and many outputs (a network's stem:
RGB in, 32 to 64 channels out) along output rows, in explicit vectors.

im2col makes a column matrix as large as the input times the kernel's taps
(ResNet's 7 x 7 stem: 147 rows of 12544 columns, 7.4 MB) and then a GEMM
of one short dimension; on the 2-core VM it took 2.4-2.5 ms where ONNX
Runtime's direct convolution takes 1.2. Here nothing of that size exists:

* **Phases.** The input is copied once into a zero-padded buffer split by
  column phase (``SW`` phases: a stride-2 stem's even and odd columns), so
  that every tap of every output row is one contiguous vector load, and no
  border needs a check (the pads are zeros in the buffer, as im2col's).
  For ResNet's stem the buffer is 3 x 2 x 229 x 131 floats (0.7 MB); the
  copy is the row chunks' (:func:`asyncrt.ops._row_chunks.split_phases`,
  with rows unsplit), split over the kernel threads by channels.
* **Blocks.** Each call of the compiled block computes a vector of
  :func:`asyncrt.ops._dwvector.lanes` output columns of one output row for
  :data:`CHANNELS` output channels at once: for every tap, one load of the
  input vector and one fused multiply-add per channel with that channel's
  weight spread over the lanes (a broadcast operand), the sums held in
  registers; each channel's vector is then a contiguous run of its output
  row (masked at the row's end), through the activation
  (:data:`asyncrt.ops._conv_epilogue.EXPRESSIONS`: ReLU, hard-swish).

Results: each output is the bias plus its taps in (input channel, kernel
row, kernel column) order, each a fused multiply-add (one rounding): they
differ from im2col's GEMM (blocked sums, in another order) by float32
rounding of the output's magnitude. Pads add zero products. float32, one
group, weights that are parameters (packed once, when the kernel is bound).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import _dwvector, _jit, _row_chunks, _team_parts
from ._common import Array
from ._conv_epilogue import ACTIVATIONS
from ._vector_ir import compile_vectors

__all__ = ("CHANNELS", "MAX_INPUTS", "MAX_TAPS", "MIN_OUTPUTS", "bind", "takes")

#: Output channels a block sums at once: one register each, beside the
#: input vector, and a weight as each multiply-add's broadcast operand.
CHANNELS = 16
#: The most taps (input channels times the kernel's cells) taken: every
#: tap is unrolled in the block's code (ResNet's stem: 147).
MAX_TAPS = 192
#: The most input channels taken: a stem's (RGB, RGBA). Wider inputs make
#: a GEMM of a deeper product, where the packed and Winograd kernels win.
MAX_INPUTS = 4
#: Convolutions of fewer outputs take :mod:`asyncrt.ops._stemvector`
#: (a pixel's outputs in one vector).
MIN_OUTPUTS = 17
#: Multiply-adds each thread of the part pool gets at least before the
#: rows are split over it (the native team's threshold:
#: :data:`asyncrt.ops._team_parts.MIN_TEAM_WORK`).
MIN_WORK_PER_THREAD = 2_000_000

_SOURCE = """
CIN, KH, KW, SH, SW, DH, DW, LANES, CHANNELS = {geometry}
ACTIVATION = "{activation}"


def _typed(phases, w, bias, out):
    arrays = ((phases, 4), (w, 2), (bias, 1), (out, 4))
    return all(_is_float_array(a, ndim) for a, ndim in arrays)


def _emit_block(context, builder, signature, args, masked):
    # out[n, c0:c0 + CHANNELS, i, j0:j0 + LANES] from the phase buffer of
    # image n: the bias, then every tap's fused multiply-add per channel;
    # masked: the columns (lanes) past out's width and channels past its
    # count are not stored
    e = _Emit(context, builder, LANES)
    b = builder
    phases, w, bias, out = e.arrays(signature, args, 4)
    n, i, j0, c0 = args[4:]
    _, planes, rows, columns = cgutils.unpack_tuple(b, phases.shape, 4)
    _, outputs, out_h, out_w = cgutils.unpack_tuple(b, out.shape, 4)
    width = cgutils.unpack_tuple(b, w.shape, 2)[1]  # the channels, padded
    fma = cgutils.get_or_insert_function(
        b.module,
        ir.FunctionType(e.vector, [e.vector] * 3),
        f"llvm.fma.v{LANES}f32",
    )
    # the sums in stack slots, which LLVM keeps in registers across the
    # loop over input channels (its body: a channel's taps, unrolled)
    slots = [
        cgutils.alloca_once_value(
            b, e.spread(b.load(b.gep(bias.data, [b.add(c0, e.const(k))])))
        )
        for k in range(CHANNELS)
    ]
    with cgutils.for_range(b, e.const(CIN), intp=e.intp) as loop:
        ci = loop.index
        totals = [b.load(slot) for slot in slots]
        for a in range(KH):
            row = b.add(e.index((i, e.const(SH))), e.const(a * DH))
            for t in range(KW):
                phase, shift = (t * DW) % SW, (t * DW) // SW
                plane = e.index((n, planes), (ci, e.const(SW)), e.const(phase))
                at = e.index((e.index((plane, rows), row), columns), j0, e.const(shift))
                value = e.load(phases, at)
                tap = e.index((ci, e.const(KH * KW)), e.const(a * KW + t))
                first = e.index((tap, width), c0)
                for k in range(CHANNELS):
                    weight = b.load(b.gep(w.data, [b.add(first, e.const(k))]))
                    totals[k] = b.call(fma, [e.spread(weight), value, totals[k]])
        for slot, total in zip(slots, totals):
            b.store(total, slot)
    totals = [b.load(slot) for slot in slots]
    lanes = e.lanes_between(j0, out_w) if masked else None
    for k in range(CHANNELS):
        channel = b.add(c0, e.const(k))
        cell = e.index((e.index((e.index((n, outputs), channel), out_h), i), out_w), j0)
        value = e.activate(totals[k], ACTIVATION)
        if masked:
            inside = b.icmp_signed("<", channel, outputs)
            with b.if_then(inside):
                e.masked_store(value, out, cell, lanes)
        else:
            e.store(value, out, cell)


def _block(masked):
    # an intrinsic (phases, w, bias, out, n, i, j0, c0): _emit_block's
    # block, masked or whole (every lane and channel inside out)
    def block_(typingctx, phases, w, bias, out, n, i, j0, c0):
        if not _typed(phases, w, bias, out):
            return None

        def codegen(context, builder, signature, args):
            _emit_block(context, builder, signature, args, masked=masked)
            return context.get_dummy_value()

        return types.none(phases, w, bias, out, *[types.intp] * 4), codegen

    return intrinsic(block_)


# a whole block; one at the end of a row or past the last channel
block_, block_masked_ = _block(False), _block(True)


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def sums(phases, w, bias, out, first, last):
    # output rows first:last of every image and channel block
    outputs, out_w = out.shape[1], out.shape[3]
    for n in range(out.shape[0]):
        for i in range(first, last):
            for c0 in range(0, outputs, CHANNELS):
                whole = c0 + CHANNELS <= outputs
                for j0 in range(0, out_w, LANES):
                    if whole and j0 + LANES <= out_w:
                        block_(phases, w, bias, out, n, i, j0, c0)
                    else:
                        block_masked_(phases, w, bias, out, n, i, j0, c0)
"""


def takes(x: Array, w: Array, out: Array, group: int, strides: tuple[int, ...]) -> bool:
    """Whether :func:`bind` computes this convolution: numpy float32, 2-D,
    C-contiguous, one group, at most :data:`MAX_INPUTS` input channels and
    :data:`MAX_TAPS` taps, a kernel larger than 1 x 1, :data:`MIN_OUTPUTS`
    outputs or more, the compiled engine available."""
    return bool(
        isinstance(x, np.ndarray)
        and isinstance(w, np.ndarray)
        and isinstance(out, np.ndarray)
        and x.ndim == w.ndim == out.ndim == 4
        and len(strides) == 2
        and group == 1
        and x.dtype == w.dtype == out.dtype == np.float32
        and all(a.flags.c_contiguous for a in (x, w, out))
        and w.shape[0] >= MIN_OUTPUTS
        and w.shape[1] <= MAX_INPUTS
        and w.shape[2] * w.shape[3] > 1
        and w.shape[1] * w.shape[2] * w.shape[3] <= MAX_TAPS
        and _jit.available()
    )


@functools.cache
def _sums(geometry: tuple[int, ...], activation: str) -> Callable[..., None]:
    """The block loop for ``(CIN, KH, KW, SH, SW, DH, DW, LANES, CHANNELS)``
    and ``activation``, compiled (or loaded from numba's disk cache)."""
    return compile_vectors(
        "asyncrt_stemrows", _SOURCE, "sums", geometry=geometry, activation=activation
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
    """The convolution ``out (N, M, OH, OW)`` of ``x (N, C, H, W)`` by ``w
    (M, C, KH, KW)`` (:func:`takes`; ``w``'s values fixed while the binding
    lives: packed now) as a call without arguments, compiled now.

    :param bias: ``(M,)`` or ``None``; read on every call.
    :param begin: the pads before each spatial axis.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    n, cin = x.shape[:2]
    outputs, _, k_h, k_w = w.shape
    out_h, out_w = out.shape[2:]
    lanes = _dwvector.lanes()
    blocks = -(-outputs // CHANNELS) * CHANNELS
    # the weights as (tap, channel): a tap's channels side by side
    packed = np.zeros((cin * k_h * k_w, blocks), np.float32)
    packed[:, :outputs] = w.reshape(outputs, -1).T
    shift = np.zeros(blocks, np.float32)
    own_bias = shift[:outputs]
    # rows and columns of the phases: as far as the last output's last tap
    # reaches, and a vector past the last output column (whole loads)
    rows = (out_h - 1) * strides[0] + (k_h - 1) * dilations[0] + 1
    reach = -(-((k_w - 1) * dilations[1] + 1) // strides[1])
    columns = -(-out_w // lanes) * lanes + reach
    phases = np.empty((n, cin * strides[1], rows, columns), np.float32)
    geometry = (cin, k_h, k_w, *strides, *dilations, lanes, CHANNELS)
    sums = _sums(geometry, activation)
    work = out.size * cin * k_h * k_w
    # each image's phases: the row chunks' copy, its rows unsplit (a row
    # stride of 1), split over the kernel threads by channels
    split = _row_chunks.phase_splitter(strides[1])
    per_image = phases[0].size
    copies = [
        _jit.bind_parts(
            split,
            (x[i], phases[i].reshape(cin, strides[1], rows, columns)),
            _team_parts.shares(cin, per_image, MIN_WORK_PER_THREAD),
            trailing=(1, strides[1], *begin),
            work=per_image,
        )
        for i in range(n)
    ]
    compute = _jit.bind_parts(
        sums,
        (phases, packed, shift, out),
        _team_parts.shares(out_h, work, MIN_WORK_PER_THREAD),
        work=work,
    )
    copyto = np.copyto

    def stem() -> None:
        if bias is not None:
            copyto(own_bias, bias)
        for copy in copies:
            copy()
        compute()

    return stem
