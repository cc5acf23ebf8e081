"""Convolution, pooling and normalisation.

Bound 3 x 3 stride-1 convolutions of enough channels and tiles run
Winograd's F(2 x 2, 3 x 3): 16 GEMMs of transformed tiles, the weights
transformed once where they are parameters (:mod:`asyncrt.ops._winograd`).
Every other convolution is im2col plus one batched BLAS matmul that writes
the planned output, in one of three ways:

* depthwise convolutions (one input and one output channel per group)
  take a compiled kernel of their own where numba is installed
  (:mod:`asyncrt.ops._depthwise`), and so do grouped ones with small
  groups (a group's input channels as more taps of its planar loop);
* strided convolutions, and stride-1 ones whose column matrix is large
  (:data:`TAPS_MIN_CELLS`), fill the column matrix by one copy per kernel
  tap from a strided view of the padded input, then ``W (group, M/group,
  K) @ cols`` writes straight into the output viewed as ``(N, group,
  M/group, P)`` (:mod:`asyncrt.ops._strided`);
* other stride-1 convolutions build it from contiguous slices of flat
  padded planes (:mod:`asyncrt.ops._im2col`), the banded matmul for
  narrow depthwise planes included; a 1x1 kernel without pads needs no
  copy at all.

Without the compiled engine, strided depthwise convolutions skip the
matmul for a multiply-add per kernel position over the whole output.
"""

from __future__ import annotations

import functools
import itertools
import math
import typing
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from scheduler.dag import TensorSpec

from ..runtime import _threads
from . import (
    _blocks,
    _common,
    _conv_epilogue,
    _depthwise,
    _epijit,
    _jit,
    _jitlrn,
    _panel_conv,
    _pointwise_depthwise,
    _poolvector,
    _row_chunks,
    _scratch,
    _stemrows,
    _stemvector,
    _winograd,
)
from ._builtin import SOFTMAX_SPLIT_ELEMENTS, ones_vector
from ._common import (
    Array,
    bind_all_finite,
    choice,
    flag,
    in_turn,
    integer,
    ints,
    number,
    opt_ints,
    quiet,
)
from ._conv_epilogue import ACTIVATIONS, add_bias_activation
from ._im2col import CHUNK_BYTES, bind_stride1, conv_stride1
from ._kernels import Bindable
from ._library import Attrs, define
from ._strided import bind_strided
from ._windows import (
    Geometry,
    bind_padded,
    bind_reduce_windows,
    pad_spatial,
    reduce_windows,
    windows,
)
from .reduce import compiled_rows

__all__ = ()

Kernel = Callable[..., None]
_AUTO_PAD = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
#: Stride-1 convolutions whose column matrix has at least this many cells
#: take one copy per tap and a GEMM over the real output positions
#: rather than the flat-plane im2col, whose GEMM also computes the padded
#: rows' junk columns (measured, one thread: 512 channels of 7 x 7, 3 x 3:
#: 4.0 -> 3.1 ms; 256 of 14 x 14: 2.75 -> 2.58 ms; 64 of 56 x 56: 3.0 ->
#: 2.9 ms).
TAPS_MIN_CELLS = 1 << 16


def _geometry(attrs: Attrs) -> Geometry:
    kernel = ints(attrs, "kernel_shape")
    rank = len(kernel)
    geometry = Geometry(
        kernel=kernel,
        strides=ints(attrs, "strides"),
        dilations=ints(attrs, "dilations"),
        pads=opt_ints(attrs, "pads"),
        auto_pad=choice(attrs, "auto_pad", _AUTO_PAD),
    )
    if len(geometry.strides) != rank or len(geometry.dilations) != rank:
        raise ValueError("strides and dilations need one value per spatial axis")
    if geometry.pads is not None and len(geometry.pads) != 2 * rank:
        raise ValueError("pads need two values per spatial axis")
    if min((*kernel, *geometry.strides, *geometry.dilations), default=1) < 1:
        raise ValueError("kernel_shape, strides and dilations must be >= 1")
    if geometry.pads is not None and min(geometry.pads, default=0) < 0:
        raise ValueError("pads must be >= 0")
    return geometry


def _conv_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """A multiply-add per output element per weight of one group."""
    return 2.0 * outs[0].size * math.prod(ins[1].shape[1:])


@define("conv", flops=_conv_flops, blas=True)
def _conv(xp: ModuleType, attrs: Attrs) -> Kernel:
    geometry = _geometry(attrs)
    group = integer(attrs, "group")
    has_bias = flag(attrs, "bias")
    rank = len(geometry.kernel)
    # An activation applied as the output is written (the ONNX frontend
    # fuses Conv -> Relu and Conv -> HardSwish): _conv_epilogue.
    activation = (
        choice(attrs, "activation", ACTIVATIONS) if "activation" in attrs else "none"
    )

    def conv(x: Array, w: Array, *rest: Array) -> None:
        if x.dtype == np.float16:
            # Accumulate half-precision products in single precision.
            wide = xp.empty(rest[-1].shape, dtype=np.float32)
            more = [r.astype(np.float32) for r in rest[:-1]]
            conv(x.astype(np.float32), w.astype(np.float32), *more, wide)
            rest[-1][...] = wide
            return
        out = rest[-1]
        if not out.size:
            return
        if not w.size:  # no input channels per group: the sums are empty
            out[...] = 0
            bias = rest[0].reshape(-1, *(1,) * rank) if has_bias else None
            add_bias_activation(xp, out, bias, out, activation)
            return
        if _depthwise.takes(xp, x, w, out, group):
            depthwise(x, w, *rest)()
            return
        if _depthwise.groups(xp, x, w, out, group):
            by_groups(x, w, *rest)()
            return
        gathered = strided(x, w, *rest)
        if gathered is not None:
            gathered()
            return
        if all(s == 1 for s in geometry.strides):
            stride1(conv_stride1, x, w, *rest)
            return
        n, c = x.shape[:2]
        m = w.shape[0]
        out_spatial = out.shape[2:]
        begin, end, _ = geometry.padding(x.shape[2:], out_spatial)
        view = windows(xp, pad_spatial(xp, x, begin, end, 0), geometry, out_spatial)
        cg, mg = c // group, m // group
        positions = math.prod(out_spatial)
        grouped = out.reshape(n, group, mg, *out_spatial)
        view = view.reshape(n, group, cg, *out_spatial, *geometry.kernel)
        if cg == 1:
            _depthwise_taps(xp, view, w.reshape(group, mg, *geometry.kernel), grouped)
        else:
            # (N, g, Cg, *out, *k) -> (N, g, Cg, *k, *out): rows of K = Cg*k.
            order = (0, 1, 2, *range(3 + rank, 3 + 2 * rank), *range(3, 3 + rank))
            cols = xp.ascontiguousarray(view.transpose(order))
            cols = cols.reshape(n, group, cg * math.prod(geometry.kernel), positions)
            weights = w.reshape(group, mg, -1)
            xp.matmul(weights, cols, out=out.reshape(n, group, mg, positions))
        bias = rest[0].reshape(group, mg, *(1,) * rank) if has_bias else None
        add_bias_activation(xp, grouped, bias, grouped, activation)

    def stride1(im2col: Callable[..., Any], x: Array, w: Array, *rest: Array) -> Any:
        """``im2col`` (:func:`conv_stride1` or :func:`bind_stride1`) of
        these arrays, for this convolution."""
        out = rest[-1]
        return im2col(
            xp,
            x,
            w,
            rest[0] if has_bias else None,
            out,
            group,
            geometry.padding(x.shape[2:], out.shape[2:])[0],
            geometry.dilations,
            activation=activation,
        )

    def depthwise(
        x: Array,
        w: Array,
        *rest: Array,
        constant_weights: bool = False,
        constant_bias: bool = False,
    ) -> Callable[[], None]:
        out = rest[-1]
        begin = geometry.padding(x.shape[2:], out.shape[2:])[0]
        return _depthwise.bind_depthwise(
            x,
            w,
            rest[0] if has_bias else None,
            out,
            geometry.strides,
            begin,
            geometry.dilations,
            activation=activation,
            constant_weights=constant_weights,
            constant_bias=constant_bias,
        )

    def by_groups(x: Array, w: Array, *rest: Array) -> Callable[[], None]:
        out = rest[-1]
        return _depthwise.bind_grouped(
            x,
            w,
            rest[0] if has_bias else None,
            out,
            group,
            geometry.strides,
            geometry.padding(x.shape[2:], out.shape[2:])[0],
            geometry.dilations,
            activation=activation,
        )

    def strided(
        x: Array, w: Array, *rest: Array, constant_weights: bool = False
    ) -> Callable[[], None] | None:
        """The convolution as one copy per tap and a GEMM over the real
        output positions (:mod:`asyncrt.ops._strided`), or ``None`` where
        each group has one input channel (:func:`_depthwise_taps` skips
        the GEMM), the arrays are not C-contiguous (a reshaped view would
        be a copy), or the strides are 1 and the flat-plane im2col does as
        well: a 1x1 kernel (no copy at all), a column matrix of fewer than
        :data:`TAPS_MIN_CELLS` cells (the extra copies' calls would cost
        more) or of more than ``CHUNK_BYTES`` (it chunks the batch). Deep
        enough columns are made a few output rows at a time by a compiled
        gather, each chunk multiplied while in cache
        (:mod:`asyncrt.ops._row_chunks`)."""
        out = rest[-1]
        if w.shape[1] == 1 or not all(a.flags.c_contiguous for a in (x, w, *rest)):
            return None
        if all(s == 1 for s in geometry.strides):
            taps = math.prod(geometry.kernel)
            cells = x.shape[0] * x.shape[1] * taps * math.prod(out.shape[2:])
            if taps == 1 or not TAPS_MIN_CELLS <= cells <= CHUNK_BYTES // x.itemsize:
                return None
        begin = geometry.padding(x.shape[2:], out.shape[2:])[0]
        bias = rest[0] if has_bias else None
        # (a 1x1 kernel has no rows to gather: one strided copy does)
        if math.prod(geometry.kernel) > 1 and _row_chunks.takes(x, w, out, group):
            return _row_chunks.bind_row_chunks(
                x,
                w,
                bias,
                out,
                geometry.strides,
                begin,
                geometry.dilations,
                activation=activation,
                constant_weights=constant_weights,
            )
        return bind_strided(
            xp,
            x,
            w,
            bias,
            out,
            group,
            geometry.strides,
            begin,
            geometry.dilations,
            activation=activation,
            constant_weights=constant_weights,
        )

    def packed_pointwise(x: Array, w: Array, *rest: Array) -> Callable[[], None] | None:
        """A 1x1 convolution of one group at stride 1 without padding,
        float32 parameters for weights: each image's plane is the column
        matrix, times the weights packed once
        (:mod:`asyncrt.ops._panel_conv`), the bias and ReLU added as it
        stores (hard-swish a pass after it); ``None`` for any other."""
        out, bias = rest[-1], rest[0] if has_bias else None
        n, c = x.shape[:2]
        k = w.shape[0]
        begin, end, _ = geometry.padding(x.shape[2:], out.shape[2:])
        if not (
            group == 1
            and all(size == 1 for size in geometry.kernel)
            and all(step == 1 for step in geometry.strides)
            and not any(begin)
            and not any(end)
            and activation in ("none", "relu", "hard_swish")
        ):
            return None
        planes = (n, -1, math.prod(out.shape[2:]))
        matrix, product = x.reshape(planes), out.reshape(planes)
        weights = w.reshape(k, c)
        if not _panel_conv.takes(weights, matrix, product, bias):
            return None
        return _panel_conv.bind(
            weights,
            matrix,
            product,
            bias=bias,
            activation=activation,
        )

    # What Winograd's exact path computes before the activation it leaves
    # to a pass of its own (hard-swish) or applies itself (ReLU).
    exact_before = (
        _conv(xp, {**attrs, "activation": "none"})
        if activation == "hard_swish"
        else conv
    )

    def bind(
        x: Array, w: Array, *rest: Array, constant: frozenset[int] = frozenset()
    ) -> Callable[[], None]:
        out = rest[-1]
        # the epilogue's loops compiled now, not on the first run
        _conv_epilogue.warm(xp, out.dtype, activation, has_bias)
        if out.size and _depthwise.takes(xp, x, w, out, group):
            return depthwise(
                x,
                w,
                *rest,
                constant_weights=1 in constant,
                constant_bias=has_bias and 2 in constant,
            )
        if out.size and _stemvector.takes(x, w, out, group):
            return _stemvector.bind(
                x,
                w,
                rest[0] if has_bias else None,
                out,
                geometry.strides,
                geometry.padding(x.shape[2:], out.shape[2:])[0],
                geometry.dilations,
                activation=activation,
                constant_weights=1 in constant,
                constant_bias=has_bias and 2 in constant,
            )
        if (
            out.size
            and 1 in constant
            and _stemrows.takes(x, w, out, group, geometry.strides)
        ):
            return _stemrows.bind(
                x,
                w,
                rest[0] if has_bias else None,
                out,
                geometry.strides,
                geometry.padding(x.shape[2:], out.shape[2:])[0],
                geometry.dilations,
                activation=activation,
            )
        if out.size and _depthwise.groups(xp, x, w, out, group):
            return by_groups(x, w, *rest)
        if out.size and _winograd.takes(
            xp, x, w, out, group, geometry.strides, geometry.dilations
        ):
            fast = _winograd.bind_winograd(
                x,
                w,
                rest[0] if has_bias else None,
                out,
                geometry.padding(x.shape[2:], out.shape[2:])[0],
                relu=activation == "relu",
                constant_weights=1 in constant,
                exact=functools.partial(exact_before, x, w, *rest),
            )
            if fast is not None and activation == "hard_swish":
                # (in float32 after the transform's sums, as the kernel's)
                after = _conv_epilogue.bind_bias_activation(
                    xp, out, None, out, activation
                )
                return functools.partial(_then, fast, after)
            if fast is not None:
                return fast
        if out.size and 1 in constant:
            pointwise = packed_pointwise(x, w, *rest)
            if pointwise is not None:
                return pointwise
        if out.size and w.size and x.dtype != np.float16:
            gathered = strided(x, w, *rest, constant_weights=1 in constant)
            if gathered is not None:
                return gathered
        bound = None
        # A bound call keeps reshaped views: of a strided array they would
        # be copies, blind to its later values.
        contiguous = all(a.flags.c_contiguous for a in (x, w, *rest))
        if (
            contiguous
            and out.size
            and w.size
            and x.dtype != np.float16
            and all(s == 1 for s in geometry.strides)
        ):
            bound = stride1(bind_stride1, x, w, *rest)
        return bound or functools.partial(conv, x, w, *rest)

    return Bindable(conv, bind, takes_constant=True)


def _then(call: Callable[[], None], after: Callable[[], None]) -> None:
    """``call()``, then ``after()``."""
    call()
    after()


def _pointwise_depthwise_flops(
    ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
) -> float:
    """The expansion's and the depthwise step's multiply-adds."""
    x, w1, w2 = ins[0], ins[1], ins[3]
    taps = math.prod(w2.shape[2:])
    return 2.0 * x.size * w1.shape[0] + 2.0 * outs[0].size * taps


@define("pointwise_depthwise", flops=_pointwise_depthwise_flops, blas=True)
def _expand_depthwise(xp: ModuleType, attrs: Attrs) -> Kernel:
    """An inverted residual block's 1 x 1 expansion and the depthwise
    convolution of its output (the import fuses them: its
    ``PointwiseDepthwise``): one compiled loop where the arrays are numpy
    float32 and the weights parameters (:mod:`asyncrt.ops._pointwise_depthwise`),
    else the two convolutions one after the other."""
    window = {
        key: ints(attrs, key)
        for key in ("kernel_shape", "strides", "pads", "dilations")
    }
    if len(window["kernel_shape"]) != 2 or len(window["pads"]) != 4:
        raise ValueError("pointwise_depthwise takes a 2-D window and four pads")
    pointwise_activation = choice(attrs, "pointwise_activation", ACTIVATIONS)
    activation = choice(attrs, "activation", ACTIVATIONS)
    plain = {"auto_pad": "NOTSET", "bias": True}
    expand = _conv(
        xp,
        {
            **plain,
            "kernel_shape": [1, 1],
            "strides": [1, 1],
            "dilations": [1, 1],
            "pads": [0, 0, 0, 0],
            "group": 1,
            "activation": pointwise_activation,
        },
    )

    @functools.cache
    def depthwise(channels: int) -> Kernel:
        return _conv(
            xp, {**plain, **window, "group": channels, "activation": activation}
        )

    def expanded(x: Array, w1: Array) -> Array:
        return xp.empty((x.shape[0], w1.shape[0], *x.shape[2:]), dtype=x.dtype)

    def pointwise_depthwise(
        x: Array, w1: Array, b1: Array, w2: Array, b2: Array, out: Array
    ) -> None:
        middle = expanded(x, w1)
        expand(x, w1, b1, middle)
        depthwise(w1.shape[0])(middle, w2, b2, out)

    def bind(
        x: Array,
        w1: Array,
        b1: Array,
        w2: Array,
        b2: Array,
        out: Array,
        constant: frozenset[int] = frozenset(),
    ) -> Callable[[], None]:
        arrays = (x, w1, b1, w2, b2, out)
        if (
            out.size
            and {1, 2, 3, 4} <= constant
            and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
            and _pointwise_depthwise.takes(x, w1, w2)
        ):
            return _pointwise_depthwise.bind(
                x,
                w1,
                b1,
                w2,
                b2,
                out,
                tuple(window["strides"]),
                tuple(window["pads"][:2]),
                tuple(window["dilations"]),
                expand_activation=pointwise_activation,
                activation=activation,
            )
        middle = expanded(x, w1)
        first = typing.cast(Bindable, expand).bind(
            x, w1, b1, middle, constant=frozenset(p for p in (1, 2) if p in constant)
        )
        second = typing.cast(Bindable, depthwise(w1.shape[0])).bind(
            middle,
            w2,
            b2,
            out,
            constant=frozenset(p - 2 for p in (3, 4) if p in constant),
        )
        return functools.partial(_then, first, second)

    return Bindable(pointwise_depthwise, bind, takes_constant=True)


def _depthwise_taps(xp: ModuleType, view: Array, w: Array, out: Array) -> None:
    """``out (N, g, Mg, *out) = sum over k of w (g, Mg, *k) * view``."""
    rank = w.ndim - 2
    spatial = (1,) * rank
    term = xp.empty_like(out)
    out[...] = 0
    for position in itertools.product(*(range(k) for k in w.shape[2:])):
        pick = (Ellipsis, *position)
        xp.multiply(view[pick], w[pick].reshape(*w.shape[:2], *spatial), term)
        xp.add(out, term, out)


@define("max_pool")
def _max_pool(xp: ModuleType, attrs: Attrs) -> Kernel:
    geometry = _geometry(attrs)
    with_indices = flag(attrs, "indices")
    column_major = integer(attrs, "storage_order") == 1

    def folds(x: Array, out: Array) -> tuple[Array, Callable[[], None]]:
        """The padded input (pads filled here) and the call that refreshes
        it from ``x`` and folds its windows into ``out``."""
        begin, _, reach = geometry.padding(x.shape[2:], out.shape[2:])
        lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        padded, refresh = bind_padded(xp, x, begin, reach, lowest)
        return padded, bind_reduce_windows(
            xp, padded, geometry, xp.maximum, out, refresh
        )

    def max_pool(x: Array, out: Array, *indices: Array) -> None:
        padded, fold = folds(x, out)
        fold()
        if with_indices:
            out_spatial = out.shape[2:]
            begin = geometry.padding(x.shape[2:], out_spatial)[0]
            view = windows(xp, padded, geometry, out_spatial)
            _argmax_indices(
                xp, view, x.shape, begin, geometry, column_major, indices[0]
            )

    def borrowed(x: Array, out: Array) -> Callable[[], None]:
        """:func:`folds` in the calling thread's scratch (fresh megabytes
        per call are slow, see :mod:`asyncrt.ops._scratch`), the views
        made again only if the scratch moved; the pads filled each call
        (other kernels on the thread write over them)."""
        begin, _, reach = geometry.padding(x.shape[2:], out.shape[2:])
        spatial = x.shape[2:]
        extents = [b + e + r for b, e, r in zip(begin, spatial, reach, strict=True)]
        padded_shape = (*x.shape[:2], *extents)
        size = math.prod(padded_shape)
        lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        inner = (
            slice(None),
            slice(None),
            *(slice(b, b + e) for b, e in zip(begin, spatial, strict=True)),
        )
        slabs = [
            (slice(None), slice(None), *(slice(None),) * axis, side)
            for axis, (b, e) in enumerate(zip(begin, spatial, strict=True))
            for side in (slice(0, b), slice(b + e, None))
        ]
        copyto = np.copyto
        cache: list[Any] = [None, None, None]

        def prepare(flat: Array) -> tuple[list[Array], Callable[[], None]]:
            padded = flat[:size].reshape(padded_shape)
            rest = [size]  # the next free element of flat

            def empty(shape: list[int]) -> Array:
                start, rest[0] = rest[0], rest[0] + math.prod(shape)
                return flat[start : rest[0]].reshape(shape)

            refresh = functools.partial(copyto, padded[inner], x)
            fold = bind_reduce_windows(
                np, padded, geometry, np.maximum, out, refresh, empty
            )
            return [padded[slab] for slab in slabs], fold

        def pool() -> None:
            (flat,) = _scratch.borrow(((size * len(extents),),), x.dtype)
            if cache[0] != flat.ctypes.data:
                cache[:] = [flat.ctypes.data, *prepare(flat)]
            for border in cache[1]:
                border.fill(lowest)
            cache[2]()

        return pool

    def bind(x: Array, out: Array, *indices: Array) -> Callable[[], None]:
        begin, _, reach = geometry.padding(x.shape[2:], out.shape[2:])
        if (
            not with_indices
            and out.size
            and _poolvector.takes(x, out, geometry.strides, geometry.dilations)
        ):
            return _poolvector.bind(x, out, geometry.kernel, geometry.strides, begin)
        if not with_indices and out.size and _depthwise.pools(xp, x, out):
            return _depthwise.bind_pool(
                x,
                out,
                geometry.kernel,
                geometry.strides,
                begin,
                geometry.dilations,
                "max",
            )
        if with_indices or (xp is not np and not _fits(x, begin, reach)):
            return functools.partial(max_pool, x, out, *indices)
        if not _fits(x, begin, reach):
            return borrowed(x, out)
        return folds(x, out)[1]

    return Bindable(max_pool, bind)


def _fits(x: Array, begin: tuple[int, ...], end: tuple[int, ...]) -> bool:
    """Whether ``x`` padded by ``begin`` and ``end``, and the window fold's
    scratch between its passes (each smaller than the padded input, one
    fewer than the spatial axes), fit in a bound kernel's scratch."""
    padded = [b + s + e for b, s, e in zip(begin, x.shape[2:], end, strict=True)]
    nbytes = x.itemsize * x.shape[0] * x.shape[1] * math.prod(padded)
    return bool(nbytes * len(padded) <= _common.BOUND_SCRATCH_BYTES)


def _argmax_indices(
    xp: ModuleType,
    view: Array,
    in_shape: tuple[int, ...],
    begin: tuple[int, ...],
    geometry: Geometry,
    column_major: bool,
    out: Array,
) -> None:
    """MaxPool's ``Indices``: each maximum's flat index into the input."""
    n, c, *spatial = in_shape
    out_spatial = out.shape[2:]
    rank = len(spatial)
    flat = view.reshape(*view.shape[: 2 + rank], -1)
    best = xp.unravel_index(flat.argmax(axis=-1), geometry.kernel)
    coords = []
    for axis in range(rank):
        shape = [1] * (2 + rank)
        shape[2 + axis] = out_spatial[axis]
        start = xp.arange(out_spatial[axis]).reshape(shape) * geometry.strides[axis]
        coords.append(start - begin[axis] + best[axis] * geometry.dilations[axis])
    order = range(rank - 1, -1, -1) if column_major else range(rank)
    index = xp.zeros(out.shape, dtype=np.int64)
    for axis in order:
        index = index * spatial[axis] + coords[axis]
    base = xp.arange(n * c).reshape(n, c, *(1,) * rank) * math.prod(spatial)
    out[...] = index + base


#: Average pooling whose pooling matrix (input positions x output positions
#: of one plane) and its making (input positions squared) stay within this
#: many cells is one matmul with that matrix, made once per shape: small
#: planes, where the strided window folds are all per-call overhead.
POOL_MATRIX_CELLS = 1 << 16


@define("avg_pool")
def _avg_pool(xp: ModuleType, attrs: Attrs) -> Kernel:
    geometry = _geometry(attrs)
    count_pads = flag(attrs, "count_include_pad")

    @functools.lru_cache(maxsize=8)
    def inverse_counts(
        in_spatial: tuple[int, ...], out_spatial: tuple[int, ...]
    ) -> Array | None:
        """1 / how many cells of each window count (``None``: all do), made
        once per shape: real input cells, plus the explicit pads with
        count_include_pad; never the cells ceil_mode adds past them."""
        rank = len(in_spatial)
        begin, end, reach = geometry.padding(in_spatial, out_spatial)
        if not any(begin) and not any(reach):
            return None
        ones = xp.ones((1, 1, *in_spatial), dtype=np.float64)
        if count_pads:
            ones = pad_spatial(xp, ones, begin, end, 1)
            extra = tuple(r - e for r, e in zip(reach, end, strict=True))
            mask = pad_spatial(xp, ones, (0,) * rank, extra, 0)
        else:
            mask = pad_spatial(xp, ones, begin, reach, 0)
        counts = xp.empty((1, 1, *out_spatial), dtype=np.float64)
        reduce_windows(xp, mask, geometry, xp.add, counts)
        return 1 / counts

    @functools.lru_cache(maxsize=8)
    def pooling_matrix(
        in_spatial: tuple[int, ...], out_spatial: tuple[int, ...], dtype: str
    ) -> Array:
        """``P (in positions, out positions)``: ``out = x @ P`` per plane.
        Column ``o`` holds ``1 / count`` at the input cells window ``o``
        covers (pads hold no input, so they drop out)."""
        size = math.prod(in_spatial)
        begin, _, reach = geometry.padding(in_spatial, out_spatial)
        # Pool the identity: plane i is the one-hot image of input cell i.
        eye = xp.eye(size, dtype=np.float64).reshape(size, 1, *in_spatial)
        columns = xp.empty((size, 1, *out_spatial), dtype=np.float64)
        reduce_windows(
            xp, pad_spatial(xp, eye, begin, reach, 0), geometry, xp.add, columns
        )
        inverse = inverse_counts(in_spatial, out_spatial)
        scale = 1 / math.prod(geometry.kernel) if inverse is None else inverse
        return (columns * scale).reshape(size, -1).astype(dtype)

    def by_matrix(x: Array, out: Array) -> Callable[[], None] | None:
        """One matmul with the pooling matrix, or ``None`` where the planes
        are too large for one (or not numpy's: on a GPU the folds are
        fine). An input holding NaN or infinity takes the folds instead:
        the matrix's zeros would spread it over its whole plane."""
        in_spatial, out_spatial = tuple(x.shape[2:]), tuple(out.shape[2:])
        size, positions = math.prod(in_spatial), math.prod(out_spatial)
        if (
            xp is not np
            or size * max(size, positions) > POOL_MATRIX_CELLS
            or x.dtype.kind != "f"
            or not (x.flags.c_contiguous and out.flags.c_contiguous)
        ):
            return None
        matrix = pooling_matrix(in_spatial, out_spatial, x.dtype.str)
        planes = x.shape[0] * x.shape[1]
        rows, columns = x.reshape(planes, size), out.reshape(planes, positions)
        matmul, finite = xp.matmul, bind_all_finite(x)

        def pool() -> None:
            if finite():
                matmul(rows, matrix, out=columns)
            else:
                by_folds(x, out)()

        return pool

    def scale(x: Array, out: Array) -> Array | float:
        """What the window sums are multiplied by."""
        inverse = inverse_counts(tuple(x.shape[2:]), tuple(out.shape[2:]))
        if inverse is None:
            return 1 / math.prod(geometry.kernel)
        return inverse.astype(x.dtype)

    def by_folds(x: Array, out: Array) -> Callable[[], None]:
        """Pad (the pads filled here), fold the windows' sums, scale."""
        begin, _, reach = geometry.padding(x.shape[2:], out.shape[2:])
        padded, refresh = bind_padded(xp, x, begin, reach, 0)
        fold = bind_reduce_windows(xp, padded, geometry, xp.add, out, refresh)
        factor = scale(x, out)
        multiply = xp.multiply

        def pool() -> None:
            with quiet(xp):  # inf + -inf in a window: NaN, as IEEE has it
                fold()
            multiply(out, factor, out)

        return pool

    def by_planes(x: Array, out: Array) -> Callable[[], None] | None:
        """The window sums scaled, in vectors (:mod:`._poolvector`) or on
        the depthwise planar loop, or ``None`` where neither takes these
        arrays."""
        if not out.size:
            return None
        begin = geometry.padding(x.shape[2:], out.shape[2:])[0]
        if _poolvector.takes(x, out, geometry.strides, geometry.dilations):
            factor = scale(x, out)
            return _poolvector.bind(
                x, out, geometry.kernel, geometry.strides, begin, scale=factor
            )
        if not _depthwise.pools(xp, x, out):
            return None
        sums = _depthwise.bind_pool(
            x,
            out,
            geometry.kernel,
            geometry.strides,
            begin,
            geometry.dilations,
            "sum",
        )
        factor, multiply = scale(x, out), xp.multiply

        def planar() -> None:
            sums()
            multiply(out, factor, out)

        return planar

    def avg_pool(x: Array, out: Array) -> None:
        (by_matrix(x, out) or by_planes(x, out) or by_folds(x, out))()

    def bind(x: Array, out: Array) -> Callable[[], None]:
        bound = by_matrix(x, out) or by_planes(x, out)
        if bound is not None:
            return bound
        begin, _, reach = geometry.padding(x.shape[2:], out.shape[2:])
        if not _fits(x, begin, reach):
            return functools.partial(avg_pool, x, out)
        return by_folds(x, out)

    return Bindable(avg_pool, bind)


def _global(reduce: str) -> Callable[[ModuleType, Attrs], Kernel]:
    def make(xp: ModuleType, attrs: Attrs) -> Kernel:
        func = getattr(xp, reduce)

        def bind(x: Array, out: Array) -> Callable[[], None]:
            size = math.prod(x.shape[2:])
            spatial = tuple(range(2, x.ndim))
            compiled = (
                compiled_rows(x, out, spatial, size, "mean")
                if reduce == "mean"
                else None
            )
            if compiled is not None:  # small float32: one compiled loop
                return compiled
            if reduce == "mean" and size and x.dtype.kind == "f" and x.itemsize >= 4:
                # Each plane's mean as one matrix-vector product (BLAS):
                # numpy's mean over several axes costs several microseconds
                # more a call, the whole of a small model's pooling.
                planes = x.shape[0] * x.shape[1]
                rows, sums = x.reshape(planes, size), out.reshape(planes)
                ones, matmul, divide = _ones(xp, size, x.dtype), xp.matmul, xp.divide

                def means() -> None:
                    matmul(rows, ones, out=sums)
                    divide(sums, size, sums)

                return means
            return functools.partial(func, x, axis=spatial, keepdims=True, out=out)

        def global_pool(x: Array, out: Array) -> None:
            bind(x, out)()

        return Bindable(global_pool, bind)

    return make


define("global_avg_pool")(_global("mean"))
define("global_max_pool")(_global("max"))


def _ones(xp: ModuleType, width: int, dtype: np.dtype[Any]) -> Array:
    """A vector of ``width`` ones (read-only and cached, on numpy): a
    matrix-vector product with it sums rows on BLAS. Means divide the sums
    by the width afterwards: multiplying by a rounded ``1 / width`` instead
    is off by an ulp, which a layer norm of a near-constant row multiplies
    by ``1 / sqrt(epsilon)``."""
    if xp is np:
        return ones_vector(width, dtype.str)
    return xp.ones(width, dtype=dtype)


def _channel_shape(x: Array) -> tuple[int, ...]:
    return (1, x.shape[1], *(1,) * (x.ndim - 2))


@define("batch_norm")
def _batch_norm(xp: ModuleType, attrs: Attrs) -> Kernel:
    epsilon = number(attrs, "epsilon")

    def batch_norm(
        x: Array, scale: Array, bias: Array, mean: Array, var: Array, out: Array
    ) -> None:
        # Per channel: y = x * a + b; a and b are C numbers, cheap per run.
        a = scale / xp.sqrt(var + epsilon)
        b = bias - mean * a
        shape = _channel_shape(x)
        xp.multiply(x, a.reshape(shape).astype(x.dtype, copy=False), out)
        xp.add(out, b.reshape(shape).astype(x.dtype, copy=False), out)

    return batch_norm


@define("instance_norm")
def _instance_norm(xp: ModuleType, attrs: Attrs) -> Kernel:
    epsilon = number(attrs, "epsilon")

    def instance_norm(x: Array, scale: Array, bias: Array, out: Array) -> None:
        axes = tuple(range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        xp.subtract(x, mean, out)
        var = (out * out).mean(axis=axes, keepdims=True)
        shape = _channel_shape(x)
        xp.multiply(out, scale.reshape(shape) / xp.sqrt(var + epsilon), out)
        xp.add(out, bias.reshape(shape), out)

    def bind(x: Array, scale: Array, bias: Array, out: Array) -> Callable[[], None]:
        """One compiled loop per plane (``_epijit``'s ``instance_norm``:
        within float32 rounding of the passes, which sum pairwise) where
        numba takes these arrays; the passes otherwise."""
        arrays = (x, scale, bias, out)
        if (
            xp is not np
            or not _jit.available()
            or x.ndim < 3
            or not out.size
            or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays)
            or scale.size != x.shape[1]
            or bias.size != x.shape[1]
        ):
            return functools.partial(instance_norm, x, scale, bias, out)
        rows = x.shape[0] * x.shape[1]
        width = x.size // rows
        planes = (
            x.reshape(rows, width),
            scale.reshape(-1),
            bias.reshape(-1),
            out.reshape(rows, width),
            np.float32(epsilon),
            x.shape[1],
        )
        return _epijit.bind_rows(_epijit.loop("instance_norm"), planes, rows, width)

    def call(x: Array, scale: Array, bias: Array, out: Array) -> None:
        bind(x, scale, bias, out)()  # the bound kernel's bits, called or bound

    return Bindable(call, bind)


def _row_normaliser(
    xp: ModuleType,
    flat: Array,
    centred: Array,
    mean: Array,
    inv: Array,
    ones: Array | None,
    epsilon: float,
    scale: Array,
    bias: Array | None,
) -> Callable[[], None]:
    """Layer norm of the rows ``flat`` (``(rows, width)``) into ``centred``
    (its rows, or the whole output where ``scale`` and ``bias`` broadcast
    otherwise), the rows' mean and 1 / std dev into ``mean`` and ``inv``.

    The mean is one matrix-vector product with ``1 / width`` (BLAS; numpy's
    ``add.reduce`` over short rows costs more), ``centred`` holds ``x -
    mean``, and the squares' sum is one ``vecdot`` (numpy >= 2; 2.5-3x
    ``einsum``, which older numpy and cupy use). Two reductions and one
    subtraction, no full-size temporary.
    """
    width = flat.shape[1]
    rows = centred.reshape(-1, width)
    mean_column, inv_column = mean.reshape(-1, 1), inv.reshape(-1, 1)
    matmul, subtract, multiply = xp.matmul, xp.subtract, xp.multiply
    add, sqrt, reciprocal, copyto = xp.add, xp.sqrt, xp.reciprocal, xp.copyto
    divide = xp.divide
    vecdot = getattr(xp, "vecdot", None)

    def row_means() -> None:
        if ones is not None:
            matmul(flat, ones, out=mean)
        else:  # half precision: numpy's pairwise sum, not a half dot
            copyto(mean, add.reduce(flat, axis=1))
        divide(mean, width, mean)

    def squares() -> None:
        if vecdot is not None and xp is np:
            vecdot(rows, rows, out=inv)
        elif vecdot is not None:
            copyto(inv, vecdot(rows, rows))
        else:
            copyto(inv, xp.einsum("ij,ij->i", rows, rows))

    def normalise() -> None:
        row_means()
        subtract(flat, mean_column, rows)
        squares()
        divide(inv, width, inv)
        add(inv, epsilon, inv)
        sqrt(inv, inv)
        reciprocal(inv, inv)
        multiply(rows, inv_column, rows)
        multiply(centred, scale, centred)
        if bias is not None:
            add(centred, bias, centred)

    return normalise


def _compiled_layer_norm(
    x: Array,
    scale: Array,
    bias: Array | None,
    out: Array,
    means: Array,
    invs: Array,
    epsilon: float,
) -> Callable[[], None] | None:
    """Layer norm of the rows of ``x`` (``(rows, width)``) into ``out`` as
    one compiled loop per row (``_epijit``'s ``layer_norm``: within float32
    rounding of the numpy passes, not bit for bit), or ``None`` without
    numba or for arrays other than C-contiguous float32 with one ``scale``
    and ``bias`` value per column."""
    width = x.shape[1]
    arrays = (x, scale, out) if bias is None else (x, scale, bias, out)
    if (
        not _jit.available()
        or not width
        or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays)
        or any(a.size != width for a in arrays[1:-1])
    ):
        return None
    shift = np.zeros(width, np.float32) if bias is None else bias.reshape(width)
    row_arrays = (x, scale.reshape(width), shift, out, means, invs, np.float32(epsilon))
    return _epijit.bind_rows(_epijit.loop("layer_norm"), row_arrays, x.shape[0], width)


@define("layer_norm")
def _layer_norm(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")
    epsilon = number(attrs, "epsilon")
    has_bias = flag(attrs, "bias")
    extra = integer(attrs, "stats")  # 0, 1 (Mean) or 2 (Mean, InvStdDev)
    stash = attrs.get("stash_dtype")
    if stash is not None and not isinstance(stash, str):
        raise ValueError(f"attribute 'stash_dtype' must be a dtype name: {stash!r}")
    # Resolved once: ``dtype.name`` costs microseconds a call.
    stash_type = None if stash is None else np.dtype(stash)

    def fast(x: Array, scale: Array, *rest: Array) -> Callable[[], None] | None:
        """Layer norm on these arrays, as one call without arguments (the
        row statistics' buffers made here; :func:`_row_normaliser` per
        block of rows), or ``None`` where a stash dtype other than ``x``'s
        needs the general path."""
        bias = rest[0] if has_bias else None
        y, *stats = rest[1:] if has_bias else rest
        width = math.prod(x.shape[axis % x.ndim :])
        if (
            y.dtype != x.dtype
            or not (stash_type is None or stash_type == x.dtype)
            or not width
        ):
            return None
        flat, centred = x.reshape(-1, width), y.reshape(-1, width)
        rows = flat.shape[0]
        mean = xp.empty(rows, dtype=x.dtype)
        inv = xp.empty(rows, dtype=x.dtype)
        kept = [
            (value, target.reshape(-1))
            for value, target in zip((mean, inv), stats[:extra], strict=False)
        ]
        ones = _ones(xp, width, x.dtype) if x.dtype.itemsize >= 4 else None
        copyto = xp.copyto
        # Blocks of rows whose arrays stay in cache through the passes, and
        # those blocks over the kernel threads where the work pays for a
        # hand-off; one block where scale or bias are not whole rows.
        rowwise = xp is np and all(
            t is None or t.size in (1, width) for t in (scale, bias)
        )
        rows_normalised = (
            _compiled_layer_norm(flat, scale, bias, centred, mean, inv, epsilon)
            if rowwise
            else None
        )
        if rows_normalised is None:
            block = max(1, _blocks.BLOCK // width) if rowwise else rows
            per_row = (
                (scale.reshape(-1), None if bias is None else bias.reshape(-1))
                if rowwise
                else (scale, bias)
            )

            def normaliser(first: int, last: int) -> Callable[[], None]:
                return in_turn(
                    [
                        _row_normaliser(
                            xp,
                            flat[i : min(i + block, last)],
                            centred[i : min(i + block, last)] if rowwise else y,
                            mean[i : min(i + block, last)],
                            inv[i : min(i + block, last)],
                            ones,
                            epsilon,
                            *per_row,
                        )
                        for i in range(first, last, block)
                    ]
                )

            shares = (
                _threads.shares(rows, x.size // SOFTMAX_SPLIT_ELEMENTS)
                if rowwise
                else [(0, rows)]
            )
            parts = [normaliser(first, last) for first, last in shares]
            rows_normalised = functools.partial(_threads.run_parts, parts)

        def normalise() -> None:
            rows_normalised()
            for value, target in kept:
                copyto(target, value)

        return normalise

    def layer_norm(x: Array, scale: Array, *rest: Array) -> None:
        bound = fast(x, scale, *rest)
        if bound is not None:
            bound()
            return
        bias = rest[0] if has_bias else None
        y, *stats = rest[1:] if has_bias else rest
        start = axis % x.ndim
        axes = tuple(range(start, x.ndim))
        work = x.astype(stash, copy=False) if stash is not None else x
        mean = work.mean(axis=axes, keepdims=True)
        centred = work - mean
        var = (centred * centred).mean(axis=axes, keepdims=True)
        inv = 1 / xp.sqrt(var + epsilon)
        xp.multiply(centred, inv, out=y, casting="unsafe")
        xp.multiply(y, scale, y)
        if bias is not None:
            xp.add(y, bias, y)
        if extra >= 1:
            stats[0][...] = mean
        if extra >= 2:
            stats[1][...] = inv

    def bind(x: Array, scale: Array, *rest: Array) -> Callable[[], None]:
        return fast(x, scale, *rest) or functools.partial(layer_norm, x, scale, *rest)

    return Bindable(layer_norm, bind)


@define("lrn")
def _lrn(xp: ModuleType, attrs: Attrs) -> Kernel:
    alpha, beta, bias = (number(attrs, k) for k in ("alpha", "beta", "bias"))
    size = integer(attrs, "size")

    def lrn(x: Array, out: Array) -> None:
        square = x * x
        before = (size - 1) // 2  # ONNX: floor before the channel, ceil after
        after = size - 1 - before
        width = [(0, 0), (before, after), *((0, 0),) * (x.ndim - 2)]
        padded = xp.pad(square, width)
        view = xp.lib.stride_tricks.sliding_window_view(padded, size, axis=1)
        total = view.sum(axis=-1)
        with quiet(xp):
            total = bias + alpha / size * total
            raise_to_beta(total, xp.empty_like(total))
            xp.divide(x, total, out)

    def raise_to_beta(total: Array, scratch: Array) -> None:
        # the compiled pass's form (_jitlrn) wherever it serves
        if beta == _jitlrn.BETA and xp is np:
            _jitlrn.power_three_quarters(total, scratch)
        else:
            xp.power(total, beta, out=total)

    def bind(x: Array, out: Array) -> Callable[[], None]:
        if xp is np and _jitlrn.takes(x, out, beta):
            return _jitlrn.bind_lrn(x, out, size, alpha, bias)
        if xp is not np or x.ndim < 2 or not x.size or x.dtype != out.dtype:
            return functools.partial(lrn, x, out)
        before = (size - 1) // 2
        channels = x.shape[1]
        # Per image: its squares (zero pads around the channels, filled
        # once) and the window sums, made here; the sums as shifted adds,
        # in the order of the window's sum (bit for bit).
        squares = np.zeros((channels + size - 1, *x.shape[2:]), x.dtype)
        total, scratch = np.empty(x.shape[1:], x.dtype), np.empty(x.shape[1:], x.dtype)
        inner = squares[before : before + channels]
        windows = [squares[k : k + channels] for k in range(1, size)]
        multiply, add, copyto = np.multiply, np.add, np.copyto
        divide, per = np.divide, alpha / size
        images = list(zip(x, out, strict=True))

        def run() -> None:
            with quiet(np):
                for image, target in images:
                    multiply(image, image, out=inner)
                    copyto(total, squares[:channels])
                    for window in windows:
                        add(total, window, out=total)
                    multiply(total, per, out=total)
                    add(total, bias, out=total)
                    raise_to_beta(total, scratch)
                    divide(image, total, out=target)

        return run

    return Bindable(lrn, bind)
