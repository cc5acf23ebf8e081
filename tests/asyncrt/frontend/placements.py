"""Placement policies the model tests split graphs with."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from devices import Device
from scheduler.cost import CostModel
from scheduler.dag import node_spec
from scheduler.placement import Placement, evaluate

__all__ = ("round_robin",)


def round_robin(
    dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
) -> Placement:
    """Every operator on the next device in turn: every edge may cross."""
    ops = [n for n in nx.topological_sort(dag) if not node_spec(dag, n).is_null]
    chosen = {nid: devices[i % len(devices)] for i, nid in enumerate(ops)}
    for nid in dag.nodes:
        chosen.setdefault(nid, devices[0])
    return evaluate(dag, devices, cost, chosen, name="round_robin")
