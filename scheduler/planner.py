"""The planner: from a DAG and the available devices to a :class:`Plan`.

Passes, each a small function over the DAG or the plan being built:

1. **placement** — which device runs each node. With one device, every node
   runs there (TVM's graph executor does the same when it is given a single
   device, whatever ``device_index`` says). With several, a node pinned by
   the graph (``NodeSpec.device``, or ``device_type`` matched to the first
   device of that DLPack type) stays there; the policy places the rest.
2. **ordering** — a launch order per stream (topological, lowest node id
   first among ready nodes: for TVM files that is file order).
3. **storage** — per device, lifetimes under the streams' order
   (:mod:`scheduler.liveness`) and offsets in one arena
   (:mod:`scheduler.storage`); graph inputs and parameters are external;
   ``__nop`` outputs alias their input.

Policies beyond a single device (HEFT, lookahead) and cross-device copies
build on these passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from devices import Device

from .dag import Entry, TensorSpec, graph_spec, node_spec
from .errors import PlanError
from .liveness import compute_liveness, default_order
from .plan import Arena, Launch, Plan, StreamPlan, TensorPlacement

__all__ = ("plan_graph",)


def plan_graph(dag: nx.DiGraph, devices: Sequence[Device]) -> Plan:
    """Plan a DAG onto devices; the first device faces the host.

    :param dag: the graph (:func:`scheduler.dag.make_dag`).
    :param devices: the devices, host-facing first.
    :return: the plan.
    :raises PlanError: if no device is given, or a node is pinned to a device
        not given.
    """
    if not devices:
        raise PlanError("no device to plan onto")
    if len(devices) > 1:
        raise PlanError(
            "planning across several devices is not available yet; pass one device"
        )
    device = devices[0]
    placement = {nid: device for nid in dag.nodes}
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        if spec.device is not None and spec.device != device:
            raise PlanError(
                f"node {spec.name!r} is pinned to {spec.device}, which is not "
                f"among the devices given ({device})"
            )
    order = default_order(dag)
    liveness = compute_liveness(dag, order)
    arena_plan = liveness.plan()

    tensors: dict[Entry, TensorSpec] = {}
    storage: dict[Entry, TensorPlacement] = {}
    launches: list[Launch] = []
    for nid in order:
        spec = node_spec(dag, nid)
        outputs = [Entry(nid, i) for i in range(len(spec.outputs))]
        for entry, tensor in zip(outputs, spec.outputs, strict=True):
            tensors[entry] = tensor
            if spec.is_null:
                storage[entry] = TensorPlacement(device, "external")
            elif entry in liveness.aliases:
                storage[entry] = TensorPlacement(
                    device, "alias", alias_of=liveness.aliases[entry]
                )
            else:
                storage[entry] = TensorPlacement(
                    device, "arena", offset=arena_plan.offsets[entry]
                )
        if spec.is_null or spec.is_nop:
            continue
        launches.append(
            Launch(
                nid=nid,
                name=spec.name,
                func_name=spec.func_name,
                args=(*spec.inputs, *outputs),
                num_inputs=len(spec.inputs),
                work=spec.flops,
            )
        )
    stream = StreamPlan(device, tuple(launches))
    graph = graph_spec(dag)
    return Plan(
        host=device,
        devices=(device,),
        placement=placement,
        streams=(stream,),
        order=tuple((0, i) for i in range(len(launches))),
        num_events=0,
        tensors=tensors,
        storage=storage,
        arenas={device: Arena(arena_plan.size, arena_plan.lower_bound)},
        inputs=tuple(n for n in order if node_spec(dag, n).is_null),
        heads=graph.heads,
    )
