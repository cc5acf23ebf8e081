"""Resize: nearest, linear and cubic interpolation, one axis at a time.

Interpolation is separable, so an N-d resize is a 1-d resize per resized
axis. Per axis, everything depends on the shapes and attributes alone and is
worked out once per shape, in float64: each output position's source
coordinate (ONNX's ``coordinate_transformation_mode``), the input positions
it reads (its *taps*: 1 for nearest, 2 for linear, 4 for cubic, more with
``antialias`` when downscaling) and their weights. A run is then, per axis,
one ``take`` per tap and a multiply-add: no loop over positions.

The rules are ONNX's reference implementation's (``onnx.reference.ops.
op_resize``), which the operator's node tests check:

* a source coordinate ``x`` reads the taps around ``left = ceil(x) - 1``
  (the position on its left, ``x - 1`` when ``x`` is whole) with ``ratio =
  x - left`` in ``(0, 1]``; taps beyond the input repeat its edge, unless
  ``exclude_outside`` drops them (and the weights are renormalised);
* nearest picks ``left`` or ``left + 1`` by ``nearest_mode`` (ties at a
  ratio of 0.5 go by ``round_prefer_floor`` / ``round_prefer_ceil``);
  ``simple`` is ONNX Runtime's rule for opset 10 (truncate when upscaling,
  round up when downscaling);
* linear weights ``1 - ratio, ratio``; cubic the Keys kernel with
  ``cubic_coeff_a``; with ``antialias`` and a scale below 1 the kernel is
  stretched by ``1 / scale`` and normalised;
* ``tf_crop_and_resize`` gives ``extrapolation_value`` where the source
  coordinate falls outside the input.

Floats are interpolated in their own precision (float16 and the narrow
formats in float32); integers in float64, then rounded half to even and
clipped to their range, as the reference saturates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ._common import Array, choice, flag, number
from ._library import Attrs, define

__all__ = ("COORDINATE_MODES", "NEAREST_MODES", "axis_taps")

Kernel = Callable[..., None]
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_MODES = ("nearest", "linear", "cubic")
_FLOAT_WORK = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


@dataclass(frozen=True)
class Interpolation:
    """The attributes that shape one axis's taps."""

    mode: str
    coordinates: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool


@dataclass(frozen=True)
class Taps:
    """One axis's resize: output position ``o`` is ``sum over t of
    weights[o, t] * input[index[o, t]]`` (``weights`` is ``None`` for
    nearest, one tap), except where ``outside[o]`` (extrapolated)."""

    index: np.ndarray[Any, Any]
    weights: np.ndarray[Any, Any] | None
    outside: np.ndarray[Any, Any] | None


def _source(
    coordinates: str,
    size_in: int,
    size_out: int,
    scale: float,
    roi: tuple[float, float],
) -> np.ndarray[Any, Any]:
    """Each output position's coordinate in the input (float64)."""
    y = np.arange(size_out, dtype=np.float64)
    width = scale * size_in  # the (fractional) output length the scale gives
    if coordinates == "align_corners":
        if width == 1:
            return np.zeros(size_out)
        return y * (size_in - 1) / (width - 1)
    if coordinates == "asymmetric":
        return y / scale
    if coordinates == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if coordinates == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            x = np.full(size_out, (end - start) * (size_in - 1) / 2)
        else:
            x = y * (end - start) * (size_in - 1) / (width - 1)
        return x + start * (size_in - 1)
    if coordinates == "pytorch_half_pixel" and width == 1:
        return np.full(size_out, -0.5)
    x = (y + 0.5) / scale - 0.5
    if coordinates == "half_pixel_symmetric":
        center = size_in / 2
        x += center * (1 - size_out / width)
    return x


def _cubic(distance: np.ndarray[Any, Any], a: float) -> np.ndarray[Any, Any]:
    """Keys's cubic kernel at ``|distance|``."""
    x = np.abs(distance)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _weights(
    interpolation: Interpolation, ratio: np.ndarray[Any, Any], scale: float
) -> np.ndarray[Any, Any]:
    """``(out, taps)`` weights of the taps ``left - taps/2 + 1 + t``."""
    a = interpolation.cubic_a
    if interpolation.antialias:
        stretch = min(scale, 1.0)
        first = math.floor((-1 if interpolation.mode == "linear" else -2) / stretch) + 1
        offsets = np.arange(first, 2 - first, dtype=np.float64)
        distance = (offsets[None, :] - ratio[:, None]) * stretch
        if interpolation.mode == "linear":
            weights = np.clip(1 - np.abs(distance), 0, 1)
        else:
            weights = _cubic(distance, a)
        return weights / weights.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]
    if interpolation.mode == "linear":
        return np.stack([1 - ratio, ratio], axis=1)
    # The reference's own polynomials (Horner's), for its exact rounding.
    r, s = ratio, 1 - ratio
    return np.stack(
        [
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
        ],
        axis=1,
    )


def axis_taps(
    interpolation: Interpolation,
    size_in: int,
    size_out: int,
    scale: float,
    roi: tuple[float, float] = (0.0, 1.0),
) -> Taps:
    """The taps and weights resizing one axis from ``size_in`` to
    ``size_out`` positions at ``scale``."""
    x = _source(interpolation.coordinates, size_in, size_out, scale, roi)
    outside = None
    if interpolation.coordinates == "tf_crop_and_resize":
        outside = (x < 0) | (x > size_in - 1)
    left = np.ceil(x) - 1
    ratio = x - left  # in (0, 1]: a whole coordinate is its left's right tap
    if interpolation.mode == "nearest":
        index = _nearest(interpolation.nearest, x, left, ratio, scale)
        index = np.clip(index, 0, size_in - 1).astype(np.intp)
        return Taps(index, None, outside)
    weights = _weights(interpolation, ratio, scale)
    count = weights.shape[1]
    index = left[:, None] - count // 2 + 1 + np.arange(count)[None, :]
    if interpolation.exclude_outside:
        weights = np.where((index < 0) | (index > size_in - 1), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, size_in - 1).astype(np.intp)
    return Taps(index, weights, outside)


def _nearest(
    mode: str,
    x: np.ndarray[Any, Any],
    left: np.ndarray[Any, Any],
    ratio: np.ndarray[Any, Any],
    scale: float,
) -> np.ndarray[Any, Any]:
    if mode == "simple":  # ONNX Runtime's Resize-10 (Upsample's rule)
        rounded: np.ndarray[Any, Any] = np.ceil(x) if scale < 1 else np.trunc(x)
        return rounded
    if mode == "round_prefer_floor":
        right = ratio > 0.5
    elif mode == "round_prefer_ceil":
        right = ratio >= 0.5
    elif mode == "floor":
        right = ratio == 1
    else:  # ceil
        right = np.ones(ratio.shape, dtype=bool)
    return left + right


def _floats(attrs: Attrs, key: str) -> tuple[float, ...]:
    value = attrs.get(key)
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"attribute {key!r} must be a list of numbers: {value!r}")
    return tuple(float(v) for v in value)


@define("resize")
def _resize(xp: ModuleType, attrs: Attrs) -> Kernel:
    interpolation = Interpolation(
        mode=choice(attrs, "mode", _MODES),
        coordinates=choice(attrs, "coordinate_transformation_mode", COORDINATE_MODES),
        nearest=choice(attrs, "nearest_mode", NEAREST_MODES),
        cubic_a=number(attrs, "cubic_coeff_a"),
        exclude_outside=flag(attrs, "exclude_outside"),
        antialias=flag(attrs, "antialias"),
    )
    scales = _floats(attrs, "scales")
    roi = _floats(attrs, "roi")
    extrapolation = number(attrs, "extrapolation_value")
    rank = len(scales)
    if len(roi) != 2 * rank or min(scales, default=1) <= 0:
        raise ValueError("resize needs a positive scale and a roi pair per axis")

    @functools.lru_cache(maxsize=16)
    def plan(
        shape_in: tuple[int, ...], shape_out: tuple[int, ...]
    ) -> tuple[tuple[int, Taps], ...]:
        """The axes to resize and their taps (in ``xp``'s arrays)."""
        crops = interpolation.coordinates == "tf_crop_and_resize"
        steps = []
        for axis, size_in in enumerate(shape_in):
            size_out = shape_out[axis]
            span = (roi[axis], roi[rank + axis])
            same = size_in == size_out and math.isclose(scales[axis], 1.0)
            if same and (not crops or span == (0.0, 1.0)):
                continue  # the identity
            if not size_out:
                steps.append((axis, Taps(np.zeros(0, np.intp), None, None)))
                continue
            taps = axis_taps(interpolation, size_in, size_out, scales[axis], span)
            steps.append((axis, _on(xp, taps)))
        return tuple(steps)

    def resize(x: Array, out: Array) -> None:
        if x.ndim != rank:
            raise ValueError(f"resize configured for rank {rank}, given {x.ndim}")
        steps = plan(tuple(x.shape), tuple(out.shape))
        if interpolation.mode == "nearest" or out.dtype in _FLOAT_WORK:
            work = x.dtype if interpolation.mode == "nearest" else out.dtype
        elif out.dtype.kind in "iub":
            work = np.dtype(np.float64)
        else:
            work = np.dtype(np.float32)  # float16 and the narrow formats
        if not steps:
            _store(xp, x, out)
            return
        result = x
        for step, (axis, taps) in enumerate(steps):
            # The last step writes the output itself where the dtypes agree.
            last = step == len(steps) - 1 and out.dtype == work
            target = out if last else None
            result = _along(xp, result, axis, taps, work, extrapolation, target)
        if result is not out:
            _store(xp, result, out)

    return resize


def _on(xp: ModuleType, taps: Taps) -> Taps:
    """``taps`` in ``xp``'s arrays."""
    if xp is np:
        return taps
    return Taps(
        xp.asarray(taps.index),
        None if taps.weights is None else xp.asarray(taps.weights),
        None if taps.outside is None else xp.asarray(taps.outside),
    )


def _along(
    xp: ModuleType,
    x: Array,
    axis: int,
    taps: Taps,
    work: np.dtype[Any],
    extrapolation: float,
    target: Array | None,
) -> Array:
    """``x`` resized along ``axis``, in ``work``'s precision, into
    ``target`` if given."""
    take = _take(xp)
    if taps.weights is None:
        result = take(x, taps.index, axis, target)
    else:
        shape = [1] * x.ndim
        shape[axis] = -1
        result = target
        for t in range(taps.weights.shape[1]):
            weight = taps.weights[:, t].astype(work).reshape(shape)
            term = take(x, taps.index[:, t], axis, None)
            if term.dtype != work:
                term = term.astype(work)
            if t == 0:
                result = xp.multiply(
                    term, weight, out=term if target is None else target
                )
            else:
                xp.multiply(term, weight, out=term)
                xp.add(result, term, out=result)
    if taps.outside is not None and bool(taps.outside.any()):
        key: list[Any] = [slice(None)] * x.ndim
        key[axis] = taps.outside
        result[tuple(key)] = extrapolation
    return result


def _take(xp: ModuleType) -> Callable[[Array, Array, int, Array | None], Array]:
    """``take`` along an axis, into ``out`` if given. The indices are
    clamped into range already: numpy's ``mode="clip"`` skips its bounds
    checks and the buffering of ``out`` they need."""
    if xp is np:
        return lambda a, index, axis, out: np.take(a, index, axis, out, mode="clip")
    return lambda a, index, axis, out: xp.take(a, index, axis, out)


def _store(xp: ModuleType, result: Array, out: Array) -> None:
    """``result`` into ``out``: integers rounded half to even and clipped to
    their range (ONNX's saturating cast), floats rounded once."""
    if out.dtype.kind in "iu" and result.dtype.kind == "f":
        info = np.iinfo(out.dtype)
        result = xp.clip(xp.rint(result), info.min, info.max)
    xp.copyto(out, result, casting="unsafe")
