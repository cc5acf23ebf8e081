"""Built-in kernels, registered globally for every device kind.

Each kernel is written once, as a function of the array library ``xp``
(numpy or cupy, which share the numpy API), and bound per device kind at
registration: numpy for ``cpu`` and ``sim``, cupy for ``cuda`` (imported on
the kernel's first call, so a numpy-only install never imports it).
Elementwise kernels *are* the library's ufuncs: a ufunc takes its output
positionally (``np.add(a, b, out)``), which is exactly TVM's
destination-passing convention, so such a kernel costs one C call and no
temporaries.

Names follow the ONNX/Relay spelling in lower case (``add``, ``relu``,
``matmul``, ...). The full operator library is the ONNX frontend's job; this
set covers elementwise math, matmul, bias, softmax, reductions and copies.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ._kernels import register_func

__all__ = ("register_for_all_kinds",)

Array = Any
KernelFactory = Callable[[ModuleType], Callable[..., None]]


class _CupyKernel:
    """A cuda kernel built from its factory on first call (imports cupy)."""

    __slots__ = ("_kernel", "_make")

    def __init__(self, make: KernelFactory) -> None:
        self._make = make
        self._kernel: Callable[..., None] | None = None

    def __call__(self, *args: Array) -> None:
        kernel = self._kernel
        if kernel is None:
            kernel = self._kernel = self._make(importlib.import_module("cupy"))
        kernel(*args)


def register_for_all_kinds(name: str, make: KernelFactory) -> None:
    """Register ``make(numpy)`` for cpu and sim, ``make(cupy)`` for cuda."""
    register_func(name, make(np), kinds=("cpu", "sim"))
    register_func(name, _CupyKernel(make), kinds=("cuda",))


def _ufunc(ufunc: str) -> KernelFactory:
    return lambda xp: getattr(xp, ufunc)


for _name, _func in (
    ("add", "add"),
    ("subtract", "subtract"),
    ("multiply", "multiply"),
    ("divide", "divide"),
    ("power", "power"),
    ("negative", "negative"),
    ("exp", "exp"),
    ("log", "log"),
    ("sqrt", "sqrt"),
    ("tanh", "tanh"),
    ("abs", "absolute"),
    ("matmul", "matmul"),
    ("bias_add", "add"),  # bias broadcast over the last axis
):
    register_for_all_kinds(_name, _ufunc(_func))


def _keyword_out(ufunc: str) -> KernelFactory:
    """For ufuncs whose positional ``out`` numpy deprecates (max/min)."""

    def make(xp: ModuleType) -> Callable[..., None]:
        func = getattr(xp, ufunc)

        def kernel(a: Array, b: Array, out: Array) -> None:
            func(a, b, out=out)

        return kernel

    return make


def _relu(xp: ModuleType) -> Callable[..., None]:
    maximum = xp.maximum

    def relu(a: Array, out: Array) -> None:
        maximum(a, 0, out=out)

    return relu


def _sigmoid(xp: ModuleType) -> Callable[..., None]:
    def sigmoid(a: Array, out: Array) -> None:
        xp.negative(a, out)
        xp.exp(out, out)
        xp.add(out, 1, out)
        xp.reciprocal(out, out)

    return sigmoid


def _copy(xp: ModuleType) -> Callable[..., None]:
    def copy(a: Array, out: Array) -> None:
        out[...] = a

    return copy


def _dense(xp: ModuleType) -> Callable[..., None]:
    matmul = xp.matmul

    def dense(a: Array, w: Array, out: Array) -> None:
        matmul(a, w.T, out)  # Relay's nn.dense: weights stored as [units, in]

    return dense


def _softmax(xp: ModuleType) -> Callable[..., None]:
    def softmax(a: Array, out: Array) -> None:
        xp.subtract(a, a.max(axis=-1, keepdims=True), out)  # numerically stable
        xp.exp(out, out)
        xp.divide(out, out.sum(axis=-1, keepdims=True), out)

    return softmax


def _sum(xp: ModuleType) -> Callable[..., None]:
    add = xp.add

    def sum_inputs(*args: Array) -> None:
        *inputs, out = args
        add(inputs[0], inputs[1], out) if len(inputs) > 1 else out.__setitem__(
            ..., inputs[0]
        )
        for other in inputs[2:]:
            add(out, other, out)

    return sum_inputs


def _reduce_sum(xp: ModuleType) -> Callable[..., None]:
    def reduce_sum(a: Array, out: Array) -> None:
        out[...] = a.sum()

    return reduce_sum


for _name, _make in (
    ("maximum", _keyword_out("maximum")),
    ("minimum", _keyword_out("minimum")),
    ("relu", _relu),
    ("sigmoid", _sigmoid),
    ("copy", _copy),
    ("dense", _dense),
    ("softmax", _softmax),
    ("sum", _sum),
    ("reduce_sum", _reduce_sum),
):
    register_for_all_kinds(_name, _make)
