"""Rules for indexing by tensors: GatherND, ScatterND, ScatterElements (and
its old name Scatter), NonZero.

NonZero's output shape is its input's count of nonzero elements: asyncrt
plans static shapes, so its input must be known at import time (a constant
expression, or a graph input bound with ``from_onnx(..., bind=...)``); the
node is then folded. A run-time input is refused by name.
"""

from __future__ import annotations

import numpy as np

from scheduler.dag import TensorSpec

from ._rules import Call, Lowering, NodeContext, rule

__all__ = ()

_REDUCTIONS = ("none", "add", "mul", "max", "min")


@rule("GatherND", attrs=("batch_dims",))
def _gather_nd(ctx: NodeContext) -> Lowering:
    batch_dims = int(ctx.attr("batch_dims", 0))
    return Call("gather_nd", (0, 1), {"batch_dims": batch_dims})


@rule("ScatterND", attrs=("reduction",))
def _scatter_nd(ctx: NodeContext) -> Lowering:
    ctx.refuse("reduction", _REDUCTIONS)
    return Call("scatter_nd", (0, 1, 2), {"reduction": ctx.attr("reduction", "none")})


@rule("ScatterElements", "Scatter", attrs=("axis", "reduction"))
def _scatter_elements(ctx: NodeContext) -> Lowering:
    ctx.refuse("reduction", _REDUCTIONS)
    rank = len(ctx.spec(0).shape)
    axis = int(ctx.attr("axis", 0))
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} out of range for rank {rank}")
    attrs = {"axis": axis % rank, "reduction": ctx.attr("reduction", "none")}
    return Call("scatter_elements", (0, 1, 2), attrs)


@rule("NonZero", static=(0,))
def _nonzero(ctx: NodeContext) -> Lowering:
    values = ctx.const(0)
    shape = (values.ndim, int(np.count_nonzero(values)))
    ctx.correct_outputs([TensorSpec(shape, "int64")])  # inference cannot know it
    return Call("nonzero", (0,))
