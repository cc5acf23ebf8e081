"""Rules for elementwise math, activations, reductions and softmax.

Attribute-free elementwise operators map onto the built-in kernels of
:mod:`asyncrt.ops._builtin` by name (``Add`` -> ``add``), so that passes which know
elementwise kernels by name (fusion) recognise them.
"""

from __future__ import annotations

import math

import numpy as np

from ._rules import NOP, Call, Lowering, NodeContext, rule
from ._values import Const

__all__ = ()

_UNARY = {
    "Abs": "abs",
    "Neg": "negative",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Reciprocal": "reciprocal",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sign": "sign",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "Erf": "erf",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Mish": "mish",
    "HardSwish": "hard_swish",
    "Not": "logical_not",
    "IsNaN": "isnan",
    "BitwiseNot": "bitwise_not",
}

_BINARY = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
    "PRelu": "prelu",
}

_VARIADIC = {"Sum": "sum", "Max": "max", "Min": "min", "Mean": "mean"}


@rule(*_UNARY)
def _unary(ctx: NodeContext) -> Lowering:
    return Call(_UNARY[ctx.op_type], (0,))


@rule(*_BINARY)
def _binary(ctx: NodeContext) -> Lowering:
    return Call(_BINARY[ctx.op_type], (0, 1))


@rule(*_VARIADIC)
def _variadic(ctx: NodeContext) -> Lowering:
    return Call(_VARIADIC[ctx.op_type], tuple(range(len(ctx.inputs))))


@rule("Div")
def _div(ctx: NodeContext) -> Lowering:
    integer = np.dtype(ctx.spec(0).dtype).kind in "iu"
    return Call("trunc_divide" if integer else "divide", (0, 1))


#: ``Pow(x, c)`` of a float ``x`` and a constant scalar ``c``: the kernel
#: that computes it without ``pow`` (numpy's float32 ``power`` takes 62 ns an
#: element for ``c = 3``, 3 passes of ``x * x * x`` 0.2 ns). ONNX Runtime
#: computes 2 and 3 as these products too; ``reciprocal`` is ``1 / x``
#: rounded once (``pow`` is within an ulp of it), ``power_half`` is
#: ``sqrt`` with ``pow``'s own results at -0 and -inf.
_POW_BY_EXPONENT = {
    1.0: "copy",
    2.0: "square",
    3.0: "cube",
    0.5: "power_half",
    -1.0: "reciprocal",
}


@rule("Pow")
def _pow(ctx: NodeContext) -> Lowering:
    base, exponent = ctx.spec(0), ctx.inputs[1]
    if (
        isinstance(exponent, Const)
        and exponent.array.size == 1
        and np.dtype(base.dtype).kind == "f"
        and ctx.outputs[0].shape == base.shape
    ):
        func = _POW_BY_EXPONENT.get(float(exponent.array.reshape(-1)[0]))
        if func is not None:
            return Call(func, (0,))
    same = ctx.spec(0).dtype == ctx.spec(1).dtype
    return Call("power" if same else "power_cast", (0, 1))


@rule("Mod", attrs=("fmod",))
def _mod(ctx: NodeContext) -> Lowering:
    return Call("fmod" if ctx.attr("fmod", 0) else "mod", (0, 1))


#: The float8 formats ``saturate`` applies to (ONNX's Cast, opset 19+).
_SATURATING = frozenset(
    {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
)


@rule("Cast", "CastLike", attrs=("to", "saturate", "round_mode"))
def _cast(ctx: NodeContext) -> Lowering:
    ctx.refuse("round_mode", ("up", "down", "nearest"))
    target = ctx.outputs[0].dtype
    if ctx.spec(0).dtype == target:
        return Call(NOP, (0,))
    saturate = bool(ctx.attr("saturate", 1))
    if target == "float8_e8m0fnu":
        attrs = {"round_mode": ctx.attr("round_mode", "up"), "saturate": saturate}
        return Call("cast_e8m0", (0,), attrs)
    if target in _SATURATING and saturate:
        return Call("saturate_cast", (0,))
    return Call("cast", (0,))


def _number(ctx: NodeContext, key: str, default: float) -> float:
    return float(ctx.attr(key, default))


@rule("LeakyRelu", attrs=("alpha",))
def _leaky_relu(ctx: NodeContext) -> Lowering:
    return Call("leaky_relu", (0,), {"alpha": _number(ctx, "alpha", 0.01)})


@rule("Elu", attrs=("alpha",))
def _elu(ctx: NodeContext) -> Lowering:
    return Call("elu", (0,), {"alpha": _number(ctx, "alpha", 1.0), "gamma": 1.0})


@rule("Selu", attrs=("alpha", "gamma"))
def _selu(ctx: NodeContext) -> Lowering:
    alpha = _number(ctx, "alpha", 1.67326319217681884765625)
    gamma = _number(ctx, "gamma", 1.05070102214813232421875)
    return Call("elu", (0,), {"alpha": alpha, "gamma": gamma})


@rule("Celu", attrs=("alpha",))
def _celu(ctx: NodeContext) -> Lowering:
    return Call("celu", (0,), {"alpha": _number(ctx, "alpha", 1.0)})


@rule("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(ctx: NodeContext) -> Lowering:
    attrs = {"alpha": _number(ctx, "alpha", 0.2), "beta": _number(ctx, "beta", 0.5)}
    return Call("hard_sigmoid", (0,), attrs)


@rule("ThresholdedRelu", attrs=("alpha",))
def _thresholded_relu(ctx: NodeContext) -> Lowering:
    return Call("thresholded_relu", (0,), {"alpha": _number(ctx, "alpha", 1.0)})


@rule("Shrink", attrs=("lambd", "bias"))
def _shrink(ctx: NodeContext) -> Lowering:
    attrs = {"lambd": _number(ctx, "lambd", 0.5), "bias": _number(ctx, "bias", 0.0)}
    return Call("shrink", (0,), attrs)


@rule("Gelu", attrs=("approximate",))
def _gelu(ctx: NodeContext) -> Lowering:
    ctx.refuse("approximate", ("none", "tanh"))
    return Call("gelu", (0,), {"approximate": ctx.attr("approximate", "none")})


@rule("IsInf", attrs=("detect_positive", "detect_negative"))
def _isinf(ctx: NodeContext) -> Lowering:
    attrs = {
        "positive": bool(ctx.attr("detect_positive", 1)),
        "negative": bool(ctx.attr("detect_negative", 1)),
    }
    return Call("isinf", (0,), attrs)


def _bound(value: float | None) -> float | int | None:
    """A clip bound as JSON: infinities mean no bound."""
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return None
    return value


@rule("Clip", attrs=("min", "max"), static=(1, 2))
def _clip(ctx: NodeContext) -> Lowering:
    low: float | None
    high: float | None
    if ctx.version < 11:
        low, high = ctx.attr("min"), ctx.attr("max")
    else:
        low = ctx.const(1).item() if ctx.has(1) else None
        high = ctx.const(2).item() if ctx.has(2) else None
    if any(isinstance(v, float) and math.isnan(v) for v in (low, high)):
        raise ctx.unsupported("a NaN bound is not supported")
    return Call("clip", (0,), {"min": _bound(low), "max": _bound(high)})


# -- reductions --------------------------------------------------------------

_REDUCE = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "prod",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceLogSum": "log_sum",
    "ReduceLogSumExp": "log_sum_exp",
    "ReduceSumSquare": "sum_square",
}


def _axes(ctx: NodeContext, axes: list[int], rank: int) -> list[int]:
    normal = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in normal):
        raise ctx.unsupported(f"axes {axes} out of range for rank {rank}")
    return normal


@rule(*_REDUCE, attrs=("axes", "keepdims", "noop_with_empty_axes"), static=(1,))
def _reduce(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    if "axes" in ctx.attrs:
        axes: list[int] | None = list(ctx.attr("axes"))
    elif ctx.has(1):
        axes = ctx.ints(1)
    else:
        axes = None
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return Call(NOP, (0,))
        axes = None
    attrs = {
        "kind": _REDUCE[ctx.op_type],
        "axes": None if axes is None else _axes(ctx, axes, rank),
        "keepdims": bool(ctx.attr("keepdims", 1)),
    }
    return Call("reduce", (0,), attrs)


@rule("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _arg_reduce(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    attrs = {
        "kind": "max" if ctx.op_type == "ArgMax" else "min",
        "axis": _axes(ctx, [ctx.attr("axis", 0)], rank)[0],
        "keepdims": bool(ctx.attr("keepdims", 1)),
        "select_last_index": bool(ctx.attr("select_last_index", 0)),
    }
    return Call("arg_reduce", (0,), attrs)


@rule("Softmax", "LogSoftmax", attrs=("axis",))
def _softmax(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    if ctx.version < 13:  # the input is seen as 2-D: [axis..] is one axis
        first = _axes(ctx, [ctx.attr("axis", 1)], rank)[0]
        axes = list(range(first, rank))
    else:
        axes = _axes(ctx, [ctx.attr("axis", -1)], rank)
    return Call("softmax", (0,), {"axes": axes, "log": ctx.op_type == "LogSoftmax"})


@rule("Hardmax", attrs=("axis",))
def _hardmax(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    coerce = ctx.version < 13
    axis = _axes(ctx, [ctx.attr("axis", 1 if coerce else -1)], rank)[0]
    return Call("hardmax", (0,), {"axis": axis, "coerce_2d": coerce})


@rule("CumSum", attrs=("exclusive", "reverse"), static=(1,))
def _cumsum(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    attrs = {
        "axis": _axes(ctx, ctx.ints(1), rank)[0],
        "exclusive": bool(ctx.attr("exclusive", 0)),
        "reverse": bool(ctx.attr("reverse", 0)),
    }
    return Call("cumsum", (0,), attrs)


@rule("TopK", attrs=("axis", "largest", "sorted", "k"), static=(1,))
def _topk(ctx: NodeContext) -> Lowering:
    rank = len(ctx.spec(0).shape)
    attrs = {
        "axis": _axes(ctx, [ctx.attr("axis", -1)], rank)[0],
        "largest": bool(ctx.attr("largest", 1)),
    }
    # sorted=0 allows any order; sorted is one of them.
    return Call("topk", (0,), attrs)
