"""The output shape and dtype of the built-in kernels, from their inputs'.

:class:`~asyncrt.graph.GraphBuilder` checks each node it adds against these
rules, so that a wrong declared output (``matmul`` of ``(2, 3)`` and
``(3, 4)`` declared ``(2, 8)``) is a :class:`~asyncrt.errors.GraphError`
naming the node when the graph is built, not a kernel failing at run time.

A rule knows one built-in kernel of :mod:`asyncrt.ops._builtin` by its name
and gives the output it makes: numpy's broadcasting for elementwise kernels,
numpy's ``matmul`` rule, Relay's ``nn.dense`` (weights as ``[units, in]``),
a reshape (``__nop``) that keeps the element count. Where the dtype of the
output is not decided by the inputs (``cast``), or inputs of different
dtypes meet (numpy would promote), only the shape is checked. Kernels
without a rule here (the attribute-configured ops of :mod:`asyncrt.ops`,
user kernels) are not checked. This module names kernels but imports none,
so the graph package stays below the kernel library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ("Expected", "Spec", "expected_output")

#: An input's shape and dtype.
Spec = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class Expected:
    """What a kernel makes of its inputs.

    :ivar shape: the output's shape.
    :ivar dtype: the output's dtype, or ``None`` where the rule leaves it open.
    :ivar size_only: only the element count must match (a reshape).
    """

    shape: tuple[int, ...]
    dtype: str | None
    size_only: bool = False


class RuleError(ValueError):
    """The inputs themselves do not fit the kernel (the message says why)."""


Rule = Callable[[Sequence[Spec]], Expected]

_BOOL = "bool"


def _broadcast(specs: Sequence[Spec]) -> tuple[int, ...]:
    shapes = [shape for shape, _ in specs]
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(-ndim, 0):
        dims = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(dims) > 1:
            raise RuleError(
                "the input shapes "
                + ", ".join(str(s) for s in shapes)
                + " do not broadcast"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _common_dtype(specs: Sequence[Spec]) -> str | None:
    dtypes = {dtype for _, dtype in specs}
    return dtypes.pop() if len(dtypes) == 1 else None


def _arity(count: int | None, rule: Rule) -> Rule:
    """``rule``, after checking the number of inputs (``None``: one or more)."""

    def checked(specs: Sequence[Spec]) -> Expected:
        if count is None and not specs:
            raise RuleError("takes one or more inputs, got none")
        if count is not None and len(specs) != count:
            plural = "input" if count == 1 else "inputs"
            raise RuleError(f"takes {count} {plural}, got {len(specs)}")
        return rule(specs)

    return checked


def _same(specs: Sequence[Spec]) -> Expected:
    return Expected(_broadcast(specs), _common_dtype(specs))


def _to_bool(specs: Sequence[Spec]) -> Expected:
    return Expected(_broadcast(specs), _BOOL)


def _shape_only(specs: Sequence[Spec]) -> Expected:
    return Expected(_broadcast(specs), None)


def _where(specs: Sequence[Spec]) -> Expected:
    return Expected(_broadcast(specs), _common_dtype(specs[1:]))


def _bias_add(specs: Sequence[Spec]) -> Expected:
    (data, dtype), _ = specs
    if _broadcast(specs) != data:
        raise RuleError(
            f"the bias {specs[1][0]} does not broadcast over the data {data}"
        )
    return Expected(data, _common_dtype(specs) or dtype)


def _matmul(specs: Sequence[Spec]) -> Expected:
    (a, _), (b, _) = specs
    if not a or not b:
        raise RuleError(f"matmul needs arrays of 1 or more axes, got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise RuleError(
            f"the inner dimensions of {a} and {b} differ ({a2[-1]} and {b2[-2]})"
        )
    batch = _broadcast([(a2[:-2], ""), (b2[:-2], "")])
    shape = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return Expected(shape, _common_dtype(specs))


def _dense(specs: Sequence[Spec]) -> Expected:
    (a, _), (w, _) = specs
    if not a or len(w) != 2:
        raise RuleError(
            f"dense needs data of 1 or more axes and 2-D weights, got {a} and {w}"
        )
    if a[-1] != w[1]:
        raise RuleError(
            f"the data's last dimension {a[-1]} is not the weights' second {w[1]} "
            "(dense weights are [units, in])"
        )
    return Expected((*a[:-1], w[0]), _common_dtype(specs))


def _reshape(specs: Sequence[Spec]) -> Expected:
    (shape, dtype), *_ = specs
    return Expected(shape, dtype, size_only=True)


_UNARY = (
    "abs acos acosh asin asinh atan atanh bitwise_not ceil copy cos cosh erf exp "
    "floor hard_swish log mish negative reciprocal relu round sigmoid sign sin "
    "sinh softmax softplus softsign sqrt tan tanh"
)
_BINARY = (
    "add bitwise_and bitwise_or bitwise_xor divide floor_divide fmod maximum "
    "minimum mod multiply power prelu subtract trunc_divide"
)
_COMPARE = (
    "equal greater greater_equal less less_equal logical_and logical_or logical_xor"
)

_RULES: dict[str, Rule] = {
    **{name: _arity(1, _same) for name in _UNARY.split()},
    **{name: _arity(1, _to_bool) for name in ("isnan", "logical_not")},
    **{name: _arity(2, _same) for name in _BINARY.split()},
    **{name: _arity(2, _to_bool) for name in _COMPARE.split()},
    **{name: _arity(None, _same) for name in ("sum", "max", "min", "mean")},
    "power_cast": _arity(2, _shape_only),
    "cast": _arity(1, _shape_only),
    "where": _arity(3, _where),
    "bias_add": _arity(2, _bias_add),
    "matmul": _arity(2, _matmul),
    "dense": _arity(2, _dense),
    "__nop": _arity(None, _reshape),
}

#: The kernels whose outputs the builder checks.
CHECKED = frozenset(_RULES)


def expected_output(func_name: str, inputs: Sequence[Spec]) -> Expected | None:
    """The output kernel ``func_name`` makes of ``inputs``, or ``None`` for a
    kernel without a rule.

    :raises RuleError: if the inputs do not fit the kernel.
    """
    rule = _RULES.get(func_name)
    return None if rule is None else rule(inputs)


def mismatch(
    func_name: str, inputs: Sequence[Spec], outputs: Sequence[Spec]
) -> str | None:
    """Why the declared ``outputs`` of a ``func_name`` node are wrong, or
    ``None`` if they are right (or the kernel has no rule)."""
    try:
        want = expected_output(func_name, inputs)
    except RuleError as exc:
        return f"{func_name}: {exc}"
    if want is None:
        return None
    if len(outputs) != 1:
        return f"{func_name} makes 1 output, not {len(outputs)}"
    ((shape, dtype),) = outputs
    described = ", ".join(str(s) for s, _ in inputs)
    if want.size_only:
        if math.prod(shape) != math.prod(want.shape):
            return (
                f"a reshape keeps the element count: {want.shape} has "
                f"{math.prod(want.shape)} elements, the declared {shape} "
                f"{math.prod(shape)}"
            )
    elif shape != want.shape:
        return (
            f"{func_name} of {described} gives shape {want.shape}, not the "
            f"declared {shape}"
        )
    if want.dtype is not None and dtype != want.dtype:
        kinds = ", ".join(d for _, d in inputs)
        return (
            f"{func_name} of {kinds} gives dtype {want.dtype}, not the declared {dtype}"
        )
    return None
