"""One signature of a symbolic ONNX model: a static graph, fast.

:class:`OnnxSpecializer` keeps what every specialization shares, computed
once: the model without its weights and its import-time-folded nodes, each
remaining node's rule, schema and parsed attributes, and the shared
constants. A specialization walks the remaining nodes with the importer's
own lowering (:class:`~._importer.Importer`), the inputs now of concrete
shapes and the shape-valued inputs bound to their values: ONNX's shape
inference gives each node's outputs, the shape-computing nodes fold, and
the data nodes become kernels.

Parameters: a constant that kernels read is a *shared* parameter, named as
in the model, when it is one of the model's shared constants (never
copied); anything folded for this signature is a parameter of its own,
named with the model's prefix (``"spec:"`` unless some name in the model
starts with it), which no shared parameter or input name starts with.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from scheduler.dag import TensorSpec

from ..errors import GraphError, InputError, UnsupportedOpError
from ..graph import (
    Specialized,
    SymbolicInput,
    TensorHandle,
    register_symbolic_format,
)
from ._importer import Importer, default_opset, node_rule
from ._infer import InferenceFailed
from ._rules import Call, NodeContext, Rule, parse_attrs
from ._shapes import fast_outputs
from ._values import Const, Tensor, Value

__all__ = ("FORMAT", "OnnxSpecializer", "Prepared")

#: The format's name in a symbolic graph's bytes.
FORMAT = "onnx"


@dataclass(frozen=True)
class Prepared:
    """An ONNX model ready to specialize.

    :ivar model: the model without initializers and without the nodes
        folded at import (their values are shared constants where read
        later).
    :ivar inputs: the inputs a caller gives.
    :ivar held: the shared constants whose values specializations read (the
        inputs of shape nodes, of a rule's static positions, and every small
        one).
    :ivar lazy: the other shared constants (weights that only kernels
        read): their specs only; a specialization names them.
    :ivar activations: output names of Conv nodes that apply an activation,
        and its name.
    :ivar prefix: the start of every per-signature parameter's name (no
        shared parameter's or input's name starts with it).
    """

    model: onnx.ModelProto
    inputs: tuple[SymbolicInput, ...]
    held: Mapping[str, np.ndarray[Any, Any]]
    lazy: Mapping[str, TensorSpec]
    activations: Mapping[str, str]
    prefix: str


@dataclass(frozen=True)
class _Step:
    """One node to lower per signature, looked up once."""

    node: onnx.NodeProto
    name: str
    rule: Rule
    schema: onnx.defs.OpSchema
    attrs: Mapping[str, Any]


class OnnxSpecializer:
    """Specializes one prepared ONNX model (see the module docstring).

    :param prepared: the model.
    :raises UnsupportedOpError: for a node asyncrt cannot lower.
    """

    format = FORMAT

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.opset = default_opset(prepared.model)
        self.steps = tuple(self._step(node) for node in prepared.model.graph.node)
        self.consts = {name: Const(a) for name, a in prepared.held.items()}
        #: kernels configured by earlier specializations: (op, repr(attrs))
        #: -> (canonical attrs, kernel name); most nodes' attributes do not
        #: change with the shapes
        self.kernels: dict[tuple[str, str], tuple[str, str]] = {}
        #: numpy kernels made to fold shape nodes, likewise
        self.folders: dict[tuple[str, str], Callable[..., Any]] = {}

    def _step(self, node: onnx.NodeProto) -> _Step:
        name = node.name or next((o for o in node.output if o), node.op_type)
        rule, schema = node_rule(node, name, self.opset, self.prepared.model)
        attrs = parse_attrs(node)
        for key in attrs:
            if key not in rule.attrs:
                raise UnsupportedOpError(
                    f"attribute {key!r} is not supported",
                    op_type=node.op_type,
                    node=name,
                    opset=self.opset,
                    attribute=key,
                )
        return _Step(node, name, rule, schema, attrs)

    def specialize(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray[Any, Any]],
        dims: Mapping[str, int],
    ) -> Specialized:
        """The static graph for validated shapes and values.

        :raises InputError: if a node cannot take them (naming it).
        :raises UnsupportedOpError: if a node cannot be lowered for them.
        """
        return _Specialization(self, shapes, values, dims).run_all()

    def payload(self) -> bytes:
        """The prepared model and its settings, as bytes."""
        meta = json.dumps(
            {
                "activations": dict(sorted(self.prepared.activations.items())),
                "prefix": self.prepared.prefix,
                "held": sorted(self.prepared.held),
            },
            sort_keys=True,
        ).encode()
        model: bytes = self.prepared.model.SerializeToString()
        return struct.pack("<Q", len(meta)) + meta + model


def load(
    payload: bytes,
    inputs: Sequence[SymbolicInput],
    params: Mapping[str, np.ndarray[Any, Any]],
) -> OnnxSpecializer:
    """A specializer from :meth:`OnnxSpecializer.payload`.

    :raises GraphError: if the payload is malformed.
    """
    try:
        (length,) = struct.unpack("<Q", payload[:8])
        meta = json.loads(payload[8 : 8 + length])
        if "activations" in meta:
            activations = {str(k): str(v) for k, v in meta["activations"].items()}
        else:  # written before Conv took activations other than ReLU
            activations = {str(name): "relu" for name in meta["relu"]}
        prefix = str(meta["prefix"])
        held_names = {str(name) for name in meta["held"]}
        model = onnx.load_model_from_string(payload[8 + length :])
    except (
        struct.error,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        DecodeError,
    ) as exc:
        raise GraphError(f"malformed ONNX payload: {exc}", field="payload") from exc
    missing = sorted(held_names - set(params))
    if missing:
        raise GraphError(f"shared constants missing: {missing}", field="params")
    # (not ascontiguousarray: it turns a scalar into shape (1,))
    held = {
        name: a if a.flags.c_contiguous else a.copy()
        for name, a in params.items()
        if name in held_names
    }
    lazy = {
        name: TensorSpec(tuple(a.shape), str(a.dtype))
        for name, a in params.items()
        if name not in held_names
    }
    prepared = Prepared(
        model, tuple(inputs), held, lazy, MappingProxyType(activations), prefix
    )
    return OnnxSpecializer(prepared)


register_symbolic_format(FORMAT, load)


class _Specialization(Importer):
    """One walk of the prepared nodes at concrete shapes."""

    def __init__(
        self,
        owner: OnnxSpecializer,
        shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray[Any, Any]],
        dims: Mapping[str, int],
    ) -> None:
        super().__init__(owner.prepared.model, {}, {})
        self.owner = owner
        self.shapes = shapes
        self.given = values
        self.dims = dims
        self.conv_activations = owner.prepared.activations
        self.fast_shapes = fast_outputs
        self.shared_read: list[str] = []

    def run_all(self) -> Specialized:
        self._inputs()
        for step in self.owner.steps:
            try:
                self.lower(step.node, step.name, step.rule, step.schema, step.attrs)
            except UnsupportedOpError as exc:
                if isinstance(exc.__cause__, InferenceFailed):
                    raise self._misfit(step, str(exc.__cause__)) from exc
                raise
            except GraphError as exc:
                reason = str(exc).removeprefix(f"node {exc.node!r}: ")
                raise self._misfit(step, reason) from exc
        heads = [self._output(out.name) for out in self.graph.output]
        self.builder.output(*heads)
        inputs = tuple(i.name for i in self.owner.prepared.inputs if not i.shape_valued)
        return Specialized(
            self.builder.build(), dict(self.params), inputs, tuple(self.shared_read)
        )

    def shared_param(self, name: str, spec: TensorSpec) -> TensorHandle:
        """Declare shared parameter ``name``, under its own name."""
        handle = self.builder.param(name, shape=spec.shape, dtype=spec.dtype)
        self.shared_read.append(name)
        return handle

    def _configure(self, op: str, attrs: Mapping[str, Any]) -> tuple[str, str]:
        # repr is exact for the JSON-like values rules give (ints, floats,
        # strings, lists): equal text means equal attributes.
        key = (op, repr(attrs))
        found = self.owner.kernels.get(key)
        if found is None:
            found = super()._configure(op, attrs)
            self.owner.kernels[key] = found
        return found

    def _host_kernel(self, context: NodeContext, call: Call) -> Callable[..., Any]:
        key = (call.func, repr(call.attrs))
        found = self.owner.folders.get(key)
        if found is None:
            found = super()._host_kernel(context, call)
            self.owner.folders[key] = found
        return found

    def _misfit(self, step: _Step, reason: str) -> InputError:
        bound = [f"{symbol}={size}" for symbol, size in self.dims.items()]
        bound += [
            f"{name}={value.tolist()}"
            for name, value in self.given.items()
            if value.size <= 16
        ]
        where = ", ".join(bound) or "these inputs"
        return InputError(
            f"node {step.name!r} ({step.node.op_type}) cannot take {where}: {reason}"
        )

    def _inputs(self) -> None:
        prepared = self.owner.prepared
        self.used_names.update(prepared.held)
        self.used_names.update(prepared.lazy)
        self.values = _Values(self, prepared.lazy)
        self.values.update(self.owner.consts)
        for item in prepared.inputs:
            if item.shape_valued:
                self.used_names.add(item.name)
                self.values[item.name] = Const(self.given[item.name].copy())
                continue
            shape = self.shapes[item.name]
            handle = self.builder.input(
                self._claim_input(item.name), shape=shape, dtype=item.dtype
            )
            self.values[item.name] = Tensor(handle, TensorSpec(shape, item.dtype))

    def _param(
        self, name: str, array: np.ndarray[Any, Any], key: str | None
    ) -> TensorHandle:
        if key is not None and key in self.param_handles:
            return self.param_handles[key]
        spec_shape = tuple(int(d) for d in array.shape)
        if key is not None and self.owner.prepared.held.get(key) is array:
            handle = self.shared_param(key, TensorSpec(spec_shape, str(array.dtype)))
        else:
            array = array if array.flags.c_contiguous else array.copy()
            own = self._unique(self.owner.prepared.prefix + name)
            handle = self.builder.param(own, shape=spec_shape, dtype=str(array.dtype))
            self.params[own] = array
        if key is not None:
            self.param_handles[key] = handle
        return handle


class _Values(dict[str, Value]):
    """The specialization's value table: a weight only kernels read becomes
    a parameter the first time a node reads it (a run-time tensor to the
    rules: they never see its values, which the specializer does not
    hold)."""

    def __init__(self, walk: _Specialization, lazy: Mapping[str, TensorSpec]) -> None:
        super().__init__()
        self.walk = walk
        self.lazy = lazy

    def __missing__(self, name: str) -> Value:
        spec = self.lazy.get(name)
        if spec is None:
            raise KeyError(name)
        value = Tensor(self.walk.shared_param(name, spec), spec)
        self[name] = value
        return value

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or name in self.lazy

    def get(self, name: str, default: Value | None = None) -> Value | None:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default
