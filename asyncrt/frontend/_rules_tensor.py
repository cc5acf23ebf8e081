"""Rules for shape and data-movement operators, and constants.

Reshapes (``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``,
``Identity``) are TVM's ``__nop``: the output aliases the input's storage,
no copy. Shape queries (``Shape``, ``Size``) and constant generators
(``Constant``, ``ConstantOfShape``, ``Range``) are folded at import time:
shapes are static.
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ._rules import NOP, Call, Folded, Lowering, NodeContext, rule
from ._values import Const

__all__ = ()


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    normal = axis + rank if axis < 0 else axis
    if not 0 <= normal < rank:
        raise ctx.unsupported(f"axis {axis} out of range for rank {rank}")
    return normal


@rule("Identity")
def _identity(ctx: NodeContext) -> Lowering:
    return Call(NOP, (0,))


@rule("Reshape", attrs=("allowzero",), static=(1,))
def _reshape(ctx: NodeContext) -> Lowering:
    return Call(NOP, (0,))  # the inferred output shape is the target


@rule("Flatten", attrs=("axis",))
def _flatten(ctx: NodeContext) -> Lowering:
    return Call(NOP, (0,))


@rule("Squeeze", "Unsqueeze", attrs=("axes",), static=(1,))
def _squeeze(ctx: NodeContext) -> Lowering:
    return Call(NOP, (0,))


@rule("Dropout", attrs=("ratio", "seed", "is_test"), static=(1, 2))
def _dropout(ctx: NodeContext) -> Lowering:
    training = bool(ctx.const(2).item()) if ctx.has(2) else False
    if training or ctx.attr("is_test", 1) == 0:
        raise ctx.unsupported("training mode (random masks) is not supported")
    if ctx.num_outputs == 1:
        return Call(NOP, (0,))
    return Call("dropout", (0,), {})


@rule("Transpose", attrs=("perm",))
def _transpose(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    perm = list(ctx.attr("perm", list(range(rank - 1, -1, -1))))
    return Call("transpose", (0,), {"perm": perm})


@rule("Concat", attrs=("axis",))
def _concat(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    axis = _axis(ctx, int(ctx.attr("axis")), rank)
    return Call("concat", tuple(range(len(ctx.inputs))), {"axis": axis})


@rule("Split", attrs=("axis", "split", "num_outputs"), static=(1,))
def _split(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    axis = _axis(ctx, int(ctx.attr("axis", 0)), rank)
    return Call("split", (0,), {"axis": axis})  # sizes: the outputs' shapes


@rule("Slice", attrs=("starts", "ends", "axes"), static=(1, 2, 3, 4))
def _slice(ctx: NodeContext) -> Lowering:
    shape = ctx.spec(0).shape
    if ctx.version < 10:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.ints(1), ctx.ints(2)
        axes = ctx.ints(3) if ctx.has(3) else list(range(len(starts)))
        steps = ctx.ints(4) if ctx.has(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.unsupported("starts, ends, axes and steps differ in length")
    slices = [
        [_axis(ctx, axis, len(shape)), start, end, step]
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True)
    ]
    if any(step == 0 for *_, step in slices):
        raise ctx.unsupported("a slice step of 0")
    return Call("slice", (0,), {"slices": slices})


@rule("Gather", attrs=("axis",))
def _gather(ctx: NodeContext) -> Lowering:
    shape = ctx.spec(0).shape
    axis = _axis(ctx, int(ctx.attr("axis", 0)), len(shape))
    indices = ctx.inputs[1]
    if isinstance(indices, Const) and indices.array.size:
        # Known now: an index past the axis would fail every run.
        low, high = int(indices.array.min()), int(indices.array.max())
        if low < -shape[axis] or high >= shape[axis]:
            raise GraphError(
                f"(Gather) index {low if low < -shape[axis] else high} is out of "
                f"range for axis {axis} of size {shape[axis]}",
                node=ctx.name,
            )
    return Call("gather", (0, 1), {"axis": axis})


@rule("GatherElements", attrs=("axis",))
def _gather_elements(ctx: NodeContext) -> Lowering:
    axis = _axis(ctx, int(ctx.attr("axis", 0)), len(ctx.spec(0).shape))
    return Call("gather_elements", (0, 1), {"axis": axis})


@rule("Expand", static=(1,))
def _expand(ctx: NodeContext) -> Lowering:
    return Call("broadcast", (0,), {})


@rule("Where")
def _where(ctx: NodeContext) -> Lowering:
    return Call("where", (0, 1, 2))


@rule("Tile", static=(1,))
def _tile(ctx: NodeContext) -> Lowering:
    return Call("tile", (0,), {"repeats": ctx.ints(1)})


@rule("Pad", attrs=("mode", "pads", "value"), static=(1, 2, 3))
def _pad(ctx: NodeContext) -> Lowering:
    ctx.refuse("mode", ("constant", "reflect", "edge", "wrap"))
    rank = len(ctx.spec(0).shape)
    if ctx.version < 11:
        pads, value = list(ctx.attr("pads")), float(ctx.attr("value", 0.0))
    else:
        pads = ctx.ints(1)
        value = ctx.const(2).item() if ctx.has(2) else 0
    axes = ctx.ints(3) if ctx.has(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.unsupported(f"pads {pads} do not match axes {axes}")
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        axis = _axis(ctx, axis, rank)
        full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
    attrs = {"pads": full, "mode": ctx.attr("mode", "constant"), "value": value}
    return Call("pad", (0,), attrs)


@rule("DepthToSpace", attrs=("blocksize", "mode"))
def _depth_to_space(ctx: NodeContext) -> Lowering:
    ctx.refuse("mode", ("DCR", "CRD"))
    attrs = {"blocksize": int(ctx.attr("blocksize")), "mode": ctx.attr("mode", "DCR")}
    return Call("depth_to_space", (0,), attrs)


@rule("SpaceToDepth", attrs=("blocksize", "mode"))
def _space_to_depth(ctx: NodeContext) -> Lowering:
    ctx.refuse("mode", ("DCR", "CRD"))
    attrs = {"blocksize": int(ctx.attr("blocksize")), "mode": ctx.attr("mode", "DCR")}
    return Call("space_to_depth", (0,), attrs)


@rule("Trilu", attrs=("upper",), static=(1,))
def _trilu(ctx: NodeContext) -> Lowering:
    k = ctx.ints(1)[0] if ctx.has(1) else 0
    return Call("trilu", (0,), {"upper": bool(ctx.attr("upper", 1)), "k": k})


# -- folded at import time ---------------------------------------------------


@rule("Shape", attrs=("start", "end"))
def _shape(ctx: NodeContext) -> Lowering:
    shape = ctx.spec(0).shape
    start, end = ctx.attr("start", 0), ctx.attr("end", len(shape))
    return Folded((np.array(shape[start:end], dtype=np.int64),))


@rule("Size")
def _size(ctx: NodeContext) -> Lowering:
    return Folded((np.array(int(np.prod(ctx.spec(0).shape)), dtype=np.int64),))


@rule(
    "Constant",
    attrs=(
        "value",
        "value_float",
        "value_floats",
        "value_int",
        "value_ints",
    ),
)
def _constant(ctx: NodeContext) -> Lowering:
    if "value" in ctx.attrs:
        value = np.asarray(ctx.attr("value"))
    elif "value_float" in ctx.attrs:
        value = np.array(ctx.attr("value_float"), dtype=np.float32)
    elif "value_floats" in ctx.attrs:
        value = np.array(ctx.attr("value_floats"), dtype=np.float32)
    elif "value_int" in ctx.attrs:
        value = np.array(ctx.attr("value_int"), dtype=np.int64)
    elif "value_ints" in ctx.attrs:
        value = np.array(ctx.attr("value_ints"), dtype=np.int64)
    else:
        raise ctx.unsupported("a Constant without a supported value attribute")
    if value.dtype.kind not in "biuf":
        raise ctx.unsupported(f"constant of dtype {value.dtype} is not supported")
    return Folded((value,))


@rule("ConstantOfShape", attrs=("value",), static=(0,))
def _constant_of_shape(ctx: NodeContext) -> Lowering:
    value = ctx.attr("value")
    fill = np.asarray(value).reshape(-1)[0] if value is not None else np.float32(0)
    return Folded((np.full(ctx.ints(0), fill, dtype=np.asarray(fill).dtype),))


@rule("Range", static=(0, 1, 2))
def _range(ctx: NodeContext) -> Lowering:
    start, limit, delta = (ctx.const(i).item() for i in range(3))
    dtype = ctx.const(0).dtype
    count = max(int(np.ceil((limit - start) / delta)), 0) if delta else 0
    values = np.array(start, dtype=dtype) + np.arange(count, dtype=dtype) * np.array(
        delta, dtype=dtype
    )
    return Folded((values.astype(dtype, copy=False),))
