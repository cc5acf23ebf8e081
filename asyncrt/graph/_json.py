"""Reading and writing TVM graph-executor JSON.

The reader accepts what TVM's ``GraphExecutor`` JSON reader accepts
(``src/runtime/graph_executor/graph_executor.h``): node entries as
``[nid, index]`` or ``[nid, index, version]``, ``attr`` as an alias of a
node's ``attrs``, ``control_deps``, ``device_index`` and ``storage_scope``,
unknown graph attrs of type ``list_int`` or ``size_t`` (kept for round
trips, such as NNVM's ``dtype``), and a top-level ``metadata`` value. Like
TVM it rejects unknown keys elsewhere. It checks every type and encoding
here, then builds a :class:`~asyncrt.graph.Graph`, which checks the
cross-references; every failure is a :class:`~asyncrt.errors.GraphError`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

from ._model import Graph, Node, NodeEntry, graph_error, graph_source, label

__all__ = ("GraphSource", "load_graph", "save_graph")

#: What :func:`load_graph` reads: JSON text or bytes, a parsed JSON object,
#: or the path of a file.
GraphSource = Union[str, bytes, bytearray, "os.PathLike[str]", Mapping[str, Any]]

_TOP_KEYS = ("nodes", "arg_nodes", "node_row_ptr", "heads", "attrs")
_ENTRY_ATTRS = {
    "storage_id": "list_int",
    "shape": "list_shape",
    "dltype": "list_str",
    "device_index": "list_int",
    "storage_scope": "list_str",
}
_REQUIRED_ATTRS = ("storage_id", "shape", "dltype")
_SKIPPABLE_ATTR_TYPES = ("list_int", "size_t")  # what TVM's loader skips
_MAX_INT = 2**63 - 1


def load_graph(source: GraphSource) -> Graph:
    """Load and validate a TVM graph-executor graph.

    A ``str`` whose first non-blank character is ``{`` or ``[`` is JSON
    text; any other ``str``, and any ``os.PathLike``, is a file path.
    ``bytes`` are UTF-8 JSON text; a mapping is an already-parsed object.

    :param source: JSON text, bytes, a parsed object, or a path.
    :return: the validated graph.
    :raises GraphError: if the file cannot be read, is not JSON, or is not a
        valid graph-executor graph; the error names the node, the field and,
        for a file, its path.
    """
    path: str | None = None
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and source.lstrip()[:1] not in ("{", "[")
    ):
        path = os.fspath(source)
    with graph_source(path):
        obj = _read(source, path)
        return parse_graph(obj)


def save_graph(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` as TVM graph-executor JSON.

    :param graph: the graph to write.
    :param path: the file to create or replace.
    :raises GraphError: if the file cannot be written.
    """
    try:
        Path(path).write_text(graph.to_json(), encoding="utf-8")
    except OSError as exc:
        raise graph_error(f"cannot write graph: {exc}") from exc


def _read(source: GraphSource, path: str | None) -> object:
    if isinstance(source, Mapping):
        return source
    if path is not None:
        try:
            data: str | bytes | bytearray = Path(path).read_bytes()
        except (OSError, ValueError) as exc:  # ValueError: NUL in the path
            raise graph_error(f"cannot read graph file: {exc}") from exc
    elif isinstance(source, (str, bytes, bytearray)):
        data = source
    else:
        raise graph_error(
            f"cannot load a graph from {type(source).__name__}; expected JSON "
            "text, bytes, a dict or a path"
        )
    if isinstance(data, (bytes, bytearray)):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise graph_error(
                f"not UTF-8 text (byte offset {exc.start}): {exc.reason}"
            ) from exc
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise graph_error(
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError as exc:
        raise graph_error("invalid JSON: nested too deeply") from exc


def parse_graph(obj: object) -> Graph:
    """Build a :class:`Graph` from a parsed JSON object, checking types.

    :raises GraphError: if the object is not a valid graph.
    """
    if not isinstance(obj, Mapping):
        raise graph_error(
            f"graph JSON must be an object, got {_kind(obj)}; this is not a "
            "TVM graph-executor graph"
        )
    for key in obj:
        if key not in (*_TOP_KEYS, "metadata"):
            raise graph_error(f"unknown top-level key {key!r}", field=str(key))
    for key in _TOP_KEYS:
        if key not in obj:
            raise graph_error(_missing_top_key(obj, key), field=key)
    nodes_raw = _list(obj["nodes"], "nodes")
    nodes = tuple(_node(raw, nid) for nid, raw in enumerate(nodes_raw))
    node_row_ptr = _ints(obj["node_row_ptr"], "node_row_ptr")
    attrs = _graph_attrs(obj["attrs"], _entry_owner(nodes, node_row_ptr))
    extras = {k: v for k, v in attrs.items() if k not in _ENTRY_ATTRS}
    metadata = None
    if "metadata" in obj:
        try:
            metadata = json.dumps(obj["metadata"], sort_keys=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise graph_error(f"not JSON data: {exc}", field="metadata") from exc
    return Graph(
        nodes=nodes,
        arg_nodes=_ints(obj["arg_nodes"], "arg_nodes"),
        heads=tuple(
            _entry(e, f"head {i}", None, "heads")
            for i, e in enumerate(_list(obj["heads"], "heads"))
        ),
        node_row_ptr=node_row_ptr,
        storage_id=attrs["storage_id"][1],
        shape=attrs["shape"][1],
        dltype=attrs["dltype"][1],
        device_index=attrs["device_index"][1] if "device_index" in attrs else None,
        storage_scope=attrs["storage_scope"][1] if "storage_scope" in attrs else None,
        extra_attrs=extras,
        metadata=metadata,
    )


def _missing_top_key(obj: Mapping[str, Any], key: str) -> str:
    message = f"missing required key {key!r}"
    nodes = obj.get("nodes")
    ops = (  # (an op that is not a string is another key's error)
        {
            op
            for n in nodes
            if isinstance(n, Mapping) and isinstance(op := n.get("op"), str)
        }
        if isinstance(nodes, list)
        else set()
    )
    if ops - {"null", "tvm_op"}:
        # The usual mistake: an NNVM/Relay symbol graph saved before compiling.
        message += (
            "; its nodes use raw ops "
            f"({', '.join(sorted(str(o) for o in ops - {'null', 'tvm_op'}))}), so "
            "this looks like an un-compiled symbol graph, not graph-executor JSON"
        )
    return message


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), f"a {type(value).__name__}")


def _list(value: object, fld: str, node: str | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise graph_error(
            f"expected an array, got {_kind(value)}", node=node, field=fld
        )
    return value


def _int(value: object, what: str, node: str | None, fld: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise graph_error(
            f"{what} must be an integer, got {_kind(value)} {value!r}",
            node=node,
            field=fld,
        )
    if not -_MAX_INT <= value <= _MAX_INT:
        raise graph_error(f"{what} {value} is out of range", node=node, field=fld)
    return value


def _ints(value: object, fld: str, node: str | None = None) -> tuple[int, ...]:
    items = _list(value, fld, node)
    return tuple(_int(v, f"item {i}", node, fld) for i, v in enumerate(items))


def _entry(value: object, what: str, node: str | None, fld: str) -> NodeEntry:
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise graph_error(
            f"{what} must be [nid, index] or [nid, index, version], got {value!r}",
            node=node,
            field=fld,
        )
    return NodeEntry(*(_int(v, what, node, fld) for v in value))


def _node(raw: object, nid: int) -> Node:
    if not isinstance(raw, Mapping):
        raise graph_error(
            f"node #{nid} must be an object, got {_kind(raw)}",
            node=f"#{nid}",
            field="nodes",
        )
    name_raw = raw.get("name")
    name = name_raw if isinstance(name_raw, str) and name_raw else f"#{nid}"
    for key in raw:
        if key not in ("op", "name", "inputs", "attrs", "attr", "control_deps"):
            raise graph_error(f"unknown node key {key!r}", node=name, field=str(key))
    if "attrs" in raw and "attr" in raw:
        raise graph_error("has both 'attr' and 'attrs'", node=name, field="attrs")
    for key in ("op", "name", "inputs"):
        if key not in raw:
            raise graph_error(f"missing required key {key!r}", node=name, field=key)
    for key in ("op", "name"):
        if not isinstance(raw[key], str):
            raise graph_error(
                f"must be a string, got {_kind(raw[key])}", node=name, field=key
            )
    attrs_raw = raw.get("attrs", raw.get("attr", {}))
    if not isinstance(attrs_raw, Mapping):
        raise graph_error(
            f"must be an object, got {_kind(attrs_raw)}", node=name, field="attrs"
        )
    for key, value in attrs_raw.items():
        if not isinstance(value, str):
            raise graph_error(
                f"must be a string, got {_kind(value)} {value!r}",
                node=name,
                field=f"attrs.{key}",
            )
    inputs = tuple(
        _entry(e, f"input {i}", name, "inputs")
        for i, e in enumerate(_list(raw["inputs"], "inputs", name))
    )
    deps = _ints(raw.get("control_deps", []), "control_deps", name)
    return Node(raw["op"], raw["name"], inputs, attrs_raw, deps)


Owner = Callable[[int], "str | None"]


def _entry_owner(nodes: tuple[Node, ...], ptr: tuple[int, ...]) -> Owner:
    """Name the node owning an entry, for errors found before the row
    pointer itself is checked (so only when it is plausible)."""
    plausible = len(ptr) == len(nodes) + 1 and all(
        a <= b for a, b in itertools.pairwise(ptr)
    )

    def owner(eid: int) -> str | None:
        if not plausible:
            return None
        nid = bisect.bisect_right(ptr, eid) - 1
        return label(nodes[nid], nid) if 0 <= nid < len(nodes) else None

    return owner


def _graph_attrs(value: object, owner: Owner) -> dict[str, tuple[str, Any]]:
    if not isinstance(value, Mapping):
        raise graph_error(f"must be an object, got {_kind(value)}", field="attrs")
    out: dict[str, tuple[str, Any]] = {}
    for key, item in value.items():
        fld = f"attrs.{key}"
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
            raise graph_error(
                "must be a [type, value] pair such as ['list_int', [...]]", field=fld
            )
        kind, data = item
        expected = _ENTRY_ATTRS.get(key)
        if expected is not None and kind != expected:
            raise graph_error(f"type must be {expected!r}, got {kind!r}", field=fld)
        if expected is None and kind not in _SKIPPABLE_ATTR_TYPES:
            raise graph_error(
                f"unknown graph attr of type {kind!r}; TVM can only skip "
                "'list_int' and 'size_t' attrs",
                field=fld,
            )
        out[key] = (kind, _attr_value(kind, data, fld, owner))
    for key in _REQUIRED_ATTRS:
        if key not in out:
            raise graph_error(
                f"missing required graph attr {key!r}", field=f"attrs.{key}"
            )
    return out


def _attr_value(kind: str, data: object, fld: str, owner: Owner) -> Any:
    if kind == "size_t":
        value = _int(data, "value", None, fld)
        if value < 0:
            raise graph_error(f"size_t value {value} is negative", field=fld)
        return value
    items = _list(data, fld)
    if kind == "list_int":
        return tuple(_int(v, f"entry {i}", owner(i), fld) for i, v in enumerate(items))
    if kind == "list_str":
        for i, v in enumerate(items):
            if not isinstance(v, str):
                raise graph_error(
                    f"entry {i} must be a string, got {_kind(v)} {v!r}",
                    node=owner(i),
                    field=fld,
                )
        return tuple(items)
    shapes = []
    for i, dims in enumerate(items):
        if not isinstance(dims, list):
            raise graph_error(
                f"entry {i} must be an array of dimensions, got {_kind(dims)}",
                node=owner(i),
                field=fld,
            )
        shapes.append(
            tuple(_int(d, f"entry {i} dimension", owner(i), fld) for d in dims)
        )
    return tuple(shapes)
