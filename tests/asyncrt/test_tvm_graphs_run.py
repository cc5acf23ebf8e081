"""Real TVM graphs run end to end with stand-in kernels, and the planned
storage never clobbers a live tensor.

The graphs' own kernels (fused TVM ops) are not available, so every
``func_name`` gets a stand-in (:mod:`tests.tvm_graph_kernels`) that writes a
value derived from all of its inputs and the node into every output. A
plain interpreter with a fresh buffer per tensor computes the same values;
if the arena planner let two live tensors share bytes, some head would
differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.graph import Graph, load_graph
from tests.tvm_graph_kernels import stand_in

GRAPHS = sorted((Path(__file__).parents[1] / "data" / "tvm-graphs").glob("*.json"))


def lib_for(graph: Graph) -> asyncrt.Module:
    """A stand-in kernel for every func_name in the graph."""
    lib = asyncrt.Module()
    for node in graph.nodes:
        name = node.func_name
        if not node.is_null and name != "__nop" and name not in lib:
            lib.add(name, stand_in(name, len(node.inputs)), kinds=("cpu", "sim"))
    return lib


def interpret(graph: Graph, inputs: dict[int, np.ndarray]) -> list[np.ndarray]:
    values: dict[tuple[int, int], np.ndarray] = {}
    for nid, node in enumerate(graph.nodes):
        if node.is_null:
            values[(nid, 0)] = inputs[nid]
            continue
        args = [values[(e.nid, e.index)] for e in node.inputs]
        outs = []
        for index in range(node.num_outputs):
            spec = graph.tensor(graph.entry_id(nid, index))
            outs.append(np.empty(spec.shape, dtype=spec.numpy_dtype()))
        if node.func_name == "__nop":
            outs[0] = args[0].reshape(outs[0].shape)
        else:
            stand_in(node.func_name, len(args))(*args, *outs)
        for index, out in enumerate(outs):
            values[(nid, index)] = out
    return [values[(e.nid, e.index)] for e in graph.heads]


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name[:40])
def test_real_graph_runs_like_a_fresh_buffer_interpreter(path: Path) -> None:
    graph = load_graph(path)
    lib = lib_for(graph)
    rng = np.random.default_rng(0)
    inputs: dict[int, np.ndarray] = {}
    for nid, node in enumerate(graph.nodes):
        if node.is_null:
            spec = graph.tensor(graph.entry_id(nid, 0))
            inputs[nid] = (rng.random(spec.shape) * 10).astype(spec.numpy_dtype())
    with graph_executor.create(graph, lib, "cpu") as ex:
        plan = ex.plan
        arena = plan.arenas[plan.host]
        assert arena.size <= 1.05 * arena.lower_bound + 64 * 16
        for nid, value in inputs.items():
            ex.set_input(graph.nodes[nid].name, value)
        ex.run_sync()
        want = interpret(graph, inputs)
        for index, expected in enumerate(want):
            np.testing.assert_allclose(
                ex.get_output(index).numpy(),
                expected,
                rtol=1e-3,
                err_msg=f"head {index}",
            )
