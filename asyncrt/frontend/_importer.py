"""ONNX model -> asyncrt graph and params (TVM's ``relay.frontend.from_onnx``).

The importer walks the model's nodes in order (ONNX requires topological
order) with a table of what each value is (:mod:`._values`): a constant or a
run-time tensor. For each node it finds the operator's rule
(:mod:`._rules`), refuses attributes the rule does not understand, and
lowers the node. A node whose kernel arguments are all constants is
evaluated right away with the same kernel on numpy — constant folding, so
``Shape -> Gather -> Concat -> Reshape`` chains vanish and their results
become attributes of the kernels that need them. Constants that reach a
run-time kernel become parameters, named after their ONNX values. Before that, with
``optimize`` (the default), :mod:`._rewrite` folds BatchNormalization into
the Conv before it, fuses Conv -> Relu and Conv -> HardSwish, merges
MatMuls that share an input and fuses a transformer's GEMM epilogues,
residual layer norms, masked softmaxes and head transposes into nodes of
asyncrt's private domain (:mod:`._epilogue`, rules in :mod:`._rules_epilogue`).

Every refusal names the operator, node and opset
(:class:`~asyncrt.errors.UnsupportedOpError`) or the value or input
(:class:`~asyncrt.errors.GraphError`): a model imports correctly or not at
all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from scheduler.dag import TensorSpec

from ..errors import GraphError, UnsupportedOpError
from ..graph import Graph, GraphBuilder, SymbolicGraph, TensorHandle
from ..ops import OP_ATTRS_ATTR, OP_NAME_ATTR, encode_attrs, lookup, register_op_kernel
from ..ops._kernels import global_namespace_func
from ._names import DEFAULT_DOMAINS, PRIVATE_DOMAIN, unique_name
from ._rewrite import Rewritten, rewrite
from ._rules import NOP, PRIVATE_RULES, RULES, Call, Folded, NodeContext, Rule
from ._values import Const, Tensor, Value, spec_of, tvm_dtype

__all__ = (
    "MIN_OPSET",
    "ONNX_OP_ATTR",
    "Importer",
    "ModelSource",
    "default_opset",
    "from_onnx",
    "load_model",
    "node_rule",
)

#: The oldest default-domain opset the importer reads.
MIN_OPSET = 1
#: The node attr recording the ONNX operator a node came from.
ONNX_OP_ATTR = "onnx_op"

ModelSource = onnx.ModelProto | str | os.PathLike[str] | bytes


def load_model(model: ModelSource) -> onnx.ModelProto:
    """A checked model from a proto, a file path or serialised bytes.

    :raises GraphError: if it cannot be read or fails ONNX's checker.
    """
    where = None
    try:
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, bytes):
            proto = onnx.load_model_from_string(model)
        else:
            where = os.fspath(model)
            proto = onnx.load(where)
    except OSError as exc:
        raise GraphError(f"cannot read the ONNX model: {exc}", source=where) from exc
    except (DecodeError, onnx.checker.ValidationError) as exc:
        raise GraphError(f"not an ONNX model: {exc}", source=where) from exc
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise GraphError(f"invalid ONNX model: {exc}", source=where) from exc
    return proto


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default (``ai.onnx``) domain.

    :raises GraphError: if it has none or one older than :data:`MIN_OPSET`.
    """
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            version = int(entry.version)
            newest = onnx.defs.onnx_opset_version()
            if not MIN_OPSET <= version <= newest:
                raise GraphError(
                    f"opset {version} is not supported: asyncrt imports opsets "
                    f"{MIN_OPSET} to {newest}",
                    field="opset_import",
                )
            return version
    raise GraphError("the model imports no ai.onnx opset", field="opset_import")


def from_onnx(
    model: ModelSource,
    shape_dict: Mapping[str, Sequence[int]] | None = None,
    *,
    bind: Mapping[str, Any] | None = None,
    optimize: bool = True,
) -> tuple[Graph | SymbolicGraph, dict[str, np.ndarray[Any, Any]]]:
    """Import an ONNX model, as TVM's ``relay.frontend.from_onnx``.

    A model whose input shapes are all fixed (declared, or given by
    ``shape_dict`` or ``bind``) becomes a static :class:`Graph`. A model
    with symbolic or unknown input dimensions left, or with inputs whose
    values decide shapes (``Reshape``'s target, ``Range``'s bounds, ...)
    left unbound, becomes a :class:`SymbolicGraph`: one import for every
    input shape, specialized per shape signature
    (:meth:`SymbolicGraph.specialize`). ``shape_dict`` fixes dimensions on
    purpose; a symbol it fixes in one input is fixed in every input that
    shares it.

    :param model: a ``ModelProto``, a path to an ``.onnx`` file, or its bytes.
    :param shape_dict: input shapes by name, for inputs whose declared shape
        has symbolic or unknown dimensions (a dimension the model fixes must
        be given as it is).
    :param bind: graph inputs fixed to values at import time; they become
        constants (folded where they decide shapes).
    :param optimize: rewrite the graph first as ONNX Runtime's basic
        optimisations do: fold BatchNormalization into the Conv before it,
        and apply a Relu after a Conv inside the convolution, where nothing
        else reads the Conv's output; merge MatMuls of one input by
        constant weights (a transformer's Q/K/V projections) into one;
        fuse MatMul + bias [+ GELU], Add + LayerNormalization, scale + mask
        + Softmax and head Transposes into one kernel each (results agree
        to float rounding).
    :return: the graph and its parameters by name (initializers and folded
        constants that kernels read), as read-only arrays (an executor holds
        them without copying; copy one before writing to it). For a symbolic
        graph, the parameters are the constants every specialization
        shares, each held once (the
        weights are read once, from the model or its external-data files,
        and the message is not kept).
    :raises GraphError: if the model is unreadable or invalid, an input's
        shape is unknown, a name in ``shape_dict``/``bind`` is no input, or
        ``shape_dict`` contradicts a dimension the model fixes.
    :raises UnsupportedOpError: for an operator, attribute, dtype or dynamic
        shape asyncrt does not implement (naming node, operator and opset).
    """
    from ._symbolic import check_shape_dict, import_symbolic, plan_inputs
    from ._weights import take_weights
    from ._wire import scan

    given = dict(shape_dict or {})
    bound = dict(bind or {})
    where = None if isinstance(model, (onnx.ModelProto, bytes)) else os.fspath(model)
    # A file or bytes: the structure first, the weights only if the model is
    # symbolic (each read once); a message: the caller holds it anyway.
    proto = load_model(model) if isinstance(model, onnx.ModelProto) else None
    scanned = None if proto is not None else scan(model)
    if scanned is not None:
        plan = plan_inputs(scanned.model, given, bound, initializers=scanned.names)
    elif proto is not None:
        plan = plan_inputs(proto, given, bound)
    if plan is None or not plan.symbolic:
        proto = proto if proto is not None else load_model(model)
        shapes = {**(plan.shape_dict if plan is not None else {}), **given}
        rewritten = rewrite(proto) if optimize else Rewritten(proto)
        importer = Importer(rewritten.model, shapes, bound)
        importer.conv_activations = rewritten.activations
        return _read_only(importer.run())
    base_dir = os.path.dirname(where) if where is not None else None
    if scanned is not None:
        skeleton = scanned.model
        _check(skeleton, scanned.placeholders(), where)
        weights = scanned.read_weights(base_dir)
    elif proto is not None:
        skeleton, weights = take_weights(proto, base_dir)
    check_shape_dict(skeleton, given)
    return _read_only(
        import_symbolic(
            skeleton,
            weights,
            plan,
            bound,
            opset=default_opset(skeleton),
            optimize=optimize,
        )
    )


_Imported = TypeVar("_Imported", bound=tuple[Any, dict[str, "np.ndarray[Any, Any]"]])


def _read_only(imported: _Imported) -> _Imported:
    """The parameters are constants: read-only, so that an executor may
    hold them as they are instead of copying them (the weights then exist
    once in the process)."""
    for value in imported[1].values():
        value.flags.writeable = False
    return imported


def _check(
    skeleton: onnx.ModelProto,
    placeholders: Sequence[onnx.TensorProto],
    where: str | None,
) -> None:
    """ONNX's checker over a model's structure, its initializers stood in
    for by empty tensors of their names and dtypes (the weights are not
    serialised for it).

    :raises GraphError: if the checker refuses the model.
    """
    checked = onnx.ModelProto()
    checked.CopyFrom(skeleton)
    checked.graph.initializer.extend(placeholders)
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError as exc:
        raise GraphError(f"invalid ONNX model: {exc}", source=where) from exc


class Importer:
    """Walks a model's nodes into a graph builder (see the module docstring)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        shape_dict: Mapping[str, Sequence[int]],
        bind: Mapping[str, Any],
    ) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = default_opset(model)
        self.shape_dict = shape_dict
        self.bind = bind
        self.builder = GraphBuilder()
        self.values: dict[str, Value] = {}
        self.params: dict[str, np.ndarray[Any, Any]] = {}
        self.param_handles: dict[str, TensorHandle] = {}
        self.used_names: set[str] = set()
        #: outputs of Conv nodes that apply a fused activation, and its name
        #: (see ``_rewrite``)
        self.conv_activations: Mapping[str, str] = {}
        #: output specs computed before ONNX's inference, where it can
        self.fast_shapes: Callable[[NodeContext], list[TensorSpec] | None] | None = None

    def run(self) -> tuple[Graph, dict[str, np.ndarray[Any, Any]]]:
        self._inputs()
        for node in self.graph.node:
            self.node(node)
        heads = [self._output(out.name) for out in self.graph.output]
        self.builder.output(*heads)
        return self.builder.build(), dict(self.params)

    # -- names -----------------------------------------------------------------

    def _unique(self, base: str) -> str:
        return unique_name(base or "node", self.used_names)

    # -- graph inputs and initializers -----------------------------------------

    def _inputs(self) -> None:
        if len(self.graph.sparse_initializer):
            raise GraphError("sparse initializers are not supported")
        for init in self.graph.initializer:
            self.values[init.name] = Const(self._initializer(init))
        declared = {i.name for i in self.graph.input}
        for key in (*self.shape_dict, *self.bind):
            if key not in declared or key in self.values:
                raise GraphError(
                    f"{key!r} is not an input of the model", field="inputs"
                )
        for value_info in self.graph.input:
            name = value_info.name
            if name in self.values:  # an initializer that may be overridden
                continue
            if name in self.bind:
                self.values[name] = Const(self._bound(value_info, self.bind[name]))
                continue
            shape, dtype = self._input_type(value_info)
            handle = self.builder.input(
                self._claim_input(name), shape=shape, dtype=dtype
            )
            self.values[name] = Tensor(handle, TensorSpec(shape, dtype))

    def _claim_input(self, name: str) -> str:
        if name in self.used_names:
            raise GraphError("duplicate graph input", node=name)
        self.used_names.add(name)
        return name

    def _initializer(self, init: onnx.TensorProto) -> np.ndarray[Any, Any]:
        if tvm_dtype(init.data_type) is None:
            type_name = onnx.TensorProto.DataType.Name(init.data_type)
            raise GraphError(
                f"initializer has unsupported dtype {type_name}", node=init.name
            )
        return numpy_helper.to_array(init)

    def _input_type(
        self, value_info: onnx.ValueInfoProto
    ) -> tuple[tuple[int, ...], str]:
        name = value_info.name
        kind = value_info.type.WhichOneof("value")
        if kind != "tensor_type":
            raise GraphError(f"input of type {kind} is not supported", node=name)
        tensor = value_info.type.tensor_type
        dtype = tvm_dtype(tensor.elem_type)
        if dtype is None:
            type_name = onnx.TensorProto.DataType.Name(tensor.elem_type)
            raise GraphError(f"input dtype {type_name} is not supported", node=name)
        if name in self.shape_dict:
            shape = tuple(int(d) for d in self.shape_dict[name])
            if any(d < 0 for d in shape):
                raise GraphError(
                    f"shape_dict gives a negative dimension: {shape}", node=name
                )
            if tensor.HasField("shape"):
                _check_given_shape(name, shape, tensor.shape)
            return shape, dtype
        if not tensor.HasField("shape"):
            raise GraphError(
                "input has no declared shape; give it in shape_dict", node=name
            )
        dims = []
        for axis, dim in enumerate(tensor.shape.dim):
            if not dim.HasField("dim_value"):
                label = dim.dim_param or "?"
                raise GraphError(
                    f"dimension {axis} is symbolic ({label!r}); give the input's "
                    "shape in shape_dict",
                    node=name,
                )
            dims.append(int(dim.dim_value))
        return tuple(dims), dtype

    def _bound(
        self, value_info: onnx.ValueInfoProto, value: Any
    ) -> np.ndarray[Any, Any]:
        tensor = value_info.type.tensor_type
        dtype = tvm_dtype(tensor.elem_type)
        if dtype is None:
            raise GraphError(
                "bound input has an unsupported dtype", node=value_info.name
            )
        return np.array(value, dtype=dtype)

    # -- nodes -----------------------------------------------------------------

    def node(self, node: onnx.NodeProto) -> None:
        """Lower (or fold) ``node``."""
        name = node.name or next((o for o in node.output if o), node.op_type)
        found, schema = node_rule(node, name, self.opset, self.model)
        self.lower(node, name, found, schema)

    def lower(
        self,
        node: onnx.NodeProto,
        name: str,
        found: Rule,
        schema: onnx.defs.OpSchema,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        """Lower (or fold) one node whose rule and schema are known.

        :param attrs: its attributes, parsed already (else parsed here).
        """
        inputs: list[Value | None] = []
        for position, input_name in enumerate(node.input):
            if not input_name:
                inputs.append(None)
                continue
            if input_name not in self.values:
                raise GraphError(
                    f"input {position} reads {input_name!r}, defined nowhere before",
                    node=name,
                )
            inputs.append(self.values[input_name])
        context = NodeContext(
            node,
            name,
            self.opset,
            schema,
            inputs,
            found.static,
            {} if attrs is None else dict(attrs),
            self.fast_shapes,
        )
        if attrs is None:
            for key in context.attrs:
                if key not in found.attrs:
                    raise context.unsupported(
                        f"attribute {key!r} is not supported", attribute=key
                    )
        for position in found.static:
            if context.has(position):
                context.const(position)
        # Omitted outputs at the end are simply not produced; one in the
        # middle would shift the kernel's output arguments.
        named = [o for o in node.output if o]
        if any(not o for o in node.output[: len(node.output) - _trailing_empty(node)]):
            raise context.unsupported("an omitted output followed by a used one")
        lowering = found.lower(context)
        if (
            isinstance(lowering, Call)
            and node.op_type == "Conv"
            and node.output[0] in self.conv_activations
            and lowering.attrs is not None
        ):
            activation = self.conv_activations[node.output[0]]
            attrs = {**lowering.attrs, "activation": activation}
            lowering = Call(lowering.func, lowering.args, attrs)
        if (
            isinstance(lowering, Call)
            and found.folds
            and self._all_const(context, lowering)
        ):
            lowering = Folded(self._evaluate(context, lowering))
        if isinstance(lowering, Folded):
            if len(lowering.values) != len(named):
                raise context.unsupported(
                    "folding produced the wrong number of outputs"
                )
            for out_name, array in zip(named, lowering.values, strict=True):
                self.values[out_name] = Const(np.asarray(array))
            return
        self._emit(context, lowering, named)

    @staticmethod
    def _all_const(context: NodeContext, call: Call) -> bool:
        return all(
            not isinstance(arg, int) or isinstance(context.inputs[arg], Const)
            for arg in call.args
        )

    def _evaluate(
        self, context: NodeContext, call: Call
    ) -> tuple[np.ndarray[Any, Any], ...]:
        arrays = [context.const(a) if isinstance(a, int) else a for a in call.args]
        specs = context.outputs
        if call.func == NOP:
            _check_alias(context, context.spec(call_arg(call)), specs[0])
            return (arrays[0].reshape(specs[0].shape),)
        outs = [np.empty(s.shape, s.numpy_dtype()) for s in specs]
        kernel = self._host_kernel(context, call)
        try:
            with np.errstate(all="ignore"):
                kernel(*arrays, *outs)
        except Exception as exc:
            raise GraphError(
                f"({context.op_type}) evaluating it on constants failed: {exc}",
                node=context.name,
            ) from exc
        return tuple(outs)

    def _emit(self, context: NodeContext, call: Call, named: list[str]) -> None:
        specs = context.outputs
        if call.func == NOP:
            _check_alias(context, context.spec(call_arg(call)), specs[0])
        handles = [self._argument(context, arg, i) for i, arg in enumerate(call.args)]
        attrs = {ONNX_OP_ATTR: context.op_type}
        if call.attrs is not None:
            try:
                attrs[OP_ATTRS_ATTR], func_name = self._configure(call.func, call.attrs)
            except (ValueError, KeyError) as exc:
                raise context.unsupported(
                    f"cannot configure its kernel: {exc}"
                ) from exc
            attrs[OP_NAME_ATTR] = call.func
        else:
            func_name = call.func
        outputs = [(spec.shape, spec.dtype) for spec in specs]
        results = self.builder.op(
            func_name,
            *handles,
            outputs=outputs,
            name=self._unique(context.name),
            attrs=attrs,
        )
        for out_name, handle, spec in zip(named, results, specs, strict=True):
            self.values[out_name] = Tensor(handle, spec)

    def _host_kernel(self, context: NodeContext, call: Call) -> Callable[..., Any]:
        """The numpy kernel of ``call``, to fold it at import time."""
        return _host_kernel(context, call)

    def _configure(self, op: str, attrs: Mapping[str, Any]) -> tuple[str, str]:
        """The canonical attributes of a library op and its kernel's name
        (registered now).

        :raises ValueError: if the op refuses the attributes.
        :raises KeyError: if there is no such op.
        """
        return encode_attrs(attrs), register_op_kernel(op, attrs)

    def _argument(
        self, context: NodeContext, arg: int | np.ndarray[Any, Any], k: int
    ) -> TensorHandle:
        if not isinstance(arg, int):
            return self._param(self._unique(f"{context.name}_const{k}"), arg, key=None)
        value = context.inputs[arg]
        if value is None:
            raise context.unsupported(f"input {arg} is required")
        if isinstance(value, Tensor):
            return value.handle
        return self._param(
            context.node.input[arg], value.array, key=context.node.input[arg]
        )

    def _param(
        self, name: str, array: np.ndarray[Any, Any], key: str | None
    ) -> TensorHandle:
        if key is not None and key in self.param_handles:
            return self.param_handles[key]
        # (not ascontiguousarray: it turns a scalar into shape (1,))
        array = array if array.flags.c_contiguous else array.copy()
        param_name = self._unique(name) if key is not None else name
        spec = spec_of(array)
        handle = self.builder.param(param_name, shape=spec.shape, dtype=spec.dtype)
        self.params[param_name] = array
        if key is not None:
            self.param_handles[key] = handle
        return handle

    def _output(self, name: str) -> TensorHandle:
        value = self.values.get(name)
        if value is None:
            raise GraphError(
                f"graph output {name!r} is never computed", field="outputs"
            )
        if isinstance(value, Tensor):
            return value.handle
        return self._param(name, value.array, key=name)


def node_rule(
    node: onnx.NodeProto, name: str, opset: int, model: onnx.ModelProto
) -> tuple[Rule, onnx.defs.OpSchema]:
    """The rule and schema of ``node``, which the importer supports.

    :param name: the node's name for messages.
    :raises UnsupportedOpError: for another domain, an operator without a
        rule, or one that is not in ``opset``.
    """
    if node.domain == PRIVATE_DOMAIN and node.op_type in PRIVATE_RULES:
        private, stand_in = PRIVATE_RULES[node.op_type]
        return private, onnx.defs.get_schema(stand_in, opset, "")
    if node.domain not in DEFAULT_DOMAINS:
        version = next(
            (int(o.version) for o in model.opset_import if o.domain == node.domain),
            0,
        )
        raise UnsupportedOpError(
            f"domain {node.domain!r} is not supported",
            op_type=node.op_type,
            node=name,
            opset=version,
        )
    found = RULES.get(node.op_type)
    if found is None:
        raise UnsupportedOpError(
            "operator is not supported", op_type=node.op_type, node=name, opset=opset
        )
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError as exc:
        raise UnsupportedOpError(
            f"no such operator in this opset ({exc})",
            op_type=node.op_type,
            node=name,
            opset=opset,
        ) from exc
    return found, schema


def call_arg(call: Call) -> int:
    """The input position a ``__nop`` call aliases."""
    arg = call.args[0]
    return arg if isinstance(arg, int) else 0


def _check_alias(context: NodeContext, source: TensorSpec, target: TensorSpec) -> None:
    """Refuse a reshape that changes the number of elements: ONNX's shape
    inference lets ``Reshape`` to ``[5, 3]`` of 12 elements through, and
    the alias would read past its input."""
    if source.size != target.size:
        raise GraphError(
            f"({context.op_type}) cannot reshape {list(source.shape)} "
            f"({source.size} elements) to {list(target.shape)} "
            f"({target.size} elements)",
            node=context.name,
        )


def _host_kernel(context: NodeContext, call: Call) -> Callable[..., Any]:
    """The numpy kernel of ``call``, to fold it at import time."""
    if call.attrs is None:
        kernel = global_namespace_func(call.func, "numpy")
        if kernel is None:
            raise context.unsupported(f"no kernel {call.func!r}")
        return kernel
    definition = lookup(call.func)
    if definition is None:
        raise context.unsupported(f"no kernel library op {call.func!r}")
    try:
        return definition.make(np, json.loads(encode_attrs(call.attrs)))
    except (ValueError, TypeError, KeyError) as exc:
        raise context.unsupported(f"cannot configure its kernel: {exc}") from exc


def _check_given_shape(
    name: str, shape: tuple[int, ...], declared: onnx.TensorShapeProto
) -> None:
    """Refuse a ``shape_dict`` entry that contradicts the model: it may fix
    symbolic or unknown dimensions, never change fixed ones (ONNX Runtime
    refuses such an input too)."""
    if len(shape) != len(declared.dim):
        raise GraphError(
            f"shape_dict gives {len(shape)} dimension(s) {shape}, but the model "
            f"declares {len(declared.dim)}",
            node=name,
        )
    for axis, (given, dim) in enumerate(zip(shape, declared.dim, strict=True)):
        if dim.HasField("dim_value") and given != dim.dim_value:
            raise GraphError(
                f"shape_dict gives dimension {axis} as {given}, but the model "
                f"fixes it at {dim.dim_value}; only symbolic dimensions can be "
                "given",
                node=name,
            )


def _trailing_empty(node: onnx.NodeProto) -> int:
    count = 0
    for name in reversed(node.output):
        if name:
            break
        count += 1
    return count
