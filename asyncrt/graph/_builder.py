"""Build a :class:`~asyncrt.graph.Graph` in Python, without writing JSON.

The builder records nodes in call order, which is a topological order
because an operator can only read handles that already exist. Every entry
gets its own storage id: planning storage reuse is the scheduler's job.
A device pinned with ``device=`` is kept in the node attr ``"device"``
(:data:`~asyncrt.graph.DEVICE_ATTR`), so it survives a JSON round trip and
reaches :attr:`scheduler.dag.NodeSpec.device`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from devices import Device, dtype_nbytes
from devices import device as make_device
from devices.errors import DeviceNotFoundError, DTypeError

from ._model import (
    DEVICE_ATTR,
    NULL_OP,
    OP_PARAM_KEYS,
    TVM_OP,
    Graph,
    Node,
    NodeEntry,
    graph_error,
)
from ._shape_rules import mismatch

__all__ = ("GraphBuilder", "TensorHandle")

_RESERVED_ATTRS = frozenset((*OP_PARAM_KEYS, DEVICE_ATTR))


@dataclass(frozen=True)
class TensorHandle:
    """One output of a node being built; pass it to :meth:`GraphBuilder.op`.

    :ivar nid: the node id.
    :ivar index: the output index.
    """

    nid: int
    index: int
    _owner: int  # id() of the builder, to catch handles from another builder


@dataclass(frozen=True)
class _Output:
    shape: tuple[int, ...]
    dtype: str


class GraphBuilder:
    """Build a graph node by node.

    Example::

        b = GraphBuilder()
        x = b.input("x", shape=(4,), dtype="float32")
        w = b.param("w", shape=(4,), dtype="float32")
        y = b.op("add", x, w, shape=(4,), dtype="float32", device="cpu:0")
        b.output(y)
        graph = b.build()
    """

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._outputs: list[tuple[_Output, ...]] = []
        self._names: set[str] = set()
        self._params: list[str] = []
        self._heads: list[NodeEntry] = []

    @property
    def params(self) -> tuple[str, ...]:
        """Names of the nodes made with :meth:`param`, for ``to_dag``."""
        return tuple(self._params)

    def input(self, name: str, *, shape: Sequence[int], dtype: str) -> TensorHandle:
        """Add a graph input.

        :param name: the input's name (unique in the graph).
        :param shape: its shape.
        :param dtype: its TVM dtype string, such as ``"float32"``.
        :return: a handle to the input.
        :raises GraphError: if the name is taken or the shape or dtype is bad.
        """
        out = _output(name, shape, dtype)
        return self._add(Node(NULL_OP, self._claim(name)), (out,))[0]

    def param(self, name: str, *, shape: Sequence[int], dtype: str) -> TensorHandle:
        """Add a parameter: an input bound to a constant at run time.

        :param name: the parameter's name (unique in the graph).
        :param shape: its shape.
        :param dtype: its TVM dtype string.
        :return: a handle to the parameter.
        :raises GraphError: if the name is taken or the shape or dtype is bad.
        """
        handle = self.input(name, shape=shape, dtype=dtype)
        self._params.append(name)
        return handle

    @overload
    def op(
        self,
        func_name: str,
        *inputs: TensorHandle,
        shape: Sequence[int],
        dtype: str,
        name: str | None = None,
        device: str | Device | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> TensorHandle: ...

    @overload
    def op(
        self,
        func_name: str,
        *inputs: TensorHandle,
        outputs: Sequence[tuple[Sequence[int], str]],
        name: str | None = None,
        device: str | Device | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> tuple[TensorHandle, ...]: ...

    def op(
        self,
        func_name: str,
        *inputs: TensorHandle,
        shape: Sequence[int] | None = None,
        dtype: str | None = None,
        outputs: Sequence[tuple[Sequence[int], str]] | None = None,
        name: str | None = None,
        device: str | Device | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> TensorHandle | tuple[TensorHandle, ...]:
        """Add an operator node that runs kernel ``func_name``.

        Give ``shape`` and ``dtype`` for one output (returns one handle), or
        ``outputs=[(shape, dtype), ...]`` for several (returns a tuple).

        :param func_name: the kernel to run.
        :param inputs: the handles it reads, in argument order.
        :param shape: the shape of its single output.
        :param dtype: the dtype of its single output.
        :param outputs: ``(shape, dtype)`` per output, instead of the above.
        :param name: the node name; defaults to ``func_name``, made unique.
        :param device: a device to pin the node to, such as ``"sim:1"``.
        :param attrs: extra string attributes for the kernel.
        :return: a handle, or a tuple of handles when ``outputs`` is given.
        :raises GraphError: if an argument is invalid, a handle comes from
            another builder, the name is taken, or a built-in kernel whose
            shape rule asyncrt knows (``matmul``, ``add``, ``relu``, ...; see
            :mod:`asyncrt.graph._shape_rules`) makes another output than the
            one declared.
        """
        # Validate everything before claiming the name, so a failed call
        # leaves the builder as it was.
        node_name = name if isinstance(name, str) and name else str(func_name)
        if not isinstance(func_name, str) or not func_name:
            raise graph_error("func_name must be a non-empty string", node=node_name)
        if (outputs is None) == (shape is None and dtype is None):
            raise graph_error(
                "give either shape= and dtype= or outputs=", node=node_name
            )
        if outputs is None:
            if shape is None or dtype is None:
                raise graph_error("give both shape= and dtype=", node=node_name)
            specs: tuple[_Output, ...] = (_output(node_name, shape, dtype),)
        else:
            if not outputs:
                raise graph_error("needs at least one output", node=node_name)
            specs = tuple(_output(node_name, s, d) for s, d in outputs)
        node_attrs = {
            "func_name": func_name,
            "num_inputs": str(len(inputs)),
            "num_outputs": str(len(specs)),
            "flatten_data": "0",
        }
        for key, value in (attrs or {}).items():
            if key in _RESERVED_ATTRS or not isinstance(value, str):
                raise graph_error(
                    "reserved key or non-string value",
                    node=node_name,
                    field=f"attrs.{key}",
                )
            node_attrs[key] = value
        if device is not None:
            node_attrs[DEVICE_ATTR] = str(_device(device, node_name))
        refs = tuple(self._ref(h, node_name, i) for i, h in enumerate(inputs))
        problem = mismatch(
            func_name,
            [self._spec(ref) for ref in refs],
            [(out.shape, out.dtype) for out in specs],
        )
        if problem is not None:
            raise graph_error(problem, node=node_name)
        node_name = self._claim(name) if name is not None else self._fresh(func_name)
        handles = self._add(Node(TVM_OP, node_name, refs, node_attrs), specs)
        return handles if outputs is not None else handles[0]

    def output(self, *handles: TensorHandle) -> None:
        """Mark ``handles`` as graph outputs, in order.

        :param handles: the outputs.
        :raises GraphError: if a handle comes from another builder.
        """
        for i, handle in enumerate(handles):
            self._heads.append(self._ref(handle, None, i))

    def build(self) -> Graph:
        """The graph built so far: every null node is an argument, and each
        entry has its own storage id.

        :return: a validated :class:`Graph`.
        :raises GraphError: if no output was marked.
        """
        if not self._heads:
            raise graph_error("the graph has no outputs; call output() first")
        flat = [out for outs in self._outputs for out in outs]
        row_ptr = [0]
        for outs in self._outputs:
            row_ptr.append(row_ptr[-1] + len(outs))
        return Graph(
            nodes=tuple(self._nodes),
            arg_nodes=tuple(i for i, n in enumerate(self._nodes) if n.is_null),
            heads=tuple(self._heads),
            node_row_ptr=tuple(row_ptr),
            storage_id=tuple(range(len(flat))),
            shape=tuple(out.shape for out in flat),
            dltype=tuple(out.dtype for out in flat),
        )

    def _add(self, node: Node, outs: tuple[_Output, ...]) -> tuple[TensorHandle, ...]:
        nid = len(self._nodes)
        self._nodes.append(node)
        self._outputs.append(outs)
        return tuple(TensorHandle(nid, i, id(self)) for i in range(len(outs)))

    def _claim(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise graph_error(f"a node name must be a non-empty string, got {name!r}")
        if name in self._names:
            raise graph_error("name is already used", node=name, field="name")
        self._names.add(name)
        return name

    def _fresh(self, base: str) -> str:
        name, n = str(base), 0
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        return self._claim(name)

    def _spec(self, ref: NodeEntry) -> tuple[tuple[int, ...], str]:
        out = self._outputs[ref.nid][ref.index]
        return out.shape, out.dtype

    def _ref(self, handle: object, node: str | None, pos: int) -> NodeEntry:
        if not isinstance(handle, TensorHandle) or handle._owner != id(self):
            raise graph_error(
                f"argument {pos} is not a handle from this builder: {handle!r}",
                node=node,
                field="inputs" if node is not None else "heads",
            )
        return NodeEntry(handle.nid, handle.index)


def _output(node: str, shape: Sequence[int], dtype: str) -> _Output:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise graph_error(f"shape must be a sequence of ints, got {shape!r}", node=node)
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise graph_error(
                f"shape {list(shape)!r} must hold integers >= 0",
                node=node,
                field="shape",
            )
    if not isinstance(dtype, str):
        raise graph_error(f"dtype must be a string, got {dtype!r}", node=node)
    try:
        dtype_nbytes(dtype)
    except DTypeError as exc:
        raise graph_error(str(exc), node=node, field="dltype") from exc
    return _Output(tuple(shape), dtype)


def _device(spec: str | Device, node: str) -> Device:
    try:
        return make_device(spec)
    except DeviceNotFoundError as exc:
        raise graph_error(str(exc), node=node, field="device") from exc
