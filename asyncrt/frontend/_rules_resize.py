"""The rule for Resize (opsets 10 to 19): every mode, coordinate
transformation, rounding, ``antialias``, ``axes`` and
``keep_aspect_ratio_policy``.

Resize's ``roi``, ``scales`` and ``sizes`` decide its output's shape, so
they must be known at import time (constants, or graph inputs bound with
``from_onnx(..., bind=...)``); a run-time one is refused by name. The rule
turns them into one scale and one ``(start, end)`` region per axis of the
input (``1.0`` and ``(0, 1)`` on the axes not resized), the attributes of
the ``resize`` kernel (:mod:`asyncrt.ops.resize`).

Opset 10's Resize has neither coordinate modes nor rounding modes; it is
read as ONNX Runtime reads it: ``asymmetric`` coordinates, and nearest
truncating when upscaling, rounding up when downscaling.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scheduler.dag import TensorSpec

from ..ops.resize import COORDINATE_MODES, NEAREST_MODES
from ._rules import Call, Lowering, NodeContext, rule

__all__ = ()

_POLICIES = ("stretch", "not_larger", "not_smaller")


def _given(ctx: NodeContext, position: int) -> np.ndarray[Any, Any] | None:
    """A constant optional input, or ``None`` if omitted or empty."""
    if not ctx.has(position):
        return None
    value = ctx.const(position)
    return value.reshape(-1) if value.size else None


def _axes(ctx: NodeContext, rank: int) -> list[int]:
    axes = [int(a) for a in ctx.attr("axes", range(rank))]
    normal = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in normal) or len(set(normal)) != len(normal):
        raise ctx.unsupported(f"axes {axes} are not distinct axes of rank {rank}")
    return normal


@rule(
    "Resize",
    attrs=(
        "mode",
        "coordinate_transformation_mode",
        "nearest_mode",
        "cubic_coeff_a",
        "exclude_outside",
        "extrapolation_value",
        "antialias",
        "axes",
        "keep_aspect_ratio_policy",
    ),
    static=(1, 2, 3),
)
def _resize(ctx: NodeContext) -> Lowering:
    ctx.refuse("mode", ("nearest", "linear", "cubic"))
    ctx.refuse("coordinate_transformation_mode", COORDINATE_MODES)
    ctx.refuse("nearest_mode", [m for m in NEAREST_MODES if m != "simple"])
    ctx.refuse("keep_aspect_ratio_policy", _POLICIES)
    shape = ctx.spec(0).shape
    rank = len(shape)
    axes = _axes(ctx, rank)
    if ctx.version < 11:
        roi, scales, sizes = None, _given(ctx, 1), None
        coordinates, nearest = "asymmetric", "simple"
    else:
        roi, scales, sizes = _given(ctx, 1), _given(ctx, 2), _given(ctx, 3)
        coordinates = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest = ctx.attr("nearest_mode", "round_prefer_floor")
    if scales is not None and sizes is None:
        given, what = scales, "scales"
    elif sizes is not None and scales is None:
        given, what = sizes, "sizes"
    else:
        raise ctx.unsupported("exactly one of scales and sizes must be given")
    if len(given) != len(axes):
        raise ctx.unsupported(f"{what} has {len(given)} values for {len(axes)} axes")
    full_scales = [1.0] * rank
    if scales is not None:
        for axis, scale in zip(axes, scales, strict=True):
            full_scales[axis] = float(scale)
        if min(full_scales) <= 0:
            raise ctx.unsupported(f"scales must be positive: {scales.tolist()}")
    else:
        _scales_of_sizes(ctx, shape, axes, [int(s) for s in given], full_scales)
    full_roi = [0.0] * rank + [1.0] * rank
    if roi is not None:
        if len(roi) != 2 * len(axes):
            raise ctx.unsupported(f"roi has {len(roi)} values for {len(axes)} axes")
        for i, axis in enumerate(axes):
            full_roi[axis] = float(roi[i])
            full_roi[rank + axis] = float(roi[len(axes) + i])
    attrs = {
        "mode": ctx.attr("mode", "nearest"),
        "coordinate_transformation_mode": coordinates,
        "nearest_mode": nearest,
        "cubic_coeff_a": float(ctx.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": bool(ctx.attr("exclude_outside", 0)),
        "extrapolation_value": float(ctx.attr("extrapolation_value", 0.0)),
        "antialias": bool(ctx.attr("antialias", 0)),
        "scales": full_scales,
        "roi": full_roi,
    }
    return Call("resize", (0,), attrs)


def _scales_of_sizes(
    ctx: NodeContext,
    shape: tuple[int, ...],
    axes: list[int],
    sizes: list[int],
    scales: list[float],
) -> None:
    """Fill ``scales`` from the target ``sizes`` (the policy may keep the
    aspect ratio: one scale for every axis), and make the output's shape
    the sizes the scales give."""
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if any(s < 0 for s in sizes) or any(shape[a] == 0 for a in axes):
        raise ctx.unsupported(f"cannot resize shape {shape} to sizes {sizes}")
    ratios = [size / shape[axis] for axis, size in zip(axes, sizes, strict=True)]
    out = list(shape)
    if policy == "stretch":
        for axis, size, ratio in zip(axes, sizes, ratios, strict=True):
            scales[axis], out[axis] = ratio, size
    else:
        ratio = min(ratios) if policy == "not_larger" else max(ratios)
        for axis in axes:
            scales[axis] = ratio
            out[axis] = math.floor(ratio * shape[axis] + 0.5)  # half up
    if any(s == 0 for s in scales):
        raise ctx.unsupported(f"cannot resize shape {shape} to sizes {sizes}")
    ctx.correct_outputs([TensorSpec(tuple(out), ctx.spec(0).dtype)])
