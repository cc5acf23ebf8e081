"""Depthwise 2-D convolution as a compiled kernel of its own.

A depthwise convolution (one input and one output channel per group, as
MobileNets and EfficientNets use) has a few multiply-adds per output
element: as a matmul it is a batch of one-row products (im2col copies
``Kh * Kw`` times the input for them), as numpy passes it is two calls per
kernel tap. Compiled loops (:mod:`asyncrt.ops._jit`) do it in one of two
layouts, chosen by the output's width:

* **NCHW planes** (outputs at least :data:`PLANAR_MIN_WIDTH` wide): each
  input plane's rows are copied, by row phase (one phase per row stride),
  into a flat zero-padded buffer, and one generated loop per tap count
  (:func:`_planes_source`) sums every tap of an output in registers, the
  taps unrolled, each reading a contiguous run of its phase; columns are
  summed at stride 1 (a stride-2 output keeps every second one). One long
  contiguous loop per plane, which LLVM vectorises. No layout copies.
  Measured (AMD EPYC VM, one thread): 16 channels of 112 x 112, 3 x 3
  stride 2: 127 us with a loop per tap (248 channels-last), 61 now; 72 of
  56 x 56 stride 2: 173 -> 70 us; 88 of 28 x 28, stride 1: 122 -> 36 us;
  96 of 28 x 28, 5 x 5 stride 2: 184 -> 54 us. float32 at column stride 1
  or 2 takes the planes in explicit row vectors instead
  (:mod:`asyncrt.ops._dwrows`: no copies, no column summed in vain; one
  thread, these shapes: 61-68 -> 52, 69 -> 58-61, 42 -> 29 us; 32 channels
  of 112 x 112 at stride 1 192 -> 136); this loop serves float64, other
  strides, grouped convolutions, stems and pools.
* **Channels-last pixels** (narrower outputs, where rows are too short):
  the input goes channels-last first (one numpy copy, ``(N, H, W, C)``),
  and a loop computes each output pixel's channel vector: the bias, then
  for each tap inside the input (padding is the taps skipped, never a
  padded copy) the tap's weights times the input pixel's channels, added
  in place, the inner loop contiguous over channels. A second copy brings
  the result back to NCHW. Measured (one thread, against im2col): 240
  channels of 14 x 14, 5 x 5: 440 -> 144 us; 576 of 7 x 7: 350 -> 67 us.
  float32 takes this layout in explicit vectors instead
  (:mod:`asyncrt.ops._dwvector`), and outputs up to
  :data:`VECTOR_MAX_WIDTH` wide too (wider for 5 x 5 kernels); this loop
  serves float64.

The same planar loop runs grouped convolutions of small groups (a group's
input channels are more taps) and a network's stem (one group of three
inputs: 3 -> 16 channels at stride 2, 313 -> 257 us on one thread against
the column matrix and GEMM on two), with columns split into phases where
a group has several outputs.

The activation (:mod:`asyncrt.ops._conv_epilogue`: ReLU, hard-swish) is
applied as the planes are copied out, or afterwards in place on the
pixels. Both layouts sum in
the same order (the bias first, then the taps in row-major order; BLAS
sums in an order of its own), so results equal the im2col kernel's within
a few float32 ulps of each output's magnitude. NaN and infinities
propagate as IEEE arithmetic has them (pads are zeros added, or taps
skipped; no structural zeros multiply input cells, as the banded matmul's
do). Work is split over the kernel threads
(:func:`asyncrt.ops._jit.bind_parts`), by output rows or channels, where
it is large enough."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _dwrows, _dwvector, _jit, _jitmath, _team_parts
from ._common import Array
from ._conv_epilogue import (
    EXPRESSIONS,
    bind_bias_activation,
    compiles,
    split_activation,
)
from ._team_parts import SHARES_PER_THREAD

__all__ = (
    "MAX_GROUP_OUTPUTS",
    "MAX_GROUP_TERMS",
    "MAX_STEM_OUTPUTS",
    "MIN_CHANNELS",
    "MIN_WORK_PER_THREAD",
    "PLANAR_MIN_WIDTH",
    "bind_depthwise",
    "bind_grouped",
    "bind_pool",
    "groups",
    "pools",
    "takes",
)

#: Fewer channels than this take the im2col or banded paths where the
#: output is narrower than :data:`PLANAR_MIN_WIDTH`: the channel vectors are
#: too short to pay for the channels-last copies (8 channels of 16 x 16 at
#: batch 32: 292 against 183 us); the planar loop needs no copies.
MIN_CHANNELS = 16

#: Multiply-adds each thread gets at least before a convolution is split
#: over threads: about 100 us of work (a hand-off costs tens of
#: microseconds, and BLAS threads may still be spinning on the cores).
MIN_WORK_PER_THREAD = 2_000_000

#: Outputs at least this wide are computed on the NCHW planes, along their
#: rows (no layout copies); narrower ones channels-last. One thread, 3 x 3
#: unless said: 8 channels of 16 x 16 at batch 2 5.8 us planar against 19.4
#: channels-last (and 17.8 by im2col); 64 of 14 x 14 19.9 against 26.7; 96
#: of 14 x 14, 5 x 5, 50.6 against 54.1; but at width 7, 64 channels 8.6
#: against 6.6 and 576 channels 68.5 against 43.3.
PLANAR_MIN_WIDTH = 8

#: float32 outputs up to this wide (past :data:`PLANAR_MIN_WIDTH`, with
#: :data:`MIN_CHANNELS` or more) go channels-last in vectors
#: (:mod:`asyncrt.ops._dwvector`), and up to :data:`VECTOR_MAX_WIDTH_MANY_TAPS`
#: for kernels of :data:`VECTOR_MIN_TAPS` taps or more (5 x 5). One thread,
#: vectors against the planes: 3 x 3, 128 channels of 20 x 20 41 against
#: 55 us, 240 of 14 x 14 43 against 67; 5 x 5, 144 of 28 x 28 159 against
#: 192, 64 of 56 x 56 at stride 2 31 against 57; but 3 x 3 at width 28 and
#: stride 2 loses (32 channels 46 against 38), and anything at width 32
#: (96 channels, 3 x 3: 86 against 68).
VECTOR_MAX_WIDTH = 20
VECTOR_MAX_WIDTH_MANY_TAPS = 28
VECTOR_MIN_TAPS = 20

#: Taps summed per statement of the planar kernel: one pass over the
#: outputs for a 3 x 3 or 5 x 5 kernel; more taps take more passes.
CHUNK = 25
#: Terms summed one after another in a statement: longer chains wait on
#: each add's latency (27 in a chain: 440 us for a 3 -> 16 channel stem).
CHAIN = 9
#: Strided convolutions with at least this many outputs a group split the
#: columns into phases too, so that no column is summed in vain: each
#: input cell is gathered once at a stride, for every output to use.
PHASED_MIN_OUTPUTS = 2
#: Output cells (rows times the pitch) computed for every output of a group
#: before the next rows: the input rows they read stay in the L1 cache.
TILE_CELLS = 2048
_DTYPES = _jit.FLOATS


def _depthwise_pixels(  # pragma: no cover - compiled by numba
    x: Any,
    w: Any,
    bias: Any,
    out: Any,
    first: int,
    last: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
) -> None:
    """Output rows ``first:last`` of ``out (N, OH, OW, C) = depthwise(x (N,
    H, W, C), w (KH, KW, C)) + bias (C,)``, all channels-last."""
    batch, height, width, channels = x.shape
    out_w = out.shape[2]
    k_h, k_w = w.shape[0], w.shape[1]
    # Plain indices, no views: numba counts every view's references
    # (atomics), which cost more than the arithmetic here (about 20%).
    for n in range(batch):
        for i in range(first, last):
            for j in range(out_w):
                for c in range(channels):
                    out[n, i, j, c] = bias[c]
                for kh in range(k_h):
                    row = i * stride_h - pad_h + kh * dilation_h
                    if row < 0 or row >= height:
                        continue
                    for kw in range(k_w):
                        column = j * stride_w - pad_w + kw * dilation_w
                        if column < 0 or column >= width:
                            continue
                        for c in range(channels):
                            out[n, i, j, c] += w[kh, kw, c] * x[n, row, column, c]


def _planes_source(
    taps: int, columns: str, activation: str, reduce: str = "sum"
) -> str:
    """The planar kernel for ``taps`` terms (kernel taps times input
    channels per group; see :func:`_bind_planes`): ``kernel(x, w, bias,
    out, phases, line, offsets, first, last, stride_h, stride_w, pad_h,
    pad_w, pitch, phase_rows, in_group, out_group)`` computes output
    channels ``first:last`` (a depthwise convolution's group is one channel
    in and one out). A group's ``in_group`` input planes are copied once,
    one after another in ``phases``, for those of its ``out_group`` output
    channels in the range.

    Each input plane's rows are split into their ``stride_h`` phases (the
    rows one output row apart), copied into ``phases`` zero-padded at row
    pitch ``pitch`` (the cells outside the input are zeros, never written
    here). Every tap then reads a contiguous run of one phase at a fixed
    offset (``offsets``) from an output's flat position at that pitch, so
    one loop over a plane's outputs sums every tap in registers (unrolled,
    :data:`CHUNK` to a statement, in chains of :data:`CHAIN`) into ``line``
    and stores once: one long contiguous loop that LLVM vectorises (a loop
    per output row is slower: 14 columns are one vector and a scalar
    remainder). Rows are then copied out of ``line``, through the
    activation (:data:`asyncrt.ops._conv_epilogue.EXPRESSIONS`). A group's
    outputs take turns a few rows at a time (:data:`TILE_CELLS`).

    ``columns`` says how strided columns are read. ``"unit"``: the stride
    is 1. ``"strided"``: columns are summed at stride 1 and every
    ``stride_w``-th is the output; for one output a group (depthwise), this
    beats splitting columns into phases, a strided gather per input cell
    (0.38 ns against 0.08 for a contiguous copy, more than the dropped
    sums); LLVM does not vectorise strided loads of the taps. ``"phased"``:
    columns are split into ``stride_w`` phases too, so no sum is wasted,
    for groups of several outputs (a stem's 16 use each gathered cell).

    ``reduce="max"`` makes the same loop a max pooling: the taps' maximum
    (``max_``: NaN in, NaN out, as ``np.maximum``) instead of the weighted
    sum, over phases padded with -inf (the weights and bias unused).
    """
    statements = []
    for begin in range(0, taps, CHUNK):
        chunk = range(begin, min(begin + CHUNK, taps))
        if reduce == "max":
            value = "line[q]" if begin else f"phases[o{chunk[0]} + q]"
            for t in chunk[0 if begin else 1 :]:
                value = f"max_({value}, phases[o{t} + q])"
        else:
            left = "shift" if begin == 0 else "line[q]"
            # Independent chains of CHAIN terms, added at the end: one
            # chain of 27 adds waits on each add's latency.
            sums = [
                " + ".join(f"w{t} * phases[o{t} + q]" for t in chunk[at : at + CHAIN])
                for at in range(0, len(chunk), CHAIN)
            ]
            sums[0] = f"{left} + {sums[0]}"
            value = " + ".join(f"({terms})" for terms in sums)
        statements += ["for q in range(begin, end):", f"    line[q] = {value}"]
    column = "j * np.uint64(stride_w)" if columns == "strided" else "j"
    result = EXPRESSIONS[activation]
    statements += [
        "for i in range(top, bottom):",
        "    at = np.uint64(i * pitch)",
        "    for j in range(np.uint64(out_w)):",
        f"        v = line[at + {column}]",
        f"        out[n, k, i, j] = {result}",
    ]
    # in locals: LLVM cannot tell that stores to ``out`` leave ``w`` as is
    weights = [] if reduce == "max" else [f"w{t} = w[k, {t}]" for t in range(taps)]
    if columns == "phased":
        # each column phase of the row, a contiguous run of ``phases``
        copy_row = [
            "for e in range(stride_w):",
            "    row = ((b * stride_h + a) * stride_w + e) * phase_size + u * pitch",
            "    low = max(0, (pad_w - e + stride_w - 1) // stride_w)",
            "    high = min(pitch, (width - 1 + pad_w - e) // stride_w + 1)",
            # unsigned, as below: a gather at stride 2 then costs 0.1 ns
            "    into = np.uint64(row + low)",
            "    source = np.uint64(low * stride_w + e - pad_w)",
            "    for v in range(np.uint64(max(0, high - low))):",
            "        phases[into + v] = x[n, c, r, source + v * unsigned_stride_w]",
        ]
    else:
        copy_row = [
            "row = np.uint64((b * stride_h + a) * phase_size + u * pitch + pad_w)",
            "for v in range(used_w):",
            "    phases[row + v] = x[n, c, r, v]",
        ]
    return "\n".join(
        [
            *_jitmath.head(
                _jitmath.SOURCE if reduce == "max" or activation != "none" else ""
            ),
            _jitmath.KERNEL,
            "def kernel(x, w, bias, out, phases, line, offsets, first, last,",
            "           stride_h, stride_w, pad_h, pad_w, pitch, phase_rows,",
            "           in_group, out_group):",
            "    batch, _, height, width = x.shape",
            "    out_h, out_w = out.shape[2], out.shape[3]",
            "    phase_size = phase_rows * pitch",
            "    used_w = np.uint64(max(0, min(width, pitch - pad_w)))",
            # (one output a group reads each input row once anyway)
            f"    tile_rows = max(1, {TILE_CELLS} // pitch)",
            "    tile_rows = out_h if out_group == 1 else tile_rows",
            "    unsigned_stride_w = np.uint64(stride_w)",
            *(f"    o{t} = np.uint64(offsets[{t}])" for t in range(taps)),
            "    for n in range(batch):",
            "        start = first",
            "        while start < last:",
            "            g = start // out_group",
            "            stop = min(last, (g + 1) * out_group)",
            "            for b in range(in_group):",
            "                c = g * in_group + b",
            "                for a in range(stride_h):",
            "                    for u in range(phase_rows):",
            "                        r = u * stride_h + a - pad_h",
            "                        if r < 0 or r >= height:",
            "                            continue",
            *(" " * 24 + text for text in copy_row),
            # a few rows at a time for every output of the group: the
            # phases' rows they read stay in the nearest caches
            "            for top in range(0, out_h, tile_rows):",
            "                bottom = min(out_h, top + tile_rows)",
            # Unsigned indices: numba wraps negative signed ones around,
            # which stops LLVM vectorising (8x).
            "                begin = np.uint64(top * pitch)",
            "                end = np.uint64(bottom * pitch)",
            "                for k in range(start, stop):",
            "                    shift = bias[k]",
            *(" " * 20 + text for text in (*weights, *statements)),
            "            start = stop",
            "",
        ]
    )


def takes(xp: ModuleType, x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether a convolution of these arrays is depthwise and compiles:
    numpy, 2-D, one input and one output channel per group, float32 or
    float64, C-contiguous, at least :data:`MIN_CHANNELS` channels or an
    output :data:`PLANAR_MIN_WIDTH` wide, and the compiled engine
    available."""
    return bool(
        xp is np
        and _jit.available()
        and x.ndim == 4
        and w.ndim == 4
        and x.dtype in _DTYPES
        and x.dtype == w.dtype == out.dtype
        and w.shape[1] == 1
        and w.shape[0] == group == x.shape[1]
        and (x.shape[1] >= MIN_CHANNELS or out.shape[3] >= PLANAR_MIN_WIDTH)
        and all(a.flags.c_contiguous for a in (x, w, out))
    )


#: Grouped convolutions take the planar loop where a group has at most
#: this many input channels times kernel taps (its terms, summed per
#: output in registers) ...
MAX_GROUP_TERMS = 72
#: ... and at most this many output channels: more reuse each input plane
#: enough for the GEMM's register blocking to win. Measured (one thread,
#: batch 1, 3 x 3, against im2col): 128 channels of 28 x 28 in 32 groups
#: 453 -> 183 us, 64 of 56 x 56 in 32 groups 551 -> 171, 256 of 14 x 14
#: in 32 groups 303 -> 168, 240 of 14 x 14 in 120 groups 250 -> 62; with
#: 16 outputs a group 64 -> 128 channels at stride 2 144 -> 163 (a loss).
MAX_GROUP_OUTPUTS = 8
#: A convolution of one group with few inputs (a network's stem: 3 -> 16
#: channels, 3 x 3) takes the planar loop with at most this many outputs:
#: the GEMM's column matrix is as large as the input times the taps, and
#: its copies cost more than the GEMM. One thread, against the GEMM on
#: two: 3 -> 16 channels, 224 x 224 at stride 2, 313 -> 257 us; 8 -> 16 of
#: 56 x 56 at stride 1, 172 -> 132 us; but 3 -> 32 at 224 x 224 403 -> 477.
#: A 1 x 1 kernel of one group is a plain GEMM: the packed one
#: (:mod:`asyncrt.ops._panel_conv`) wins (2 threads: 16 -> 16 channels of
#: 56 x 56 11 against 24 us, 16 -> 24 of 28 x 28 7 against 12).
MAX_STEM_OUTPUTS = 16


def groups(xp: ModuleType, x: Array, w: Array, out: Array, group: int) -> bool:
    """Whether a grouped (not depthwise) convolution, or one of a single
    group with few inputs, compiles on the planar loop: as :func:`pools`
    for the arrays, with small groups (:data:`MAX_GROUP_TERMS` and
    :data:`MAX_GROUP_OUTPUTS`, or :data:`MAX_STEM_OUTPUTS` for one
    group, whose kernel is more than 1 x 1)."""
    outputs = MAX_GROUP_OUTPUTS if group > 1 else MAX_STEM_OUTPUTS
    return bool(
        w.ndim == 4
        and (group > 1 or math.prod(w.shape[2:]) > 1)
        and w.dtype == x.dtype
        and w.flags.c_contiguous
        and math.prod(w.shape[1:]) <= MAX_GROUP_TERMS
        and w.shape[0] // group <= outputs
        and pools(xp, x, out)
    )


def bind_grouped(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    *,
    activation: str = "none",
) -> Callable[[], None]:
    """The grouped convolution of :func:`groups`' arrays as a call without
    arguments: each group's input planes copied once, then each of its
    outputs summed over their every tap in one pass (the depthwise planar
    loop, with a group's input channels as more taps).

    :param bias: ``(M,)`` or ``None``.
    :param begin: the pads before each spatial axis.
    """
    geometry = (*strides, *begin, *dilations)
    return _bind_planes(x, w, bias, out, geometry, activation, group=group)


def bind_depthwise(
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
    """The depthwise convolution of :func:`takes`' arrays as a call without
    arguments (compiled on the first binding of a process): its
    channels-last buffers made once.

    :param bias: ``(C,)`` or ``None``.
    :param begin: the pads before each spatial axis (those after follow
        from the shapes).
    :param constant_weights: ``w``'s values stay as they are while the
        binding lives (parameters): the channels-last copy of the weights
        is made once, not per call.
    :param constant_bias: so do ``bias``'s.
    """
    vectors = _dwvector.takes(x, w)
    if out.shape[3] >= PLANAR_MIN_WIDTH and not (vectors and _vectors_win(w, out)):
        if _dwrows.takes(x, w, strides):
            return _dwrows.bind(
                x, w, bias, out, strides, begin, dilations, activation=activation
            )
        geometry = (*strides, *begin, *dilations)
        return _bind_planes(x, w, bias, out, geometry, activation)
    if vectors:
        return _dwvector.bind(
            x,
            w,
            bias,
            out,
            strides,
            begin,
            dilations,
            activation=activation,
            constant_weights=constant_weights,
            constant_bias=constant_bias,
        )
    kernel = _jit.compile_kernel(_depthwise_pixels)
    n, channels = x.shape[:2]
    out_h, out_w = out.shape[2:]
    pixels = np.empty((n, *x.shape[2:], channels), x.dtype)
    result = np.empty((n, out_h, out_w, channels), x.dtype)
    taps = np.empty((*w.shape[2:], channels), x.dtype)
    shift = np.zeros(channels, x.dtype) if bias is None else bias
    source, weights = x.transpose(0, 2, 3, 1), w[:, 0].transpose(1, 2, 0)
    planar = result.transpose(0, 3, 1, 2)
    geometry = (*strides, *begin, *dilations)
    compute = _jit.bind_parts(
        kernel,
        (pixels, taps, shift, result),
        _shares(out, w, out_h),
        trailing=geometry,
        work=out.size * math.prod(w.shape[1:]),
    )
    copyto = np.copyto
    activate = bind_bias_activation(np, out, None, out, activation)

    if constant_weights:
        copyto(taps, weights)

    def depthwise() -> None:
        if not constant_weights:
            copyto(taps, weights)  # an input's values change per run
        copyto(pixels, source)
        compute()
        copyto(out, planar)
        activate()

    return depthwise


def _bind_planes(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    geometry: tuple[int, ...],
    activation: str,
    reduce: str = "sum",
    group: int | None = None,
) -> Callable[[], None]:
    """:func:`bind_depthwise` on the NCHW planes (no layout copies), by the
    kernel of :func:`_planes_source` for this many taps (``w`` of shape
    ``(M, C / group, Kh, Kw)``, ``group`` by default the channels: one
    each; with ``reduce="max"`` only its shape counts)."""
    channels = x.shape[1]
    group = channels if group is None else group
    in_group, out_group = channels // group, w.shape[0] // group
    k_h, k_w = w.shape[2:]
    stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w = geometry
    out_h, out_w = out.shape[2:]
    # Rows are split into phases (an output row's taps are rows of the
    # phases below it); columns are summed at stride 1, or split too.
    reach_h, reach_w = (k_h - 1) * dilation_h, (k_w - 1) * dilation_w
    phased = stride_w > 1 and out_group >= PHASED_MIN_OUTPUTS
    column_phases = stride_w if phased else 1
    if phased:
        pitch = out_w + reach_w // stride_w
    else:
        pitch = (out_w - 1) * stride_w + 1 + reach_w
    phase_rows = out_h + reach_h // stride_h
    phase_size = phase_rows * pitch
    # Each input channel of a group has its phases after the previous one's.
    offsets = np.array(
        [
            (
                (b * stride_h + kh * dilation_h % stride_h) * column_phases
                + kw * dilation_w % column_phases
            )
            * phase_size
            + (kh * dilation_h // stride_h) * pitch
            + kw * dilation_w // column_phases
            for b in range(in_group)
            for kh in range(k_h)
            for kw in range(k_w)
        ],
        np.int64,
    )
    columns = "phased" if phased else "unit" if stride_w == 1 else "strided"
    # an activation the loop cannot apply in this dtype follows it, and
    # hard-swish always does (split_activation)
    inside, _ = split_activation(out, activation)
    inside = inside if compiles(inside, x.dtype) else "none"
    text = _planes_source(len(offsets), columns, inside, reduce)
    module = "asyncrt_depthwise_" + hashlib.sha256(text.encode()).hexdigest()[:20]
    kernel = _jit.compile_source(module, text, "kernel")
    taps = w.reshape(w.shape[0], len(offsets))
    shift = np.zeros(w.shape[0], x.dtype) if bias is None else bias
    # each share copies its groups' input planes: a group of many inputs
    # copies them once per share of its outputs
    shares = _shares(out, w, w.shape[0], 1 if in_group > 1 else SHARES_PER_THREAD)
    pad = -np.inf if reduce == "max" else 0  # what a cell outside the input adds
    planes = in_group * stride_h * column_phases
    # The loop also sums the pitch's padding columns of the last row, whose
    # taps reach up to reach_w cells past the last phase: slack, never read
    # for an output.
    phases = np.full((len(shares), planes * phase_size + reach_w), pad, x.dtype)
    lines = np.empty((len(shares), out_h * pitch), x.dtype)
    geometry = (
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        pitch,
        phase_rows,
        in_group,
        out_group,
    )
    planar = _jit.bind_parts(
        kernel,
        (x, taps, shift, out, phases, lines, offsets),
        shares,
        per_part=frozenset({4, 5}),
        trailing=geometry,
        work=out.size * math.prod(w.shape[1:]),
    )
    if inside == activation:
        return planar
    activate = bind_bias_activation(np, out, None, out, activation)

    def then_activation() -> None:
        planar()
        activate()

    return then_activation


def pools(xp: ModuleType, x: Array, out: Array) -> bool:
    """Whether a 2-D pooling (max or average) of these arrays compiles on
    the planar loop: as :func:`takes`, with outputs at least
    :data:`PLANAR_MIN_WIDTH` wide."""
    return bool(
        xp is np
        and _jit.available()
        and x.ndim == 4
        and x.dtype in _DTYPES
        and out.dtype == x.dtype
        and out.shape[3] >= PLANAR_MIN_WIDTH
        and x.flags.c_contiguous
        and out.flags.c_contiguous
    )


def bind_pool(
    x: Array,
    out: Array,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    begin: tuple[int, ...],
    dilations: tuple[int, ...],
    reduce: str,
) -> Callable[[], None]:
    """2-D pooling of :func:`pools`' arrays on the planar loop: each
    window's maximum (``reduce="max"``: pads -inf, NaN propagated as
    ``np.maximum``; the window folds' values but for the sign of equal
    zeros) or its sum (``"sum"``: the depthwise loop with unit weights, pads
    zero; within float32 rounding of the folds, which add in another
    order)."""
    w = np.ones((x.shape[1], 1, *kernel), x.dtype)
    geometry = (*strides, *begin, *dilations)
    return _bind_planes(x, w, None, out, geometry, "none", reduce)


def _vectors_win(w: Array, out: Array) -> bool:
    """Whether outputs wide enough for the planes still go faster in
    vectors (see :data:`VECTOR_MAX_WIDTH`)."""
    many = w.shape[2] * w.shape[3] >= VECTOR_MIN_TAPS
    limit = VECTOR_MAX_WIDTH_MANY_TAPS if many else VECTOR_MAX_WIDTH
    return bool(w.shape[0] >= MIN_CHANNELS and out.shape[3] <= limit)


def _shares(
    out: Array, w: Array, extent: int, per_thread: int = SHARES_PER_THREAD
) -> list[tuple[int, int]]:
    """``range(extent)`` cut into ``(first, last)`` shares over the kernel
    threads the work pays for (:func:`asyncrt.ops._team_parts.shares`)."""
    work = out.size * math.prod(w.shape[1:])
    return _team_parts.shares(extent, work, MIN_WORK_PER_THREAD, per_thread=per_thread)
