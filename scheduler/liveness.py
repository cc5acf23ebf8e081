"""Tensor lifetimes on one in-order stream: what the storage planner needs.

Given a DAG (:mod:`scheduler.dag`) and a linear launch order of its nodes,
:func:`compute_liveness` works out which tensors need arena memory and
during which steps, and turns that into storage requests, a conflict
relation and an exact lower bound for :func:`scheduler.storage.plan_offsets`.

Step ``i`` is the ``i``-th non-null node of the launch order (null nodes in
the order are ignored: they run nothing). The rules:

* **Null nodes** (graph inputs and parameters) are not in the arena: they
  are bound separately and never clobbered. They get no request.
* **Op outputs** get one request each (a node with several outputs gets
  several). A tensor is live from its producer's step to its last
  consumer's step, both included. An op's inputs and outputs are live at
  the same step, so an op never writes over its own input: no in-place
  reuse, which keeps every kernel safe.
* An output nobody reads and that is not a head still occupies storage
  during its producer's step: lifetime ``[step, step]``.
* **Graph heads** (outputs) live until the end of the run: they stay in the
  arena, untouched, until the run completes and the caller reads them.
* **``__nop``** (TVM's reshape-without-copy) has no storage of its own: its
  output 0 aliases the storage of its input 0 (following chains of nops).
  The aliased tensor then lives until the nop output's last use (or the end
  of the run, if the nop output is a head), and is sized to the larger of
  the two. If the nop's input is a graph input or parameter, its output
  simply aliases that external storage. :attr:`Liveness.aliases` maps each
  nop output to the entry whose storage it uses; the executor binds it
  there.

With one in-order stream, two requests conflict exactly when their
lifetimes share a step (:func:`scheduler.storage.interval_conflicts`), and
the largest number of bytes live at one step is an exact lower bound on the
arena.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx

from scheduler.dag import Entry, graph_spec, node_spec
from scheduler.errors import PlanError
from scheduler.storage import (
    DEFAULT_ALIGNMENT,
    ArenaPlan,
    Conflicts,
    Lifetime,
    StorageRequest,
    interval_conflicts,
    plan_offsets,
)

__all__ = ("Liveness", "compute_liveness", "default_order")


@dataclass(frozen=True)
class Liveness:
    """Lifetimes of a DAG's tensors under one launch order.

    :ivar order: the launch order, null nodes removed; step ``i`` runs
        node ``order[i]``.
    :ivar requests: one per op output that needs arena storage, in order
        of definition (step, then output index).
    :ivar lifetimes: the lifetime of each request, by entry.
    :ivar conflicts: requests whose lifetimes share a step.
    :ivar lower_bound: the most bytes live at any one step (exact).
    :ivar aliases: each ``__nop`` output entry -> the entry whose storage it
        uses: an op output with a request, or a null-node entry (external
        storage).
    """

    order: tuple[int, ...]
    requests: tuple[StorageRequest[Entry], ...]
    lifetimes: Mapping[Entry, Lifetime]
    conflicts: Conflicts[Entry]
    lower_bound: int
    aliases: Mapping[Entry, Entry]

    def plan(self) -> ArenaPlan[Entry]:
        """Assign arena offsets to :attr:`requests`.

        :return: the plan from :func:`scheduler.storage.plan_offsets`.
        """
        return plan_offsets(self.requests, self.conflicts, self.lower_bound)


def default_order(dag: nx.DiGraph) -> tuple[int, ...]:
    """A topological order of the DAG, lowest node id first among ready nodes.

    For TVM graphs (already in topological order) this is ``0, 1, 2, ...``.

    :param dag: the DAG.
    :return: every node id once.
    """
    return tuple(nx.lexicographical_topological_sort(dag))


def _check_order(dag: nx.DiGraph, order: Iterable[int]) -> tuple[int, ...]:
    """The order with null nodes removed, checked to be a valid launch order."""
    steps: list[int] = []
    seen: set[int] = set()
    for nid in order:
        if nid not in dag:
            raise PlanError(f"launch order names node id {nid}, not in the graph")
        if nid in seen:
            raise PlanError(f"launch order names node id {nid} twice")
        seen.add(nid)
        spec = node_spec(dag, nid)
        if spec.is_null:
            continue
        for position, entry in enumerate(spec.inputs):
            if not node_spec(dag, entry.nid).is_null and entry.nid not in seen:
                raise PlanError(
                    f"launch order runs node {spec.name!r} (id {nid}) before "
                    f"input {position}, produced by node id {entry.nid}"
                )
        steps.append(nid)
    missing = [n for n in dag.nodes if n not in seen and not node_spec(dag, n).is_null]
    if missing:
        raise PlanError(f"launch order leaves out node ids {sorted(missing)}")
    return tuple(steps)


def compute_liveness(
    dag: nx.DiGraph,
    order: Iterable[int] | None = None,
    alignment: int = DEFAULT_ALIGNMENT,
) -> Liveness:
    """Lifetimes, storage requests and conflicts of a DAG's op outputs.

    See the module docstring for the rules.

    :param dag: the DAG (:func:`scheduler.dag.make_dag`).
    :param order: the launch order, a sequence of node ids containing every
        op node once (null nodes may appear and are ignored); default
        :func:`default_order`.
    :param alignment: the alignment of every request, in bytes.
    :return: the liveness, ready for :meth:`Liveness.plan`.
    :raises PlanError: if the order is not a valid launch order (unknown or
        repeated node, a missing op node, a node before its input), or a
        ``__nop`` node does not have exactly one output and at least one
        input.
    """
    steps = _check_order(dag, default_order(dag) if order is None else order)
    end = len(steps) - 1
    first: dict[Entry, int] = {}
    last: dict[Entry, int] = {}
    nbytes: dict[Entry, int] = {}
    aliases: dict[Entry, Entry] = {}

    def storage_of(entry: Entry) -> Entry:
        return aliases.get(entry, entry)

    def use(entry: Entry, step: int) -> None:
        root = storage_of(entry)
        if root in last:
            last[root] = max(last[root], step)

    for step, nid in enumerate(steps):
        spec = node_spec(dag, nid)
        for entry in spec.inputs:
            use(entry, step)
        if spec.is_nop:
            if len(spec.outputs) != 1 or not spec.inputs:
                raise PlanError(
                    f"__nop node {spec.name!r} (id {nid}) needs one output and an "
                    f"input, has {len(spec.outputs)} and {len(spec.inputs)}"
                )
            root = storage_of(spec.inputs[0])
            aliases[Entry(nid, 0)] = root
            if root in nbytes:
                nbytes[root] = max(nbytes[root], spec.outputs[0].nbytes)
            continue
        for index, tensor in enumerate(spec.outputs):
            entry = Entry(nid, index)
            first[entry] = last[entry] = step
            nbytes[entry] = tensor.nbytes
    for head in graph_spec(dag).heads:
        use(head, end)

    requests = tuple(StorageRequest(e, nbytes[e], alignment) for e in first)
    lifetimes = {e: Lifetime(first[e], last[e]) for e in first}
    conflicts, lower_bound = interval_conflicts(requests, lifetimes)
    return Liveness(
        order=steps,
        requests=requests,
        lifetimes=MappingProxyType(lifetimes),
        conflicts=conflicts,
        lower_bound=lower_bound,
        aliases=MappingProxyType(aliases),
    )
