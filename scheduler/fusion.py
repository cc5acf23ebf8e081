"""Elementwise fusion: a pure pass over the DAG, run before planning.

A chain of elementwise nodes (``multiply -> tanh -> exp -> sqrt``) costs one
launch and one full-size intermediate tensor per node. This pass merges such
chains into single nodes, so that a kernel library can evaluate the whole
expression in one pass over memory.

**Which nodes.** The caller says which nodes are elementwise and may be fused
(``fusible``: the scheduler knows nothing of kernels). On top of that a
member of a group must

* have exactly one output, with the same shape and dtype as every other
  member's (the group's shape);
* be pinned like every other member (same ``device`` and ``device_type``,
  both possibly ``None``): one fused node runs on one device;
* read, from outside the group, only tensors of the group's dtype whose
  shape broadcasts to the group's shape (scalars, bias vectors, same-shape
  tensors).

**Groups.** Every group has one *sink*, the only member whose output is read
outside the group or is a graph output; every other member is *interior*: its
output is read only by members and is not a head. So a fused node has exactly
one output, and no tensor that someone else needs disappears.

**Algorithm.** Nodes are visited in reverse topological order (node ids
break ties, so the result is deterministic). An unassigned fusible node
starts a group as its sink; the group then grows towards its producers: a
producer joins when it is fusible, unassigned, compatible, not a head, and
*all* its consumers are already members. A producer that is refused because
a consumer is missing is looked at again whenever another of its consumers
joins, so diamonds (``f`` read by ``f * f`` and ``f + 1``) fuse completely.
Growth stops at ``max_inputs`` distinct outside tensors. Groups of one node
are left as they are.

The contracted graph has no cycle: a path leaving a group leaves from its
sink (interior members have no outside consumers), and every member is an
ancestor of the sink, so a path from the sink back into the group would be a
cycle in the original graph.

**Result.** The fused node keeps the sink's id (so heads and the consumers'
entries stay valid), reads the group's outside tensors (each once, in order
of first use), carries the sum of the members' ``flops`` (cost models and the
simulated devices still see the real work), and records where it came from:
its name is readable (``fused_multiply_tanh_exp_sqrt``), the attribute
``"fused_nodes"`` lists the original node names (JSON), and
:class:`FusedNode` gives the recipe: members in topological order and where
each of their arguments comes from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, NamedTuple

import networkx as nx

from .dag import EdgeUse, Entry, NodeSpec, TensorSpec, graph_spec, node_spec

__all__ = (
    "FUSED_NODES_ATTR",
    "FusedArg",
    "FusedNode",
    "Fusion",
    "broadcasts",
    "fuse_elementwise",
)

#: The node attribute listing the original node names of a fused node (JSON).
FUSED_NODES_ATTR = "fused_nodes"
#: How many member labels a fused node's name spells out before abbreviating.
NAME_LABELS = 6


class FusedArg(NamedTuple):
    """Where one argument of a member comes from.

    :ivar source: ``"input"``: the fused node's input ``index``;
        ``"member"``: the output of the member at position ``index``.
    :ivar index: the position in the fused node's inputs or members.
    """

    source: Literal["input", "member"]
    index: int  # type: ignore[assignment]  # shadows tuple.index, as Entry does


@dataclass(frozen=True)
class FusedNode:
    """The recipe of one fused node.

    :ivar nid: the fused node's id (its sink's id in the original graph).
    :ivar spec: the fused node's spec in the fused graph.
    :ivar member_ids: the original node ids, in topological order; the last
        is the sink.
    :ivar members: the original specs, in the same order.
    :ivar args: for each member, where each of its arguments comes from.
    :ivar input_specs: the shape and dtype of each of the fused node's inputs.
    """

    nid: int
    spec: NodeSpec
    member_ids: tuple[int, ...]
    members: tuple[NodeSpec, ...]
    args: tuple[tuple[FusedArg, ...], ...]
    input_specs: tuple[TensorSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The original node names, in topological order."""
        return tuple(member.name for member in self.members)


@dataclass(frozen=True)
class Fusion:
    """The result of :func:`fuse_elementwise`.

    :ivar dag: the fused graph (a new DAG; the input is not changed).
    :ivar groups: every fused node's recipe, by node id.
    """

    dag: nx.DiGraph
    groups: Mapping[int, FusedNode]


def fuse_elementwise(
    dag: nx.DiGraph,
    fusible: Callable[[NodeSpec], bool],
    *,
    func_name: Callable[[int], str] = lambda nid: f"__fused_{nid}",
    label: Callable[[NodeSpec], str] = lambda spec: spec.func_name,
    max_inputs: int = 32,
    accept: Callable[[FusedNode], bool] = lambda recipe: True,
) -> Fusion:
    """Fuse maximal groups of elementwise nodes (see the module docstring).

    :param dag: the graph (:func:`scheduler.dag.make_dag`); not modified.
    :param fusible: whether a node is elementwise and may be fused (its
        kernel can be evaluated as part of one expression).
    :param func_name: the kernel name of the fused node with this id.
    :param label: a node's short name in the fused node's name.
    :param max_inputs: the most distinct outside tensors one group may read.
    :param accept: whether a group is worth fusing (one its kernels cannot
        speed up stays as its nodes).
    :return: the fused graph and the recipes of its fused nodes.
    :raises ValueError: if ``max_inputs`` < 1.
    """
    if max_inputs < 1:
        raise ValueError(f"max_inputs must be >= 1, got {max_inputs}")
    heads = {entry.nid for entry in graph_spec(dag).heads}
    order = list(nx.lexicographical_topological_sort(dag))
    rank = {nid: i for i, nid in enumerate(order)}
    candidates = {
        nid
        for nid in dag.nodes
        if _shape_ok(node_spec(dag, nid)) and fusible(node_spec(dag, nid))
    }
    groups: list[list[int]] = []
    for sink in reversed(order):
        if sink in candidates:
            members = _grow(dag, sink, candidates, heads, max_inputs)
            candidates -= members
            if len(members) > 1:
                groups.append(sorted(members, key=rank.__getitem__))
    fused = dag.copy()
    recipes: dict[int, FusedNode] = {}
    for group in groups:
        recipe = _recipe(dag, group, func_name, label)
        if not accept(recipe):
            continue
        _contract(fused, recipe)
        recipes[recipe.nid] = recipe
    return Fusion(fused, MappingProxyType(recipes))


def _shape_ok(spec: NodeSpec) -> bool:
    return not spec.is_null and not spec.is_nop and len(spec.outputs) == 1


def _compatible(a: NodeSpec, b: NodeSpec) -> bool:
    return (
        a.outputs == b.outputs
        and a.device == b.device
        and a.device_type == b.device_type
    )


def _broadcasts(tensor: TensorSpec, to: TensorSpec) -> bool:
    """Whether ``tensor`` can be read elementwise against shape ``to``."""
    return tensor.dtype == to.dtype and broadcasts(tensor.shape, to.shape)


def broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` broadcasts to ``to`` (numpy's rule,
    without growing ``to``): no more axes, each trailing one 1 or equal.

    :param shape: the shape read.
    :param to: the shape it is read against.
    """
    if len(shape) > len(to):
        return False
    tail = to[len(to) - len(shape) :]
    return all(n in (1, m) for n, m in zip(shape, tail, strict=True))


def _grow(
    dag: nx.DiGraph,
    sink: int,
    candidates: set[int],
    heads: set[int],
    max_inputs: int,
) -> set[int]:
    """The members of the group whose sink is ``sink``, drawn from
    ``candidates`` (the fusible nodes no other group has taken)."""
    sink_spec = node_spec(dag, sink)
    group_tensor = sink_spec.outputs[0]
    members = {sink}

    def reads(nid: int) -> set[Entry]:
        """What ``nid`` reads from outside the group."""
        return {e for e in node_spec(dag, nid).inputs if e.nid not in members}

    def broadcast(entries: set[Entry]) -> bool:
        return all(
            _broadcasts(node_spec(dag, e.nid).outputs[e.index], group_tensor)
            for e in entries
        )

    outside = reads(sink)
    if not broadcast(outside):
        return members
    pending = list(dag.predecessors(sink))
    while pending:
        nid = pending.pop()
        if nid in members or nid not in candidates or nid in heads:
            continue
        if not _compatible(node_spec(dag, nid), sink_spec):
            continue
        if not all(c in members for c in dag.successors(nid)):
            continue  # looked at again when another of its consumers joins
        new = reads(nid)
        grown = {e for e in outside if e.nid != nid} | new
        if not broadcast(new) or len(grown) > max_inputs:
            continue
        members.add(nid)
        outside = grown
        pending.extend(dag.predecessors(nid))
    return members


def _recipe(
    dag: nx.DiGraph,
    members: list[int],
    func_name: Callable[[int], str],
    label: Callable[[NodeSpec], str],
) -> FusedNode:
    """The fused node of ``members`` (topological order, sink last)."""
    position = {nid: i for i, nid in enumerate(members)}
    specs = tuple(node_spec(dag, nid) for nid in members)
    inputs: list[Entry] = []
    input_index: dict[Entry, int] = {}
    args: list[tuple[FusedArg, ...]] = []
    for spec in specs:
        member_args = []
        for entry in spec.inputs:
            if entry.nid in position:
                member_args.append(FusedArg("member", position[entry.nid]))
                continue
            if entry not in input_index:
                input_index[entry] = len(inputs)
                inputs.append(entry)
            member_args.append(FusedArg("input", input_index[entry]))
        args.append(tuple(member_args))
    sink = specs[-1]
    labels = [label(spec) for spec in specs]
    if len(labels) > NAME_LABELS:
        more = len(labels) - NAME_LABELS + 1
        labels = [*labels[: NAME_LABELS - 1], f"{more}more"]
    spec = NodeSpec(
        name="fused_" + "_".join(labels),
        op=sink.op,
        func_name=func_name(members[-1]),
        inputs=tuple(inputs),
        outputs=sink.outputs,
        attrs=MappingProxyType({FUSED_NODES_ATTR: json.dumps([s.name for s in specs])}),
        device_type=sink.device_type,
        device=sink.device,
        flops=sum(s.flops for s in specs),
    )
    input_specs = tuple(node_spec(dag, e.nid).outputs[e.index] for e in inputs)
    return FusedNode(members[-1], spec, tuple(members), specs, tuple(args), input_specs)


def _contract(dag: nx.DiGraph, recipe: FusedNode) -> None:
    """Replace the recipe's members in ``dag`` by its fused node."""
    nid = recipe.nid
    dag.remove_nodes_from(recipe.member_ids[:-1])
    dag.remove_edges_from(list(dag.in_edges(nid)))
    dag.nodes[nid]["spec"] = recipe.spec
    uses: dict[int, list[EdgeUse]] = {}
    for position, (src, index) in enumerate(recipe.spec.inputs):
        uses.setdefault(src, []).append(EdgeUse(index, position))
    for src, src_uses in uses.items():
        dag.add_edge(src, nid, uses=tuple(src_uses))
