"""Work estimates: each node's FLOPs from its kernel's declaration."""

from __future__ import annotations

import dataclasses

import networkx as nx

from scheduler.dag import node_spec

from ._kernels import Module, resolve_flops

__all__ = ("annotate_work",)


def annotate_work(dag: nx.DiGraph, lib: Module | None) -> None:
    """Set ``NodeSpec.flops`` of every node whose kernel declares its work
    (``register_func(..., flops=...)``); others keep the graph's default (one
    operation per output element)."""
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        if spec.is_null:
            continue
        estimate = resolve_flops(spec.func_name, lib)
        if estimate is None:
            continue
        inputs = [node_spec(dag, e.nid).outputs[e.index] for e in spec.inputs]
        flops = float(estimate(inputs, spec.outputs))
        dag.nodes[nid]["spec"] = dataclasses.replace(spec, flops=flops)
