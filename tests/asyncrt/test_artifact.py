"""The exported-module artifact: round trips and every refusal."""

from __future__ import annotations

import ast
import json
import os
import re
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncrt.io._artifact as artifact_module
from asyncrt.errors import ArtifactError
from asyncrt.io._artifact import Artifact, read_artifact, write_artifact
from asyncrt.io._params import decode_params, encode_params

GRAPH = json.dumps({"nodes": [], "arg_nodes": [], "heads": []})
PARAMS = encode_params({"w": np.arange(4, dtype=np.float32)})


def sample() -> Artifact:
    return Artifact(
        graph_json=GRAPH,
        params=PARAMS,
        kernels=("tvmgen_default_fused_add", "nn.dense", "ns::op-1"),
        device_kinds=("cpu", "sim"),
        metadata={"model": "resnet", "note": "é ü \u2603"},
    )


def manifest(**changes: Any) -> bytes:
    base: dict[str, Any] = {
        "format": "asyncrt.artifact",
        "version": 1,
        "kernels": ["add"],
        "device_kinds": ["cpu"],
        "metadata": {},
    }
    for key, value in changes.items():
        if value is ...:
            del base[key]
        else:
            base[key] = value
    return json.dumps(base).encode()


def make_zip(
    path: Path,
    members: list[tuple[str, bytes]] | None = None,
    method: int = zipfile.ZIP_DEFLATED,
) -> Path:
    """Write an archive by hand (no write_artifact involved)."""
    if members is None:
        members = [
            ("manifest.json", manifest()),
            ("graph.json", GRAPH.encode()),
            ("params.bin", PARAMS),
        ]
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return path


def replace_member(name: str, data: bytes) -> list[tuple[str, bytes]]:
    members = {
        "manifest.json": manifest(),
        "graph.json": GRAPH.encode(),
        "params.bin": PARAMS,
    }
    members[name] = data
    return list(members.items())


def central_entry(blob: bytes, name: str) -> int:
    """The offset of ``name``'s central-directory record."""
    at = 0
    while True:
        at = blob.index(b"PK\x01\x02", at)
        (length,) = struct.unpack_from("<H", blob, at + 28)
        if blob[at + 46 : at + 46 + length] == name.encode():
            return at
        at += 4


def refused(path: Path, message: str, **limits: int) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        read_artifact(path, **limits)
    assert info.value.path == str(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ")
    assert message in text, text
    return info.value


# --- round trips -----------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "model.art"
    write_artifact(path, sample())
    got = read_artifact(path)
    assert got == sample()
    assert got.params == PARAMS
    assert dict(got.metadata) == {"model": "resnet", "note": "é ü \u2603"}
    np.testing.assert_array_equal(decode_params(got.params)["w"], np.arange(4))
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["manifest.json", "graph.json", "params.bin"]
        assert archive.getinfo("params.bin").compress_type == zipfile.ZIP_STORED
        assert json.loads(archive.read("manifest.json")) == {
            "format": "asyncrt.artifact",
            "version": 1,
            "kernels": ["tvmgen_default_fused_add", "nn.dense", "ns::op-1"],
            "device_kinds": ["cpu", "sim"],
            "metadata": {"model": "resnet", "note": "é ü \u2603"},
        }


def test_reads_hand_built_archive_stored_or_deflated(tmp_path: Path) -> None:
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        path = make_zip(tmp_path / f"m{method}.zip", method=method)
        got = read_artifact(path)
        assert got.kernels == ("add",)
        assert got.device_kinds == ("cpu",)
        assert got.graph_json == GRAPH
        assert got.params == PARAMS


def test_write_is_deterministic_and_atomic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_artifact(a, sample())
    write_artifact(b, sample())
    assert a.read_bytes() == b.read_bytes()
    write_artifact(a, Artifact(GRAPH, b"", (), (), {}))  # replaces in place
    assert read_artifact(a).params == b""
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_failed_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.art"
    write_artifact(path, sample())
    before = path.read_bytes()

    def broken(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr("asyncrt.io._artifact.os.replace", broken)
    with pytest.raises(OSError, match="disk on fire"):
        write_artifact(path, Artifact(GRAPH, b"x", (), (), {}))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.art"]


def test_artifact_is_immutable() -> None:
    meta = {"a": "1"}
    art = Artifact(GRAPH, bytearray(b"ab"), ["k"], ["cpu"], meta)  # type: ignore[arg-type]
    meta["a"] = "2"
    assert art.metadata["a"] == "1"
    assert art.kernels == ("k",) and art.device_kinds == ("cpu",)
    assert art.params == b"ab" and type(art.params) is bytes
    with pytest.raises(TypeError):
        art.metadata["b"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kernels": ("a b",)}, "kernels: 'a b' is not a plain name"),
        ({"kernels": ("../x/y",)}, "kernels: '../x/y' is not a plain name"),
        ({"kernels": ("",)}, "kernels: '' is not a plain name"),
        ({"kernels": ("a", "a")}, "kernels has duplicates"),
        ({"device_kinds": ("cpu\n",)}, "device_kinds: 'cpu\\n' is not a plain"),
        ({"graph_json": "{"}, "graph_json is not valid JSON"),
        ({"graph_json": "[]"}, "graph_json must be a JSON object"),
        ({"params": "abc"}, "params must be bytes"),
        ({"metadata": {"a": 1}}, "metadata must map str to str"),
    ],
)
def test_write_refuses_invalid(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    fields: dict[str, Any] = {
        "graph_json": GRAPH,
        "params": PARAMS,
        "kernels": ("add",),
        "device_kinds": ("cpu",),
        "metadata": {},
    }
    fields.update(changes)
    path = tmp_path / "x.art"
    with pytest.raises(ArtifactError, match=re.escape(message)) as info:
        write_artifact(path, Artifact(**fields))
    assert info.value.path == str(path)
    assert not path.exists()
    assert os.listdir(tmp_path) == []


# --- archive-level refusals ------------------------------------------------


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "x.art"
    path.write_bytes(b"import os; os.system('boom')\n")
    refused(path, "not a zip archive")
    path.write_bytes(b"")
    refused(path, "not a zip archive")


def test_missing_file_is_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_artifact(tmp_path / "absent.art")


def test_missing_member(tmp_path: Path) -> None:
    members = [*replace_member("graph.json", b"")[:1], ("params.bin", PARAMS)]
    refused(make_zip(tmp_path / "x.zip", members), "missing member 'graph.json'")


def test_extra_member(tmp_path: Path) -> None:
    members = [*replace_member("graph.json", GRAPH.encode()), ("evil.pkl", b"x")]
    refused(make_zip(tmp_path / "x.zip", members), "unexpected member 'evil.pkl'")


def test_duplicate_member(tmp_path: Path) -> None:
    members = [*replace_member("graph.json", GRAPH.encode()), ("graph.json", b"{}")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile: Duplicate name
        path = make_zip(tmp_path / "x.zip", members)
    refused(path, "duplicate member 'graph.json'")


@pytest.mark.parametrize(
    "name",
    [
        "../graph.json",
        "a/../../graph.json",
        "/graph.json",
        "..\\graph.json",
        "C:graph.json",
        "c:/graph.json",
        "sub/..",
    ],
)
def test_unsafe_member_names(tmp_path: Path, name: str) -> None:
    members = [*replace_member("graph.json", GRAPH.encode()), (name, b"{}")]
    refused(make_zip(tmp_path / "x.zip", members), f"unsafe member name {name!r}")


def test_nul_in_member_name(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip")
    blob = bytearray(path.read_bytes())
    entry = central_entry(bytes(blob), "graph.json")
    blob[entry + 46 + 5] = 0  # "graph\x00json"
    path.write_bytes(bytes(blob))
    refused(path, "unsafe member name 'graph\\x00json'")


def test_declared_size_over_limit_is_refused_before_reading(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip")
    blob = bytearray(path.read_bytes())
    entry = central_entry(bytes(blob), "graph.json")
    struct.pack_into("<I", blob, entry + 24, 512 * 2**20)
    path.write_bytes(bytes(blob))
    refused(
        path,
        "member 'graph.json' declares 536870912 bytes, over the limit of 268435456",
    )


def test_params_limit(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip")
    refused(
        path,
        f"member 'params.bin' declares {len(PARAMS)} bytes, over the limit of 10",
        max_params_bytes=10,
    )


def test_honest_zip_bomb_refused_by_declared_size(tmp_path: Path) -> None:
    bomb = b"{" + b" " * (8 * 2**20) + b"}"
    path = make_zip(tmp_path / "x.zip", replace_member("graph.json", bomb))
    assert path.stat().st_size < 64 * 1024
    refused(
        path, "declares 8388610 bytes, over the limit of 1048576", max_json_bytes=2**20
    )


def test_lying_header_cannot_inflate_memory(tmp_path: Path) -> None:
    bomb = b"\x00" * (32 * 2**20)
    path = make_zip(tmp_path / "x.zip", replace_member("params.bin", bomb))
    blob = bytearray(path.read_bytes())
    entry = central_entry(bytes(blob), "params.bin")
    struct.pack_into("<I", blob, entry + 24, 1000)  # claims 1000 bytes
    path.write_bytes(bytes(blob))
    tracemalloc.start()
    try:
        refused(path, "member 'params.bin': CRC mismatch")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


def test_crc_error(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip", method=zipfile.ZIP_STORED)
    blob = bytearray(path.read_bytes())
    at = blob.index(PARAMS)
    blob[at + len(PARAMS) - 1] ^= 0xFF
    path.write_bytes(bytes(blob))
    refused(path, "member 'params.bin': CRC mismatch")


def test_encrypted_flag(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip")
    blob = bytearray(path.read_bytes())
    entry = central_entry(bytes(blob), "manifest.json")
    blob[entry + 8] |= 1
    path.write_bytes(bytes(blob))
    refused(path, "member 'manifest.json' is encrypted")


def test_unsupported_compression(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip", method=zipfile.ZIP_BZIP2)
    refused(path, "member 'manifest.json' uses unsupported compression 12")


def test_truncated_archive(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "x.zip")
    path.write_bytes(path.read_bytes()[:-30])
    refused(path, "not a zip archive")


# --- JSON and manifest refusals -------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("manifest.json", b"{", "manifest.json: bad JSON"),
        ("manifest.json", b"\xff{}", "manifest.json: not valid UTF-8"),
        ("manifest.json", b"[]", "manifest.json: expected a JSON object"),
        ("graph.json", b"{'a': 1}", "graph.json: bad JSON"),
        ("graph.json", b"[" * 100000 + b"]" * 100000, "graph.json: bad JSON"),
        ("graph.json", b"[1, 2]", "graph.json: expected a JSON object"),
        (
            "manifest.json",
            b'{"format": "asyncrt.artifact", "format": "x"}',
            "duplicate key 'format'",
        ),
        (
            "manifest.json",
            manifest(format="pickle"),
            "format is 'pickle', expected 'asyncrt.artifact'",
        ),
        ("manifest.json", manifest(version=2), "unsupported version 2, expected 1"),
        ("manifest.json", manifest(version="1"), "unsupported version '1'"),
        ("manifest.json", manifest(version=True), "unsupported version True"),
        ("manifest.json", manifest(version=...), "unsupported version None"),
        (
            "manifest.json",
            manifest(metadata=...),
            "wrong keys: missing ['metadata'], unexpected []",
        ),
        (
            "manifest.json",
            manifest(code="os.system"),
            "wrong keys: missing [], unexpected ['code']",
        ),
        (
            "manifest.json",
            manifest(kernels="add"),
            "kernels must be a list of strings, got str",
        ),
        (
            "manifest.json",
            manifest(kernels=[1]),
            "kernels must be a list of strings, found 1",
        ),
        (
            "manifest.json",
            manifest(kernels=["os.system('x')"]),
            "kernels: \"os.system('x')\" is not a plain name",
        ),
        (
            "manifest.json",
            manifest(device_kinds=["cpu", "cpu"]),
            "device_kinds has duplicates",
        ),
        (
            "manifest.json",
            manifest(metadata={"a": 1}),
            "metadata must be an object of strings to strings",
        ),
        (
            "manifest.json",
            manifest(metadata=["a"]),
            "metadata must be an object of strings to strings",
        ),
    ],
)
def test_bad_json_and_manifest(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    path = make_zip(tmp_path / "x.zip", replace_member(name, data))
    refused(path, message)


def test_loading_never_executes_code() -> None:
    tree = ast.parse(Path(artifact_module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"eval", "exec", "compile", "__import__"}
    assert imported <= {
        "__future__",
        "collections.abc",
        "contextlib",
        "dataclasses",
        "errors",
        "json",
        "os",
        "re",
        "struct",
        "tempfile",
        "types",
        "typing",
        "zipfile",
        "zlib",
    }


# --- fuzzing ---------------------------------------------------------------


@st.composite
def mutations(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["set", "cut", "insert"]),
                st.integers(0, 10_000),
                st.integers(0, 255),
            ),
            min_size=1,
            max_size=3,
        )
    )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(mutations())
def test_fuzz_mutations_give_artifact_or_artifact_error(
    tmp_path: Path, changes: list[tuple[str, int, int]]
) -> None:
    path = tmp_path / "fuzz.art"
    write_artifact(path, sample())
    blob = bytearray(path.read_bytes())
    for kind, at, value in changes:
        at %= len(blob) or 1
        if kind == "set" and blob:
            blob[at] = value
        elif kind == "cut":
            del blob[at:]
        else:
            blob[at:at] = bytes([value])
    path.write_bytes(bytes(blob))
    try:
        got = read_artifact(path)
    except ArtifactError as exc:
        assert exc.path == str(path)
    else:
        assert isinstance(got, Artifact)
