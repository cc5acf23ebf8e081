"""The library's op definitions and their configured, named kernels.

An *op* (``conv``, ``max_pool``, ``reduce``, ...) is a kernel factory
``make(xp, attrs)``: given the array namespace (numpy or cupy) and the op's
attributes, it returns a destination-passing kernel. A graph node that uses
an op stores the op's name and its attributes as data, in its node attrs
(:data:`OP_NAME_ATTR`, :data:`OP_ATTRS_ATTR`, the attributes as canonical
JSON), and names its kernel ``<op>.<digest>``, the digest being a hash of
those two strings. The name is thus content-addressed: the same op with the
same attributes is one kernel however many graphs, imports or processes name
it, so registering it in the global registry is idempotent, and a graph
loaded from a file gets its kernels back from data alone
(:func:`register_graph_kernels`), never from code in the file.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import GraphError
from ..graph import Graph
from ._kernels import FlopsFunction, get_global_func, register_func

__all__ = (
    "OP_ATTRS_ATTR",
    "OP_NAME_ATTR",
    "Attrs",
    "OpDef",
    "define",
    "encode_attrs",
    "kernel_name",
    "lookup",
    "op_names",
    "register_graph_kernels",
    "register_op_kernel",
)

#: The node attr holding the library op's name.
OP_NAME_ATTR = "op_name"
#: The node attr holding the op's attributes, as canonical JSON.
OP_ATTRS_ATTR = "op_attrs"

#: An op's attributes: JSON values (numbers, strings, lists, None) by name.
Attrs = Mapping[str, Any]
Kernel = Callable[..., None]
KernelMaker = Callable[[ModuleType, Attrs], Kernel]


@dataclass(frozen=True)
class OpDef:
    """One op of the library.

    :ivar name: the op's name, the prefix of its kernels' names.
    :ivar make: ``make(xp, attrs)`` returns the kernel for that namespace.
    :ivar flops: the kernels' work from their tensors' specs, if known.
    """

    name: str
    make: KernelMaker
    flops: FlopsFunction | None = None


_OPS: dict[str, OpDef] = {}
_lock = threading.Lock()


def define(
    name: str, *, flops: FlopsFunction | None = None
) -> Callable[[KernelMaker], KernelMaker]:
    """Add an op to the library (a decorator over its kernel factory).

    :param name: the op's name.
    :param flops: the work estimate of its kernels.
    :raises ValueError: if the name is taken.
    """

    def add(make: KernelMaker) -> KernelMaker:
        if name in _OPS:
            raise ValueError(f"op {name!r} is already defined")
        _OPS[name] = OpDef(name, make, flops)
        return make

    return add


def lookup(name: str) -> OpDef | None:
    """The op called ``name``, or ``None``."""
    return _OPS.get(name)


def op_names() -> tuple[str, ...]:
    """Every op of the library, sorted."""
    return tuple(sorted(_OPS))


def encode_attrs(attrs: Attrs) -> str:
    """The canonical JSON text of ``attrs`` (sorted keys, no spaces).

    :raises ValueError: if a value is not JSON (NaN and infinities are
        refused: they have no JSON spelling).
    """
    return json.dumps(
        _plain(attrs), sort_keys=True, separators=(",", ":"), allow_nan=False
    )


def _plain(value: Any) -> Any:
    """numpy scalars and tuples as the JSON types they stand for, and
    non-finite floats as the strings :func:`~asyncrt.ops._common.number`
    reads back."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "inf", "-inf", "nan": JSON has no spelling for them
    return value


def kernel_name(op: str, encoded_attrs: str) -> str:
    """The content-addressed kernel name of ``op`` with these attributes."""
    digest = hashlib.sha256(f"{op}\0{encoded_attrs}".encode()).hexdigest()
    return f"{op}.{digest[:16]}"


class _CupyKernel:
    """A cuda kernel made on its first call (imports cupy then, not before)."""

    __slots__ = ("_attrs", "_kernel", "_make")

    def __init__(self, make: KernelMaker, attrs: Attrs) -> None:
        self._make, self._attrs = make, attrs
        self._kernel: Kernel | None = None

    def __call__(self, *args: Any) -> None:
        kernel = self._kernel
        if kernel is None:
            cupy = importlib.import_module("cupy")
            kernel = self._kernel = self._make(cupy, self._attrs)
        kernel(*args)


def register_op_kernel(op: str, attrs: Attrs) -> str:
    """Register the kernel of ``op`` configured with ``attrs`` for every
    device kind (numpy on cpu and sim, cupy on cuda), unless it already is.

    :return: the kernel's name.
    :raises KeyError: if there is no such op.
    :raises ValueError: if ``attrs`` is not JSON, or the op refuses it.
    """
    definition = _OPS.get(op)
    if definition is None:
        raise KeyError(f"no op {op!r} in the kernel library")
    encoded = encode_attrs(attrs)
    name = kernel_name(op, encoded)
    with _lock:
        if get_global_func(name, "cpu", allow_missing=True) is None:
            decoded = json.loads(encoded)  # what a loaded graph would give
            host = definition.make(np, decoded)
            register_func(name, host, kinds=("cpu", "sim"), flops=definition.flops)
            cuda = _CupyKernel(definition.make, decoded)
            register_func(name, cuda, kinds=("cuda",), flops=definition.flops)
    return name


def register_graph_kernels(graph: Graph) -> tuple[str, ...]:
    """Register the library kernels ``graph``'s nodes name, from their attrs.

    Nothing is executed from the graph: each node names a library op and
    gives its attributes as JSON data; the kernel's name must be the digest
    of both, so a node cannot claim one configuration and run another.

    :return: the names of the kernels registered or found.
    :raises GraphError: if a node names an unknown op, its attributes do not
        parse or do not match its ``func_name``, or the op refuses them.
    """
    names: list[str] = []
    for node in graph.nodes:
        op = node.attrs.get(OP_NAME_ATTR)
        if node.is_null or op is None:
            continue
        encoded = node.attrs.get(OP_ATTRS_ATTR, "{}")
        if lookup(op) is None:
            raise GraphError(
                f"unknown kernel library op {op!r}", node=node.name, field=OP_NAME_ATTR
            )
        if kernel_name(op, encoded) != node.func_name:
            raise GraphError(
                f"func_name {node.func_name!r} does not match op {op!r} and its "
                f"attrs (expected {kernel_name(op, encoded)!r})",
                node=node.name,
                field="func_name",
            )
        try:
            attrs = json.loads(encoded)
            if not isinstance(attrs, dict):
                raise ValueError("op_attrs must be a JSON object")
            if encode_attrs(attrs) != encoded:
                raise ValueError("op_attrs must be canonical JSON (sorted, compact)")
            names.append(register_op_kernel(op, attrs))
        except (ValueError, TypeError, KeyError) as exc:
            raise GraphError(
                f"bad attributes for op {op!r}: {exc}",
                node=node.name,
                field=OP_ATTRS_ATTR,
            ) from exc
    return tuple(names)
