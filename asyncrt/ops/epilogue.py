"""Ops that finish a GEMM or a residual sum in the same kernel.

The ONNX importer's rewrites (:mod:`asyncrt.frontend._epilogue`) make them of
a transformer's ``MatMul -> Add(bias) [-> GELU]`` and ``Add -> LayerNorm``,
as ONNX Runtime's own fusions do, so that the default executor launches one
kernel where the model has two to seven, and the activations do not make a
round trip through memory per op:

* ``matmul_bias(a, w, bias, out...)``, attribute ``activation`` (``"none"``,
  ``"gelu"``, the exact erf form, ``"gelu_tanh"``, GPT-2's tanh
  approximation, or ``"relu"``): the GEMM writes ``out``, the bias is
  added in place while ``out`` is still in cache, and the GELU follows in
  the same pass where numba is installed (:mod:`asyncrt.ops._epijit`);
  without it, the library's ``gelu`` kernel over a scratch buffer. Where
  ``w`` is a float32 parameter (:mod:`asyncrt.ops._panel_gemm`), the bias
  and ReLU are added as the product's blocks are stored: no pass at all.
  Attributes ``axis`` and ``splits`` (several outputs): the product's parts
  along ``axis`` (attention's Q, K and V from one product); along the last
  axis of a float32 parameter's product, each part is its own packed
  product straight into its output (MiniLM's 128 x 1152 product and split:
  572 -> 533 us, two threads), else the product into a buffer and a copy a
  part.
* ``add_layer_norm(x, r, scale, [bias,] out[, total])``, attributes
  ``axis``, ``epsilon``, ``bias`` and ``sum`` (``total`` given: ``x + r``
  kept there too): ``layer_norm(x + r)`` over the last axes: one
  compiled loop per row with numba, else ``add`` then the library's
  ``layer_norm`` in place (the unfused kernels' bits).
* ``scale_add_softmax(x, c[, m], out)``, attributes ``divide`` and
  ``axes``: attention's ``softmax(x / c + m)`` (or ``x * c``, or no
  mask): the three kernels
  the unfused graph runs, in place in ``out`` (the unfused bits, one launch
  and no intermediate tensors). float32 over the last axis, with numba:
  one compiled pass per block of rows (``_epijit``'s
  ``scale_add_softmax_rows``), the mask's rows indexed, not broadcast: the
  same bits, a third of the memory traffic.
* ``scale_where_softmax(x, c, k, f, out)``, attributes ``divide``,
  ``keep`` and ``axes``: a causal mask as PyTorch exports it,
  ``softmax(where(k, x / c, f))`` (``where(k, f, x / c)`` without
  ``keep``): the scaled scores written into ``out``, the fill copied over
  the masked cells (the condition inverted once where it is a parameter),
  then the softmax in place: the unfused bits, without the Where's pass
  and tensor. float32 with numba: one compiled pass per block of rows
  (``scale_where_softmax_rows``), as ``scale_add_softmax``.
* ``squeeze_excite(x, w1, b1, w2, b2, out)``, attributes ``gate``
  (``"hard_sigmoid"`` or ``"sigmoid"``), ``alpha`` and ``beta``: a CNN's
  squeeze-excitation, ``x`` times ``gate(w2 relu(w1 mean(x) + b1) + b2)``
  per channel (``w1`` and ``w2`` 1 x 1 convolutions' weights): one
  compiled call an image with numba (float32), the channel means, the two
  small products and the scaling (the unfused graph: six launches, five
  of them on 1 x 1 planes); else numpy's passes. The means and the
  products sum in another order than the unfused kernels' (float32
  rounding).
* ``matmul_views(a, b, out)``, attributes ``perm_a``, ``perm_b`` and
  ``perm_out`` (each a permutation or ``None``): attention's ``Transpose ->
  MatMul -> Transpose`` as one matmul over transposed views. BLAS reads a
  matrix with any row stride, so the head-splitting copies are not made
  (numpy loops over the stack one GEMM per head either way).

Results equal the unfused kernels to float32 rounding: the GEMM and the bias
add are the same calls; the compiled GELU is the library's ``gelu`` bit for
bit (the model's own chain rounds its products in another order) and the
compiled layer norm sums rows in another order than numpy's (a few ulps).
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np

from scheduler.dag import TensorSpec

from . import (
    _batched_gemm,
    _epijit,
    _jit,
    _panel_conv,
    _panel_gemm,
    _softvector,
    _team_blas,
    _team_parts,
)
from ._builtin import SOFTMAX_SPLIT_ELEMENTS, bind_matmul
from ._common import BOUND_SCRATCH_BYTES, Array, choice, flag, integer, ints, number
from ._conv_epilogue import ACTIVATIONS as CONV_ACTIVATIONS
from ._conv_epilogue import activate_in_place
from ._kernels import Bindable
from ._library import Attrs, define, lookup

__all__ = ()

Kernel = Callable[..., None]
_FLOAT32 = np.dtype(np.float32)
#: Work per GELU element, in matmul flops (the erf's rational form).
_GELU_FLOPS = 30.0


def _matmul_bias_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """The GEMM's multiply-adds, plus the bias add (and GELU) per output."""
    size = sum(out.size for out in outs)  # (the parts of a split product)
    depth = ins[1].shape[-2] if len(ins[1].shape) >= 2 else 1
    return 2.0 * size * depth + size * (1 + _GELU_FLOPS)


def _compiles(*arrays: Array) -> bool:
    """Whether the compiled loops take these arrays: numpy float32,
    C-contiguous, numba available."""
    return _jit.available() and all(
        isinstance(a, np.ndarray) and a.dtype == _FLOAT32 and a.flags.c_contiguous
        for a in arrays
    )


#: ``matmul_bias``'s activations: none, the exact (erf) GELU, the tanh one,
#: ReLU.
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu")


@define("matmul_bias", flops=_matmul_bias_flops, blas=True)
def _matmul_bias(xp: ModuleType, attrs: Attrs) -> Kernel:
    activation = choice(attrs, "activation", ACTIVATIONS)
    gelu = activation.startswith("gelu")
    relu = activation == "relu"
    gelu_kernel = lookup("gelu")
    if gelu_kernel is None:  # pragma: no cover - the library defines it
        raise ValueError("the library has no gelu op")
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    plain_gelu = gelu_kernel.make(xp, {"approximate": approximate})
    loop = "bias_gelu_tanh" if approximate == "tanh" else "bias_gelu"
    matmul, add, maximum = xp.matmul, xp.add, xp.maximum
    splits = ints(attrs, "splits") if "splits" in attrs else ()
    split_axis = integer(attrs, "axis") if splits else -1

    def bind(
        a: Array,
        w: Array,
        bias: Array,
        *outs: Array,
        constant: frozenset[int] = frozenset(),
    ) -> Callable[[], None]:
        if len(outs) != max(1, len(splits)):
            raise ValueError(
                f"matmul_bias: {len(outs)} outputs for splits {list(splits)}"
            )
        if splits:
            return bind_parts(a, w, bias, outs, constant)
        return bind_one(a, w, bias, outs[0], constant)

    def bind_parts(
        a: Array,
        w: Array,
        bias: Array,
        outs: tuple[Array, ...],
        constant: frozenset[int],
    ) -> Callable[[], None]:
        """The product's parts along the split axis into ``outs``: where the
        axis is the last and ``w`` a float32 parameter, one packed product a
        part, each from its columns of ``w`` (no copy after); else the whole
        product into a buffer of this binding, then a copy a part."""
        axis = split_axis + a.ndim if split_axis < 0 else split_axis
        ends = np.cumsum(splits).tolist()
        columns = [slice(e - n, e) for n, e in zip(splits, ends, strict=True)]
        if xp is np and axis == a.ndim - 1 and not gelu and 1 in constant:
            parts = [
                (np.ascontiguousarray(w[:, cut]), bias[cut], out)
                for cut, out in zip(columns, outs, strict=True)
            ]
            if all(
                _panel_gemm.takes(a, part_w, out)
                and _panel_gemm.takes_bias(part_bias, out)
                for part_w, part_bias, out in parts
            ):
                products = [
                    _panel_gemm.bind(a, part_w, out, bias=part_bias, relu=relu)
                    for part_w, part_bias, out in parts
                ]

                def packed_parts() -> None:
                    for product in products:
                        product()

                return packed_parts
        whole = xp.empty((*a.shape[:-1], w.shape[-1]), outs[0].dtype)
        compute = bind_one(a, w, bias, whole, constant)
        index = [slice(None)] * whole.ndim
        copies = []
        for cut, out in zip(columns, outs, strict=True):
            index[axis] = cut
            copies.append((out, whole[tuple(index)]))
        copyto = xp.copyto

        def then_copy() -> None:
            compute()
            for out, part in copies:
                copyto(out, part)

        return then_copy

    def bind_one(
        a: Array,
        w: Array,
        bias: Array,
        out: Array,
        constant: frozenset[int],
    ) -> Callable[[], None]:
        if (
            not gelu
            and 1 in constant
            and _panel_gemm.takes(a, w, out)
            and _panel_gemm.takes_bias(bias, out)
        ):  # the bias and ReLU added as the product's blocks are stored
            return _panel_gemm.bind(a, w, out, bias=bias, relu=relu)
        product = bind_matmul(matmul, a, w, out, constant_b=1 in constant)
        cols = out.shape[-1] if out.ndim else 1
        if gelu and out.size and bias.shape == (cols,) and _compiles(out, bias):
            rows = out.size // cols
            finish = _epijit.bind_rows(
                _epijit.loop(loop), (out.reshape(rows, cols), bias), rows, cols
            )

            def compiled() -> None:
                product()
                finish()

            return compiled
        scratch = xp.empty_like(out) if gelu else None

        def passes() -> None:
            product()
            add(out, bias, out, casting="unsafe")
            if relu:
                maximum(out, 0, out=out)
            if scratch is not None:  # the library's gelu is not in place
                plain_gelu(out, scratch)
                xp.copyto(out, scratch)

        return passes

    def matmul_bias(a: Array, w: Array, bias: Array, *outs: Array) -> None:
        bind(a, w, bias, *outs)()

    return Bindable(matmul_bias, bind, takes_constant=True)


def _leading_broadcast(
    shape: tuple[int, ...], full: tuple[int, ...], width: int
) -> bool:
    """Whether an operand of ``shape`` broadcasts to ``full`` along leading
    axes alone, whole rows of ``width`` (a position embedding beside a
    batch's token embeddings): its rows, cycled, are ``full``'s."""
    if len(shape) > len(full) or not width:
        return False
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    lead = next((i for i, n in enumerate(padded) if n != 1), len(padded))
    size = math.prod(padded)
    return padded[lead:] == full[lead:] and size >= width and size % width == 0


def _add_layer_norm_flops(
    ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
) -> float:
    """About nine operations per element (add, two sums, centre, square,
    scale, shift)."""
    return 9.0 * outs[0].size


@define("add_layer_norm", flops=_add_layer_norm_flops)
def _add_layer_norm(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis, epsilon = integer(attrs, "axis"), number(attrs, "epsilon")
    has_bias = flag(attrs, "bias")
    keeps_sum = bool(attrs.get("sum", False))
    norm_op = lookup("layer_norm")
    if norm_op is None:  # pragma: no cover - the library defines it
        raise ValueError("the library has no layer_norm op")
    norm = norm_op.make(
        xp,
        {
            "axis": axis,
            "epsilon": epsilon,
            "bias": has_bias,
            "stats": 0,
            "stash_dtype": "float32",
        },
    )
    add = xp.add

    def bind(x: Array, r: Array, scale: Array, *rest: Array) -> Callable[[], None]:
        out, total = (rest[-2], rest[-1]) if keeps_sum else (rest[-1], rest[-1])
        shift = rest[0] if has_bias else None
        width = math.prod(out.shape[axis % out.ndim :]) if out.ndim else 1
        sums = (total,) if keeps_sum else ()
        if x.shape != out.shape:  # (the add commutes, bit for bit)
            x, r = r, x
        if (
            x.shape == out.shape
            and _leading_broadcast(r.shape, out.shape, width)
            and out.size
            and scale.shape == out.shape[axis % out.ndim :]
            and (shift is None or shift.shape == scale.shape)
            and _compiles(x, r, scale, out, *sums, *(() if shift is None else (shift,)))
        ):
            rows = out.size // width
            offset = np.zeros(width, np.float32) if shift is None else shift
            arrays = (
                x.reshape(rows, width),
                r.reshape(-1, width),
                scale.reshape(width),
                offset.reshape(width),
                out.reshape(rows, width),
                *(s.reshape(rows, width) for s in sums),
                np.float32(epsilon),
            )
            name = "add_layer_norm_sum" if keeps_sum else "add_layer_norm"
            return _epijit.bind_rows(_epijit.loop(name), arrays, rows, width)
        args = (total, scale, *(() if shift is None else (shift,)), out)
        normalise = (
            norm.bind(*args)
            if isinstance(norm, Bindable)
            else functools.partial(norm, *args)
        )

        def passes() -> None:
            add(x, r, total, casting="unsafe")
            normalise()

        return passes

    def add_layer_norm(x: Array, r: Array, scale: Array, *rest: Array) -> None:
        bind(x, r, scale, *rest)()

    return Bindable(add_layer_norm, bind)


def _softmax_in_place(xp: ModuleType, attrs: Attrs) -> Callable[[Array], Kernel]:
    """The library's softmax over ``attrs["axes"]``, bound in place to an
    array (it is in place safe)."""
    softmax_op = lookup("softmax")
    if softmax_op is None:  # pragma: no cover - the library defines it
        raise ValueError("the library has no softmax op")
    softmax = softmax_op.make(xp, {"axes": attrs.get("axes"), "log": False})

    def bound(out: Array) -> Kernel:
        if isinstance(softmax, Bindable):
            return softmax.bind(out, out)
        return functools.partial(softmax, out, out)

    return bound


def _rows_of(operand: Array, out: Array) -> tuple[Array, Array] | None:
    """``operand`` (broadcast to ``out``'s shape) as 2-D rows of ``out``'s
    width and, for each of ``out``'s rows, the index of its row there; or
    ``None`` where it does not broadcast along whole rows (its last axis is
    not ``out``'s) or is strided."""
    width = out.shape[-1]
    if not operand.ndim or operand.shape[-1] != width:
        return None
    if not operand.flags.c_contiguous:
        return None
    lead = operand.shape[:-1]
    index = np.arange(math.prod(lead), dtype=np.int64).reshape(lead)
    try:
        rows = np.broadcast_to(index, out.shape[:-1]).reshape(-1)
    except ValueError:
        return None
    return operand.reshape(-1, width), np.ascontiguousarray(rows)


def _compiled_softmax(attrs: Attrs, x: Array, c: Array, out: Array) -> bool:
    """Whether the compiled scale-and-softmax loops take these arrays: the
    softmax over the last axis, numpy float32 (the scale too: numpy
    computes in float64 with a float64 one), C-contiguous, of one shape, a
    one-element scale, numba available."""
    return bool(
        _jit.available()
        and out.ndim
        and out.size
        and attrs.get("axes") in (None, [out.ndim - 1])
        and c.size == 1
        and x.shape == out.shape
        and all(
            isinstance(a, np.ndarray) and a.dtype == _FLOAT32 and a.flags.c_contiguous
            for a in (x, c, out)
        )
    )


def _bind_softmax_rows(
    name: str, operands: tuple[Array, ...], out: Array, *flags: bool
) -> Callable[[], None]:
    """The compiled loop ``name(*operands, out rows, *flags, first, last)``
    over ``out``'s rows, split over the kernel threads as the softmax is."""
    width = out.shape[-1]
    rows = out.size // width
    x, product = operands[0], out.reshape(rows, width)
    if _softvector.takes(x, product):  # rows of about a vector
        mode = "add" if name == "scale_add_softmax_rows" else "where"
        scale, aux, aux_rows, *fill = operands[1:]
        return _softvector.bind(
            x,
            product,
            split_elements=SOFTMAX_SPLIT_ELEMENTS,
            mode=mode,
            aux=aux,
            aux_rows=aux_rows,
            scale=scale,
            fill=fill[0] if fill else None,
            divide=flags[0],
            keep=mode == "where" and flags[1],
        )
    shares = _team_parts.shares(
        rows,
        out.size,
        SOFTMAX_SPLIT_ELEMENTS,
        min_team_work=_team_parts.MIN_TEAM_ELEMENTS,
    )
    arrays = (*operands, product, *flags)
    return _jit.bind_parts(_epijit.loop(name), arrays, shares, work=out.size)


@define("scale_add_softmax", flops=lambda ins, outs: 4.0 * outs[0].size)
def _scale_add_softmax(xp: ModuleType, attrs: Attrs) -> Kernel:
    divide = flag(attrs, "divide")
    softmax_of = _softmax_in_place(xp, attrs)
    scale, add = (xp.divide if divide else xp.multiply), xp.add

    def bind(x: Array, c: Array, *rest: Array) -> Callable[[], None]:
        out = rest[-1]
        compiled = compiled_rows(x, c, *rest)
        if compiled is not None:
            return compiled
        normalise = softmax_of(out)
        if len(rest) == 1:  # no mask

            def scale_softmax() -> None:
                scale(x, c, out, casting="unsafe")
                normalise()

            return scale_softmax
        m = rest[0]

        def scale_add_softmax() -> None:
            scale(x, c, out, casting="unsafe")
            add(out, m, out, casting="unsafe")
            normalise()

        return scale_add_softmax

    def compiled_rows(x: Array, c: Array, *rest: Array) -> Callable[[], None] | None:
        """One compiled pass per block of rows, or ``None``."""
        out = rest[-1]
        if not _compiled_softmax(attrs, x, c, out):
            return None
        width = out.shape[-1]
        if len(rest) == 1:  # no mask: one row of zeros for every row
            zeros = np.zeros((1, width), _FLOAT32)
            rows: tuple[Array, Array] | None = (
                zeros,
                np.zeros(out.size // width, np.int64),
            )
        elif rest[0].dtype == _FLOAT32:
            rows = _rows_of(rest[0], out)
        else:  # numpy adds in the mask's wider type
            rows = None
        if rows is None:
            return None
        operands = (x.reshape(-1, width), c.reshape(-1), *rows)
        return _bind_softmax_rows("scale_add_softmax_rows", operands, out, divide)

    def call(x: Array, c: Array, *rest: Array) -> None:
        bind(x, c, *rest)()

    return Bindable(call, bind)


@define("scale_where_softmax", flops=lambda ins, outs: 4.0 * outs[0].size)
def _scale_where_softmax(xp: ModuleType, attrs: Attrs) -> Kernel:
    divide, keep = flag(attrs, "divide"), flag(attrs, "keep")
    softmax_of = _softmax_in_place(xp, attrs)
    scale = xp.divide if divide else xp.multiply

    def bind(
        x: Array,
        c: Array,
        k: Array,
        f: Array,
        out: Array,
        constant: frozenset[int] = frozenset(),
    ) -> Callable[[], None]:
        rows = _rows_of(k, out) if k.dtype == np.bool_ and out.ndim else None
        if rows is not None and f.size == 1 and _compiled_softmax(attrs, x, c, out):
            operands = (x.reshape(-1, out.shape[-1]), c.reshape(-1), *rows)
            return _bind_softmax_rows(
                "scale_where_softmax_rows",
                (*operands, f.reshape(-1)),
                out,
                divide,
                keep,
            )
        normalise = softmax_of(out)
        # the cells that take the fill: where k does not hold, with keep
        filled = xp.logical_not(k) if keep and 2 in constant else None

        def scale_where_softmax() -> None:
            scale(x, c, out, casting="unsafe")
            where = filled if filled is not None else xp.logical_not(k) if keep else k
            xp.copyto(out, f, casting="unsafe", where=where)
            normalise()

        return scale_where_softmax

    def call(x: Array, c: Array, k: Array, f: Array, out: Array) -> None:
        bind(x, c, k, f, out)()

    return Bindable(call, bind, takes_constant=True)


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def _perm(attrs: Attrs, key: str) -> tuple[int, ...] | None:
    value = attrs.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or sorted(value) != list(range(len(value))):
        raise ValueError(f"attribute {key!r} must be a permutation: {value!r}")
    return tuple(int(v) for v in value)


def _matmul_views_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """``2 * stack * M * N * K``, which is ``2 sqrt(|a| |b| |out| /
    stack)``, with the stack estimated as ``out``'s leading axes (exact
    where ``perm_out`` keeps the last two axes; an estimate otherwise)."""
    out = outs[0]
    stack = math.prod(out.shape[:-2])
    if not out.size or not stack:
        return 0.0
    return 2.0 * math.sqrt(ins[0].size * ins[1].size * out.size / stack)


#: A right operand whose rows are not contiguous (attention's ``K^T`` as a
#: view) is copied first where its rows are at least this long: numpy's
#: matmul over such a view cost 98 against 77 us with the copy at 2 x 12
#: heads of 64 x 64, 195 against 150 at 12 of 128 x 128, but 135 against
#: 155 us at 32 x 12 of 16 x 16 (2-core AVX-512 VM).
MIN_COPIED_COLUMNS = 32


def _copies_right(right: Array) -> bool:
    return bool(
        right.ndim >= 2
        and right.strides[-1] != right.itemsize
        and right.shape[-1] >= MIN_COPIED_COLUMNS
    )


#: ``squeeze_excite``'s gates.
GATES = ("hard_sigmoid", "sigmoid")


def _squeeze_excite_flops(
    ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
) -> float:
    """The mean and the scaling (a flop an element each), and the two
    products' multiply-adds."""
    x, w1 = ins[0], ins[1]
    images = x.shape[0] if x.shape else 1
    return 2.0 * x.size + 4.0 * images * w1.size


def _squeeze_gates_flops(
    ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
) -> float:
    """The mean (a flop an element) and the two products' multiply-adds."""
    x, w1 = ins[0], ins[1]
    images = x.shape[0] if x.shape else 1
    return 1.0 * x.size + 4.0 * images * w1.size


class _Excitation:
    """A squeeze-excitation's steps for ``attrs`` (``gate``, ``alpha``,
    ``beta``) in the array namespace ``xp``: the gates, and the input
    scaled by them."""

    def __init__(self, xp: ModuleType, attrs: Attrs) -> None:
        self.xp = xp
        self.sigmoid = choice(attrs, "gate", GATES) == "sigmoid"
        self.alpha, self.beta = number(attrs, "alpha"), number(attrs, "beta")

    def gates(self, x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
        """numpy's passes: each image's gate per channel ``(N, C)``."""
        xp = self.xp
        images, channels = x.shape[:2]
        reduced = w1.shape[0]
        means = x.reshape(images, channels, -1).mean(axis=2, dtype=x.dtype)
        hidden = xp.matmul(means, w1.reshape(reduced, channels).T) + b1
        xp.maximum(hidden, 0, out=hidden)
        gate = xp.matmul(hidden, w2.reshape(channels, reduced).T) + b2
        if self.sigmoid:
            return 1 / (1 + xp.exp(-gate))
        kind = gate.dtype.type
        return xp.clip(gate * kind(self.alpha) + kind(self.beta), 0, 1)

    def bind_loop(
        self, name: str, x: Array, weights: tuple[Array, ...], *rest: Array
    ) -> Callable[[], None]:
        """The compiled ``squeeze_excite`` (``rest``: its output and the
        gates) or ``squeeze_gates`` (``rest``: the gates), split over the
        images."""
        w1, b1, w2, b2 = weights
        images, channels = x.shape[:2]
        reduced = w1.shape[0]
        area = x.size // (images * channels)
        outputs = [a.reshape(images, channels, -1) for a in rest[:-1]]
        arrays = (
            x.reshape(images, channels, area),
            w1.reshape(reduced, channels),
            b1,
            w2.reshape(channels, reduced),
            b2,
            *outputs,
            np.empty((images, channels), np.float32),  # each image's means,
            np.empty((images, reduced), np.float32),  # hidden layer
            rest[-1].reshape(images, channels),  # and gates
            self.sigmoid,
            np.float32(self.alpha),
            np.float32(self.beta),
        )
        return _epijit.bind_rows(_epijit.loop(name), arrays, images, channels * area)


@define("squeeze_excite", flops=_squeeze_excite_flops)
def _squeeze_excite(xp: ModuleType, attrs: Attrs) -> Kernel:
    excitation = _Excitation(xp, attrs)

    def passes(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> None:
        gate = excitation.gates(x, w1, b1, w2, b2)
        images, channels = x.shape[:2]
        xp.multiply(x, gate.reshape(images, channels, *(1,) * (x.ndim - 2)), out=out)

    def bind(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> Callable[[], None]:
        if out.size and _compiles(x, w1, b1, w2, b2, out):
            gates = np.empty(x.shape[:2], np.float32)
            weights = (w1, b1, w2, b2)
            return excitation.bind_loop("squeeze_excite", x, weights, out, gates)
        return functools.partial(passes, x, w1, b1, w2, b2, out)

    def squeeze_excite(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> None:
        bind(x, w1, b1, w2, b2, out)()

    return Bindable(squeeze_excite, bind)


@define("squeeze_gates", flops=_squeeze_gates_flops)
def _squeeze_gates(xp: ModuleType, attrs: Attrs) -> Kernel:
    """A squeeze-excitation's gates ``(N, C)`` alone (attributes as
    ``squeeze_excite``'s): the convolution after it scales its input's
    rows by them (``fused_pointwise``)."""
    excitation = _Excitation(xp, attrs)

    def passes(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> None:
        out[...] = excitation.gates(x, w1, b1, w2, b2)

    def bind(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> Callable[[], None]:
        if out.size and x.size and _compiles(x, w1, b1, w2, b2, out):
            return excitation.bind_loop("squeeze_gates", x, (w1, b1, w2, b2), out)
        return functools.partial(passes, x, w1, b1, w2, b2, out)

    def squeeze_gates(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> None:
        bind(x, w1, b1, w2, b2, out)()

    return Bindable(squeeze_gates, bind)


def _fused_pointwise_flops(
    ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
) -> float:
    """The product, and a flop an input element for the gates and an
    output element for the residual (where they are inputs)."""
    x = ins[0]
    w = ins[2] if len(ins[1].shape) == 2 else ins[1]  # (after the gates, 2-D)
    depth = w.shape[1] if len(w.shape) > 1 else 1
    return 2.0 * outs[0].size * depth + 1.0 * x.size + 1.0 * outs[0].size


@define("fused_pointwise", flops=_fused_pointwise_flops, blas=True)
def _fused_pointwise(xp: ModuleType, attrs: Attrs) -> Kernel:
    """``act(w @ (x * gates) + b + residual)``: a 1 x 1 convolution (``w``
    ``(K, C, 1, 1)``, one group, no pads or strides) of ``x`` ``(N, C,
    ...)``; attributes ``gated`` (an input ``gates`` ``(N, C)`` after
    ``x``, a squeeze-excitation's: ``squeeze_gates``, scales each image's
    channels), ``residual`` (an input after ``b``, added to the biased
    product: a residual block's ``Add``, broadcast as numpy's) and
    ``activation`` (``"none"``, ``"relu"`` or ``"hard_swish"``, applied
    last). Bound with float32 parameters for weights and bias, the panel
    GEMM scales each row as it loads it and adds the residual as it stores
    (:mod:`asyncrt.ops._panel_conv`): neither the scaled input nor the
    product is written apart; else the steps one after another."""
    gated, residual = flag(attrs, "gated"), flag(attrs, "residual")
    activation = choice(attrs, "activation", CONV_ACTIVATIONS)
    conv = lookup("conv")
    assert conv is not None
    pointwise: dict[str, object] = {
        "kernel_shape": [1, 1],
        "strides": [1, 1],
        "dilations": [1, 1],
        "pads": [0, 0, 0, 0],
        "auto_pad": "NOTSET",
        "group": 1,
        "bias": True,
        "activation": "none" if residual else activation,
    }
    product = typing.cast(Bindable, conv.make(xp, pointwise))

    def parts(
        arrays: tuple[Array, ...],
    ) -> tuple[Array, Array | None, Array, Array, Array | None, Array]:
        """x, gates, w, b, residual, out."""
        rest = list(arrays)
        x = rest.pop(0)
        gates = rest.pop(0) if gated else None
        w, b = rest.pop(0), rest.pop(0)
        added = rest.pop(0) if residual else None
        return x, gates, w, b, added, rest[0]

    def steps(
        arrays: tuple[Array, ...], constant: frozenset[int]
    ) -> Callable[[], None]:
        """The scaling, the product and the residual's add, one after
        another, the product bound as the unfused graph's convolution."""
        x, gates, w, b, added, out = parts(arrays)
        images, channels = x.shape[:2]
        source = x if gates is None else xp.empty_like(x)
        sums = out
        if added is not None:
            sums = xp.empty((images, w.shape[0], *x.shape[2:]), dtype=out.dtype)
        first = 2 if gated else 1
        parameters = frozenset(
            p - first + 1 for p in (first, first + 1) if p in constant
        )
        convolve = product.bind(source, w, b, sums, constant=parameters)

        factors = None
        if gates is not None:
            factors = gates.reshape(images, channels, *(1,) * (x.ndim - 2))

        def run() -> None:
            if factors is not None:
                xp.multiply(x, factors, out=source)
            convolve()
            if added is not None:
                xp.add(sums, added, out=out)
                activate_in_place(xp, out, activation)

        return run

    def fused_pointwise(*arrays: Array) -> None:
        steps(arrays, frozenset())()

    def bind(
        *arrays: Array, constant: frozenset[int] = frozenset()
    ) -> Callable[[], None]:
        x, gates, w, b, added, out = parts(arrays)
        first = 2 if gated else 1
        images, channels = x.shape[:2]
        if (
            out.size
            and {first, first + 1} <= constant
            and x.ndim >= 3
            and _compiles(x, w, b, *(a for a in (gates, added) if a is not None))
            and isinstance(out, np.ndarray)
            and out.flags.c_contiguous
            and (added is None or added.shape == out.shape)
        ):
            weights = w.reshape(w.shape[0], channels)
            matrix, result = (
                x.reshape(images, channels, -1),
                out.reshape(images, w.shape[0], -1),
            )
            if _panel_conv.takes(weights, matrix, result, b):
                return _panel_conv.bind(
                    weights,
                    matrix,
                    result,
                    bias=b,
                    activation=activation,
                    scale=None if gates is None else gates.reshape(images, channels),
                    residual=None if added is None else added.reshape(result.shape),
                )
        return steps(arrays, constant)

    return Bindable(fused_pointwise, bind, takes_constant=True)


@define("matmul_views", flops=_matmul_views_flops, blas=True)
def _matmul_views(xp: ModuleType, attrs: Attrs) -> Kernel:
    perm_a, perm_b = _perm(attrs, "perm_a"), _perm(attrs, "perm_b")
    perm_out = _perm(attrs, "perm_out")
    back = None if perm_out is None else _inverse(perm_out)
    matmul = xp.matmul

    def bind(a: Array, b: Array, out: Array) -> Callable[[], None]:
        left = a if perm_a is None else a.transpose(perm_a)
        right = b if perm_b is None else b.transpose(perm_b)
        result = out if back is None else out.transpose(back)
        if xp is not np:  # cupy's matmul may refuse a strided ``out``

            def through_temporary() -> None:
                xp.copyto(result, matmul(left, right))

            return through_temporary
        if _batched_gemm.takes(left, right, result, (a, b, out)):
            # every head on the team, in registers, reading the views
            return _batched_gemm.bind(left, right, result, (a, b, out))
        if _team_blas.takes(left, right, result):
            # every head on the team, BLAS reading the views as they are
            return _team_blas.bind(left, right, result)
        if not _copies_right(right):
            return functools.partial(matmul, left, right, out=result)
        keep = right.nbytes <= BOUND_SCRATCH_BYTES
        scratch = xp.empty(right.shape, right.dtype) if keep else None
        copyto = xp.copyto

        def packed() -> None:
            dense = scratch if scratch is not None else xp.empty_like(right)
            copyto(dense, right)
            matmul(left, dense, out=result)

        return packed

    def call(a: Array, b: Array, out: Array) -> None:
        bind(a, b, out)()

    return Bindable(call, bind)
