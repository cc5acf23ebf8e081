"""3 x 3 stride-1 convolution by Winograd's minimal filtering, F(2 x 2, 3 x 3)
and, for float32 with parameters for weights, F(4 x 4, 3 x 3).

Each 2 x 2 tile of the output is ``A^T [(G g G^T) * (B^T d B)] A`` for the
4 x 4 input tile ``d`` under it and the 3 x 3 kernel ``g`` (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016): 16 products a
tile instead of 36. Over all channels that is 16 GEMMs, one per position
of the 4 x 4 transformed tile, ``M[p] (K, tiles) = U[p] (K, C) @ V[p] (C,
tiles)``: 2.25x fewer multiply-adds than im2col's one GEMM, for two passes
over memory (the input transform writes ``V``, the output transform reads
``M`` and writes the output with the bias and ReLU).

* **F(4 x 4, 3 x 3)** (:mod:`asyncrt.ops._winograd4`): the same steps
  over 6 x 6 input tiles, 36 GEMMs of a quarter of im2col's multiply-adds,
  transforms in explicit vectors. Taken where float32 weights are packed
  once and an output row holds a vector of four tiles or more, the last
  maybe cut (:func:`_tile`, :data:`MIN_TILES_4`).
* **Weights packed once.** ``U = G g G^T`` depends on the weights alone.
  Bound to parameters (the dispatcher says which arrays are:
  :class:`~scheduler.dispatch.Bindable`'s ``constant``), they are
  transformed when the kernel is bound and shared by every run context
  bound to the same values (:func:`packed`, keyed by their digest).
  Parameters that are not finite take im2col (the transforms would mix an
  infinity into NaN where a direct sum keeps it). Weights computed by the
  graph are transformed per call, and only where
  that is small beside the convolution (:data:`PER_CALL_MIN_TILES`).
* **Products streamed.** Transformed float32 parameters are packed once
  more for :mod:`asyncrt.ops._panel_conv` (a stack: each position its own
  weights), whose kernel multiplies as the weights stream in. In a model
  the weights come from memory (ResNet-18's, transformed, outgrow the L3
  cache), and BLAS packed each position's weights before multiplying
  them: 256 channels of 14 x 14, two threads, a cold cache, 1.17-1.38 ->
  0.92-1.06 ms; ResNet-18 0.85x -> 0.80x ONNX Runtime's time.
* **Transforms compiled** (:mod:`asyncrt.ops._jit`), split over the
  kernel threads by channels where the convolution is large enough
  (:data:`MIN_WORK_PER_THREAD`); the zero padding is a small plane per
  part, never a padded copy of the input. The output transform is loops of
  one store each, which LLVM vectorises (sixteen stores in one loop it
  leaves scalar: 0.34 against 0.15 ms on 64 channels of 56 x 56). The 16
  planes of ``V`` and ``M`` are spaced a cache line beyond their size: at
  sizes that are multiples of 4 KiB (64 channels of 56 x 56) they would
  share L1 sets, and the transforms measured 3-10x slower.
* **Accuracy.** The transforms add and subtract (``G`` halves), so a
  result differs from im2col's by float32 rounding of the same order as
  BLAS's own summation order (relative to the output's magnitude: about
  5e-7 measured on ResNet-18's layers). A call whose input holds a value
  that is not finite, or of magnitude ``2**(maxexp - 3)`` or more (the
  input transform sums four cells: it could overflow where a direct sum
  does not), takes the exact kernel instead (the input transform notes
  it as it copies), so non-finite values follow im2col's arithmetic.

Measured (2-core AMD EPYC VM, ResNet-18's layers, batch 1, against the
im2col kernel, each alone): 64 channels of 56 x 56 2.0 -> 1.3 ms, 128 of
28 x 28 1.6 -> 1.1, 256 of 14 x 14 1.7 -> 0.9; 512 of 7 x 7 2.3 -> 1.9
alone but no faster inside the model (:data:`MIN_TILES`). The whole model
(``bench/bench_winograd.py``, interleaved in one process): 31.8 -> 25.9 ms.
F(4 x 4, 3 x 3) against F(2 x 2, 3 x 3), alone: 64 channels of 56 x 56
1.40-1.48 -> 0.78-0.82 ms, 128 of 28 x 28 1.16-1.23 -> 0.77-0.81 ms, 64 of
112 x 112 6.7 -> 3.9 ms; 256 of 16 x 16 (16 tiles) 1.28 -> 1.39 ms, slower
(its packed weights, 36 / 9 of the weights, read each call): below
:data:`MIN_TILES_4`. ResNet-18 beside ONNX Runtime: 1.50x -> 1.25x. 256
channels of 14 x 14 (three whole tiles a row and a cut one) at batch 4:
3.46 -> 2.99 ms, batch 8: 7.39 -> 5.93 ms, batch 16: 15.4 -> 12.6 ms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import (
    _common,
    _jit,
    _packed,
    _panel_conv,
    _scratch,
    _team_blas,
    _team_parts,
    _winograd4,
)
from ._common import Array
from ._im2col import CHUNK_BYTES

__all__ = (
    "MIN_CHANNELS",
    "MIN_TILES",
    "PER_CALL_MIN_TILES",
    "bind_winograd",
    "pack",
    "packed",
    "takes",
)

#: Input and output channels at least this many: below, the 16 GEMMs are
#: too small for BLAS to beat im2col's one.
MIN_CHANNELS = 32

#: Each of the 16 GEMMs has at least this many columns (output tiles over
#: the batch): ResNet-18's 7 x 7 layers at batch 1 (16 tiles of 512
#: channels) measured no faster than im2col, their transformed weights
#: (16 MB a layer, 16 / 9 of the weights) read from memory every call.
MIN_TILES = 36

#: Tiles of F(4 x 4, 3 x 3) (over the batch) at least, for it to be
#: chosen over F(2 x 2, 3 x 3).
MIN_TILES_4 = 36

#: Weights that are not parameters are transformed per call, where the
#: GEMMs have at least this many columns: transforming ``K * C`` weights
#: costs about ``K * C`` times 20 ns (128 channels: 0.27 ms), what the
#: smaller GEMMs save on 28 x 28 outputs.
PER_CALL_MIN_TILES = 576

#: Multiply-adds (of the im2col GEMM) each thread gets at least before a
#: transform is split over the part pool's threads, where the native team
#: is not available (:func:`_team_parts.shares`): split at batch 1,
#: ResNet-18's transforms ran slower in the model (the team's threads that
#: just ran the GEMMs still spin on the cores, and a pool thread wakes
#: late). On the team they split: 64 channels of 56 x 56 at F(4 x 4), two
#: threads, input transform 130 -> 78 us, output 55 -> 29, the layer 0.52-0.66
#: -> 0.41 ms.
MIN_WORK_PER_THREAD = 300_000_000

#: Elements between two of the 16 planes of ``V`` and ``M`` beyond a
#: plane's size: a cache line, so planes of 4 KiB multiples fall in
#: different L1 sets.
PLANE_GAP = 16

_DTYPES = _jit.FLOATS


def takes(
    xp: ModuleType,
    x: Array,
    w: Array,
    out: Array,
    group: int,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
) -> bool:
    """Whether this convolution runs by :func:`bind_winograd`: numpy arrays
    of float32 or float64, C-contiguous, a 3 x 3 kernel of stride 1 and no
    dilation over 2-D planes, one group, at least :data:`MIN_CHANNELS`
    channels in and out, with the compiled engine installed."""
    return bool(
        xp is np
        and _jit.available()
        and x.ndim == 4
        and w.shape[2:] == (3, 3)
        and group == 1
        and tuple(strides) == (1, 1)
        and tuple(dilations) == (1, 1)
        and x.dtype in _DTYPES
        and w.dtype == x.dtype
        and out.dtype == x.dtype
        and min(x.shape[1], w.shape[0]) >= MIN_CHANNELS
        and out.shape[2] >= 2
        and out.shape[3] >= 2
        and all(a.flags.c_contiguous for a in (x, w, out))
    )


def pack(w: Array, into: Array | None = None) -> Array:
    """``U = G w G^T`` for every ``(K, C)`` pair of 3 x 3 weights ``w``,
    as ``(16, K, C)`` (position ``4 * a + b`` of the 4 x 4 result first),
    in ``w``'s precision (``G``'s entries are halves: exact scalings).

    :param into: a ``(16, K, C)`` array to write (a new one if ``None``).
    """
    k, c = w.shape[:2]
    u = np.empty((16, k, c), w.dtype) if into is None else into
    g = [[w[:, :, i, j] for j in range(3)] for i in range(3)]

    def transformed(row: list[Array]) -> list[Array]:
        # G v for one column (or row) of three: v0, (v0+v1+v2)/2,
        # (v0-v1+v2)/2, v2.
        outer = row[0] + row[2]
        return [row[0], (outer + row[1]) * 0.5, (outer - row[1]) * 0.5, row[2]]

    rows = [transformed([g[0][j], g[1][j], g[2][j]]) for j in range(3)]  # [j][a]
    for a in range(4):
        for b, value in enumerate(transformed([rows[0][a], rows[1][a], rows[2][a]])):
            u[4 * a + b] = value
    return u


def packed(w: Array, tile: int = 2) -> Array:
    """:func:`pack` of ``w`` (``tile`` 4: :func:`_winograd4.pack`), shared
    with every other binding to weights of the same values (run contexts of
    one executor bind the same parameters: :func:`_packed.shared`)."""
    return _packed.shared(("winograd", tile), w, _winograd4.pack if tile == 4 else pack)


def _panel_weights(w: Array, tile: int) -> Array:
    """The transformed weights of every position packed for
    :mod:`asyncrt.ops._panel_conv` (``(positions, blocks, C, ROWS)``),
    shared by value."""

    def make(weights: Array) -> Array:
        return _panel_conv.pack(
            _winograd4.pack(weights) if tile == 4 else pack(weights)
        )

    return _packed.shared(("winograd-panel", tile), w, make)


def _planes(count: int, rows: int, cols: int, dtype: Any, buffer: Array) -> Array:
    """``(count, rows, cols)`` over ``buffer``, the planes
    :data:`PLANE_GAP` elements apart beyond their size."""
    item = np.dtype(dtype).itemsize
    step = rows * cols + PLANE_GAP
    return np.ndarray(
        (count, rows, cols),
        dtype,
        buffer=buffer,
        strides=(step * item, cols * item, item),
    )


def _tiles_in(  # pragma: no cover - compiled by numba
    x: Any,
    bits: Any,
    plane: Any,
    v: Any,
    large: Any,
    step: int,
    columns: int,
    first: int,
    last: int,
    pad_h: int,
    pad_w: int,
    exponent: int,
    limit: int,
) -> None:
    """``V[p, c, image * tiles + t] = (B^T d B)[p]`` for the input tile
    ``d`` of every output tile ``t``, channels ``first:last``: ``v`` is
    ``V`` flat, plane ``p`` at ``p * step``, row ``c`` at ``c * columns``.
    ``plane`` is this part's zero-bordered padded plane (its interior
    rewritten). ``large[0]`` ends nonzero if an input's exponent bits
    (``bits``, ``x`` viewed as unsigned integers, masked by ``exponent``)
    reach ``limit``: not finite, or large enough for the transforms to
    overflow. Indices are unsigned: numba wraps negative signed ones
    around, which stops LLVM vectorising."""
    images, _, height, width = x.shape
    tiles_h = (plane.shape[0] - 2) // 2
    tiles_w = np.uint64((plane.shape[1] - 2) // 2)
    tiles = np.uint64(tiles_h) * tiles_w
    s = np.uint64(step)
    one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
    seen = 0
    for image in range(images):
        for c in range(first, last):
            for i in range(height):
                row = plane[pad_h + i]
                for j in range(np.uint64(width)):
                    row[np.uint64(pad_w) + j] = x[image, c, i, j]
                    # An integer OR, which LLVM vectorises (a float sum it
                    # may not reorder).
                    seen |= (bits[image, c, i, j] & exponent) >= limit
            for ty in range(tiles_h):
                r0 = plane[2 * ty]
                r1 = plane[2 * ty + 1]
                r2 = plane[2 * ty + 2]
                r3 = plane[2 * ty + 3]
                base = np.uint64(c * columns) + np.uint64(image) * tiles
                base += np.uint64(ty) * tiles_w
                for tx in range(tiles_w):
                    j = two * tx
                    # B^T d: its rows, per column of the tile.
                    a0 = r0[j] - r2[j]
                    a1 = r0[j + one] - r2[j + one]
                    a2 = r0[j + two] - r2[j + two]
                    a3 = r0[j + three] - r2[j + three]
                    b0 = r1[j] + r2[j]
                    b1 = r1[j + one] + r2[j + one]
                    b2 = r1[j + two] + r2[j + two]
                    b3 = r1[j + three] + r2[j + three]
                    c0 = r2[j] - r1[j]
                    c1 = r2[j + one] - r1[j + one]
                    c2 = r2[j + two] - r1[j + two]
                    c3 = r2[j + three] - r1[j + three]
                    d0 = r1[j] - r3[j]
                    d1 = r1[j + one] - r3[j + one]
                    d2 = r1[j + two] - r3[j + two]
                    d3 = r1[j + three] - r3[j + three]
                    t = base + tx
                    # ... then B on the right: the same along each row.
                    v[t] = a0 - a2
                    v[s + t] = a1 + a2
                    v[np.uint64(2) * s + t] = a2 - a1
                    v[np.uint64(3) * s + t] = a1 - a3
                    v[np.uint64(4) * s + t] = b0 - b2
                    v[np.uint64(5) * s + t] = b1 + b2
                    v[np.uint64(6) * s + t] = b2 - b1
                    v[np.uint64(7) * s + t] = b1 - b3
                    v[np.uint64(8) * s + t] = c0 - c2
                    v[np.uint64(9) * s + t] = c1 + c2
                    v[np.uint64(10) * s + t] = c2 - c1
                    v[np.uint64(11) * s + t] = c1 - c3
                    v[np.uint64(12) * s + t] = d0 - d2
                    v[np.uint64(13) * s + t] = d1 + d2
                    v[np.uint64(14) * s + t] = d2 - d1
                    v[np.uint64(15) * s + t] = d1 - d3
    large[0] = seen


def _tiles_out(  # pragma: no cover - compiled by numba
    m: Any,
    step: int,
    columns: int,
    bias: Any,
    out: Any,
    sums: Any,
    lines: Any,
    first: int,
    last: int,
    relu: bool,
) -> None:
    """``out = A^T M A + bias`` (then ReLU, NaN kept as ``np.maximum``
    keeps it) for output channels ``first:last``, ``m`` laid out as
    :func:`_tiles_in`'s ``v``. Each step is a loop over all of an
    image's tiles with one store (LLVM vectorises a loop of one store
    stream; sixteen it leaves scalar): ``sums`` (12 planes of ``tiles``)
    takes ``A^T``'s two row sums of each column, then the four outputs of
    each tile; ``lines`` (two of ``2 * tiles``) interleaves their columns
    into the output's rows (an odd width's last column is cut there)."""
    images, _, height, width = out.shape
    tiles_w = np.uint64((width + 1) // 2)
    tiles = np.uint64((height + 1) // 2) * tiles_w
    s = np.uint64(step)
    one, two = np.uint64(1), np.uint64(2)
    for image in range(images):
        for k in range(first, last):
            shift = bias[k]
            row = np.uint64(k * columns) + np.uint64(image) * tiles
            for b in range(4):
                # A^T on the left: rows 0 + 1 + 2 and 1 - 2 - 3, column b.
                top = np.uint64(b) * tiles
                low = np.uint64(b + 4) * tiles
                m0 = np.uint64(b) * s + row
                m4 = np.uint64(b + 4) * s + row
                m8 = np.uint64(b + 8) * s + row
                m12 = np.uint64(b + 12) * s + row
                for t in range(tiles):
                    sums[top + t] = m[m0 + t] + m[m4 + t] + m[m8 + t]
                for t in range(tiles):
                    sums[low + t] = m[m4 + t] - m[m8 + t] - m[m12 + t]
            for dy in range(2):
                # ... and A on the right: columns 0 + 1 + 2 and 1 - 2 - 3.
                c0 = np.uint64(4 * dy) * tiles
                c1 = c0 + tiles
                c2 = c1 + tiles
                c3 = c2 + tiles
                even = np.uint64(8 + 2 * dy) * tiles
                odd = even + tiles
                for t in range(tiles):
                    o = sums[c0 + t] + sums[c1 + t] + sums[c2 + t] + shift
                    sums[even + t] = (0 if o < 0 else o) if relu else o
                for t in range(tiles):
                    o = sums[c1 + t] - sums[c2 + t] - sums[c3 + t] + shift
                    sums[odd + t] = (0 if o < 0 else o) if relu else o
                line = lines[dy]
                for t in range(tiles):
                    line[two * t] = sums[even + t]
                    line[two * t + one] = sums[odd + t]
            for ty in range((height + 1) // 2):
                i = 2 * ty
                at = two * np.uint64(ty) * tiles_w
                top_line = lines[0]
                for j in range(np.uint64(width)):
                    out[image, k, i, j] = top_line[at + j]
                if i + 1 < height:
                    below = lines[1]
                    for j in range(np.uint64(width)):
                        out[image, k, i + 1, j] = below[at + j]


def _tile(x: Array, bias: Array | None, out: Array, constant_weights: bool) -> int:
    """The output tile's side: 4 (F(4 x 4, 3 x 3), :mod:`._winograd4`) for
    float32 weights packed once, where a row holds a vector of four tiles
    or more (13 outputs wide at least: the last tile may be cut) and the
    batch :data:`MIN_TILES_4` tiles; else 2."""
    n, _, out_h, out_w = out.shape
    tiles = n * -(-out_h // 4) * -(-out_w // 4)
    return (
        4
        if constant_weights
        and x.dtype == np.float32
        and (bias is None or (bias.dtype == np.float32 and bias.flags.c_contiguous))
        and _winograd4.lanes_for(-(-out_w // 4)) >= 4
        and tiles >= MIN_TILES_4
        else 2
    )


def bind_winograd(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    begin: tuple[int, ...],
    *,
    relu: bool,
    constant_weights: bool,
    exact: Callable[[], None],
) -> Callable[[], None] | None:
    """The convolution of :func:`takes`' arrays as a call without
    arguments, or ``None`` where it would not be faster than im2col: too
    few tiles (:data:`MIN_TILES`), or weights that change per call and
    would cost too much to transform (:data:`PER_CALL_MIN_TILES`).

    :param bias: ``(K,)`` or ``None``.
    :param begin: the pads before each spatial axis (those after follow
        from the shapes).
    :param constant_weights: ``w``'s values are fixed for the binding's
        life (a parameter): packed now, once.
    :param exact: computes the same convolution without the transforms,
        for calls whose input is not finite or huge.
    """
    n, c = x.shape[:2]
    k = w.shape[0]
    out_h, out_w = out.shape[2:]
    tile = _tile(x, bias, out, constant_weights)
    tiles_h, tiles_w = -(-out_h // tile), -(-out_w // tile)
    tiles = tiles_h * tiles_w
    if n * tiles < (MIN_TILES if constant_weights else PER_CALL_MIN_TILES):
        return None
    if constant_weights and not np.isfinite(w).all():
        # the transforms would mix an infinity into NaN: im2col's sums
        return None
    positions = (tile + 2) ** 2
    dtype = x.dtype
    per_image = positions * max(c, k) * tiles * dtype.itemsize
    chunk = max(1, min(n, CHUNK_BYTES // per_image))
    columns = chunk * tiles
    v_step, m_step = c * columns + PLANE_GAP, k * columns + PLANE_GAP
    sizes = (positions * v_step, positions * m_step)
    own_u = None if constant_weights else np.empty((positions, k, c), dtype)
    # float32 parameters: the positions' products by the packed kernel, its
    # weights streamed as it multiplies (BLAS packs each position's first:
    # from memory, in a model, before any product)
    panel = (
        _panel_weights(w, tile) if constant_weights and dtype == np.float32 else None
    )
    # (the transformed weights as BLAS takes them, where it multiplies)
    u = own_u if not constant_weights or panel is not None else packed(w, tile)
    shift = np.zeros(k, dtype) if bias is None else bias
    work = n * k * c * 9 * out_h * out_w
    in_shares = _team_parts.shares(c, work, MIN_WORK_PER_THREAD)
    out_shares = _team_parts.shares(k, work, MIN_WORK_PER_THREAD)
    large = np.zeros((len(in_shares), 1), np.int64)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    bits = x.view(unsigned)
    mantissa = np.finfo(dtype).nmant
    exponent = unsigned.type(np.finfo(dtype).maxexp * 2 - 1 << mantissa)
    # Inputs of 2**(maxexp - 3) or more (or not finite) take the exact
    # kernel: F(2 x 2)'s input transform sums four cells, F(4 x 4)'s
    # scales by up to 100 (2**(maxexp - 8)).
    margin = 4 if tile == 2 else 9
    limit = unsigned.type(np.finfo(dtype).maxexp * 2 - margin << mantissa)
    if tile == 4:
        lanes_in = _winograd4.lanes_for(tiles_w)
        lanes_out = _winograd4.lanes_for(out_w // 4)
        narrow = lanes_out < 4  # (14 wide: 3 whole tiles and a cut one)
        if narrow:
            lanes_out = lanes_in
            wholes = np.empty((len(out_shares), 1, 1, 4 * tiles_h, 4 * tiles_w), dtype)
        into, back = _winograd4.transforms(lanes_in, lanes_out, narrow)
        # rows of whole tiles, and a vector's slack past the last column
        plane = (4 * tiles_h + 2, 4 * tiles_w + lanes_in)
        planes = np.zeros((len(in_shares), *plane), dtype)
        out_scratch: tuple[Array, ...] = (wholes,) if narrow else ()
    else:
        into = _jit.compile_kernel(_tiles_in)
        back = _jit.compile_kernel(_tiles_out)
        planes = np.zeros((len(in_shares), 2 * tiles_h + 2, 2 * tiles_w + 2), dtype)
        out_scratch = (
            np.empty((len(out_shares), 12 * tiles), dtype),  # sums
            np.empty((len(out_shares), 2, 2 * tiles), dtype),  # lines
        )
    pad_h, pad_w = begin

    Steps = list[tuple[Callable[[], None], Callable[[], None], Callable[[], None]]]

    def calls(flat: Array) -> Steps:
        """The input transform, the GEMMs and the output transform of each
        chunk of the batch, through ``flat`` scratch."""
        v_flat, m_flat = flat[: sizes[0]], flat[sizes[0] :]
        v_all = _planes(positions, c, columns, dtype, v_flat)
        m_all = _planes(positions, k, columns, dtype, m_flat)
        made: Steps = []
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            images = slice(start, start + size)
            v = v_all[:, :, : size * tiles]
            m = m_all[:, :, : size * tiles]
            transform_in = _jit.bind_parts(
                into,
                (x[images], bits[images], planes, v_flat, large, v_step, columns),
                in_shares,
                per_part=frozenset({2, 4}),
                trailing=(pad_h, pad_w, exponent, limit),
            )
            transform_out = _jit.bind_parts(
                back,
                (m_flat, m_step, columns, shift, out[images], *out_scratch),
                out_shares,
                per_part=frozenset(range(5, 5 + len(out_scratch))),
                trailing=(relu,),
            )
            if panel is not None:
                gemms = _panel_conv.bind_packed(panel, k, v, m)
            elif u is None:  # pragma: no cover - constant weights have u or panel
                raise AssertionError("no weights to multiply")
            elif _team_blas.takes(u, v, m):
                gemms = _team_blas.bind(u, v, m)  # the positions' GEMMs, the team
            else:
                gemms = functools.partial(np.matmul, u, v, out=m)
            made.append((transform_in, gemms, transform_out))
        return made

    def run(steps: Steps) -> None:
        if own_u is not None:
            (_winograd4.pack if tile == 4 else pack)(w, own_u)
        for transform_in, gemms, transform_out in steps:
            transform_in()
            if large.any():
                exact()
                return
            gemms()
            transform_out()

    if sum(sizes) * dtype.itemsize <= _common.BOUND_SCRATCH_BYTES:
        steps = calls(np.empty(sum(sizes), dtype))
        return functools.partial(run, steps)
    cache: list[Any] = [None, []]

    def borrowed() -> None:
        (flat,) = _scratch.borrow(((sum(sizes),),), dtype)
        if cache[0] != flat.ctypes.data:
            cache[:] = [flat.ctypes.data, calls(flat)]
        run(cache[1])

    return borrowed
