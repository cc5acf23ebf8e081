"""The typed model of a TVM graph-executor graph and its invariants.

A :class:`Graph` mirrors TVM's graph JSON one to one: nodes in topological
order, ``node_row_ptr`` mapping each node to its output entries, and one
table row per entry (``storage_id``, ``shape``, ``dltype`` and the optional
``device_index`` and ``storage_scope``). Constructing a :class:`Graph` checks
every invariant TVM's executor relies on, so a ``Graph`` value is always
valid, whether it came from JSON (:func:`asyncrt.graph.load_graph`) or from
the Python builder. The JSON loader checks types and encodings first; the
checks here assume well-typed fields.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from devices import Device, dtype_nbytes
from devices.errors import DeviceNotFoundError, DTypeError
from scheduler.dag import Entry, TensorSpec

from ..errors import GraphError

__all__ = ("DEVICE_ATTR", "Graph", "Node", "NodeEntry")

NULL_OP = "null"
TVM_OP = "tvm_op"
#: The node attribute that pins a node to one device, as ``"kind:index"``.
#: asyncrt's own extension (TVM graphs pin only device *types*, through
#: ``device_index``); TVM keeps unknown node attrs, so files stay loadable.
DEVICE_ATTR = "device"
#: The node attrs TVM's loader requires of every node that has ``attrs``.
OP_PARAM_KEYS = ("func_name", "num_inputs", "num_outputs", "flatten_data")

# The file being loaded, so that errors raised while checking a Graph built
# from it name the file without threading it through every check.
_SOURCE: ContextVar[str | None] = ContextVar("asyncrt_graph_source", default=None)


@contextmanager
def graph_source(source: str | None) -> Iterator[None]:
    """Name ``source`` in every :class:`GraphError` raised in the block."""
    token = _SOURCE.set(source)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def graph_error(
    message: str, *, node: str | None = None, field: str | None = None
) -> GraphError:
    """A :class:`GraphError` that names the file being loaded, if any."""
    return GraphError(message, node=node, field=field, source=_SOURCE.get())


def _frozen_attrs() -> Mapping[str, str]:
    return MappingProxyType({})


class NodeEntry(NamedTuple):
    """One node output as TVM writes it: ``[nid, index, version]``.

    ``version`` is carried for round trips only; TVM ignores it.
    """

    nid: int
    index: int  # type: ignore[assignment]  # shadows tuple.index, as TVM names it
    version: int = 0

    def entry(self) -> Entry:
        """The scheduler's :class:`~scheduler.dag.Entry` (version dropped)."""
        return Entry(self.nid, self.index)


@dataclass(frozen=True)
class Node:
    """One node of a graph.

    :ivar op: ``"null"`` (graph input or parameter) or ``"tvm_op"``.
    :ivar name: the node's name; unique among null nodes, while operator
        nodes may share names (real TVM files do).
    :ivar inputs: the entries the node reads, in argument order.
    :ivar attrs: string attributes, including TVM's ``func_name``,
        ``num_inputs``, ``num_outputs`` and ``flatten_data`` for operators.
    :ivar control_deps: node ids that must run first (TVM reads, never uses).
    """

    op: str
    name: str
    inputs: tuple[NodeEntry, ...] = ()
    attrs: Mapping[str, str] = field(default_factory=_frozen_attrs)
    control_deps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # A private read-only copy: callers may pass (and later mutate) a dict.
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))
        object.__setattr__(self, "inputs", tuple(NodeEntry(*e) for e in self.inputs))
        object.__setattr__(self, "control_deps", tuple(self.control_deps))

    @property
    def is_null(self) -> bool:
        """Whether the node is a graph input or parameter."""
        return self.op == NULL_OP

    @property
    def func_name(self) -> str:
        """The kernel name (``""`` for null nodes)."""
        return self.attrs.get("func_name", "")

    @property
    def num_outputs(self) -> int:
        """Declared outputs (TVM's default is 1 when attrs are absent)."""
        return int(self.attrs.get("num_outputs", "1"))

    @property
    def device(self) -> Device | None:
        """The device the node is pinned to by :data:`DEVICE_ATTR`, if any."""
        text = self.attrs.get(DEVICE_ATTR)
        return None if text is None else Device.parse(text)


@dataclass(frozen=True)
class Graph:
    """A TVM graph-executor graph, checked on construction.

    :ivar nodes: the nodes, in topological order (node id = position).
    :ivar arg_nodes: ids of the null nodes the caller binds (inputs, params).
    :ivar heads: the graph outputs.
    :ivar node_row_ptr: node ``i`` owns entries
        ``node_row_ptr[i] .. node_row_ptr[i + 1] - 1``.
    :ivar storage_id: per entry, the storage pool slot.
    :ivar shape: per entry, the tensor shape (``()`` for a scalar).
    :ivar dltype: per entry, the TVM dtype string.
    :ivar device_index: per entry, a DLPack device-type code, if given.
    :ivar storage_scope: per entry, a memory scope such as ``"global"``.
    :ivar extra_attrs: other graph attrs kept for round trips, by key:
        ``(type, value)`` with type ``"list_int"`` (a tuple) or ``"size_t"``
        (an int); NNVM's ``dtype`` list is one.
    :ivar metadata: the top-level ``metadata`` value as JSON text, if any.
    :raises GraphError: if any invariant is broken (see the module docs).
    """

    nodes: tuple[Node, ...]
    arg_nodes: tuple[int, ...]
    heads: tuple[NodeEntry, ...]
    node_row_ptr: tuple[int, ...]
    storage_id: tuple[int, ...]
    shape: tuple[tuple[int, ...], ...]
    dltype: tuple[str, ...]
    device_index: tuple[int, ...] | None = None
    storage_scope: tuple[str, ...] | None = None
    extra_attrs: Mapping[str, tuple[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    metadata: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "extra_attrs", MappingProxyType(dict(self.extra_attrs))
        )
        object.__setattr__(self, "heads", tuple(NodeEntry(*e) for e in self.heads))
        _check_graph(self)

    @property
    def num_entries(self) -> int:
        """The number of node outputs in the graph (``node_row_ptr[-1]``)."""
        return self.node_row_ptr[-1]

    def num_outputs(self, nid: int) -> int:
        """The number of outputs of node ``nid``.

        :raises GraphError: if ``nid`` is not a node id.
        """
        self._check_nid(nid)
        return self.node_row_ptr[nid + 1] - self.node_row_ptr[nid]

    def entry_id(self, nid: int, index: int = 0) -> int:
        """The row of output ``index`` of node ``nid`` in the entry tables.

        :raises GraphError: if the node or the output does not exist.
        """
        if not 0 <= index < self.num_outputs(nid):
            raise graph_error(
                f"node {nid} has no output {index}", node=self.nodes[nid].name
            )
        return self.node_row_ptr[nid] + index

    def tensor(self, eid: int) -> TensorSpec:
        """Shape and dtype of entry ``eid``.

        :raises GraphError: if ``eid`` is not an entry id.
        """
        if not 0 <= eid < self.num_entries:
            raise graph_error(f"no entry {eid}")
        return TensorSpec(self.shape[eid], self.dltype[eid])

    @property
    def input_names(self) -> tuple[str, ...]:
        """Names of the argument (null) nodes, in ``arg_nodes`` order."""
        return tuple(self.nodes[nid].name for nid in self.arg_nodes)

    @property
    def output_entries(self) -> tuple[NodeEntry, ...]:
        """The graph outputs, in order (the ``heads``)."""
        return self.heads

    def to_dict(self) -> dict[str, Any]:
        """The graph as TVM's JSON object (plain lists and dicts)."""
        attrs: dict[str, Any] = {
            "dltype": ["list_str", list(self.dltype)],
            "storage_id": ["list_int", list(self.storage_id)],
            "shape": ["list_shape", [list(s) for s in self.shape]],
        }
        if self.device_index is not None:
            attrs["device_index"] = ["list_int", list(self.device_index)]
        if self.storage_scope is not None:
            attrs["storage_scope"] = ["list_str", list(self.storage_scope)]
        for key, (kind, value) in self.extra_attrs.items():
            attrs[key] = [kind, list(value) if isinstance(value, tuple) else value]
        out: dict[str, Any] = {
            "nodes": [_node_dict(node) for node in self.nodes],
            "arg_nodes": list(self.arg_nodes),
            "heads": [list(h) for h in self.heads],
            "attrs": attrs,
            "node_row_ptr": list(self.node_row_ptr),
        }
        if self.metadata is not None:
            out["metadata"] = json.loads(self.metadata)
        return out

    def to_json(self) -> str:
        """The graph as TVM graph-executor JSON text.

        :return: text that TVM's ``GraphExecutor`` and :func:`load_graph` read.
        """
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def _check_nid(self, nid: int) -> None:
        if not 0 <= nid < len(self.nodes):
            raise graph_error(f"no node with id {nid}")


def _node_dict(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"op": node.op, "name": node.name}
    if node.attrs or not node.is_null:
        out["attrs"] = dict(node.attrs)
    out["inputs"] = [list(e) for e in node.inputs]
    if node.control_deps:
        out["control_deps"] = list(node.control_deps)
    return out


def label(node: Node, nid: int) -> str:
    """How errors name a node: its name, or ``#nid`` if it has none."""
    return node.name if node.name else f"#{nid}"


def _check_graph(g: Graph) -> None:
    _check_row_ptr(g)
    _check_entry_tables(g)
    for nid, node in enumerate(g.nodes):
        _check_node(g, nid, node)
    _check_args(g)
    for i, head in enumerate(g.heads):
        _check_ref(g, head, len(g.nodes), f"head {i}", None, "heads")


def _check_row_ptr(g: Graph) -> None:
    ptr = g.node_row_ptr
    if len(ptr) != len(g.nodes) + 1:
        raise graph_error(
            f"has {len(ptr)} items; expected len(nodes) + 1 = {len(g.nodes) + 1}",
            field="node_row_ptr",
        )
    if ptr[0] != 0:
        raise graph_error(f"must start at 0, got {ptr[0]}", field="node_row_ptr")
    for nid in range(len(g.nodes)):
        if ptr[nid + 1] <= ptr[nid]:
            raise graph_error(
                f"must increase strictly (every node has an output), but "
                f"node_row_ptr[{nid + 1}] = {ptr[nid + 1]} <= "
                f"node_row_ptr[{nid}] = {ptr[nid]}",
                node=label(g.nodes[nid], nid),
                field="node_row_ptr",
            )


def _entry_owners(g: Graph) -> list[tuple[int, int]]:
    """``(nid, output index)`` for each entry id."""
    owners = []
    for nid in range(len(g.nodes)):
        for index in range(g.node_row_ptr[nid + 1] - g.node_row_ptr[nid]):
            owners.append((nid, index))
    return owners


def _check_entry_tables(g: Graph) -> None:
    n = g.num_entries
    tables: dict[str, tuple[Any, ...] | None] = {
        "storage_id": g.storage_id,
        "shape": g.shape,
        "dltype": g.dltype,
        "device_index": g.device_index,
        "storage_scope": g.storage_scope,
    }
    for key, table in tables.items():
        if table is not None and len(table) != n:
            raise graph_error(
                f"has {len(table)} entries; node_row_ptr[-1] says {n}",
                field=f"attrs.{key}",
            )
    owners = _entry_owners(g)
    device_of_storage: dict[int, int] = {}
    for eid, (nid, index) in enumerate(owners):
        where = f"entry {eid} (output {index} of node #{nid})"
        name = label(g.nodes[nid], nid)
        if g.storage_id[eid] < 0:
            raise graph_error(
                f"{where}: storage id {g.storage_id[eid]} is negative "
                "(dynamic shapes are not supported)",
                node=name,
                field="attrs.storage_id",
            )
        for dim in g.shape[eid]:
            if dim < 0:
                raise graph_error(
                    f"{where}: negative dimension in shape {list(g.shape[eid])}",
                    node=name,
                    field="attrs.shape",
                )
        try:
            dtype_nbytes(g.dltype[eid])
        except DTypeError as exc:
            raise graph_error(
                f"{where}: {exc}", node=name, field="attrs.dltype"
            ) from exc
        if g.device_index is not None:
            # TVM's SetupStorage: one storage slot lives on one device type.
            dev = device_of_storage.setdefault(g.storage_id[eid], g.device_index[eid])
            if dev != g.device_index[eid]:
                raise graph_error(
                    f"{where}: storage id {g.storage_id[eid]} is shared by "
                    f"device types {dev} and {g.device_index[eid]}",
                    node=name,
                    field="attrs.device_index",
                )


def _check_ref(
    g: Graph, ref: NodeEntry, limit: int, what: str, node: str | None, fld: str
) -> None:
    """Check that ``ref`` names an existing output of a node before ``limit``."""
    src, index = ref.nid, ref.index
    if not 0 <= src < len(g.nodes):
        raise graph_error(f"{what} refers to missing node {src}", node=node, field=fld)
    if src >= limit:
        raise graph_error(
            f"{what} refers to node {src}, which does not come before node "
            f"#{limit}; nodes must be in topological order (a cycle or a "
            "misordered graph)",
            node=node,
            field=fld,
        )
    span = g.node_row_ptr[src + 1] - g.node_row_ptr[src]
    if not 0 <= index < span:
        raise graph_error(
            f"{what} refers to output {index} of node {src} "
            f"({g.nodes[src].name!r}), which has {span} output(s)",
            node=node,
            field=fld,
        )


def _check_node(g: Graph, nid: int, node: Node) -> None:
    name = label(node, nid)
    if node.op not in (NULL_OP, TVM_OP):
        raise graph_error(
            f"unsupported op {node.op!r}; graph-executor nodes are 'null' or "
            "'tvm_op' (an un-compiled symbol graph is not executor JSON)",
            node=name,
            field="op",
        )
    for key, value in node.attrs.items():
        if not isinstance(value, str):
            raise graph_error(
                f"value must be a string, got {value!r}",
                node=name,
                field=f"attrs.{key}",
            )
    span = g.node_row_ptr[nid + 1] - g.node_row_ptr[nid]
    if node.is_null:
        if node.inputs:
            raise graph_error(
                "a null node cannot have inputs", node=name, field="inputs"
            )
    else:
        _check_op_attrs(node, name)
        if int(node.attrs["num_inputs"]) != len(node.inputs):
            raise graph_error(
                f"num_inputs is {node.attrs['num_inputs']} but the node has "
                f"{len(node.inputs)} inputs",
                node=name,
                field="attrs.num_inputs",
            )
    if "num_outputs" in node.attrs or node.is_null:
        _check_decimal(node, name, "num_outputs")
        if node.num_outputs != span:
            raise graph_error(
                f"num_outputs is {node.num_outputs} but node_row_ptr gives the "
                f"node {span} entries",
                node=name,
                field="attrs.num_outputs",
            )
    for pos, ref in enumerate(node.inputs):
        _check_ref(g, ref, nid, f"input {pos}", name, "inputs")
    for dep in node.control_deps:
        if not 0 <= dep < nid:
            raise graph_error(
                f"control dependency {dep} is not a node before #{nid}",
                node=name,
                field="control_deps",
            )
    if DEVICE_ATTR in node.attrs:
        try:
            node.device  # noqa: B018  # parse to validate
        except DeviceNotFoundError as exc:
            raise graph_error(
                str(exc), node=name, field=f"attrs.{DEVICE_ATTR}"
            ) from exc


def _check_decimal(node: Node, name: str, key: str) -> None:
    value = node.attrs.get(key, "1")
    if not (value.isascii() and value.isdigit()):
        raise graph_error(
            f"must be a decimal integer string, got {value!r}",
            node=name,
            field=f"attrs.{key}",
        )


def _check_op_attrs(node: Node, name: str) -> None:
    for key in OP_PARAM_KEYS:
        if key not in node.attrs:
            raise graph_error(
                f"a tvm_op node needs attrs.{key}", node=name, field=f"attrs.{key}"
            )
    if not node.func_name:
        raise graph_error("func_name is empty", node=name, field="attrs.func_name")
    for key in OP_PARAM_KEYS[1:]:
        _check_decimal(node, name, key)


def _check_args(g: Graph) -> None:
    seen: set[int] = set()
    for nid in g.arg_nodes:
        if not 0 <= nid < len(g.nodes):
            raise graph_error(f"refers to missing node {nid}", field="arg_nodes")
        node = g.nodes[nid]
        if not node.is_null:
            raise graph_error(
                f"node #{nid} is a {node.op!r} node; arguments must be null nodes",
                node=label(node, nid),
                field="arg_nodes",
            )
        if nid in seen:
            raise graph_error(
                f"lists node #{nid} twice", node=label(node, nid), field="arg_nodes"
            )
        seen.add(nid)
    names: dict[str, int] = {}
    for nid, node in enumerate(g.nodes):
        if node.is_null:
            first = names.setdefault(node.name, nid)
            if first != nid:
                raise graph_error(
                    f"input name used by null nodes #{first} and #{nid}; "
                    "input names must be unique",
                    node=label(node, nid),
                    field="name",
                )


def tensor_size(shape: tuple[int, ...]) -> int:
    """Number of elements of ``shape`` (1 for a scalar)."""
    return math.prod(shape)
