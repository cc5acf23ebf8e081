"""The storage planner on real TVM graph-executor files.

An integration test: it loads the graphs with :mod:`asyncrt.graph` and plans
them in the default launch order (node id order). Targets on every file: an
arena within 5% of the exact lower bound, and no larger than TVM's own plan
(``TVM plan bytes`` in ``tests/data/tvm-graphs/SOURCES.md``: per storage id,
the largest tvm_op entry assigned to it, summed).

With 64-byte alignment the comparison is with TVM's plan padded per storage
id to 64 bytes: TVM allocates each storage id as its own 64-byte aligned
array, so that is the memory it really reserves.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncrt.graph import Graph, load_graph, to_dag
from devices import dtype_nbytes
from scheduler.liveness import compute_liveness
from scheduler.storage import check_no_overlap

DATA = Path(__file__).parent.parent / "data" / "tvm-graphs"

# From SOURCES.md, "TVM plan bytes (op entries, reuse)".
TVM_PLAN_BYTES = {
    "neo-ai__neo-ai-dlr__4in2out_deploy.json": 20,
    "YiChunHung__MobileNet_pretrain__deploy_graph.json": 2_262_032,
    "MirrorYuChen__tvm_insightface__deploy_graph.json": 3_717_120,
    "faddi__face-recognition-api__deploy_graph.json": 3_593_856,
    "LiGuihong__nonn__wrn-rasp.json": 789_584,
    "apivovarov__neo-ai-dlr-test__resnet18v2_model.json": 4_925_248,
    "renesas-rz__rzv_drp-ai_tvm__face_deeppose_cpu_deploy.json": 12_845_840,
    "renesas-rz__rzv_drp-ai_tvm__tinyyolov3_onnx_deploy.json": 1_297_582,
    "renesas-rz__rzv_ai_sdk__facenet_v2l_deploy.json": 727_296,
    "renesas-rz__rzv_ai_sdk__fish_classification_deploy.json": 355_390,
}


def _tvm_plan_bytes(graph: Graph, alignment: int) -> int:
    """TVM's pool for op entries: per storage id, the largest op entry
    (padded to ``alignment``), summed."""
    per_storage: dict[int, int] = {}
    for nid, node in enumerate(graph.nodes):
        if node.is_null:
            continue
        for eid in range(graph.node_row_ptr[nid], graph.node_row_ptr[nid + 1]):
            nbytes = math.prod(graph.shape[eid]) * dtype_nbytes(graph.dltype[eid])
            nbytes = -(-nbytes // alignment) * alignment
            sid = graph.storage_id[eid]
            per_storage[sid] = max(per_storage.get(sid, 0), nbytes)
    return sum(per_storage.values())


def test_every_fixture_is_listed() -> None:
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(TVM_PLAN_BYTES)


@pytest.mark.parametrize("alignment", [1, 64])
@pytest.mark.parametrize("name", sorted(TVM_PLAN_BYTES))
def test_arena_near_bound_and_within_tvm_plan(name: str, alignment: int) -> None:
    graph = load_graph(DATA / name)
    if alignment == 1:
        assert _tvm_plan_bytes(graph, 1) == TVM_PLAN_BYTES[name]
    tvm_bytes = _tvm_plan_bytes(graph, alignment)
    liveness = compute_liveness(to_dag(graph), alignment=alignment)
    plan = liveness.plan()
    check_no_overlap(plan, liveness.requests, liveness.conflicts)
    assert plan.lower_bound <= plan.size <= 1.05 * plan.lower_bound, str(plan)
    assert plan.size <= tvm_bytes
