"""Transposed convolution: one batched GEMM, then col2im.

``x (N, C, *in)`` and ``w (C, M / group, *kernel)``. Per group, the GEMM
``w_g^T (M/g * K, C/g) @ x_g (C/g, P)`` gives every input position's
contribution to every kernel offset of every output channel: a column
matrix ``(N, M, *kernel, *in)``. col2im then adds each kernel offset's
plane into the output, strided by ``strides`` and shifted by ``offset *
dilation - pad_begin``: ``prod(kernel)`` whole-array adds over strided
views, never a loop per pixel. The parts of a plane that fall into the pads
(or past ``output_shape``) are cut before the add, so the planned output is
written directly, without a padded buffer.

Where the kernel tiles the output exactly (``strides == kernel_shape``,
no dilation, no pads, ``out == in * strides``: U-Net's 2x2 upsampling),
the kernel offsets' planes are disjoint and cover the output: col2im is a
strided copy per offset, without the zero fill and the adds. (One copy of
the whole column matrix transposed into the output measured 4-5x slower:
its innermost axis strides across planes.)

Where the column matrix is at least as large as the input (``C / group <=
M / group``) and outgrows the bound scratch, or the strides are all 1, and
there is no dilation, the kernel runs as stride-1 convolutions instead, one
per output phase (:mod:`asyncrt.ops._subpixel`), whose GEMMs do the sums.

Half precision and the narrow formats accumulate in float32. The column
matrix is scratch (bound kernels keep it when it fits
``BOUND_SCRATCH_BYTES``); everything that depends only on the shapes is
worked out once per shape.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from scheduler.dag import TensorSpec

from . import _common, _subpixel
from ._common import Array, flag, integer, ints
from ._kernels import Bindable
from ._library import Attrs, define

__all__ = ()

Kernel = Callable[..., None]
_WIDE = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """A multiply-add per input element per weight of one output group."""
    return 2.0 * ins[0].size * math.prod(ins[1].shape[1:])


@dataclass(frozen=True)
class _Col2Im:
    """How a column matrix ``(N, M, *kernel, *in)`` lands in the output."""

    #: ``(output key, column key)`` per kernel offset that reaches it.
    adds: tuple[tuple[tuple[slice, ...], tuple[Any, ...]], ...]
    #: the offsets' planes are disjoint and cover the output: copies, not adds.
    tiles: bool


@functools.lru_cache(maxsize=256)
def _col2im(
    in_spatial: tuple[int, ...],
    out_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    begin: tuple[int, ...],
) -> _Col2Im:
    tiles = (
        strides == kernel
        and all(d == 1 for d in dilations)
        and not any(begin)
        and out_spatial
        == tuple(i * s for i, s in zip(in_spatial, strides, strict=True))
    )
    adds = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        out_key: list[slice] = []
        col_key: list[Any] = list(offset)
        for axis, k in enumerate(offset):
            s, shift = strides[axis], k * dilations[axis] - begin[axis]
            # the input positions i whose output i * s + shift is in range
            first = max(0, -(shift // s))
            last = min(in_spatial[axis], (out_spatial[axis] - 1 - shift) // s + 1)
            if last <= first:
                break
            start = first * s + shift
            out_key.append(slice(start, start + (last - first - 1) * s + 1, s))
            col_key.append(slice(first, last))
        else:
            adds.append((tuple(out_key), tuple(col_key)))
    return _Col2Im(tuple(adds), tiles)


@define("conv_transpose", flops=_flops, blas=True)
def _conv_transpose(xp: ModuleType, attrs: Attrs) -> Kernel:
    kernel = ints(attrs, "kernel_shape")
    strides = ints(attrs, "strides")
    dilations = ints(attrs, "dilations")
    begin = ints(attrs, "pads_begin")
    group = integer(attrs, "group")
    has_bias = flag(attrs, "bias")
    rank = len(kernel)
    if not len(strides) == len(dilations) == len(begin) == rank:
        raise ValueError("strides, dilations and pads_begin need one value per axis")
    if min((*kernel, *strides, *dilations), default=1) < 1 or group < 1:
        raise ValueError("kernel_shape, strides, dilations and group must be >= 1")

    def setup(
        x: Array, w: Array, out: Array
    ) -> tuple[_Col2Im, tuple[int, ...], Array, Array]:
        """The col2im plan, the column matrix's shape, and the GEMM's
        operands: ``w`` as ``(g, M/g * K, C/g)`` and ``x`` as ``(N, g, C/g,
        P)`` (views)."""
        n, c, *spatial = x.shape
        m = w.shape[1] * group
        plan = _col2im(
            tuple(spatial), tuple(out.shape[2:]), kernel, strides, dilations, begin
        )
        weights = w.reshape(group, c // group, -1).transpose(0, 2, 1)
        inputs = x.reshape(n, group, c // group, -1)
        return plan, (n, m, *kernel, *spatial), weights, inputs

    def make(x: Array, w: Array, *rest: Array) -> Callable[[], None]:
        """The kernel on these arrays: views, scratch and col2im plan made
        here, once."""
        out = rest[-1]
        if out.dtype not in _WIDE or not out.size:
            return functools.partial(narrow, x, w, *rest)
        bias = rest[0].reshape(1, -1, *(1,) * rank) if has_bias else None
        plan, shape, weights, inputs = setup(x, w, out)
        kept = math.prod(shape) * out.itemsize <= _common.BOUND_SCRATCH_BYTES
        cg, mg = x.shape[1] // group, w.shape[1]
        single = all(s == 1 for s in strides)
        if (
            not plan.tiles
            and (single or not kept)
            and _subpixel.worth_it(strides, dilations, cg, mg)
        ):
            phases = _subpixel.phases(
                tuple(x.shape[2:]), tuple(out.shape[2:]), kernel, strides, begin
            )
            vector = rest[0] if has_bias else None
            run = _subpixel.run_phases
            return functools.partial(run, xp, phases, x, w, vector, out, group)
        scratch = xp.empty(shape, dtype=out.dtype) if kept else None
        grid = (shape[0], group, weights.shape[1], inputs.shape[-1])
        matmul, add, copyto = xp.matmul, xp.add, xp.copyto
        keys = [
            ((Ellipsis, *out_key), (slice(None), slice(None), *col_key))
            for out_key, col_key in plan.adds
        ]
        # With the column matrix kept, its views and the output's are made
        # here (a few microseconds per offset a call otherwise).
        views = None if scratch is None else [(out[o], scratch[c]) for o, c in keys]

        def col2im(cols: Array) -> None:
            pairs = views or [(out[o], cols[c]) for o, c in keys]
            if plan.tiles:
                for target, plane in pairs:
                    copyto(target, plane)
                if bias is not None:
                    add(out, bias, out)
                return
            # The bias is the sums' starting value: no pass of its own.
            if bias is not None:
                copyto(out, bias)
            else:
                out[...] = 0
            for target, plane in pairs:
                add(target, plane, target)

        def conv_transpose() -> None:
            cols = scratch if scratch is not None else xp.empty(shape, out.dtype)
            matmul(weights, inputs, out=cols.reshape(grid))
            col2im(cols)

        return conv_transpose

    def narrow(x: Array, w: Array, *rest: Array) -> None:
        """Half precision and the narrow formats: in float32, rounded once."""
        wide = xp.empty(rest[-1].shape, dtype=np.float32)
        if wide.size:
            more = [r.astype(np.float32) for r in rest[:-1]]
            make(x.astype(np.float32), w.astype(np.float32), *more, wide)()
        rest[-1][...] = wide

    def conv_transpose(x: Array, w: Array, *rest: Array) -> None:
        make(x, w, *rest)()

    def bind(x: Array, w: Array, *rest: Array) -> Callable[[], None]:
        # A bound call keeps reshaped views: of a strided array they would
        # be copies, blind to its later values.
        if all(a.flags.c_contiguous for a in (x, w, *rest)):
            return make(x, w, *rest)
        return functools.partial(conv_transpose, x, w, *rest)

    return Bindable(conv_transpose, bind)
