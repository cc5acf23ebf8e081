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
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from scheduler.dag import TensorSpec

from ._kernels import FlopsFunction, register_func

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


def register_for_all_kinds(
    name: str, make: KernelFactory, flops: FlopsFunction | None = None
) -> None:
    """Register ``make(numpy)`` for cpu and sim, ``make(cupy)`` for cuda."""
    register_func(name, make(np), kinds=("cpu", "sim"), flops=flops)
    register_func(name, _CupyKernel(make), kinds=("cuda",), flops=flops)


def _matmul_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """A multiply and an add per output element per reduced element."""
    return 2.0 * outs[0].size * (ins[0].shape[-1] if ins[0].shape else 1)


def _per_element(cost: float) -> FlopsFunction:
    """Elementwise work, weighted (transcendental functions cost more)."""
    return lambda ins, outs: cost * math.fsum(o.size for o in outs)


def _ufunc(ufunc: str) -> KernelFactory:
    return lambda xp: getattr(xp, ufunc)


_TRANSCENDENTAL = _per_element(20.0)  # roughly, against a multiply-add

for _name, _func, _flops in (
    ("add", "add", None),
    ("subtract", "subtract", None),
    ("multiply", "multiply", None),
    ("divide", "divide", None),
    ("power", "power", _TRANSCENDENTAL),
    ("negative", "negative", None),
    ("exp", "exp", _TRANSCENDENTAL),
    ("log", "log", _TRANSCENDENTAL),
    ("sqrt", "sqrt", None),
    ("tanh", "tanh", _TRANSCENDENTAL),
    ("abs", "absolute", None),
    ("matmul", "matmul", _matmul_flops),
    ("bias_add", "add", None),  # bias broadcast over the last axis
):
    register_for_all_kinds(_name, _ufunc(_func), _flops)


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


for _name, _make, _flops in (
    ("maximum", _keyword_out("maximum"), None),
    ("minimum", _keyword_out("minimum"), None),
    ("relu", _relu, None),
    ("sigmoid", _sigmoid, _TRANSCENDENTAL),
    ("copy", _copy, None),
    ("dense", _dense, _matmul_flops),
    ("softmax", _softmax, _TRANSCENDENTAL),
    ("sum", _sum, None),
    ("reduce_sum", _reduce_sum, None),
):
    register_for_all_kinds(_name, _make, _flops)
