"""Built-in kernels, registered globally for every device kind.

Each kernel is written once against the numpy API and runs on numpy (cpu,
sim) and cupy (cuda) arrays alike: :func:`array_module` picks the array's
own library, and every kernel writes into its preallocated output with
``out=`` (destination passing, no temporaries where the library allows).

Names follow the ONNX/Relay spelling in lower case (``add``, ``relu``,
``matmul``, ...). The full operator library is the ONNX frontend's job; this
set covers elementwise math, matmul, bias, softmax, reductions and copies.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

from ._kernels import register_func

__all__ = ("array_module",)

Array = Any


def array_module(array: Array) -> ModuleType:
    """numpy or cupy: the library that owns ``array``."""
    if type(array).__module__.startswith("cupy"):
        return sys.modules["cupy"]
    return np


def _binary(name: str, ufunc: str) -> None:
    def kernel(a: Array, b: Array, out: Array) -> None:
        getattr(array_module(out), ufunc)(a, b, out=out)

    kernel.__name__ = kernel.__qualname__ = name
    register_func(name, kernel)


def _unary(name: str, ufunc: str) -> None:
    def kernel(a: Array, out: Array) -> None:
        getattr(array_module(out), ufunc)(a, out=out)

    kernel.__name__ = kernel.__qualname__ = name
    register_func(name, kernel)


for _name, _ufunc in (
    ("add", "add"),
    ("subtract", "subtract"),
    ("multiply", "multiply"),
    ("divide", "divide"),
    ("maximum", "maximum"),
    ("minimum", "minimum"),
    ("power", "power"),
):
    _binary(_name, _ufunc)

for _name, _ufunc in (
    ("negative", "negative"),
    ("exp", "exp"),
    ("log", "log"),
    ("sqrt", "sqrt"),
    ("tanh", "tanh"),
    ("abs", "absolute"),
):
    _unary(_name, _ufunc)


@register_func("relu")
def relu(a: Array, out: Array) -> None:
    """``max(a, 0)``."""
    array_module(out).maximum(a, 0, out=out)


@register_func("sigmoid")
def sigmoid(a: Array, out: Array) -> None:
    """``1 / (1 + exp(-a))``, computed in place in ``out``."""
    xp = array_module(out)
    xp.negative(a, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1, out=out)
    xp.reciprocal(out, out=out)


@register_func("copy")
def copy(a: Array, out: Array) -> None:
    """``out = a``."""
    out[...] = a


@register_func("matmul")
def matmul(a: Array, b: Array, out: Array) -> None:
    """Matrix product (batched over leading dimensions)."""
    array_module(out).matmul(a, b, out=out)


@register_func("dense")
def dense(a: Array, w: Array, out: Array) -> None:
    """``a @ w.T`` (Relay's ``nn.dense``: weights stored as [units, in])."""
    array_module(out).matmul(a, w.T, out=out)


@register_func("bias_add")
def bias_add(a: Array, bias: Array, out: Array) -> None:
    """``a + bias``, the bias broadcast over the last axis."""
    array_module(out).add(a, bias, out=out)


@register_func("softmax")
def softmax(a: Array, out: Array) -> None:
    """Softmax over the last axis, numerically stable."""
    xp = array_module(out)
    xp.subtract(a, a.max(axis=-1, keepdims=True), out=out)
    xp.exp(out, out=out)
    xp.divide(out, out.sum(axis=-1, keepdims=True), out=out)


@register_func("sum")
def sum_all(*args: Array) -> None:
    """Sum of every input, elementwise (all inputs share one shape), into
    the last argument."""
    *inputs, out = args
    xp = array_module(out)
    out[...] = inputs[0]
    for other in inputs[1:]:
        xp.add(out, other, out=out)


@register_func("reduce_sum")
def reduce_sum(a: Array, out: Array) -> None:
    """Sum of all elements of ``a`` into a scalar (or keep-shape) output."""
    out[...] = a.sum()
