"""Data movement: transposes, concatenation, splits, slices, gathers,
padding, tiling and block rearrangements.

Shapes and index ranges that ONNX takes as inputs (``Slice``'s starts,
``Split``'s sizes, ``Pad``'s pads) reach these ops as attributes: the
importer requires them to be known at import time, so that every tensor has
a static shape the planner can place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import numpy as np

from ._common import Array, calculable, choice, flag, integer, ints, number, quiet
from ._kernels import Bindable
from ._library import Attrs, define

__all__ = ()

Kernel = Callable[..., None]


def _copy_into(xp: ModuleType, out: Array, value: Array) -> None:
    xp.copyto(out, value, casting="unsafe")


@define("transpose")
def _transpose(xp: ModuleType, attrs: Attrs) -> Kernel:
    perm = ints(attrs, "perm")

    def bind(a: Array, out: Array) -> Callable[[], None]:
        return functools.partial(xp.copyto, out, a.transpose(perm))

    def transpose(a: Array, out: Array) -> None:
        bind(a, out)()

    return Bindable(transpose, bind)


@define("concat")
def _concat(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")

    def concat(*args: Array) -> None:
        *inputs, out = args
        xp.concatenate(inputs, axis=axis, out=out)

    return concat


@define("split")
def _split(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")

    def bind(a: Array, *outs: Array) -> Callable[[], None]:
        """One copy per output, from its view of ``a`` (made here)."""
        pairs, start = [], 0
        index = [slice(None)] * a.ndim
        for out in outs:
            stop = start + out.shape[axis]
            index[axis] = slice(start, stop)
            pairs.append((out, a[tuple(index)]))
            start = stop
        copyto = xp.copyto

        def copy_parts() -> None:
            for out, part in pairs:
                copyto(out, part)

        return copy_parts

    def split(a: Array, *outs: Array) -> None:
        bind(a, *outs)()

    return Bindable(split, bind)


@define("slice")
def _slice(xp: ModuleType, attrs: Attrs) -> Kernel:
    # [[axis, start, stop, step], ...], as ONNX gives them: Python's slice
    # semantics (negative counts from the end, clamping) are ONNX's.
    spec = attrs.get("slices")
    if not isinstance(spec, list) or not all(
        isinstance(item, list) and len(item) == 4 and all(type(v) is int for v in item)
        for item in spec
    ):
        raise ValueError(
            f"attribute 'slices' must be [[axis, start, stop, step]...]: {spec!r}"
        )
    if any(item[3] == 0 for item in spec):
        raise ValueError("a slice step cannot be 0")

    def slice_(a: Array, out: Array) -> None:
        index = [slice(None)] * a.ndim
        for axis, start, stop, step in spec:
            index[axis] = slice(start, stop, step)
        xp.copyto(out, a[tuple(index)])

    return slice_


@define("gather")
def _gather(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")

    def gather(a: Array, indices: Array, out: Array) -> None:
        if xp is not np or indices.size <= GATHER_CHECKED_MIN:
            xp.take(a, indices, axis=axis, out=out)
            return
        # numpy buffers ``out`` where it checks the indices itself
        # (mode="raise"): checked here, the rows go straight to ``out``
        # (16 x 512 rows of a 30522 x 768 table: 6.5 -> 2.4 ms).
        size = a.shape[axis]
        low, high = int(indices.min()), int(indices.max())
        if low < -size or high >= size:
            bad = low if low < -size else high
            raise IndexError(
                f"index {bad} is out of bounds for axis {axis} with size {size}"
            )
        np.take(a, indices, axis=axis, out=out, mode="wrap")

    return gather


#: Gathers of more indices than this check them once and copy unbuffered;
#: fewer take numpy's checked (buffered) path, which costs less than the
#: two reductions there.
GATHER_CHECKED_MIN = 64


@define("gather_elements")
def _gather_elements(xp: ModuleType, attrs: Attrs) -> Kernel:
    axis = integer(attrs, "axis")

    def gather_elements(a: Array, indices: Array, out: Array) -> None:
        xp.copyto(out, xp.take_along_axis(a, indices, axis=axis))

    return gather_elements


@define("pad")
def _pad(xp: ModuleType, attrs: Attrs) -> Kernel:
    pads = ints(attrs, "pads")  # begin per axis, then end per axis
    mode = choice(attrs, "mode", ("constant", "reflect", "edge", "wrap"))
    value = number(attrs, "value")

    def pad(a: Array, out: Array) -> None:
        rank = a.ndim
        begin, end = pads[:rank], pads[rank:]
        # Negative pads crop; positive ones grow.
        crop = tuple(
            slice(max(-b, 0), a.shape[i] - max(-e, 0))
            for i, (b, e) in enumerate(zip(begin, end, strict=True))
        )
        width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
        source = a[crop]
        if mode == "constant":
            padded = xp.pad(source, width, mode="constant", constant_values=value)
        else:
            padded = xp.pad(source, width, mode=mode)
        _copy_into(xp, out, padded)

    return pad


@define("tile")
def _tile(xp: ModuleType, attrs: Attrs) -> Kernel:
    repeats = ints(attrs, "repeats")

    def tile(a: Array, out: Array) -> None:
        xp.copyto(out, xp.tile(a, repeats))

    return tile


@define("depth_to_space")
def _depth_to_space(xp: ModuleType, attrs: Attrs) -> Kernel:
    block = integer(attrs, "blocksize")
    dcr = choice(attrs, "mode", ("DCR", "CRD")) == "DCR"

    def depth_to_space(a: Array, out: Array) -> None:
        n, c, h, w = a.shape
        depth = c // (block * block)
        if dcr:
            tmp = a.reshape(n, block, block, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            tmp = a.reshape(n, depth, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
        xp.copyto(out, tmp.reshape(out.shape))

    return depth_to_space


@define("space_to_depth")
def _space_to_depth(xp: ModuleType, attrs: Attrs) -> Kernel:
    block = integer(attrs, "blocksize")
    dcr = choice(attrs, "mode", ("DCR", "CRD")) == "DCR"
    # DCR: depth is (block, block, channel); CRD: (channel, block, block).
    order = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)

    def space_to_depth(a: Array, out: Array) -> None:
        n, c, h, w = a.shape
        tmp = a.reshape(n, c, h // block, block, w // block, block)
        xp.copyto(out, tmp.transpose(order).reshape(out.shape))

    return space_to_depth


@define("trilu")
def _trilu(xp: ModuleType, attrs: Attrs) -> Kernel:
    upper = flag(attrs, "upper")
    k = integer(attrs, "k")

    def trilu(a: Array, out: Array) -> None:
        xp.copyto(out, xp.triu(a, k) if upper else xp.tril(a, k))

    return trilu


@define("broadcast")
def _broadcast(xp: ModuleType, attrs: Attrs) -> Kernel:
    def broadcast(a: Array, out: Array) -> None:
        xp.copyto(out, a)  # ONNX's Expand: numpy broadcasting into the output

    return broadcast


@define("einsum", blas=True)
def _einsum(xp: ModuleType, attrs: Attrs) -> Kernel:
    equation = attrs.get("equation")
    if not isinstance(equation, str) or not equation.isascii():
        raise ValueError(f"attribute 'equation' must be an ASCII string: {equation!r}")

    def einsum(*args: Array) -> None:
        *inputs, out = args
        with quiet(xp):
            operands = [calculable(a) for a in inputs]
            _copy_into(xp, out, xp.einsum(equation, *operands))

    return einsum


@define("dropout")
def _dropout(xp: ModuleType, attrs: Attrs) -> Kernel:
    def dropout(a: Array, out: Array, mask: Array) -> None:
        xp.copyto(out, a)  # inference: nothing is dropped
        mask[...] = True

    return dropout
