"""The exported-module artifact: one zip file, three members, no code.

An artifact holds what is needed to rebuild an executor elsewhere: the graph
JSON text, the params blob (TVM's binary format, see :mod:`asyncrt.io._params`)
and a manifest naming the format, the kernels the graph needs, the device
kinds it was built for and free-form ``str -> str`` metadata. The file is a
zip archive (``zipfile``; JSON deflated, params stored) with exactly the
members ``manifest.json``, ``graph.json`` and ``params.bin``.

Reading is defensive because an artifact may come from anywhere: nothing in
it is ever executed or imported (JSON only, no pickle); member names, count,
sizes, compression and CRCs are checked, and every member is read through a
bounded reader so a header that lies about its size cannot inflate memory.
Every refusal is an :class:`~asyncrt.errors.ArtifactError` naming the file.
The params blob itself is only checked when it is decoded
(:func:`asyncrt.io._params.decode_params`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import tempfile
import types
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..errors import ArtifactError, ArtifactIOError, ArtifactNotFoundError

__all__ = (
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Artifact",
    "read_artifact",
    "write_artifact",
)

FORMAT_NAME = "asyncrt.artifact"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
GRAPH = "graph.json"
PARAMS = "params.bin"
MEMBERS = (MANIFEST, GRAPH, PARAMS)

#: Default limits on declared uncompressed sizes, checked before reading.
MAX_PARAMS_BYTES = 4 * 2**30
MAX_JSON_BYTES = 256 * 2**20

_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_MANIFEST_KEYS = frozenset({"format", "version", "kernels", "device_kinds", "metadata"})
# A fixed timestamp makes equal artifacts byte-identical files.
_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Artifact:
    """An exported module: graph, params and what it needs to run.

    ``metadata`` is copied into a read-only mapping on construction.

    :ivar graph_json: the graph, as TVM graph JSON text.
    :ivar params: the params blob in TVM's binary format.
    :ivar kernels: the kernel (``func_name``) names the graph needs.
    :ivar device_kinds: the device kinds it was built for, such as ``"cpu"``.
    :ivar metadata: free-form string annotations.
    """

    graph_json: str
    params: bytes
    kernels: tuple[str, ...]
    device_kinds: tuple[str, ...]
    metadata: Mapping[str, str] = field(
        default_factory=lambda: types.MappingProxyType({})
    )

    def __post_init__(self) -> None:
        # Frozen: a caller keeping the dict it passed cannot change us later.
        object.__setattr__(
            self, "metadata", types.MappingProxyType(dict(self.metadata))
        )
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "device_kinds", tuple(self.device_kinds))
        if isinstance(self.params, (bytearray, memoryview)):
            object.__setattr__(self, "params", bytes(self.params))


def write_artifact(path: str | os.PathLike[str], artifact: Artifact) -> None:
    """Write ``artifact`` to ``path`` atomically.

    The archive is written to a temporary file in the same directory, flushed
    to disk and renamed over ``path``, so readers see the old file or the new
    one, never half of one.

    :param path: the file to create or replace.
    :param artifact: what to write.
    :raises ArtifactError: if the artifact is invalid (field types, names
        that are not plain identifiers, graph JSON that does not parse).
    :raises ArtifactNotFoundError: if the folder to write into does not
        exist (also a :class:`FileNotFoundError`).
    :raises ArtifactIOError: if the file cannot be written otherwise (also
        an :class:`OSError`); both name ``path``, not the temporary file.
    """
    where = os.fspath(path)
    _check_artifact(artifact, where)
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "kernels": list(artifact.kernels),
        "device_kinds": list(artifact.device_kinds),
        "metadata": dict(artifact.metadata),
    }
    members = (
        (MANIFEST, json.dumps(manifest, indent=2).encode(), zipfile.ZIP_DEFLATED),
        (GRAPH, artifact.graph_json.encode(), zipfile.ZIP_DEFLATED),
        # Float weights barely compress; storing them keeps loads cheap.
        (PARAMS, bytes(artifact.params), zipfile.ZIP_STORED),
    )
    directory = os.path.dirname(os.path.abspath(where))
    try:
        _write_atomically(where, directory, members)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise ArtifactNotFoundError(
                f"cannot write: the folder {directory} does not exist",
                path=where,
                errno=exc.errno,
            ) from exc
        reason = exc.strerror or str(exc)
        raise ArtifactIOError(
            f"cannot write: {reason}", path=where, errno=exc.errno
        ) from exc


def _write_atomically(
    where: str, directory: str, members: tuple[tuple[str, bytes, int], ...]
) -> None:
    fd, tmp = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(where)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as fh:
            with zipfile.ZipFile(fh, "w") as archive:
                for name, data, method in members:
                    info = zipfile.ZipInfo(name, date_time=_DATE_TIME)
                    info.compress_type = method
                    info.external_attr = 0o644 << 16
                    archive.writestr(info, data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, where)
    except BaseException:
        # Never leave a stray temp file behind, whatever interrupted us.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_artifact(
    path: str | os.PathLike[str],
    *,
    max_params_bytes: int = MAX_PARAMS_BYTES,
    max_json_bytes: int = MAX_JSON_BYTES,
) -> Artifact:
    """Load an artifact written by :func:`write_artifact`, trusting nothing.

    :param path: the artifact file.
    :param max_params_bytes: the largest ``params.bin`` accepted.
    :param max_json_bytes: the largest ``manifest.json``/``graph.json``.
    :return: the artifact.
    :raises ArtifactError: if the file is not a zip archive, has missing,
        extra, duplicate or unsafe member names, an encrypted member or an
        unsupported compression, a member larger than its limit, a CRC
        mismatch, JSON that does not parse, or a manifest with the wrong
        format, version, keys or field types.
    :raises ArtifactNotFoundError: if there is no such file (also a
        :class:`FileNotFoundError`).
    :raises ArtifactIOError: if it cannot be opened otherwise (also an
        :class:`OSError`).
    """
    where = os.fspath(path)
    try:
        opened = open(where, "rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise ArtifactNotFoundError(
                "no such file", path=where, errno=exc.errno
            ) from exc
        reason = exc.strerror or str(exc)
        raise ArtifactIOError(
            f"cannot read: {reason}", path=where, errno=exc.errno
        ) from exc
    with opened as fh:
        try:
            return _read(fh, where, max_params_bytes, max_json_bytes)
        except ArtifactError:
            raise
        except (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            OSError,
            ValueError,
            NotImplementedError,
            RuntimeError,
            OverflowError,
            struct.error,
        ) as exc:
            # zipfile reports damage through many exception types.
            raise ArtifactError(f"corrupt zip archive: {exc}", path=where) from exc


def _read(
    fh: BinaryIO, where: str, max_params_bytes: int, max_json_bytes: int
) -> Artifact:
    try:
        archive = zipfile.ZipFile(fh)
    except zipfile.BadZipFile as exc:
        raise ArtifactError(f"not a zip archive ({exc})", path=where) from exc
    with archive:
        infos = _check_members(archive, where)
        limits = {MANIFEST: max_json_bytes, GRAPH: max_json_bytes}
        limits[PARAMS] = max_params_bytes
        data = {
            name: _read_member(archive, infos[name], limits[name], where)
            for name in MEMBERS
        }
    manifest = _parse_json(data[MANIFEST], MANIFEST, where)
    graph_text = _decode_text(data[GRAPH], GRAPH, where)
    graph = _parse_json(data[GRAPH], GRAPH, where)
    if not isinstance(graph, dict):
        raise ArtifactError(f"{GRAPH}: expected a JSON object", path=where)
    kernels, device_kinds, metadata = _check_manifest(manifest, where)
    return Artifact(
        graph_json=graph_text,
        params=data[PARAMS],
        kernels=kernels,
        device_kinds=device_kinds,
        metadata=metadata,
    )


def _check_members(archive: zipfile.ZipFile, where: str) -> dict[str, zipfile.ZipInfo]:
    """The three members' infos, after refusing anything unexpected."""
    infos: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.orig_filename
        if _unsafe_name(name) or name != info.filename:
            raise ArtifactError(f"unsafe member name {name!r}", path=where)
        if name in infos:
            raise ArtifactError(f"duplicate member {name!r}", path=where)
        if name not in MEMBERS:
            raise ArtifactError(
                f"unexpected member {name!r}; expected exactly {list(MEMBERS)}",
                path=where,
            )
        infos[name] = info
    for name in MEMBERS:
        if name not in infos:
            raise ArtifactError(f"missing member {name!r}", path=where)
    return infos


def _unsafe_name(name: str) -> bool:
    """Whether a member name could escape a directory if ever extracted."""
    parts = name.split("/")
    return (
        name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or re.match(r"[A-Za-z]:", name) is not None
        or ".." in parts
    )


def _read_member(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, where: str
) -> bytes:
    """Read one member, never more than ``limit`` bytes, CRC checked."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise ArtifactError(f"member {name!r} is encrypted", path=where)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ArtifactError(
            f"member {name!r} uses unsupported compression {info.compress_type}",
            path=where,
        )
    if info.file_size > limit:
        raise ArtifactError(
            f"member {name!r} declares {info.file_size} bytes, over the limit of "
            f"{limit}",
            path=where,
        )
    chunks: list[bytes] = []
    total = 0
    try:
        with archive.open(info) as member:
            # zipfile stops at the declared size and checks the CRC there;
            # reading in chunks up to limit + 1 keeps us bounded regardless.
            while total <= limit:
                chunk = member.read(min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except zipfile.BadZipFile as exc:
        message = str(exc)
        if "CRC" in message:
            raise ArtifactError(f"member {name!r}: CRC mismatch", path=where) from exc
        raise ArtifactError(f"member {name!r}: {message}", path=where) from exc
    if total > limit:
        raise ArtifactError(
            f"member {name!r} holds more than the limit of {limit} bytes", path=where
        )
    if total != info.file_size:
        raise ArtifactError(
            f"member {name!r} holds {total} bytes, its header says {info.file_size}",
            path=where,
        )
    return b"".join(chunks)


def _decode_text(data: bytes, name: str, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{name}: not valid UTF-8 ({exc})", path=where) from exc


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _parse_json(data: bytes, name: str, where: str) -> Any:
    text = _decode_text(data, name, where)
    try:
        hook = _no_duplicate_keys if name == MANIFEST else None
        return json.loads(text, object_pairs_hook=hook)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and huge integer literals.
        raise ArtifactError(f"{name}: bad JSON ({exc})", path=where) from exc


def _check_manifest(
    manifest: Any, where: str
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """Validate the manifest's format, version, keys and field types."""

    def fail(message: str) -> ArtifactError:
        return ArtifactError(f"{MANIFEST}: {message}", path=where)

    if not isinstance(manifest, dict):
        raise fail("expected a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise fail(f"format is {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    version = manifest.get("version")
    # bool is an int subclass; `true` is not a version.
    if type(version) is not int or version != FORMAT_VERSION:
        raise fail(f"unsupported version {version!r}, expected {FORMAT_VERSION}")
    keys = set(manifest)
    if keys != _MANIFEST_KEYS:
        missing = sorted(_MANIFEST_KEYS - keys)
        extra = sorted(keys - _MANIFEST_KEYS)
        raise fail(f"wrong keys: missing {missing}, unexpected {extra}")
    kernels = _names(manifest["kernels"], "kernels", fail)
    device_kinds = _names(manifest["device_kinds"], "device_kinds", fail)
    metadata = manifest["metadata"]
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise fail("metadata must be an object of strings to strings")
    return kernels, device_kinds, metadata


def _names(
    value: Any, key: str, fail: Callable[[str], ArtifactError]
) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise fail(f"{key} must be a list of strings, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise fail(f"{key} must be a list of strings, found {item!r}")
        if _NAME_RE.fullmatch(item) is None:
            raise fail(f"{key}: {item!r} is not a plain name ([A-Za-z0-9_.:-]+)")
    if len(set(value)) != len(value):
        raise fail(f"{key} has duplicates")
    return tuple(value)


def _check_artifact(artifact: Artifact, where: str) -> None:
    """Refuse to write what :func:`read_artifact` would refuse to read."""

    def fail(message: str) -> ArtifactError:
        return ArtifactError(f"cannot write artifact: {message}", path=where)

    if not isinstance(artifact.graph_json, str):
        raise fail("graph_json must be a str")
    try:
        graph = json.loads(artifact.graph_json)
    except (ValueError, RecursionError) as exc:
        raise fail(f"graph_json is not valid JSON ({exc})") from exc
    if not isinstance(graph, dict):
        raise fail("graph_json must be a JSON object")
    try:
        artifact.graph_json.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise fail(f"graph_json is not valid UTF-8 ({exc})") from exc
    if not isinstance(artifact.params, bytes):
        raise fail("params must be bytes")
    _names(list(artifact.kernels), "kernels", fail)
    _names(list(artifact.device_kinds), "device_kinds", fail)
    for key, value in artifact.metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise fail(f"metadata must map str to str, found {key!r}: {value!r}")
