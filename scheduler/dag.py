"""The DAG contract between the graph front end (:mod:`asyncrt`) and the
scheduler.

A model graph reaches the scheduler as a :class:`networkx.DiGraph` built with
:func:`make_dag`. Everything the scheduler reads is typed:

* each node key is the integer node id (``nid``, as in TVM's graph JSON);
  the node attribute ``"spec"`` holds a frozen :class:`NodeSpec`;
* each edge ``(u, v)`` has the attribute ``"uses"``: a tuple of
  :class:`EdgeUse`, one per argument of ``v`` that reads an output of ``u``
  (a node may read the same producer more than once);
* graph-level facts live in ``G.graph["spec"]``, a :class:`GraphSpec`
  (input node ids, parameter node ids, heads).

Use the accessors (:func:`node_spec`, :func:`graph_spec`, :func:`edge_uses`)
rather than the raw attribute dictionaries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import networkx as nx
import numpy as np

from devices import Device, dtype_nbytes

__all__ = (
    "EdgeUse",
    "Entry",
    "GraphSpec",
    "NodeSpec",
    "TensorSpec",
    "edge_uses",
    "graph_spec",
    "make_dag",
    "node_spec",
)

NULL_OP = "null"
#: TVM's no-op: the node's output aliases its input 0.
NOP_FUNC = "__nop"
#: TVM's device copy, and the name every :class:`~scheduler.plan.Copy` step
#: shows: the one definition of the string.
COPY_FUNC = "__copy"


class Entry(NamedTuple):
    """One output of one node: TVM's ``[nid, index]`` (version dropped)."""

    nid: int
    index: int  # type: ignore[assignment]  # shadows tuple.index, as TVM names it


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor (one node output)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """Number of elements (1 for a scalar shape ``()``)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies, as TVM sizes it."""
        return self.size * dtype_nbytes(self.dtype)

    def numpy_dtype(self) -> np.dtype[np.generic]:
        """The matching numpy dtype."""
        from devices import numpy_dtype

        return numpy_dtype(self.dtype)


@dataclass(frozen=True)
class NodeSpec:
    """Everything the scheduler knows about one node.

    :ivar name: the node's name in the graph (not always unique: real TVM
        files repeat operator names; key nodes by id).
    :ivar op: ``"null"`` for graph inputs and parameters, else ``"tvm_op"``.
    :ivar func_name: the kernel to run (``""`` for null nodes); TVM's special
        ``"__nop"`` (output aliases input 0's storage) and :data:`COPY_FUNC`.
    :ivar inputs: the entries this node reads, in argument order.
    :ivar outputs: one :class:`TensorSpec` per output.
    :ivar attrs: the node's string attributes as the graph gave them.
    :ivar device_type: a DLPack device-type code the graph pinned the node to
        (TVM's ``device_index``), or ``None``.
    :ivar device: a concrete device the graph pinned the node to (the Python
        builder), or ``None``.
    :ivar flops: estimated work in floating-point operations (0 if unknown);
        cost models turn it into time per device.
    """

    name: str
    op: str
    func_name: str
    inputs: tuple[Entry, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    device_type: int | None = None
    device: Device | None = None
    flops: float = 0.0

    @property
    def is_null(self) -> bool:
        """Whether this node is a graph input or parameter (no kernel)."""
        return self.op == NULL_OP

    @property
    def is_nop(self) -> bool:
        """Whether this is TVM's ``__nop``: its output aliases input 0."""
        return self.func_name == NOP_FUNC

    @property
    def is_copy(self) -> bool:
        """Whether this is TVM's ``__copy``: its output is a copy of its one
        input (a :class:`~scheduler.plan.Copy` step, no kernel)."""
        return self.func_name == COPY_FUNC


class EdgeUse(NamedTuple):
    """One argument of the consumer that reads one output of the producer."""

    output_index: int
    arg_position: int


@dataclass(frozen=True)
class GraphSpec:
    """Graph-level facts.

    :ivar inputs: node ids of graph inputs (null nodes that are not params).
    :ivar params: node ids of parameters (null nodes bound to constants).
    :ivar heads: the graph's outputs, in order.
    """

    inputs: tuple[int, ...]
    params: tuple[int, ...]
    heads: tuple[Entry, ...]


def node_spec(dag: nx.DiGraph, nid: int) -> NodeSpec:
    """The :class:`NodeSpec` of node ``nid``."""
    spec: NodeSpec = dag.nodes[nid]["spec"]
    return spec


def graph_spec(dag: nx.DiGraph) -> GraphSpec:
    """The :class:`GraphSpec` of the DAG."""
    spec: GraphSpec = dag.graph["spec"]
    return spec


def edge_uses(dag: nx.DiGraph, src: int, dst: int) -> tuple[EdgeUse, ...]:
    """How node ``dst`` reads node ``src``'s outputs."""
    uses: tuple[EdgeUse, ...] = dag.edges[src, dst]["uses"]
    return uses


def make_dag(nodes: Iterable[NodeSpec], graph: GraphSpec) -> nx.DiGraph:
    """Build the scheduler's DAG from node specs given in node-id order.

    Node ``i`` of ``nodes`` gets id ``i``. Inputs must refer to existing
    nodes and outputs; the result is checked to be acyclic.

    :raises ValueError: if an input refers to a missing node or output, or
        the graph has a cycle. Front ends validate first and report their
        own, more specific errors; this is the last line of defence.
    """
    dag = nx.DiGraph(spec=graph)
    specs = list(nodes)
    for nid, spec in enumerate(specs):
        dag.add_node(nid, spec=spec)
    for nid, spec in enumerate(specs):
        uses: dict[int, list[EdgeUse]] = {}
        for position, (src, index) in enumerate(spec.inputs):
            if not 0 <= src < len(specs) or not 0 <= index < len(specs[src].outputs):
                raise ValueError(
                    f"node {spec.name!r} input {position} refers to missing "
                    f"entry ({src}, {index})"
                )
            uses.setdefault(src, []).append(EdgeUse(index, position))
        for src, src_uses in uses.items():
            dag.add_edge(src, nid, uses=tuple(src_uses))
    if not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        raise ValueError(f"graph has a cycle through node ids {cycle}")
    return dag
