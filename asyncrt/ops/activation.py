"""Elementwise functions configured by attributes: leaky and exponential
linear units, hard sigmoid, thresholds, Gelu, Clip, IsInf.

The attribute-free elementwise functions (``relu``, ``tanh``, ``erf``, ...)
are built-in kernels of :mod:`asyncrt.ops._builtin`, named after the function alone,
so that passes which recognise elementwise kernels by name see them.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from types import ModuleType

import numpy as np

from ._blocks import blockwise, negative_part, positive_part
from ._builtin import SCIPY_SMALL_FLOAT32, make_erf
from ._common import Array, choice, flag, number, quiet
from ._jitfuse import compiled_unary
from ._kernels import Bindable
from ._library import Attrs, FusionTemplate, define

__all__ = ()

Kernel = Callable[..., None]
_NDTR_TYPES = (np.float32, np.float64)  # scipy's ndtr loops


def _positive_part(xp: ModuleType, a: Array, out: Array) -> None:
    """Where ``a > 0``, ``out = a`` (``out`` holds the negative branch)."""
    xp.copyto(out, a, where=a > 0)


def _float32(value: float) -> str:
    """``value`` as a float32 constant in a compiled template."""
    return f"np.float32({float(value)!r})"


def _leaky_relu_fusion(attrs: Attrs) -> FusionTemplate:
    alpha = _float32(number(attrs, "alpha"))
    # copyto(out, a, where=a > 0) over a * alpha: NaN and -0. take a * alpha
    return FusionTemplate(
        "leaky_relu", jit=f"({{0}} if {{0}} > _ZERO else {{0}} * {alpha})"
    )


@define("leaky_relu", fusion=_leaky_relu_fusion)
def _leaky_relu(xp: ModuleType, attrs: Attrs) -> Kernel:
    alpha = number(attrs, "alpha")

    def leaky_relu(a: Array, out: Array) -> None:
        xp.multiply(a, alpha, out, casting="unsafe")
        _positive_part(xp, a, out)

    if xp is not np:
        return leaky_relu
    return compiled_unary(_leaky_relu_fusion(attrs), leaky_relu)


@define("elu")
def _elu(xp: ModuleType, attrs: Attrs) -> Bindable:
    alpha = number(attrs, "alpha")
    gamma = number(attrs, "gamma")  # 1 for Elu, Selu's scale otherwise

    def elu(a: Array, out: Array, scratch: Array) -> None:
        # min(a, 0) through expm1, plus max(a, 0): a above zero, alpha
        # (e^a - 1) below, in SIMD passes (a masked copy branches on every
        # element: 5x slower on random signs).
        negative_part(xp, a, out)
        with quiet(xp):
            xp.expm1(out, out)
        xp.multiply(out, alpha, out, casting="unsafe")
        positive_part(xp, a, scratch)
        xp.add(out, scratch, out)
        if gamma != 1:
            xp.multiply(out, gamma, out, casting="unsafe")

    kernel = blockwise(xp, elu, scratch=1)
    if xp is not np:
        return kernel
    scale = "" if gamma == 1 else f" * {_float32(gamma)}"
    negative = f"expm1_({{0}}) * {_float32(alpha)}"
    return compiled_unary(
        _within_ulps("elu", f"(({{0}} if {{0}} > _ZERO else {negative}){scale})"),
        kernel,
    )


@define("celu")
def _celu(xp: ModuleType, attrs: Attrs) -> Bindable:
    alpha = number(attrs, "alpha")

    def celu(a: Array, out: Array, scratch: Array) -> None:
        # ONNX's max(0, x) + min(0, alpha (e^(x / alpha) - 1))
        with quiet(xp):
            xp.divide(a, alpha, out, casting="unsafe")
            xp.expm1(out, out)
        xp.multiply(out, alpha, out, casting="unsafe")
        negative_part(xp, out, out)
        positive_part(xp, a, scratch)
        xp.add(out, scratch, out)

    kernel = blockwise(xp, celu, scratch=1)
    if xp is not np:
        return kernel
    a = _float32(alpha)
    negative = f"expm1_({{0}} / {a}) * {a}"
    return compiled_unary(
        _within_ulps("celu", f"({{0}} if {{0}} > _ZERO else {negative})"), kernel
    )


def _within_ulps(label: str, expression: str) -> FusionTemplate:
    """The one compiled loop of an ELU over ``_jitmath``'s ``expm1_``
    (within 3 ulps of the exact result where numpy's ``expm1`` is within
    2.5: not its bits, so the default fusion leaves it alone)."""
    return FusionTemplate(label, jit=expression, jit_exact_from=None)


def _hard_sigmoid_fusion(attrs: Attrs) -> FusionTemplate:
    alpha, beta = (_float32(number(attrs, key)) for key in ("alpha", "beta"))
    return FusionTemplate("hard_sigmoid", jit=f"hsig_({{0}}, {alpha}, {beta})")


@define("hard_sigmoid", fusion=_hard_sigmoid_fusion)
def _hard_sigmoid(xp: ModuleType, attrs: Attrs) -> Kernel:
    alpha, beta = number(attrs, "alpha"), number(attrs, "beta")

    def hard_sigmoid(a: Array, out: Array) -> None:
        xp.multiply(a, alpha, out, casting="unsafe")
        xp.add(out, beta, out, casting="unsafe")
        xp.clip(out, 0, 1, out=out)

    if xp is not np:
        return hard_sigmoid
    return compiled_unary(_hard_sigmoid_fusion(attrs), hard_sigmoid)


def _thresholded_relu_fusion(attrs: Attrs) -> FusionTemplate:
    alpha = _float32(number(attrs, "alpha"))
    return FusionTemplate(
        "thresholded_relu", jit=f"({{0}} if {{0}} > {alpha} else _ZERO)"
    )


@define("thresholded_relu", fusion=_thresholded_relu_fusion)
def _thresholded_relu(xp: ModuleType, attrs: Attrs) -> Kernel:
    alpha = number(attrs, "alpha")

    def thresholded_relu(a: Array, out: Array) -> None:
        out[...] = 0
        xp.copyto(out, a, where=a > alpha)

    if xp is not np:
        return thresholded_relu
    # one compiled select where numba is installed (the masked copy
    # branches on every element)
    return compiled_unary(_thresholded_relu_fusion(attrs), thresholded_relu)


def _shrink_fusion(attrs: Attrs) -> FusionTemplate:
    lambd, bias = (_float32(number(attrs, key)) for key in ("lambd", "bias"))
    return FusionTemplate(
        "shrink",
        jit=(
            f"({{0}} + {bias} if {{0}} < -{lambd} else "
            f"({{0}} - {bias} if {{0}} > {lambd} else _ZERO))"
        ),
    )


@define("shrink", fusion=_shrink_fusion)
def _shrink(xp: ModuleType, attrs: Attrs) -> Kernel:
    lambd, bias = number(attrs, "lambd"), number(attrs, "bias")

    def shrink(a: Array, out: Array) -> None:
        out[...] = 0
        with quiet(xp):
            xp.copyto(out, a + bias, where=a < -lambd, casting="unsafe")
            xp.copyto(out, a - bias, where=a > lambd, casting="unsafe")

    if xp is not np:
        return shrink
    return compiled_unary(_shrink_fusion(attrs), shrink)


def _gelu_fusion(attrs: Attrs) -> FusionTemplate:
    if choice(attrs, "approximate", ("none", "tanh")) == "tanh":
        return FusionTemplate("gelu", jit="gelu_tanh_({0})")
    return FusionTemplate("gelu", jit="gelu_erf_({0})")


@define("gelu", fusion=_gelu_fusion)
def _gelu(xp: ModuleType, attrs: Attrs) -> Kernel:
    tanh = choice(attrs, "approximate", ("none", "tanh")) == "tanh"
    erf = make_erf(xp)

    def by_ndtr(a: Array) -> bool:
        return bool(
            not tanh
            and xp is np
            and a.size <= SCIPY_SMALL_FLOAT32
            and a.dtype in _NDTR_TYPES
        )

    def gelu(a: Array, out: Array) -> None:
        if by_ndtr(a):
            # x Phi(x), Phi the normal CDF, in two calls (see make_erf)
            importlib.import_module("scipy.special").ndtr(a, out)
            xp.multiply(out, a, out)
            return
        if tanh:
            # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); x^3
            # overflows past 5e12, where tanh is +-1 anyway: no warning.
            with quiet(xp):
                xp.multiply(a, a, out)
                xp.multiply(out, 0.044715, out)
                xp.add(out, 1, out)
                xp.multiply(out, a, out)
                xp.multiply(out, math.sqrt(2 / math.pi), out)
                xp.tanh(out, out)
        else:
            # 0.5 x (1 + erf(x / sqrt(2)))
            xp.multiply(a, 1 / math.sqrt(2), out)
            erf(out, out)
        # Halve before the product: (1 + erf) x overflows for x > max / 2.
        xp.add(out, 1, out)
        xp.multiply(out, 0.5, out)
        xp.multiply(out, a, out)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        multiply, add = xp.multiply, xp.add
        if by_ndtr(a):
            ndtr = importlib.import_module("scipy.special").ndtr

            def small() -> None:
                ndtr(a, out)
                multiply(out, a, out)

            return small
        if tanh:
            return functools.partial(gelu, a, out)
        erf_in_place = erf.bind(out, out)
        root_half = 1 / math.sqrt(2)

        def exact() -> None:
            multiply(a, root_half, out)
            erf_in_place()
            add(out, 1, out)
            multiply(out, 0.5, out)
            multiply(out, a, out)

        return exact

    kernel = Bindable(gelu, bind)
    if xp is not np:
        return kernel
    # One compiled pass (the same arithmetic over the library's float32
    # tanh, _jitmath's tanh_) at every size where numba is installed (small
    # arrays: one call where scipy's ndtr takes 6 ns an element); without
    # it, small arrays take ndtr.
    return compiled_unary(_gelu_fusion(attrs), kernel)


def _clip_fusion(attrs: Attrs) -> FusionTemplate | None:
    low, high = attrs.get("min"), attrs.get("max")
    if not all(v is None or isinstance(v, (int, float)) for v in (low, high)):
        return None  # the kernel refuses these
    expression = "{0}"
    if low is not None and not isinstance(low, bool):
        expression = f"max_({expression}, {_float32(low)})"
    if high is not None and not isinstance(high, bool):
        expression = f"min_({expression}, {_float32(high)})"
    return FusionTemplate("clip", jit=expression)


@define("clip", fusion=_clip_fusion)
def _clip(xp: ModuleType, attrs: Attrs) -> Kernel:
    low, high = attrs.get("min"), attrs.get("max")
    for key, value in (("min", low), ("max", high)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            raise ValueError(f"attribute {key!r} must be a number or null: {value!r}")

    def clip(a: Array, out: Array) -> None:
        xp.copyto(out, a)
        if low is not None:
            xp.maximum(out, low, out=out, casting="unsafe")
        if high is not None:
            xp.minimum(out, high, out=out, casting="unsafe")

    if xp is not np:
        return clip
    # one compiled pass where numba is installed (ReLU6 in MobileNetV2):
    # numpy's float32 maximum and minimum run at a quarter of add's speed
    return compiled_unary(_clip_fusion(attrs), clip)


@define("isinf")
def _isinf(xp: ModuleType, attrs: Attrs) -> Kernel:
    positive, negative = flag(attrs, "positive"), flag(attrs, "negative")

    def isinf(a: Array, out: Array) -> None:
        xp.isinf(a, out)
        if not positive:
            xp.logical_and(out, a < 0, out)
        if not negative:
            xp.logical_and(out, a > 0, out)

    return isinf
