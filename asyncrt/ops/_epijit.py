"""Compiled row loops for the epilogue ops (numba, where it is installed).

Two loops over a 2-D float32 view, rows ``first:last``, generated as source
with :mod:`asyncrt.ops._jitmath`'s helpers and compiled once per machine
(:func:`asyncrt.ops._jit.compile_source`):

* ``bias_gelu(y, bias, first, last)``: ``y = gelu(y + bias)`` in place, the
  library's exact GELU (``gelu_erf_``): one pass after a GEMM instead of
  six (bias add, divide, erf, add, multiply, multiply).
* ``add_layer_norm(x, r, scale, shift, out, epsilon, first, last)``:
  ``out = layer_norm(x + r)`` over each row, in passes over a row that
  stays in L1 (sum, then centred squares, then the affine map) instead of a
  residual add and six whole-array passes; ``add_layer_norm_sum(..., out,
  total, ...)`` keeps ``x + r`` in ``total`` too (a pre-LN block).
* ``layer_norm(x, scale, shift, out, means, invs, epsilon, first, last)``:
  the layer norm op alone (each row's mean and 1 / std dev kept): 1.1-1.7x
  its bytes floor against 2.2-5x for numpy's seven passes.
* ``instance_norm(x, scale, shift, out, epsilon, channels, first, last)``:
  each row a plane of ``(N * C, H * W)``, its channel's scale and shift.
* ``softmax_rows(x, out, first, last)``: each row's softmax over
  ``_jitmath``'s ``exp_``, by blocks of rows in L1: a block whose values
  all lie within ``NO_SHIFT_BOUND`` takes its exponentials unshifted (one
  vectorised check of the block instead of each row's maximum and
  subtraction, as the numpy passes do); another shifts each row by its
  maximum (an integer maximum of order keys, which vectorises). Rows are
  indexed in two dimensions (a row view costs reference counts). Against
  numpy's six passes, one thread: 1536 elements 5.9 -> 1.9 us, 49Ki 44 ->
  35, 480k (4 x 12 x 100 x 100) 409 -> 392, 1.5M 1342 -> 1175; rows of 16
  then 1.6 -> 1.3 us (1536 elements). NaN in a row, or an infinite
  maximum, makes the row NaN, as the numpy passes do. Each path takes an
  ``exp_`` of its own range: unshifted values are within the bound, so
  ``2^n`` is one normal factor and no clamp is needed
  (``exp_bounded_``: ``exp_``'s bits); shifted ones are at most 0, and
  their exponentials below ``e^-87`` (subnormal in float32) are 0
  (``exp_nonpositive_``, ``exp_``'s bits above; both
  :mod:`asyncrt.ops._jitmath`'s). One thread, against the
  ``exp_`` of every range: rows of 32 to 512, 0.67-0.78x unshifted,
  0.58-0.67x shifted; masked and scaled (shifted a row at a time, the
  exponential in the same loop, from rows of :data:`WIDE`) 0.78-0.85x.
* ``scale_add_softmax_rows(x, scale, mask, mask_rows, out, divide, first,
  last)`` and ``scale_where_softmax_rows(x, scale, cond, cond_rows, fill,
  out, divide, keep, first, last)``: attention's scaled, masked softmax as
  one pass over memory (the scale and mask applied as each row is read,
  the mask's or condition's row for each row given by an index: a
  broadcast mask is not expanded), each row's maximum and the bound's
  check taken as the row is written. Against numpy's scale and mask
  passes before the compiled softmax, bit for bit, one thread, a causal
  mask: 4 x 12 x 100 x 100 563 -> 472 us, 8 x 12 x 128 x 128 1795 -> 1327,
  16 x 12 x 512 x 512 70 -> 50 ms (a third of the memory traffic); with
  the maximum taken as rows are written, 1 x 6 x 16 x 16 2.8 -> 2.1 us,
  2 x 6 x 64 x 64 40 -> 36.
* ``squeeze_excite(x, w1, b1, w2, b2, out, means, hidden, gates, sigmoid,
  alpha, beta, first, last)``: images ``first:last`` of ``(N, C, H * W)``,
  each channel's mean, the two 1 x 1 convolutions' products (ReLU
  between), the gate (``sigmoid``, else hard-sigmoid by ``alpha`` and
  ``beta``) and the image scaled by it, in one call (``means``,
  ``hidden`` and ``gates``: an image's scratch rows);
  ``squeeze_gates(...)`` (the same arguments but ``out``) the gates
  alone, for a convolution that scales its input's rows by them.
* ``row_sums(x, out, divisor, first, last)``: each row's sum over
  ``divisor`` (1 for ReduceSum, the width for ReduceMean), for small
  arrays, whose numpy reduction costs its call (3.5-4.2 us for 16 rows of
  384, 1.1-1.2 compiled); ``row_extremes(x, out, largest, first, last)``
  each row's maximum or minimum, exact (NaN where a row has one), for
  the same arrays (ReduceMax of 16 rows of 384: 2.7 -> 0.8 us).

The row sums are compiled with LLVM's ``reassoc`` flag alone, so they
vectorise (several partial sums, added at the end); no other fast-math flag
(NaN and infinities propagate as in numpy). numpy's row means (a BLAS dot)
sum in another order, so the normalised rows agree with the unfused kernels
to float32 rounding (a few ulps of the result), not bit for bit. At 512 rows
of 384 the loop took 62 us against 148 for eight manual float32 lanes and
about 190 for the unfused add and layer norm (2-core AVX-512 VM).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from . import _jit, _jitmath
from ._common import Array

__all__ = ("MIN_ELEMENTS_PER_THREAD", "bind_rows", "loop")

#: Elements each thread gets at least before a loop is split over threads:
#: 1Mi, eight times the fused kernels' threshold, because these loops run
#: right after a GEMM whose BLAS threads still spin. The MiniLM encoder at
#: batch 32 x sequence 16 (GELU over 786k elements) took 65.7 and 70.5 ms
#: split at 128Ki against 64.8 and 70.0 unsplit, and 159 against 133 ms
#: with a busy neighbour on the other core (2-core VM).
MIN_ELEMENTS_PER_THREAD = 1 << 20

_HEADER = _jitmath.KERNEL

_LOOPS = f"""
{_HEADER}
def bias_gelu(y, bias, first, last):
    cols = y.shape[1]
    for r in range(first, last):
        for c in range(cols):
            y[r, c] = gelu_erf_(y[r, c] + bias[c])


{_HEADER}
def bias_gelu_tanh(y, bias, first, last):
    cols = y.shape[1]
    for r in range(first, last):
        for c in range(cols):
            y[r, c] = gelu_tanh_(y[r, c] + bias[c])


# Only the row sums may be reassociated (vectorised): no other fast-math
# flag, so NaN and infinities still propagate.
@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False,
            fastmath={{'reassoc'}})
def row_sum_(v):
    total = _ZERO
    for c in range(v.shape[0]):
        total += v[c]
    return total


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False,
            fastmath={{'reassoc'}})
def row_squares_(v, mean):
    total = _ZERO
    for c in range(v.shape[0]):
        d = v[c] - mean
        total += d * d
    return total


{_HEADER}
def add_layer_norm(x, res, scale, shift, out, epsilon, first, last):
    cols = out.shape[1]
    width = _F(cols)
    repeat = res.shape[0]  # (fewer rows than x: res broadcasts, rows cycle)
    for r in range(first, last):
        # row views, indices from 0: LLVM vectorises the loops
        xr, rr, row = x[r], res[r % repeat], out[r]
        for c in range(cols):
            row[c] = xr[c] + rr[c]
        mean = row_sum_(row) / width
        inv = _ONE / np.sqrt(row_squares_(row, mean) / width + epsilon)
        for c in range(cols):
            row[c] = ((row[c] - mean) * inv) * scale[c] + shift[c]


{_HEADER}
def layer_norm(x, scale, shift, out, means, invs, epsilon, first, last):
    cols = out.shape[1]
    width = _F(cols)
    for r in range(first, last):
        xr, row = x[r], out[r]
        mean = row_sum_(xr) / width
        inv = _ONE / np.sqrt(row_squares_(xr, mean) / width + epsilon)
        means[r] = mean
        invs[r] = inv
        for c in range(cols):
            row[c] = ((xr[c] - mean) * inv) * scale[c] + shift[c]


{_HEADER}
def instance_norm(x, scale, shift, out, epsilon, channels, first, last):
    cols = out.shape[1]
    width = _F(cols)
    for r in range(first, last):
        xr, row = x[r], out[r]
        c = r % channels
        mean = row_sum_(xr) / width
        factor = scale[c] / np.sqrt(row_squares_(xr, mean) / width + epsilon)
        offset = shift[c]
        for i in range(cols):
            row[i] = (xr[i] - mean) * factor + offset


@numba.njit(inline="always", error_model="numpy")
def order_key_(v):
    # float32 bits as an int32 in the floats' order (NaN of either sign
    # past the infinities): an integer maximum vectorises, a float one
    # does not without fast-math
    b = _F(v).view(_I)
    return b ^ ((b >> 31) & _I(2147483647))


@numba.njit(inline="always", error_model="numpy")
def from_key_(k):
    # the float32 whose order key (order_key_) is k
    return _I(k ^ ((k >> 31) & _I(2147483647))).view(_F)


@numba.njit(inline="always", error_model='numpy', boundscheck=False)
def row_top_(a, r, width):
    # row r's maximum (an integer maximum of order keys: it vectorises)
    top = order_key_(a[r, 0])
    for c in range(width):
        k = order_key_(a[r, c])
        top = k if k > top else top
    return from_key_(top)


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False,
            fastmath={{'reassoc'}})
def row_total_(a, r, width):
    total = _ZERO
    for c in range(width):
        total += a[r, c]
    return total


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def bounded_(flat):
    # whether every value is within +-_NO_SHIFT_BOUND (NaN is not)
    outside = 0
    for i in range(flat.shape[0]):
        v = flat[i]
        outside |= 0 if (v <= _NO_SHIFT_BOUND and v >= -_NO_SHIFT_BOUND) else 1
    return outside == 0


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def exp_scale_(out, r0, r1, width, shifted, flat_done):
    # rows r0:r1 of out: their exponentials in one flat pass (whole vectors,
    # no remainder per row; skipped where flat_done), exp_nonpositive_ where
    # the rows are shifted by their maxima, else exp_bounded_; then each
    # row scaled by 1 / its sum
    if not flat_done:
        flat = out[r0:r1].reshape(-1)
        if shifted:
            for i in range(flat.shape[0]):
                flat[i] = exp_nonpositive_(flat[i])
        else:
            for i in range(flat.shape[0]):
                flat[i] = exp_bounded_(flat[i])
    for r in range(r0, r1):
        inv = _ONE / row_total_(out, r, width)
        for c in range(width):
            out[r, c] = out[r, c] * inv


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def normalise_(x, out, r0, r1, in_place):
    # the softmax of rows r0:r1 of x into out (of out itself, in_place): the
    # exponentials unshifted where every value of the block is within
    # +-_NO_SHIFT_BOUND (no sum can overflow or vanish), else each row's
    # shifted by its maximum. Rows are indexed in two dimensions by
    # unsigned integers (a row view costs reference counts; numba wraps
    # negative signed indices).
    width = np.uint64(out.shape[1])
    if in_place:
        bounded = bounded_(out[r0:r1].reshape(-1))
        if not bounded:
            for r in range(r0, r1):
                top = row_top_(out, r, width)
                for c in range(width):
                    out[r, c] = out[r, c] - top
        exp_scale_(out, r0, r1, width, not bounded, False)
        return
    source = x[r0:r1].reshape(-1)
    if bounded_(source):
        flat = out[r0:r1].reshape(-1)
        for i in range(flat.shape[0]):
            flat[i] = exp_bounded_(source[i])
        exp_scale_(out, r0, r1, width, False, True)
        return
    for r in range(r0, r1):
        top = row_top_(x, r, width)
        for c in range(width):
            out[r, c] = x[r, c] - top
    exp_scale_(out, r0, r1, width, True, False)


@numba.njit(inline="always", error_model='numpy')
def blocks_(rows, width, first, last):
    # (r0, r1) of the blocks of rows first:last that stay in L1, unsigned
    step = np.uint64(max(1, _ROWS_BLOCK // width))
    return np.uint64(first), np.uint64(last), step


{_HEADER}
def softmax_rows(x, out, first, last):
    lo, hi, step = blocks_(x.shape[0], x.shape[1], first, last)
    for r0 in range(lo, hi, step):
        normalise_(x, out, r0, min(hi, r0 + step), False)


{_HEADER}
def softmax_rows_in_place(out, first, last):
    # softmax_rows with x as out: one array, not two that are one (LLVM's
    # overlap check would take its scalar loops)
    lo, hi, step = blocks_(out.shape[0], out.shape[1], first, last)
    for r0 in range(lo, hi, step):
        normalise_(out, out, r0, min(hi, r0 + step), True)


@numba.njit(inline="always", error_model='numpy')
def inside_(v):
    # 0 where v is within +-_NO_SHIFT_BOUND, else 1 (NaN: 1)
    return 0 if (v <= _NO_SHIFT_BOUND and v >= -_NO_SHIFT_BOUND) else 1


@numba.njit(inline="always", error_model='numpy')
def written_(v, top, outside):
    # a row's running maximum (an order key) and the block's bound check,
    # after the row's value v is written
    k = order_key_(v)
    return (k if k > top else top), outside | inside_(v)


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def normalise_masked_(out, r0, r1, tops, outside):
    # normalise_ of rows r0:r1 of out in place, each row's maximum (an
    # order key) already in tops and whether any value of the block is
    # outside the bound in outside (both found as the rows were written)
    # (rows of _WIDE or more: each row shifted and exponentiated in one
    # loop, not a pass for the shift; narrower ones shift, then take one
    # flat pass, whose vectors are whole)
    width = np.uint64(out.shape[1])
    wide = width >= _WIDE
    if outside != 0:
        for r in range(r0, r1):
            top = from_key_(tops[r - r0])
            if wide:
                for c in range(width):
                    out[r, c] = exp_nonpositive_(out[r, c] - top)
            else:
                for c in range(width):
                    out[r, c] = out[r, c] - top
    exp_scale_(out, r0, r1, width, outside != 0, wide and outside != 0)


{_HEADER}
def scale_add_softmax_rows(x, scale, mask, mask_rows, out, divide, first, last):
    # softmax(x * scale + mask) (x / scale with divide), the mask's row for
    # each row given by mask_rows (a broadcast mask: rows repeat); each
    # row's maximum and the bound's check taken as it is written
    width = np.uint64(x.shape[1])
    lo, hi, step = blocks_(x.shape[0], x.shape[1], first, last)
    c0 = _F(scale[0])
    tops = np.empty(step, _I)
    for r0 in range(lo, hi, step):
        r1 = min(hi, r0 + step)
        outside = 0
        for r in range(r0, r1):
            m = np.uint64(mask_rows[r])
            top = order_key_(-_INF)
            for c in range(width):
                v = x[r, c] / c0 + mask[m, c] if divide else x[r, c] * c0 + mask[m, c]
                out[r, c] = v
                top, outside = written_(v, top, outside)
            tops[r - r0] = top
        normalise_masked_(out, r0, r1, tops, outside)


{_HEADER}
def scale_where_softmax_rows(x, scale, cond, cond_rows, fill, out, divide, keep,
                             first, last):
    # softmax(where(cond != keep, fill, x * scale)) (x / scale with
    # divide): keep=True fills where cond does not hold
    width = np.uint64(x.shape[1])
    lo, hi, step = blocks_(x.shape[0], x.shape[1], first, last)
    c0, f0 = _F(scale[0]), _F(fill[0])
    tops = np.empty(step, _I)
    for r0 in range(lo, hi, step):
        r1 = min(hi, r0 + step)
        outside = 0
        for r in range(r0, r1):
            m = np.uint64(cond_rows[r])
            top = order_key_(-_INF)
            for c in range(width):
                scaled = x[r, c] / c0 if divide else x[r, c] * c0
                v = f0 if cond[m, c] != keep else scaled
                out[r, c] = v
                top, outside = written_(v, top, outside)
            tops[r - r0] = top
        normalise_masked_(out, r0, r1, tops, outside)


{_HEADER}
def row_sums(x, out, divisor, first, last):
    for r in range(first, last):
        out[r] = row_sum_(x[r]) / divisor


{_HEADER}
def row_extremes(x, out, largest, first, last):
    # each row's maximum (largest) or minimum: integer extremes of order
    # keys (they vectorise), NaN where the row has one (numpy's
    # maximum.reduce propagates it; a NaN's key need not be the extreme)
    width = np.uint64(x.shape[1])
    for r in range(np.uint64(first), np.uint64(last)):
        top = order_key_(x[r, 0])
        nan = 0
        if largest:
            for c in range(width):
                v = x[r, c]
                k = order_key_(v)
                top = k if k > top else top
                nan |= 0 if v == v else 1
        else:
            for c in range(width):
                v = x[r, c]
                k = order_key_(v)
                top = k if k < top else top
                nan |= 0 if v == v else 1
        value = from_key_(top)
        out[r] = _F(np.nan) if nan != 0 else value


# Reassociated (the means and the products' sums vectorise), indexed in
# two dimensions (a row view costs numba reference counts: atomics) by
# unsigned integers (numba wraps negative signed ones, which stops LLVM
# vectorising).
@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False,
            fastmath={{'reassoc'}})
def excite_image(x, w1, b1, w2, b2, means, hidden, gates, n, sigmoid, alpha, beta):
    # image n's gate of each channel, into gates[n]
    channels = np.uint64(x.shape[1])
    reduced = np.uint64(w1.shape[0])
    area = np.uint64(x.shape[2])
    scale = _ONE / _F(x.shape[2])
    for c in range(channels):
        total = _ZERO
        for i in range(area):
            total += x[n, c, i]
        means[n, c] = total * scale
    for r in range(reduced):
        h = _ZERO
        for c in range(channels):
            h += w1[r, c] * means[n, c]
        h += b1[r]
        hidden[n, r] = h if h > _ZERO else _ZERO
    for c in range(channels):
        g = _ZERO
        for r in range(reduced):
            g += w2[c, r] * hidden[n, r]
        g += b2[c]
        gates[n, c] = sigmoid_(g) if sigmoid else hsig_(g, alpha, beta)


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def squeeze_excite(x, w1, b1, w2, b2, out, means, hidden, gates, sigmoid, alpha,
                   beta, first, last):
    area = np.uint64(x.shape[2])
    for n in range(np.uint64(first), np.uint64(last)):
        excite_image(x, w1, b1, w2, b2, means, hidden, gates, n, sigmoid, alpha, beta)
        for c in range(np.uint64(x.shape[1])):
            g = gates[n, c]
            for i in range(area):
                out[n, c, i] = x[n, c, i] * g


@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def squeeze_gates(x, w1, b1, w2, b2, means, hidden, gates, sigmoid, alpha, beta,
                  first, last):
    for n in range(np.uint64(first), np.uint64(last)):
        excite_image(x, w1, b1, w2, b2, means, hidden, gates, n, sigmoid, alpha, beta)


{_HEADER}
def add_layer_norm_sum(x, res, scale, shift, out, total, epsilon, first, last):
    cols = out.shape[1]
    width = _F(cols)
    repeat = res.shape[0]
    for r in range(first, last):
        xr, rr, row, sums = x[r], res[r % repeat], out[r], total[r]
        for c in range(cols):
            sums[c] = xr[c] + rr[c]
        mean = row_sum_(sums) / width
        inv = _ONE / np.sqrt(row_squares_(sums, mean) / width + epsilon)
        for c in range(cols):
            row[c] = ((sums[c] - mean) * inv) * scale[c] + shift[c]
"""

#: Elements of the rows each block of the compiled softmax loops holds
#: (32 KiB, in L1; the numpy passes' blocks, ``_builtin.SOFTMAX_BLOCK``,
#: are sized for L2).
ROWS_BLOCK = 8192
#: Masked rows at least this wide are shifted and exponentiated in one loop
#: a row (16 x 12 x 512 x 512 causal scores, one thread: about 5 % faster);
#: narrower ones shift, then take one flat pass whose vectors are whole.
WIDE = 64
#: The softmax loops take each block's exponentials unshifted where all its
#: values are within this bound (``asyncrt.ops._builtin.NO_SHIFT_BOUND``:
#: the numpy passes' bound, and why).
NO_SHIFT_BOUND = 64.0

_SOURCE = "\n".join(
    [
        *_jitmath.head(),
        f"_ROWS_BLOCK = {ROWS_BLOCK}",
        f"_WIDE = {WIDE}",
        f"_NO_SHIFT_BOUND = _F({NO_SHIFT_BOUND!r})",
        _LOOPS,
    ]
)
_MODULE = "asyncrt_epilogue_" + hashlib.sha256(_SOURCE.encode()).hexdigest()[:20]


def loop(name: str) -> Callable[..., None]:
    """The compiled loop ``name`` (``"bias_gelu"``, ``"bias_gelu_tanh"``,
    ``"add_layer_norm"``, ``"add_layer_norm_sum"``, ``"layer_norm"``,
    ``"instance_norm"``, ``"softmax_rows"``, ``"softmax_rows_in_place"``,
    ``"scale_add_softmax_rows"``, ``"scale_where_softmax_rows"``,
    ``"squeeze_excite"``, ``"squeeze_gates"``, ``"row_sums"`` or
    ``"row_extremes"``).

    :raises ModuleNotFoundError: if numba is not installed.
    """
    function: Callable[..., None] = _jit.compile_source(_MODULE, _SOURCE, name)
    return function


def bind_rows(
    kernel: Callable[..., None], arrays: tuple[Array, ...], rows: int, cols: int
) -> Callable[[], None]:
    """``kernel(*arrays, first, last)`` over all ``rows`` as a call without
    arguments, compiled for these arrays now and split over the kernel
    threads where each gets :data:`MIN_ELEMENTS_PER_THREAD` elements."""
    return _jit.bind_rows(kernel, arrays, rows, cols, MIN_ELEMENTS_PER_THREAD)
