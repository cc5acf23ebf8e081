"""The transforms of Winograd's F(4 x 4, 3 x 3) in explicit LLVM vectors
(float32; :mod:`asyncrt.ops._winograd` binds them).

F(4 x 4, 3 x 3) computes each 4 x 4 output tile from the 6 x 6 input tile
under it with 36 products a channel pair instead of 144 (F(2 x 2, 3 x 3):
64 for the same 16 outputs): 36 GEMMs of a quarter of the direct
convolution's multiply-adds, over transformed tensors 2.25 floats an
output cell (F(2 x 2): 4), so the transforms move about half the memory.

Vectors run along a row of tiles: lane ``l`` is tile ``t0 + l`` of the
row. A tile's six input columns ``4 t + s`` are, for the lanes, stride-4
runs of the padded plane: four vectors of consecutive columns,
de-interleaved by shuffles into the four column phases, and one more
vector for the two columns past the block (``s = 4, 5``). The output
transform interleaves its 4 x 4 results back into four runs of
consecutive columns a row. A row's last block starts ``LANES`` tiles
before its end (its first tiles computed twice, alike): every load and
store stays inside its row, and a thread never writes a cell of another
thread's channels. Tiles that an output's width cuts take a scalar loop.

Matrices (Lavin and Gray, 2016; interpolation points 0, 1, -1, 2, -2):
``B^T`` rows ``[4, 0, -5, 0, 1, 0]``, ``[0, -4, -4, 1, 1, 0]``, ``[0, 4,
-4, -1, 1, 0]``, ``[0, -2, -1, 2, 1, 0]``, ``[0, 2, -1, -2, 1, 0]``,
``[0, 4, 0, -5, 0, 1]``; ``G`` rows ``[1/4, 0, 0]``, ``[-1/6, -1/6,
-1/6]``, ``[-1/6, 1/6, -1/6]``, ``[1/24, 1/12, 1/6]``, ``[1/24, -1/12,
1/6]``, ``[0, 0, 1]``; ``A^T`` rows ``[1, 1, 1, 1, 1, 0]``, ``[0, 1, -1, 2,
-2, 0]``, ``[0, 1, 1, 4, 4, 0]``, ``[0, 1, -1, 8, -8, 1]``.

Accuracy: the transforms scale by up to 8 and ``G``'s sixths are rounded,
so results differ from a direct sum by about 1e-5 of the output's largest
magnitude (5e-6 measured on 64 channels of 56 x 56 with unit-variance
inputs; F(2 x 2): 5e-7), well inside the 1e-4 the models are held to
against ONNX Runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ._common import Array
from ._vector_ir import compile_vectors

__all__ = ("LANE_CHOICES", "lanes_for", "pack", "transforms")

#: Vector widths, widest first: a row of ``n`` tiles takes the widest that
#: is at most ``n``.
LANE_CHOICES = (16, 8, 4)

_B_T = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    np.float64,
)
_G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ]
)
_A_T = np.array(
    [
        [1, 1, 1, 1, 1, 0],
        [0, 1, -1, 2, -2, 0],
        [0, 1, 1, 4, 4, 0],
        [0, 1, -1, 8, -8, 1],
    ],
    np.float64,
)


def lanes_for(tiles: int) -> int:
    """The widest of :data:`LANE_CHOICES` at most ``tiles``, or 0."""
    return next((lanes for lanes in LANE_CHOICES if lanes <= tiles), 0)


def pack(w: Array, into: Array | None = None) -> Array:
    """``U = G w G^T`` for every ``(K, C)`` pair of 3 x 3 weights ``w``, as
    ``(36, K, C)`` (position ``6 * a + b`` of the 6 x 6 result first),
    computed in float64 and rounded once to ``w``'s precision.

    :param into: a ``(36, K, C)`` array to write (a new one if ``None``).
    """
    k, c = w.shape[:2]
    u = np.einsum("ai,kcij,bj->abkc", _G, w.astype(np.float64), _G)
    if into is None:
        return np.ascontiguousarray(u.reshape(36, k, c), w.dtype)
    into[...] = u.reshape(36, k, c)
    return into


_SOURCE = """
import numpy as np

LANES_IN, LANES_OUT = {lanes}
_TWO, _FOUR, _EIGHT = np.float32(2), np.float32(4), np.float32(8)


def _times(b, v, factor):
    lanes = v.type.count
    return b.fmul(v, ir.Constant(v.type, [ir.Constant(ir.FloatType(), factor)] * lanes))


def _transform_in(b, d):
    # B^T d for one column (or row) of six vectors
    def mul(v, factor):
        return _times(b, v, factor)

    p = b.fsub(d[4], mul(d[2], 4.0))
    q = b.fsub(d[3], mul(d[1], 4.0))
    p2 = b.fsub(d[4], d[2])
    q2 = mul(b.fsub(d[3], d[1]), 2.0)
    return [
        b.fadd(mul(b.fsub(d[0], d[2]), 4.0), p2),
        b.fadd(p, q),
        b.fsub(p, q),
        b.fadd(p2, q2),
        b.fsub(p2, q2),
        b.fadd(mul(b.fsub(d[1], d[3]), 4.0), b.fsub(d[5], d[3])),
    ]


def _transform_out(b, m):
    # A^T m for one column (or row) of six vectors
    def mul(v, factor):
        return _times(b, v, factor)

    a = b.fadd(m[1], m[2])
    c = b.fsub(m[1], m[2])
    s = b.fadd(m[3], m[4])
    t = b.fsub(m[3], m[4])
    return [
        b.fadd(b.fadd(m[0], a), s),
        b.fadd(c, mul(t, 2.0)),
        b.fadd(a, mul(s, 4.0)),
        b.fadd(b.fadd(c, mul(t, 8.0)), m[5]),
    ]


def _halves(b, one, other, lanes, pick):
    # the even (pick 0) or odd (pick 1) lanes of one then other
    masks = ir.VectorType(ir.IntType(32), lanes)
    order = [2 * k + pick for k in range(lanes)]
    return b.shuffle_vector(one, other, ir.Constant(masks, order))


def _zip(b, one, other, lanes, half):
    # lanes one[0], other[0], one[1], ... of the low (half 0) or high half
    masks = ir.VectorType(ir.IntType(32), lanes)
    start = half * lanes // 2
    order = [k // 2 + start + (lanes if k % 2 else 0) for k in range(lanes)]
    return b.shuffle_vector(one, other, ir.Constant(masks, order))


@intrinsic
def in_block_(typingctx, plane, v, row0, col0, at, step):
    # v[(6 p + q) * step + at + l] = (B^T d B)[p, q] of the tile whose
    # input starts at plane[row0, col0 + 4 l], for the LANES_IN lanes l
    if not (_is_float_array(plane, 2) and _is_float_array(v, 1)):
        return None

    def codegen(context, builder, signature, args):
        b = builder
        lanes = LANES_IN
        e = _Emit(context, builder, lanes)
        source, target = e.arrays(signature, args, 2)
        row0, col0, at, step = args[2:]
        cols = cgutils.unpack_tuple(b, source.shape, 2)[1]
        masks = ir.VectorType(ir.IntType(32), lanes)
        shift_0 = ir.Constant(masks, list(range(1, lanes)) + [lanes])
        shift_1 = ir.Constant(masks, list(range(1, lanes)) + [lanes + 1])
        rows = []
        for r in range(6):
            start = e.index((b.add(row0, e.const(r)), cols), col0)
            a = [e.load(source, b.add(start, e.const(k * lanes))) for k in range(5)]
            even_low, odd_low = (_halves(b, a[0], a[1], lanes, p) for p in (0, 1))
            even_high, odd_high = (_halves(b, a[2], a[3], lanes, p) for p in (0, 1))
            phase_0 = _halves(b, even_low, even_high, lanes, 0)
            phase_2 = _halves(b, even_low, even_high, lanes, 1)
            phase_1 = _halves(b, odd_low, odd_high, lanes, 0)
            phase_3 = _halves(b, odd_low, odd_high, lanes, 1)
            # columns 4 (t + 1) and 4 (t + 1) + 1: the phases a lane on
            phase_4 = b.shuffle_vector(phase_0, a[4], shift_0)
            phase_5 = b.shuffle_vector(phase_1, a[4], shift_1)
            d = [phase_0, phase_1, phase_2, phase_3, phase_4, phase_5]
            rows.append(_transform_in(b, d))  # d B along the row
        for q in range(6):
            column = _transform_in(b, [rows[r][q] for r in range(6)])
            for p in range(6):
                e.store(column[p], target, e.index((e.const(6 * p + q), step), at))
        return context.get_dummy_value()

    intp = types.intp
    return types.none(plane, v, intp, intp, intp, intp), codegen


def _out_block(activation):
    @intrinsic
    def out_block_(typingctx, m, out, bias, plane, k, row0, col0, at, step, rows):
        # out[plane, row0 + i, col0 + 4 l + j] for i < rows and the
        # LANES_OUT lanes l: (A^T M A)[i, j] of tile at + l, plus bias[k]
        # and the activation
        arrays = ((m, 1), (out, 4), (bias, 1))
        if not all(_is_float_array(a, ndim) for a, ndim in arrays):
            return None

        def codegen(context, builder, signature, args):
            b = builder
            lanes = LANES_OUT
            e = _Emit(context, builder, lanes)
            source, target, shifts = e.arrays(signature, args, 3)
            plane, channel, row0, col0, at, step, rows = args[3:]
            _, channels, height, width = cgutils.unpack_tuple(b, target.shape, 4)
            shift_at = b.gep(shifts.data, [channel])
            shift = b.load(shift_at)
            undefined = ir.Constant(e.vector, None)
            zero = ir.Constant(ir.IntType(32), 0)
            splat = b.shuffle_vector(
                b.insert_element(undefined, shift, zero),
                undefined,
                ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes),
            )
            columns = []
            for q in range(6):
                m_q = [
                    e.load(source, e.index((e.const(6 * p + q), step), at))
                    for p in range(6)
                ]
                columns.append(_transform_out(b, m_q))  # A^T M, column q
            start = e.index((plane, height, width), (row0, width), col0)
            for i in range(4):
                y = _transform_out(b, [columns[q][i] for q in range(6)])
                y = [e.activate(b.fadd(v, splat), activation) for v in y]
                low_02, high_02 = (_zip(b, y[0], y[2], lanes, h) for h in (0, 1))
                low_13, high_13 = (_zip(b, y[1], y[3], lanes, h) for h in (0, 1))
                runs = [
                    _zip(b, low_02, low_13, lanes, 0),
                    _zip(b, low_02, low_13, lanes, 1),
                    _zip(b, high_02, high_13, lanes, 0),
                    _zip(b, high_02, high_13, lanes, 1),
                ]
                inside = b.icmp_signed("<", e.const(i), rows)
                with b.if_then(inside, likely=True):
                    row = b.add(start, b.mul(e.const(i), width))
                    for k, run in enumerate(runs):
                        e.store(run, target, b.add(row, e.const(k * lanes)))
            return context.get_dummy_value()

        intp = types.intp
        signature = types.none(m, out, bias, *[intp] * 7)
        return signature, codegen

    return out_block_


out_block_none_ = _out_block("none")
out_block_relu_ = _out_block("relu")


@numba.njit(inline="always", error_model="numpy", boundscheck=False)
def _at(m0, m1, m2, m3, m4, m5):
    a = m1 + m2
    c = m1 - m2
    s = m3 + m4
    t = m3 - m4
    # in float32, as out_block_ (a Python int would widen to float64)
    return m0 + a + s, c + t * _TWO, a + s * _FOUR, c + t * _EIGHT + m5


@numba.njit(inline="always", error_model="numpy", boundscheck=False)
def _column(m, at, step, q):
    # A^T M for column q of one tile
    return _at(
        m[q * step + at], m[(6 + q) * step + at], m[(12 + q) * step + at],
        m[(18 + q) * step + at], m[(24 + q) * step + at], m[(30 + q) * step + at],
    )


@numba.njit(error_model="numpy", boundscheck=False)
def out_tile_(m, out, shift, image, k, at, step, row0, col0, relu):
    # one tile, scalar, its cells inside out: out_block_'s arithmetic
    height, width = out.shape[2], out.shape[3]
    c0, c1 = _column(m, at, step, 0), _column(m, at, step, 1)
    c2, c3 = _column(m, at, step, 2), _column(m, at, step, 3)
    c4, c5 = _column(m, at, step, 4), _column(m, at, step, 5)
    for i in range(min(4, height - row0)):
        y = _at(c0[i], c1[i], c2[i], c3[i], c4[i], c5[i])
        for j in range(min(4, width - col0)):
            o = y[j] + shift
            out[image, k, row0 + i, col0 + j] = (0 if o < 0 else o) if relu else o


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def tiles_in(x, bits, plane, v, large, step, columns, first, last, pad_h, pad_w,
             exponent, limit):
    # V of channels first:last (v flat: plane p at p * step, channel c's
    # row at c * columns, image n's tiles from n * tiles): each image's
    # channel copied into this part's zero-bordered plane (its interior),
    # noting in large[0] an input whose exponent bits reach limit
    images, _, height, width = x.shape
    rows, cols = plane.shape
    tiles_h = (rows - 2) // 4
    tiles_w = (cols - LANES_IN) // 4
    tiles = tiles_h * tiles_w
    last_block = tiles_w - LANES_IN
    seen = 0
    for image in range(images):
        for c in range(first, last):
            for i in range(height):
                row = plane[pad_h + i]
                for j in range(np.uint64(width)):
                    row[np.uint64(pad_w) + j] = x[image, c, i, j]
                    seen |= (bits[image, c, i, j] & exponent) >= limit
            base = c * columns + image * tiles
            for ty in range(tiles_h):
                tx = 0
                while tx < tiles_w:
                    t0 = min(tx, last_block)
                    at = base + ty * tiles_w + t0
                    in_block_(plane, v, 4 * ty, 4 * t0, at, step)
                    tx = t0 + LANES_IN
    large[0] = seen


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def tiles_out(m, step, columns, bias, out, first, last, relu):
    # out = A^T M A + bias (then ReLU) for output channels first:last, m
    # laid out as tiles_in's v
    images, channels, height, width = out.shape
    tiles_w = (width + 3) // 4
    tiles = (height + 3) // 4 * tiles_w
    whole = width // 4  # tiles of four columns inside the row
    last_block = whole - LANES_OUT
    for image in range(images):
        for k in range(first, last):
            plane = image * channels + k
            base = k * columns + image * tiles
            for ty in range((height + 3) // 4):
                rows = min(4, height - 4 * ty)
                at = base + ty * tiles_w
                tx = 0
                while tx < whole and last_block >= 0:
                    t0 = min(tx, last_block)
                    cell = (4 * ty, 4 * t0)
                    block = (m, out, bias, plane, k, *cell, at + t0, step, rows)
                    if relu:
                        out_block_relu_(*block)
                    else:
                        out_block_none_(*block)
                    tx = t0 + LANES_OUT
                for t in range(tx, tiles_w):
                    cell = (4 * ty, 4 * t)
                    out_tile_(m, out, bias[k], image, k, at + t, step, *cell, relu)


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def tiles_out_narrow(m, step, columns, bias, out, whole, first, last, relu):
    # tiles_out for rows of fewer than LANES_OUT whole tiles: each plane's
    # tiles, cut ones too, go whole into this part's plane whole (1, 1, 4
    # tiles_h, 4 tiles_w), whose corner is then copied into out
    images, channels, height, width = out.shape
    tiles_h, tiles_w = (height + 3) // 4, (width + 3) // 4
    tiles = tiles_h * tiles_w
    last_block = tiles_w - LANES_OUT
    for image in range(images):
        for k in range(first, last):
            base = k * columns + image * tiles
            for ty in range(tiles_h):
                at = base + ty * tiles_w
                tx = 0
                while tx < tiles_w:
                    t0 = min(tx, last_block)
                    block = (m, whole, bias, 0, k, 4 * ty, 4 * t0, at + t0, step, 4)
                    if relu:
                        out_block_relu_(*block)
                    else:
                        out_block_none_(*block)
                    tx = t0 + LANES_OUT
            for i in range(height):
                for j in range(width):
                    out[image, k, i, j] = whole[0, 0, i, j]
"""


@functools.cache
def transforms(
    lanes_in: int, lanes_out: int, narrow: bool = False
) -> tuple[Callable[..., None], ...]:
    """The input and output transforms' loops for these vector widths,
    compiled (or loaded from numba's disk cache):
    ``tiles_in(x, bits, plane, v, large, step, columns, first, last, pad_h,
    pad_w, exponent, limit)`` and ``tiles_out(m, step, columns, bias, out,
    first, last, relu)``, or with ``narrow`` (rows of fewer than
    ``lanes_out`` whole tiles: ``lanes_out`` counts the cut tile too)
    ``tiles_out_narrow(m, step, columns, bias, out, whole, first, last,
    relu)``, ``whole`` a part's ``(1, 1, 4 tiles_h, 4 tiles_w)`` plane."""
    lanes = (lanes_in, lanes_out)
    out = "tiles_out_narrow" if narrow else "tiles_out"
    return (
        compile_vectors("asyncrt_winograd4", _SOURCE, "tiles_in", lanes=lanes),
        compile_vectors("asyncrt_winograd4", _SOURCE, out, lanes=lanes),
    )
