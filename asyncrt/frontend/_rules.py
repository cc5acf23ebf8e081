"""How an ONNX node becomes an asyncrt node: the rule registry.

A :class:`Rule` lowers one ONNX node, seen through a :class:`NodeContext`
(its attributes, its input values, its inferred outputs), to either

* a :class:`Call` of a kernel — a built-in by name (``"add"``), a library op
  of :mod:`asyncrt.ops` with its attributes (``"conv"``, ``{...}``), or TVM's
  ``"__nop"`` (a reshape that aliases its input) — over some of its inputs,
* or :class:`Folded` values, known at import time (``Shape``, ``Range``).

A rule lists the attributes it understands (any other is an error, so a
model never silently runs with an attribute ignored) and the inputs that
must be known at import time (``Reshape``'s target shape): asyncrt plans
static shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from scheduler.dag import TensorSpec

from ..errors import UnsupportedOpError
from ._infer import InferenceFailed, infer_outputs
from ._values import Const, Value

__all__ = (
    "PRIVATE_RULES",
    "RULES",
    "Call",
    "Folded",
    "Lowering",
    "NodeContext",
    "Rule",
    "parse_attrs",
    "private_rule",
    "rule",
)

NOP = "__nop"


@dataclass(frozen=True)
class Call:
    """Run a kernel.

    :ivar func: a built-in kernel's name, or a library op's when ``attrs``
        is given, or ``"__nop"``.
    :ivar args: the kernel's array arguments: input positions, or new
        constants (they become parameters).
    :ivar attrs: the library op's attributes (JSON values), if ``func`` is
        one.
    """

    func: str
    args: tuple[int | np.ndarray[Any, Any], ...] = (0,)
    attrs: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Folded:
    """The node's outputs, computed at import time."""

    values: tuple[np.ndarray[Any, Any], ...]


Lowering = Call | Folded


@dataclass
class NodeContext:
    """One ONNX node as a rule sees it.

    :ivar node: the node.
    :ivar name: its name for messages (the first output's if it has none).
    :ivar opset: the model's opset of the default domain.
    :ivar schema: the operator's schema at that opset.
    :ivar inputs: a value per input position (``None`` where omitted).
    :ivar static: input positions that must be known at import time.
    """

    node: onnx.NodeProto
    name: str
    opset: int
    schema: onnx.defs.OpSchema
    inputs: list[Value | None]
    static: tuple[int, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    #: computes output specs first, where it can (else ONNX's inference)
    shapes: Callable[[NodeContext], list[TensorSpec] | None] | None = None

    def __post_init__(self) -> None:
        if not self.attrs:  # else given parsed already
            self.attrs.update(parse_attrs(self.node))

    @property
    def op_type(self) -> str:
        """The operator's name."""
        return self.node.op_type

    @property
    def version(self) -> int:
        """The version of the operator in the model's opset."""
        return int(self.schema.since_version)

    @cached_property
    def outputs(self) -> list[TensorSpec]:
        """The shape and dtype of each named output.

        :raises UnsupportedOpError: if they cannot be inferred statically.
        """
        if self.shapes is not None:
            found = self.shapes(self)
            if found is not None:
                return found
        try:
            return infer_outputs(
                self.node, self.schema, self.inputs, self.opset, self.static
            )
        except InferenceFailed as exc:
            raise self.unsupported(f"cannot infer its outputs: {exc}") from exc

    def correct_outputs(self, specs: list[TensorSpec]) -> None:
        """Replace the inferred output specs, where ONNX's shape inference
        is behind its operator's specification."""
        self.__dict__["outputs"] = specs

    @cached_property
    def num_outputs(self) -> int:
        """How many outputs the node names."""
        return sum(1 for name in self.node.output if name)

    def attr(self, key: str, default: Any = None) -> Any:
        """An attribute's value, or ``default``."""
        return self.attrs.get(key, default)

    def has(self, position: int) -> bool:
        """Whether input ``position`` is given."""
        return position < len(self.inputs) and self.inputs[position] is not None

    def spec(self, position: int) -> TensorSpec:
        """Shape and dtype of input ``position``."""
        value = self.inputs[position]
        if value is None:
            raise self.unsupported(f"input {position} is missing")
        return value.spec

    def const(self, position: int) -> np.ndarray[Any, Any]:
        """The contents of input ``position``, known at import time.

        :raises UnsupportedOpError: if it is computed at run time.
        """
        value = self.inputs[position] if position < len(self.inputs) else None
        if not isinstance(value, Const):
            raise self.unsupported(
                f"input {position} ({self.node.input[position]!r}) must be known at "
                "import time (an initializer or a constant expression; bind a graph "
                "input with from_onnx(..., bind={...}))"
            )
        return value.array

    def ints(self, position: int) -> list[int]:
        """A constant input as a list of Python ints."""
        return [int(v) for v in self.const(position).reshape(-1)]

    def unsupported(
        self, message: str, attribute: str | None = None
    ) -> UnsupportedOpError:
        """An error naming this node, its operator and the opset."""
        return UnsupportedOpError(
            message,
            op_type=self.op_type,
            node=self.name,
            opset=self.opset,
            attribute=attribute,
        )

    def refuse(self, key: str, allowed: Iterable[Any]) -> None:
        """Refuse attribute ``key`` unless its value is one of ``allowed``.

        :raises UnsupportedOpError: if it is set to another value.
        """
        options = list(allowed)
        if key in self.attrs and self.attrs[key] not in options:
            raise self.unsupported(
                f"attribute {key}={self.attrs[key]!r} is not supported "
                f"(supported: {options})",
                attribute=key,
            )


@dataclass(frozen=True)
class Rule:
    """How to lower one operator.

    :ivar lower: the lowering.
    :ivar attrs: the attributes it understands.
    :ivar static: input positions that must be known at import time.
    :ivar folds: whether a node whose inputs are all constants is folded.
    """

    lower: Callable[[NodeContext], Lowering]
    attrs: frozenset[str]
    static: tuple[int, ...] = ()
    folds: bool = True


RULES: dict[str, Rule] = {}


def rule(
    *op_types: str,
    attrs: Sequence[str] = (),
    static: Sequence[int] = (),
    folds: bool = True,
) -> Callable[[Callable[[NodeContext], Lowering]], Callable[[NodeContext], Lowering]]:
    """Register a lowering for ``op_types`` (a decorator).

    :raises ValueError: if an operator already has a rule.
    """

    def add(
        lower: Callable[[NodeContext], Lowering],
    ) -> Callable[[NodeContext], Lowering]:
        for op_type in op_types:
            if op_type in RULES:
                raise ValueError(f"{op_type} already has a rule")
            RULES[op_type] = Rule(lower, frozenset(attrs), tuple(static), folds)
        return lower

    return add


#: The rules of asyncrt's own fused ops (:data:`._names.PRIVATE_DOMAIN`),
#: by name: the rule, and the default-domain operator whose schema stands in
#: for the op's (they have none of their own; their rules give the outputs).
PRIVATE_RULES: dict[str, tuple[Rule, str]] = {}


def private_rule(
    op_type: str, stand_in: str, *, attrs: Sequence[str] = ()
) -> Callable[[Callable[[NodeContext], Lowering]], Callable[[NodeContext], Lowering]]:
    """Register the lowering of a private op (a decorator); the lowering
    must set the outputs (:meth:`NodeContext.correct_outputs`).

    :param stand_in: the default-domain operator whose schema the node
        context carries.
    :raises ValueError: if the op already has a rule.
    """

    def add(
        lower: Callable[[NodeContext], Lowering],
    ) -> Callable[[NodeContext], Lowering]:
        if op_type in PRIVATE_RULES:
            raise ValueError(f"{op_type} already has a rule")
        PRIVATE_RULES[op_type] = (Rule(lower, frozenset(attrs)), stand_in)
        return lower

    return add


def parse_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values, by name."""
    return {a.name: _attribute_value(a) for a in node.attribute}


def _attribute_value(attribute: onnx.AttributeProto) -> Any:
    """A Python value for an attribute (tensors as numpy arrays)."""
    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attribute.t)
    if kind == onnx.AttributeProto.STRING:
        return attribute.s.decode("utf-8", errors="replace")
    if kind == onnx.AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attribute.strings]
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return attribute  # no rule accepts subgraphs; kept to be refused by name
    return onnx.helper.get_attribute_value(attribute)
