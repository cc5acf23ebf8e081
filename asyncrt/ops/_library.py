"""The kernel library's table: one record per op.

An op is one :class:`OpDef`: its kernel factory, written once against the
array namespace ``xp`` (numpy or cupy, which share the numpy API), its work
estimate, and its fusion template. Two decorators add one:

* :func:`builtin` over ``make(xp)``: an op without attributes (``add``,
  ``relu``, ``erf``, ...). Its kernels are named by the op alone and are in
  the global registry as soon as the op is defined, one per namespace of
  :data:`~asyncrt.ops._kernels.ALL_NAMESPACES`.
* :func:`define` over ``make(xp, attrs)``: an op configured by attributes
  (``conv``, ``max_pool``, ``reduce``, ...). A graph node that uses one
  stores the op's name and its attributes as data, in its node attrs
  (:data:`OP_NAME_ATTR`, :data:`OP_ATTRS_ATTR`, the attributes as canonical
  JSON), and names its kernel ``<op>.<digest>``, the digest being a hash of
  those two strings. The name is thus content-addressed: the same op with
  the same attributes is one kernel however many graphs, imports or
  processes name it, so registering it is idempotent, and any process that
  loads the graph (a worker process, an exported artifact, the command line)
  makes its kernels again from the nodes' data alone
  (:func:`register_graph_kernels`), never from code in the file.

Per namespace, a kernel is made once: numpy's when it is registered (numpy
is asyncrt's own dependency, and the dispatcher binds those kernels to their
arrays), every other namespace's on its first call (a numpy-only install
never imports cupy; such kernels run unbound, as they always have).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, TypeVar

import numpy as np

from ..errors import GraphError
from ..graph import Graph
from ._kernels import (
    ALL_NAMESPACES,
    FlopsFunction,
    global_namespace_func,
    register_func,
)

__all__ = (
    "OP_ATTRS_ATTR",
    "OP_NAME_ATTR",
    "Attrs",
    "FusionTemplate",
    "OpDef",
    "builtin",
    "builtin_names",
    "calls_blas",
    "define",
    "encode_attrs",
    "fusion_template",
    "kernel_name",
    "lookup",
    "lookup_builtin",
    "node_fusion_template",
    "op_names",
    "register_graph_kernels",
    "register_op_kernel",
)

#: The node attr holding the library op's name.
OP_NAME_ATTR = "op_name"
#: The node attr holding the op's attributes, as canonical JSON.
OP_ATTRS_ATTR = "op_attrs"
#: The namespace whose kernels are made when registered (see the module
#: docstring); every other one's are made on their first call.
HOST_NAMESPACE = "numpy"

#: An op's attributes: JSON values (numbers, strings, lists, None) by name.
Attrs = Mapping[str, Any]
Kernel = Callable[..., None]
#: ``make(xp, attrs)``: a configured op's kernel for namespace ``xp``.
KernelMaker = Callable[[ModuleType, Attrs], Kernel]
#: ``make(xp)``: a built-in op's kernel for namespace ``xp``.
BuiltinMaker = Callable[[ModuleType], Kernel]
_B = TypeVar("_B", bound=BuiltinMaker)
_M = TypeVar("_M", bound=KernelMaker)


@dataclass(frozen=True)
class FusionTemplate:
    """How one elementwise op appears in a fused kernel
    (:mod:`asyncrt.ops._fusion`).

    :ivar label: its short name in fused node names.
    :ivar numexpr: a numexpr template over ``{0}``, ``{1}``, ... (each
        argument already parenthesised), or ``None``.
    :ivar cuda_c: a CUDA C template over the same placeholders (``T`` is the
        element type), or ``None``.
    :ivar variadic: the template is joined over any number of arguments
        with this operator instead of formatted.
    :ivar jit: a float32 Python expression numba compiles into a fused loop
        (:mod:`asyncrt.ops._jitfuse`; the helpers of
        :mod:`asyncrt.ops._jitmath` in scope), computing what the op's
        kernel computes in the same order, or ``None``.
    :ivar jit_exact_from: the smallest output (elements) from which ``jit``
        computes the op's kernel bit for bit (erf: where the kernel stops
        using scipy's), or ``None`` where it never does (tanh's rational
        approximation): what the default fusion (``fuse="auto"``) fuses.

    With no template, the op still fuses: the ``"numpy"`` engine runs
    its own kernel block by block.
    """

    label: str
    numexpr: str | None = None
    cuda_c: str | None = None
    variadic: str | None = None
    jit: str | None = None
    jit_exact_from: int | None = 0

    def expression(
        self, engine: Literal["numexpr", "cuda_c", "jit"], args: Sequence[str]
    ) -> str:
        """The op applied to ``args`` in an engine's syntax.

        :raises KeyError: if the op has no template for ``engine``.
        """
        if self.variadic is not None:
            return "(" + f" {self.variadic} ".join(args) + ")"
        template = {"numexpr": self.numexpr, "cuda_c": self.cuda_c, "jit": self.jit}[
            engine
        ]
        if template is None:
            raise KeyError(f"{self.label} has no {engine} template")
        return template.format(*args)


@dataclass(frozen=True)
class OpDef:
    """One op of the library.

    :ivar name: the op's name: its kernel's name (built-in ops) or the
        prefix of its kernels' names (configured ops).
    :ivar make: ``make(xp, attrs)`` returns the kernel for that namespace
        (a built-in op ignores ``attrs``).
    :ivar flops: the kernels' work from their tensors' specs, if known.
    :ivar fusion: how the op fuses with its elementwise neighbours, or
        ``None`` if it does not.
    :ivar configured: whether its kernels are configured by attributes
        (named ``<op>.<digest>``).
    :ivar fusion_of: a configured elementwise op's fusion template for
        given attributes (``None`` where those do not fuse).
    :ivar blas: whether its kernels call BLAS (whose threads spin on the
        cores after each call: :mod:`asyncrt.runtime._threads`).
    """

    name: str
    make: KernelMaker
    flops: FlopsFunction | None = None
    fusion: FusionTemplate | None = None
    configured: bool = True
    fusion_of: Callable[[Attrs], FusionTemplate | None] | None = None
    blas: bool = False


# Two name spaces: a built-in op is named by its kernel's name (a graph's
# func_name), a configured op by the name graphs give in ``op_name``.
# ``softmax`` is both: over the last axis, and over any axes (or log).
_BUILTIN: dict[str, OpDef] = {}
_CONFIGURED: dict[str, OpDef] = {}
_lock = threading.Lock()


def _add(definition: OpDef) -> None:
    table = _CONFIGURED if definition.configured else _BUILTIN
    if definition.name in table:
        raise ValueError(f"op {definition.name!r} is already defined")
    table[definition.name] = definition


class _Deferred:
    """A kernel made on its first call (its namespace is imported then)."""

    __slots__ = ("_attrs", "_kernel", "_make", "_namespace")

    def __init__(self, make: KernelMaker, attrs: Attrs, namespace: str) -> None:
        self._make, self._attrs, self._namespace = make, attrs, namespace
        self._kernel: Kernel | None = None

    def __call__(self, *args: Any) -> None:
        kernel = self._kernel
        if kernel is None:
            xp = importlib.import_module(self._namespace)
            kernel = self._kernel = self._make(xp, self._attrs)
        kernel(*args)


def _register(name: str, definition: OpDef, attrs: Attrs) -> None:
    """Register ``definition``'s kernel for ``attrs`` as ``name``, once per
    namespace."""
    for namespace in ALL_NAMESPACES:
        kernel: Kernel = (
            definition.make(np, attrs)
            if namespace == HOST_NAMESPACE
            else _Deferred(definition.make, attrs, namespace)
        )
        register_func(name, kernel, namespaces=(namespace,), flops=definition.flops)


def builtin(
    name: str,
    *,
    flops: FlopsFunction | None = None,
    fusion: FusionTemplate | None = None,
    blas: bool = False,
) -> Callable[[_B], _B]:
    """Add an op without attributes (a decorator over ``make(xp)``) and
    register its kernel, named ``name``, for every namespace.

    :param name: the op's name, which is its kernel's name.
    :param flops: the work estimate of its kernel.
    :param fusion: its fusion template, if it is elementwise.
    :param blas: whether its kernel calls BLAS.
    :raises ValueError: if the name is taken.
    """

    def add(make: _B) -> _B:
        definition = OpDef(
            name,
            lambda xp, attrs: make(xp),
            flops,
            fusion,
            configured=False,
            blas=blas,
        )
        _add(definition)
        _register(name, definition, {})
        return make

    return add


def define(
    name: str,
    *,
    flops: FlopsFunction | None = None,
    fusion: Callable[[Attrs], FusionTemplate | None] | None = None,
    blas: bool = False,
) -> Callable[[_M], _M]:
    """Add an op configured by attributes (a decorator over ``make(xp,
    attrs)``); its kernels are registered per configuration
    (:func:`register_op_kernel`).

    :param name: the op's name.
    :param flops: the work estimate of its kernels.
    :param fusion: for an elementwise op, its fusion template for given
        attributes (``None`` where those do not fuse).
    :param blas: whether its kernels call BLAS.
    :raises ValueError: if the name is taken.
    """

    def add(make: _M) -> _M:
        _add(OpDef(name, make, flops, fusion_of=fusion, blas=blas))
        return make

    return add


def lookup(name: str) -> OpDef | None:
    """The op configured by attributes called ``name``, or ``None``."""
    return _CONFIGURED.get(name)


def lookup_builtin(name: str) -> OpDef | None:
    """The built-in op whose kernel is ``name``, or ``None``."""
    return _BUILTIN.get(name)


def calls_blas(func_name: str) -> bool:
    """Whether the library kernel named ``func_name`` (a built-in op's name,
    or ``<op>.<digest>`` of a configured op) calls BLAS."""
    definition = lookup_builtin(func_name) or lookup(func_name.split(".", 1)[0])
    return definition is not None and definition.blas


def op_names() -> tuple[str, ...]:
    """Every op configured by attributes, sorted."""
    return tuple(sorted(_CONFIGURED))


def builtin_names() -> tuple[str, ...]:
    """Every built-in op (its kernel's name), sorted."""
    return tuple(sorted(_BUILTIN))


def fusion_template(func_name: str) -> FusionTemplate | None:
    """The fusion template of the built-in op whose kernel is ``func_name``,
    or ``None`` if there is no such fusible op."""
    definition = _BUILTIN.get(func_name)
    return None if definition is None else definition.fusion


def node_fusion_template(
    func_name: str, attrs: Mapping[str, str]
) -> FusionTemplate | None:
    """The fusion template of a node's kernel: a built-in op's, or a
    configured op's for the attributes the node gives (:data:`OP_NAME_ATTR`,
    :data:`OP_ATTRS_ATTR`, which must name ``func_name``), or ``None``."""
    template = fusion_template(func_name)
    if template is not None:
        return template
    op = attrs.get(OP_NAME_ATTR)
    if op is None:
        return None
    return _configured_template(func_name, op, attrs.get(OP_ATTRS_ATTR, "{}"))


@functools.lru_cache(maxsize=1024)
def _configured_template(
    func_name: str, op: str, encoded: str
) -> FusionTemplate | None:
    definition = _CONFIGURED.get(op)
    if (
        definition is None
        or definition.fusion_of is None
        or kernel_name(op, encoded) != func_name
    ):
        return None
    try:
        attrs = json.loads(encoded)
        return definition.fusion_of(attrs) if isinstance(attrs, dict) else None
    except (ValueError, TypeError, KeyError):
        return None  # the kernel itself refuses such attributes


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


def register_op_kernel(op: str, attrs: Attrs) -> str:
    """Register the kernel of ``op`` configured with ``attrs`` for every
    namespace, unless it already is.

    :return: the kernel's name.
    :raises KeyError: if there is no such op.
    :raises ValueError: if ``attrs`` is not JSON, or the op refuses it.
    """
    definition = _CONFIGURED.get(op)
    if definition is None:
        raise KeyError(f"no configurable op {op!r} in the kernel library")
    encoded = encode_attrs(attrs)
    name = kernel_name(op, encoded)
    with _lock:
        if global_namespace_func(name, HOST_NAMESPACE) is None:
            _register(name, definition, json.loads(encoded))  # as a graph gives it
    return name


def register_graph_kernels(graph: Graph) -> tuple[str, ...]:
    """Register the library kernels ``graph``'s nodes configure, from their
    attrs.

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
