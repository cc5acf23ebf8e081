"""From a :class:`~asyncrt.graph.Graph` to the scheduler's DAG.

Each graph node becomes one :class:`~scheduler.dag.NodeSpec` with the same
node id. Kernels are opaque (a ``func_name`` says nothing about the work it
does), so the cost estimate is deliberately simple: ``flops`` is the number
of output elements of an operator node, and 0 for null nodes and for
``__nop`` nodes (which only alias their input). Cost models scale it per
device; a front end that knows better can replace the specs.
"""

from __future__ import annotations

from collections.abc import Collection

import networkx as nx

from scheduler.dag import NOP_FUNC, GraphSpec, NodeSpec, TensorSpec, make_dag

from ._model import Graph, graph_error, tensor_size

__all__ = ("to_dag",)


def to_dag(graph: Graph, params: Collection[str] = ()) -> nx.DiGraph:
    """Convert ``graph`` to the scheduler's DAG (see :mod:`scheduler.dag`).

    :param graph: a validated graph.
    :param params: names of the null nodes bound to constant parameters;
        every other null node is a graph input.
    :return: a DAG built with :func:`scheduler.dag.make_dag`: node ids as in
        ``graph``, a :class:`~scheduler.dag.NodeSpec` per node (outputs from
        the entry tables; ``device_type`` from the ``device_index`` of the
        node's first output; ``device`` from the ``"device"`` node attr), and
        a :class:`~scheduler.dag.GraphSpec` of inputs, params and heads.
    :raises GraphError: if a name in ``params`` is not a null node.
    """
    null_names = {node.name for node in graph.nodes if node.is_null}
    unknown = sorted(set(params) - null_names)
    if unknown:
        raise graph_error(
            f"params {unknown} are not input (null) nodes of the graph",
            field="params",
        )
    specs = [_node_spec(graph, nid) for nid in range(len(graph.nodes))]
    nulls = [nid for nid, node in enumerate(graph.nodes) if node.is_null]
    param_set = frozenset(params)
    spec = GraphSpec(
        inputs=tuple(n for n in nulls if graph.nodes[n].name not in param_set),
        params=tuple(n for n in nulls if graph.nodes[n].name in param_set),
        heads=tuple(h.entry() for h in graph.heads),
    )
    return make_dag(specs, spec)


def _node_spec(graph: Graph, nid: int) -> NodeSpec:
    node = graph.nodes[nid]
    first = graph.node_row_ptr[nid]
    outputs = tuple(
        TensorSpec(graph.shape[eid], graph.dltype[eid])
        for eid in range(first, graph.node_row_ptr[nid + 1])
    )
    costless = node.is_null or node.func_name == NOP_FUNC
    return NodeSpec(
        name=node.name,
        op=node.op,
        func_name=node.func_name,
        inputs=tuple(e.entry() for e in node.inputs),
        outputs=outputs,
        attrs=node.attrs,
        device_type=None if graph.device_index is None else graph.device_index[first],
        device=node.device,
        flops=0.0 if costless else float(sum(tensor_size(t.shape) for t in outputs)),
    )
