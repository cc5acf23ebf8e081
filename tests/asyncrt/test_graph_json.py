"""Loading, validating and saving TVM graph-executor JSON."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrt.errors import GraphError
from asyncrt.graph import Graph, NodeEntry, load_graph, save_graph

DATA = Path(__file__).resolve().parents[1] / "data" / "tvm-graphs"
FILES = sorted(DATA.glob("*.json"))
NOT_EXECUTOR = DATA / "not-executor" / "allegrofb__LeNet__deploy_graph.json"


def small() -> dict[str, Any]:
    """x, w -> add0 -> split (2 outputs) -> mul; heads: mul and split's 2nd."""

    def op(name: str, func: str, inputs: list[list[int]], outs: int = 1) -> Any:
        attrs = {
            "func_name": func,
            "num_inputs": str(len(inputs)),
            "num_outputs": str(outs),
            "flatten_data": "0",
        }
        return {"op": "tvm_op", "name": name, "attrs": attrs, "inputs": inputs}

    return {
        "nodes": [
            {"op": "null", "name": "x", "inputs": []},
            {"op": "null", "name": "w", "inputs": []},
            op("add0", "add", [[0, 0, 0], [1, 0, 0]]),
            op("split", "split", [[2, 0, 0]], outs=2),
            op("mul", "mul", [[3, 0, 0], [3, 1, 0]]),
        ],
        "arg_nodes": [0, 1],
        "heads": [[4, 0, 0], [3, 1, 0]],
        "attrs": {
            "storage_id": ["list_int", [0, 1, 2, 3, 4, 5]],
            "shape": ["list_shape", [[4], [4], [4], [2], [2], [2]]],
            "dltype": ["list_str", ["float32"] * 6],
            "device_index": ["list_int", [1] * 6],
        },
        "node_row_ptr": [0, 1, 2, 3, 5, 6],
    }


# -- real files ---------------------------------------------------------------


def test_fixture_files_present() -> None:
    assert len(FILES) == 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:40])
def test_real_file_loads_and_round_trips(path: Path) -> None:
    graph = load_graph(path)
    assert load_graph(graph.to_json()) == graph
    # What we write is the same JSON object TVM wrote (TVM-readable).
    assert json.loads(graph.to_json()) == json.loads(path.read_text())


def test_not_executor_file_is_rejected_with_reason() -> None:
    with pytest.raises(GraphError) as info:
        load_graph(NOT_EXECUTOR)
    err = info.value
    assert err.field == "attrs"
    assert err.source == str(NOT_EXECUTOR)
    assert "un-compiled symbol graph" in str(err)
    assert "conv2d" in str(err)


def test_multi_output_nodes_use_node_row_ptr() -> None:
    graph = load_graph(DATA / "renesas-rz__rzv_drp-ai_tvm__tinyyolov3_onnx_deploy.json")
    assert graph.heads == (NodeEntry(7, 0, 0), NodeEntry(7, 1, 0))
    assert graph.num_outputs(7) == 2
    assert graph.entry_id(7, 1) == graph.node_row_ptr[7] + 1
    assert graph.num_entries == 11
    assert "float16" in graph.dltype


def test_nnvm_dtype_attr_and_version_are_kept() -> None:
    graph = load_graph(DATA / "LiGuihong__nonn__wrn-rasp.json")
    kind, value = graph.extra_attrs["dtype"]
    assert kind == "list_int" and len(value) == graph.num_entries
    versions = {e.version for n in graph.nodes for e in n.inputs}
    assert versions == {0, 1}


def test_device_index_and_scalar_shapes() -> None:
    graph = load_graph(DATA / "renesas-rz__rzv_ai_sdk__fish_classification_deploy.json")
    assert graph.device_index is not None and set(graph.device_index) == {1}
    assert () in graph.shape
    assert "int64" in graph.dltype


def test_nop_and_string_attrs() -> None:
    graph = load_graph(
        DATA / "renesas-rz__rzv_drp-ai_tvm__face_deeppose_cpu_deploy.json"
    )
    nops = [n for n in graph.nodes if n.func_name == "__nop"]
    assert len(nops) == 2 and nops[0].name == "reshape_nop"
    assert all(isinstance(v, str) for n in graph.nodes for v in n.attrs.values())


# -- sources ------------------------------------------------------------------


def test_sources_text_bytes_dict_path(tmp_path: Path) -> None:
    obj = small()
    text = json.dumps(obj)
    path = tmp_path / "g.json"
    path.write_text(text)
    expected = load_graph(obj)
    assert load_graph(text) == expected
    assert load_graph("  \n" + text) == expected
    assert load_graph(text.encode()) == expected
    assert load_graph(path) == expected
    assert load_graph(str(path)) == expected


def test_save_graph(tmp_path: Path) -> None:
    graph = load_graph(small())
    save_graph(graph, tmp_path / "out.json")
    assert load_graph(tmp_path / "out.json") == graph


def test_graph_helpers() -> None:
    graph = load_graph(small())
    assert graph.input_names == ("x", "w")
    assert graph.output_entries == (NodeEntry(4, 0), NodeEntry(3, 1))
    assert graph.entry_id(3, 1) == 4
    assert graph.num_outputs(3) == 2
    assert graph.tensor(4).shape == (2,)
    assert graph.nodes[2].func_name == "add"
    assert graph.nodes[0].is_null and not graph.nodes[2].is_null
    with pytest.raises(GraphError):
        graph.entry_id(3, 2)
    with pytest.raises(GraphError):
        graph.num_outputs(99)


def test_graph_is_immutable() -> None:
    graph = load_graph(small())
    with pytest.raises(AttributeError):
        graph.nodes = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        graph.nodes[2].attrs["func_name"] = "x"  # type: ignore[index]


def test_tvm_variants_accepted() -> None:
    obj = small()
    node = obj["nodes"][2]
    node["attr"] = node.pop("attrs")  # TVM's alias
    node["inputs"] = [[0, 0], [1, 0, 7]]  # pair, and any version
    obj["nodes"][4]["control_deps"] = [2]
    obj["attrs"]["dtype"] = ["list_int", [0] * 6]
    obj["attrs"]["storage_scope"] = ["list_str", ["global"] * 6]
    obj["attrs"]["storage_num"] = ["size_t", 6]
    obj["metadata"] = {"note": [1, 2]}
    graph = load_graph(obj)
    assert graph.nodes[2].inputs == (NodeEntry(0, 0, 0), NodeEntry(1, 0, 7))
    assert graph.nodes[2].func_name == "add"
    assert graph.nodes[4].control_deps == (2,)
    assert graph.extra_attrs["storage_num"] == ("size_t", 6)
    assert graph.storage_scope == ("global",) * 6
    assert load_graph(graph.to_json()) == graph


# -- validation errors --------------------------------------------------------


def _set(path: str, value: Any) -> Any:
    """A mutation that sets ``obj[k1][k2]...`` (``-`` deletes the key)."""

    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = obj
        for key in parents:
            target = target[int(key) if isinstance(target, list) else key]
        key_: Any = int(last) if isinstance(target, list) else last
        if value == "-":
            del target[key_]
        else:
            target[key_] = value

    return mutate


def _both(first: Any, second: Any) -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        first(obj)
        second(obj)

    return mutate


ERRORS = [
    # (mutation, node, field, message fragment)
    (_set("nodes", "-"), None, "nodes", "missing required key 'nodes'"),
    (_set("heads", "-"), None, "heads", "missing required key"),
    # an unhashable op beside a missing key (found by the fuzz test below)
    (
        _both(_set("nodes/0/op", [0]), _set("heads", "-")),
        None,
        "heads",
        "missing required key",
    ),
    (_set("arg_nodes", "-"), None, "arg_nodes", "missing required key"),
    (_set("node_row_ptr", "-"), None, "node_row_ptr", "missing required key"),
    (_set("attrs", "-"), None, "attrs", "missing required key 'attrs'"),
    (_set("extra", 1), None, "extra", "unknown top-level key"),
    (_set("attrs/storage_id", "-"), None, "attrs.storage_id", "missing required"),
    (_set("attrs/shape", "-"), None, "attrs.shape", "missing required"),
    (_set("attrs/dltype", "-"), None, "attrs.dltype", "missing required"),
    (_set("attrs/dltype", ["list_int", [0]]), None, "attrs.dltype", "list_str"),
    (_set("attrs/shape", "oops"), None, "attrs.shape", "[type, value] pair"),
    (_set("attrs/odd", ["list_str", []]), None, "attrs.odd", "can only skip"),
    (_set("attrs/storage_id/1", [0, 1]), None, "attrs.storage_id", "has 2 entries"),
    (_set("attrs/dltype/1/5", "float13"), "mul", "attrs.dltype", "unknown dtype"),
    (_set("attrs/dltype/1/2", 3), "add0", "attrs.dltype", "must be a string"),
    (_set("attrs/shape/1/3", [-2]), "split", "attrs.shape", "negative dimension"),
    (_set("attrs/shape/1/3", [2.5]), "split", "attrs.shape", "must be an integer"),
    (_set("attrs/shape/1/3", ["2"]), "split", "attrs.shape", "must be an integer"),
    (_set("attrs/shape/1/3", 2), "split", "attrs.shape", "array of dimensions"),
    (_set("attrs/storage_id/1/0", -1), "x", "attrs.storage_id", "negative"),
    (
        _both(_set("attrs/device_index/1/3", 2), _set("attrs/storage_id/1/3", 0)),
        "split",
        "attrs.device_index",
        "shared by device types 1 and 2",
    ),
    (_set("attrs/device_index/1/3", 2), "split", None, None),  # valid: own slot
    (_set("attrs/storage_id/1/3", 0), "split", None, None),  # valid: reuse
    (_set("node_row_ptr", [0, 1, 2, 3, 5]), None, "node_row_ptr", "has 5 items"),
    (_set("node_row_ptr", [1, 1, 2, 3, 5, 6]), None, "node_row_ptr", "start at 0"),
    (_set("node_row_ptr", [0, 2, 1, 3, 5, 6]), "w", "node_row_ptr", "increase"),
    (_set("node_row_ptr", [0, 1, 2, 3, 4, 6]), "split", "attrs.num_outputs", "1"),
    (_set("node_row_ptr", "0,1"), None, "node_row_ptr", "expected an array"),
    (_set("nodes/3/attrs/num_outputs", "3"), "split", "attrs.num_outputs", "3"),
    (_set("nodes/2/attrs/num_inputs", "3"), "add0", "attrs.num_inputs", "2 inputs"),
    (_set("nodes/2/attrs/num_inputs", "two"), "add0", "attrs.num_inputs", "decimal"),
    (_set("nodes/2/attrs/num_inputs", 2), "add0", "attrs.num_inputs", "string"),
    (_set("nodes/2/attrs/func_name", "-"), "add0", "attrs.func_name", "needs"),
    (_set("nodes/2/attrs/func_name", ""), "add0", "attrs.func_name", "empty"),
    (_set("nodes/2/attrs/flatten_data", "-"), "add0", "attrs.flatten_data", "needs"),
    (_set("nodes/2/attrs", "-"), "add0", "attrs.func_name", "needs"),
    (_set("nodes/2/attrs", []), "add0", "attrs", "must be an object"),
    (_set("nodes/2/attrs/device", "gpu:x"), "add0", "attrs.device", "parse"),
    (_set("nodes/2/op", "conv2d"), "add0", "op", "unsupported op"),
    (_set("nodes/2/op", 5), "add0", "op", "must be a string"),
    (_set("nodes/2/name", "-"), "#2", "name", "missing required key"),
    (_set("nodes/2/inputs", "-"), "add0", "inputs", "missing required key"),
    (_set("nodes/2/inputs", {}), "add0", "inputs", "expected an array"),
    (_set("nodes/2/inputs/0", [9, 0, 0]), "add0", "inputs", "missing node 9"),
    (_set("nodes/2/inputs/0", [-1, 0, 0]), "add0", "inputs", "missing node -1"),
    (_set("nodes/2/inputs/0", [2, 0, 0]), "add0", "inputs", "topological order"),
    (_set("nodes/2/inputs/0", [4, 0, 0]), "add0", "inputs", "topological order"),
    (_set("nodes/4/inputs/0", [3, 2, 0]), "mul", "inputs", "has 2 output(s)"),
    (_set("nodes/2/inputs/0", [0]), "add0", "inputs", "[nid, index]"),
    (_set("nodes/2/inputs/0", [0, "0"]), "add0", "inputs", "must be an integer"),
    (_set("nodes/2/inputs/0", [0, True]), "add0", "inputs", "must be an integer"),
    (_set("nodes/2/inputs/0", [0, 2**70]), "add0", "inputs", "out of range"),
    (_set("nodes/2/control_deps", [3]), "add0", "control_deps", "before"),
    (_set("nodes/2/colour", "red"), "add0", "colour", "unknown node key"),
    (_set("nodes/0/inputs", [[1, 0]]), "x", "inputs", "cannot have inputs"),
    (_set("nodes/1/name", "x"), "x", "name", "must be unique"),
    (_set("nodes/4/name", "add0"), "add0", None, None),  # valid: op names may repeat
    (_set("nodes/1", "w"), "#1", "nodes", "must be an object"),
    (_set("arg_nodes", [0, 2]), "add0", "arg_nodes", "must be null nodes"),
    (_set("arg_nodes", [0, 0]), "x", "arg_nodes", "twice"),
    (_set("arg_nodes", [0, 7]), None, "arg_nodes", "missing node 7"),
    (_set("arg_nodes", [0, None]), None, "arg_nodes", "must be an integer"),
    (_set("heads/0", [5, 0, 0]), None, "heads", "missing node 5"),
    (_set("heads/0", [3, 2, 0]), None, "heads", "has 2 output(s)"),
    (_set("heads", [[4, 0, 0], 3]), None, "heads", "[nid, index]"),
]


@pytest.mark.parametrize(("mutate", "node", "field", "fragment"), ERRORS)
def test_validation_errors(mutate: Any, node: Any, field: Any, fragment: Any) -> None:
    obj = small()
    mutate(obj)
    if fragment is None:  # a mutation that must stay valid
        load_graph(obj)
        return
    with pytest.raises(GraphError) as info:
        load_graph(obj)
    err = info.value
    assert (err.node, err.field) == (node, field), str(err)
    assert fragment in str(err)
    assert err.source is None


def test_error_names_source_file(tmp_path: Path) -> None:
    obj = small()
    obj["nodes"][2]["inputs"][0] = [9, 0, 0]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(GraphError) as info:
        load_graph(path)
    assert info.value.source == str(path)
    assert str(info.value).startswith(f"{path}, node 'add0', field 'inputs': ")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"nodes": [\n  1,\n  ]', "invalid JSON at line 3, column 3"),
        ("[1, 2]", "must be an object, got an array"),
        (b"\xff\xfe{", "not UTF-8"),
        ("[" * 100_000, "invalid JSON"),
    ],
)
def test_bad_json_text(text: str | bytes, fragment: str) -> None:
    with pytest.raises(GraphError) as info:
        load_graph(text)
    assert fragment in str(info.value)


def test_missing_file_and_wrong_source_type(tmp_path: Path) -> None:
    with pytest.raises(GraphError) as info:
        load_graph(tmp_path / "nope.json")
    assert info.value.source == str(tmp_path / "nope.json")
    assert "cannot read graph file" in str(info.value)
    with pytest.raises(GraphError, match="cannot load a graph from int"):
        load_graph(42)  # type: ignore[arg-type]


# -- fuzzing ------------------------------------------------------------------

_JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(["", "x", "float32", "list_int", "tvm_op", "null", "1"]),
    st.lists(st.integers(-2, 8), max_size=4),
    st.just({}),
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, (*prefix, i))
    return out


BASES = [small(), json.loads((DATA / FILES[-1].name).read_text())]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), base=st.sampled_from(range(len(BASES))))
def test_fuzz_mutations_give_graph_or_graph_error(data: Any, base: int) -> None:
    obj = copy.deepcopy(BASES[base])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(obj) if p]
        path = data.draw(st.sampled_from(paths))
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["delete", "replace", "bump"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = data.draw(_JSON_VALUES)
        elif isinstance(parent[path[-1]], int):
            parent[path[-1]] += data.draw(st.sampled_from([-1, 1, 1000]))
    try:
        graph = load_graph(obj)
    except GraphError:
        return
    assert isinstance(graph, Graph)
    assert load_graph(graph.to_json()) == graph


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_fuzz_garbage_text(blob: bytes | str) -> None:
    if isinstance(blob, str) and blob.lstrip()[:1] not in ("{", "["):
        blob = "{" + blob  # keep it JSON text, never a path
    with contextlib.suppress(GraphError):
        load_graph(blob)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(json.dumps(small())) - 1), st.characters())
def test_fuzz_text_corruption(pos: int, char: str) -> None:
    text = json.dumps(small())
    with contextlib.suppress(GraphError):
        load_graph(text[:pos] + char + text[pos + 1 :])
