"""An ONNX model with symbolic input shapes, imported once for every shape.

:func:`plan_inputs` reads the model's inputs and decides the path: when
``shape_dict`` and ``bind`` leave every input dimension fixed and no input
whose values decide shapes unbound, :func:`~asyncrt.frontend.from_onnx`
imports a static graph as always; otherwise :func:`import_symbolic` makes a
:class:`~asyncrt.graph.SymbolicGraph`.

The shape-independent work happens here, once:

1. the weights are read into arrays once and the message without them is
   kept (:mod:`._weights`);
2. the rewrites run (BatchNormalization folding, Conv-Relu, MatMul merges);
3. every value is classified: **const** (computed from weights and
   constants alone), **shape** (from the inputs' shapes, ``Shape`` and
   ``Size``, and the shape-valued inputs' values) or **data** (from the
   inputs' values);
4. the const nodes are folded now, with the importer's own kernels; the
   const values that later nodes read are the shared parameters;
5. every other node is checked to have a rule (an unsupported operator or
   attribute is refused now, not per request).

What remains per signature (:mod:`._specialize`) is the shape and data
nodes: shape propagation, folding the shape nodes and lowering the data
nodes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from scheduler.dag import TensorSpec

from ..errors import GraphError, UnsupportedOpError
from ..graph import SymbolicGraph, SymbolicInput
from ._importer import Importer, node_rule
from ._names import DEFAULT_DOMAINS, unique_name
from ._rewrite import rewrite
from ._rules import RULES, parse_attrs
from ._specialize import OnnxSpecializer, Prepared
from ._static import static_inputs
from ._values import Const, tvm_dtype

__all__ = (
    "InputPlan",
    "Kind",
    "check_shape_dict",
    "import_symbolic",
    "plan_inputs",
)

#: Operators whose output depends on their input's shape, not its values.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


@dataclass(frozen=True)
class InputPlan:
    """The inputs as ``shape_dict`` and ``bind`` leave them.

    :ivar inputs: the inputs a caller gives, with their dimensions (sizes
        or symbols).
    :ivar shape_dict: the shape of every input whose dimensions are all
        known (given, declared, or fixed through a shared symbol).
    :ivar symbolic: whether an input keeps a symbol or decides shapes by
        its values: the model needs a symbolic graph.
    """

    inputs: tuple[SymbolicInput, ...]
    shape_dict: dict[str, tuple[int, ...]]
    symbolic: bool


def plan_inputs(
    model: onnx.ModelProto,
    shape_dict: Mapping[str, Sequence[int]],
    bind: Mapping[str, Any],
    *,
    initializers: Sequence[str] | None = None,
) -> InputPlan | None:
    """The inputs of ``model`` after ``shape_dict`` and ``bind``, or
    ``None`` where the static importer must judge them (an input of no
    tensor type, of an unsupported dtype, or of unknown rank: it names
    the problem as it always has).

    A symbol that ``shape_dict`` fixes in one input is fixed in every input
    that shares it.

    :param initializers: the initializers' names, for a model whose
        initializers were taken out (default: its own).
    :raises GraphError: if a name in ``shape_dict``/``bind`` is no input, or
        ``shape_dict`` gives one symbol two sizes.
    """
    graph = model.graph
    inits = set(
        (init.name for init in graph.initializer)
        if initializers is None
        else initializers
    )
    declared = {i.name for i in graph.input}
    for key in (*shape_dict, *bind):
        if key not in declared or key in inits:
            raise GraphError(f"{key!r} is not an input of the model", field="inputs")
    valued = set(static_inputs(model)) - set(bind) - inits
    chosen: dict[str, int] = {}
    raw: list[tuple[str, str, list[int | str]]] = []
    used = {d.dim_param for i in graph.input for d in _dims(i) if d.dim_param}
    for value_info in graph.input:
        name = value_info.name
        if name in inits or name in bind:
            continue
        if value_info.type.WhichOneof("value") != "tensor_type":
            return None
        tensor = value_info.type.tensor_type
        dtype = tvm_dtype(tensor.elem_type)
        if dtype is None:
            return None
        if name in shape_dict:
            given = [int(d) for d in shape_dict[name]]
            for dim, size in zip(_dims(value_info), given, strict=False):
                if dim.dim_param and not dim.HasField("dim_value"):
                    _fix(chosen, dim.dim_param, size, name)
            raw.append((name, dtype, list(given)))
            continue
        if not tensor.HasField("shape"):
            return None
        dims: list[int | str] = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.dim_param:
                dims.append(dim.dim_param)
            else:
                dims.append(unique_name(f"{name}_dim{axis}", used))
        raw.append((name, dtype, dims))
    inputs = []
    fixed: dict[str, tuple[int, ...]] = {}
    for name, dtype, dims in raw:
        shape = tuple(chosen.get(d, d) if isinstance(d, str) else d for d in dims)
        inputs.append(SymbolicInput(name, dtype, shape, name in valued))
        if all(isinstance(d, int) for d in shape):
            fixed[name] = tuple(int(d) for d in shape)
    symbolic = bool(valued) or len(fixed) < len(inputs)
    return InputPlan(tuple(inputs), fixed, symbolic)


def _dims(value_info: onnx.ValueInfoProto) -> Sequence[Any]:
    tensor = value_info.type.tensor_type
    return tensor.shape.dim if tensor.HasField("shape") else ()


def _fix(chosen: dict[str, int], symbol: str, size: int, name: str) -> None:
    if chosen.setdefault(symbol, size) != size:
        raise GraphError(
            f"shape_dict gives symbol {symbol!r} the sizes {chosen[symbol]} and {size}",
            node=name,
        )


def check_shape_dict(
    model: onnx.ModelProto, shape_dict: Mapping[str, Sequence[int]]
) -> None:
    """Refuse a ``shape_dict`` entry that contradicts the model: it may fix
    symbolic or unknown dimensions, never change fixed ones (as ONNX Runtime
    refuses such an input).

    :raises GraphError: naming the input and the dimension.
    """
    for value_info in model.graph.input:
        given = shape_dict.get(value_info.name)
        if given is None or not value_info.type.tensor_type.HasField("shape"):
            continue
        dims = _dims(value_info)
        shape = tuple(int(d) for d in given)
        if len(shape) != len(dims):
            raise GraphError(
                f"shape_dict gives {len(shape)} dimension(s) {shape}, but the "
                f"model declares {len(dims)}",
                node=value_info.name,
            )
        for axis, (size, dim) in enumerate(zip(shape, dims, strict=True)):
            if size < 0:
                raise GraphError(
                    f"shape_dict gives a negative dimension: {shape}",
                    node=value_info.name,
                )
            if dim.HasField("dim_value") and size != dim.dim_value:
                raise GraphError(
                    f"shape_dict gives dimension {axis} as {size}, but the model "
                    f"fixes it at {dim.dim_value}; only symbolic dimensions can "
                    "be given",
                    node=value_info.name,
                )


class Kind(enum.Enum):
    """What a value is computed from."""

    CONST = "const"
    SHAPE = "shape"
    DATA = "data"


def import_symbolic(
    skeleton: onnx.ModelProto,
    weights: dict[str, np.ndarray[Any, Any]],
    plan: InputPlan,
    bind: Mapping[str, Any],
    *,
    opset: int,
    optimize: bool,
) -> tuple[SymbolicGraph, dict[str, np.ndarray[Any, Any]]]:
    """Import a model as a symbolic graph and its shared parameters.

    :param skeleton: the model without its initializers.
    :param weights: its initializers (:func:`~._weights.take_weights`).
    :param plan: its inputs, from :func:`plan_inputs`.
    :param bind: inputs fixed to values (constants).
    :param opset: its opset of the default domain.
    :param optimize: run the rewrites.
    :raises GraphError: if the model is malformed.
    :raises UnsupportedOpError: for an operator or attribute asyncrt does not
        implement (naming node, operator and opset).
    """
    activations: dict[str, str] = {}
    if optimize:
        rewritten = rewrite(skeleton, weights)
        skeleton, activations = rewritten.model, rewritten.activations
        weights = rewritten.weights if rewritten.weights is not None else weights
    consts: dict[str, np.ndarray[Any, Any]] = dict(weights)
    for name, value in bind.items():
        consts[name] = _bound(skeleton, name, value)
    del weights
    kinds = _classify(skeleton, plan, consts, opset)
    folder = _Folder(skeleton, consts, activations)
    later: list[onnx.NodeProto] = []
    for node in skeleton.graph.node:
        if all(kinds.get(o) is Kind.CONST for o in node.output if o):
            folder.fold(node)
        else:
            later.append(node)
    read = {n for node in later for n in node.input if n}
    read |= {o.name for o in skeleton.graph.output}
    shared: dict[str, np.ndarray[Any, Any]] = {}
    for name, value in folder.values.items():
        if name in read and isinstance(value, Const):
            array = value.array
            shared[name] = array if array.flags.c_contiguous else array.copy()
    held = _value_read(later, kinds, shared)
    del skeleton.graph.node[:]
    skeleton.graph.node.extend(later)
    taken = {*shared, *(i.name for i in plan.inputs)}
    prefix = "spec:"
    while any(name.startswith(prefix) for name in taken):
        prefix = prefix[:-1] + "_:"
    specs = {name: TensorSpec(a.shape, str(a.dtype)) for name, a in shared.items()}
    prepared = Prepared(
        skeleton,
        plan.inputs,
        {name: shared[name] for name in held},
        {name: spec for name, spec in specs.items() if name not in held},
        MappingProxyType(dict(activations)),
        prefix,
    )
    graph = SymbolicGraph(
        plan.inputs,
        [o.name for o in skeleton.graph.output],
        OnnxSpecializer(prepared),
        {name: (spec.shape, spec.dtype) for name, spec in specs.items()},
    )
    return graph, shared


#: Constants up to this many elements are held by the specializer whoever
#: reads them (a rule may look at a small constant's values).
_SMALL = 4096


def _value_read(
    later: Sequence[onnx.NodeProto],
    kinds: Mapping[str, Kind],
    shared: Mapping[str, np.ndarray[Any, Any]],
) -> set[str]:
    """The shared constants whose *values* specializations read: the inputs
    of shape nodes (folded per signature), the inputs a rule reads at
    import (its static positions), and every small one. The rest (the
    weights that data nodes' kernels read) are only named and typed: the
    symbolic graph does not hold them, so that an executor that loaded them
    holds them once."""
    held = {name for name, array in shared.items() if array.size <= _SMALL}
    for node in later:
        outputs = [o for o in node.output if o]
        folded = bool(outputs) and kinds.get(outputs[0]) is not Kind.DATA
        found = RULES.get(node.op_type)
        static = set(found.static) if found is not None else set()
        for position, name in enumerate(node.input):
            if name in shared and (folded or position in static):
                held.add(name)
    return held


def _bound(model: onnx.ModelProto, name: str, value: Any) -> np.ndarray[Any, Any]:
    value_info = next(i for i in model.graph.input if i.name == name)
    dtype = tvm_dtype(value_info.type.tensor_type.elem_type)
    if dtype is None:
        raise GraphError("bound input has an unsupported dtype", node=name)
    return np.array(value, dtype=dtype)


def _classify(
    model: onnx.ModelProto,
    plan: InputPlan,
    consts: Mapping[str, np.ndarray[Any, Any]],
    opset: int,
) -> dict[str, Kind]:
    """The kind of every value; every node's operator and attributes are
    checked on the way."""
    kinds = dict.fromkeys(consts, Kind.CONST)
    for item in plan.inputs:
        kinds[item.name] = Kind.SHAPE if item.shape_valued else Kind.DATA
    for node in model.graph.node:
        name = node.name or next((o for o in node.output if o), node.op_type)
        found, _ = node_rule(node, name, opset, model)
        for key in parse_attrs(node):
            if key not in found.attrs:
                raise UnsupportedOpError(
                    f"attribute {key!r} is not supported",
                    op_type=node.op_type,
                    node=name,
                    opset=opset,
                    attribute=key,
                )
        seen = []
        for position, input_name in enumerate(node.input):
            if not input_name:
                continue
            kind = kinds.get(input_name)
            if kind is None:
                raise GraphError(
                    f"input {position} reads {input_name!r}, defined nowhere before",
                    node=name,
                )
            seen.append(kind)
        if all(k is Kind.CONST for k in seen) and found.folds:
            out = Kind.CONST
        elif node.op_type in _SHAPE_ONLY and node.domain in DEFAULT_DOMAINS:
            out = Kind.SHAPE
        elif Kind.DATA in seen or not found.folds:
            out = Kind.DATA
        else:
            out = Kind.SHAPE
        for output in node.output:
            if output:
                kinds[output] = out
    return kinds


class _Folder:
    """Folds the const nodes once, with the importer's own lowering."""

    def __init__(
        self,
        model: onnx.ModelProto,
        consts: Mapping[str, np.ndarray[Any, Any]],
        activations: Mapping[str, str],
    ) -> None:
        self.importer = Importer(model, {}, {})
        self.importer.conv_activations = activations
        self.values = self.importer.values
        self.values.update((name, Const(array)) for name, array in consts.items())

    def fold(self, node: onnx.NodeProto) -> None:
        self.importer.node(node)
        for output in node.output:
            if output and not isinstance(self.values.get(output), Const):
                raise GraphError(
                    "a node of constants was not folded at import", node=node.name
                )
