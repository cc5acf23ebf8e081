"""A graph whose input shapes are symbols: one model for every input shape.

A :class:`SymbolicGraph` is what :func:`asyncrt.frontend.from_onnx` returns
for a model with symbolic (``dim_param``) or unknown input dimensions, or
with inputs whose *values* decide shapes (``Reshape``'s target, ``Range``'s
bounds, ...). It is not run directly: an executor asks it for the
**signature** of each request (the concrete shape of every input plus the
values of the shape-valued inputs) and, on first sight of a signature, for
a **specialization**: a static :class:`~asyncrt.graph.Graph` planned like
any other, and the constants folded for that signature.

The work is split so that a request pays little:

* once, at import: parsing and checking the model, the rewrites, folding
  the subgraphs that read only weights, and the per-input checks below;
* per request, :meth:`SymbolicGraph.signature`: a few comparisons per
  dimension (microseconds); a shape the model cannot take is an
  :class:`~asyncrt.errors.InputError` naming the input, the dimension and
  its symbol, before anything is built;
* per new signature, :meth:`SymbolicGraph.specialize`: shape propagation,
  folding of the shape-computing subgraph and lowering to kernels.

The shared weights stay with the caller (``from_onnx`` returns them once as
``params``); a specialization refers to them by name and never copies them.
Its own constants get names that no shared parameter or input can have.

A symbolic graph goes to a worker process as data
(:meth:`SymbolicGraph.to_bytes`, :meth:`SymbolicGraph.from_bytes`): a
small header in JSON and the format's payload; its parameters travel
separately (TVM's params format). Nothing in the bytes is executed.
"""

from __future__ import annotations

import importlib
import json
import struct
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from devices import numpy_dtype
from devices.errors import DTypeError

from ..errors import GraphError, InputError
from ._model import Graph

__all__ = (
    "Specialized",
    "Specializer",
    "SymbolicGraph",
    "SymbolicInput",
    "register_symbolic_format",
)

Shapes = Mapping[str, Sequence[int]]
Values = Mapping[str, "np.ndarray[Any, Any]"]

_MAGIC = b"ASYNCRT-SYMBOLIC\n"
_VERSION = 1
#: The module that registers each format's loader when imported (a fixed
#: table: a name in the bytes never chooses code to import).
_FORMAT_MODULES = {"onnx": "asyncrt.frontend"}


@dataclass(frozen=True)
class SymbolicInput:
    """One input a caller gives (parameters are not inputs).

    :ivar name: the input's name.
    :ivar dtype: its TVM dtype, such as ``"int64"``.
    :ivar shape: per dimension, a size the model fixes (an int) or a symbol
        (the model's ``dim_param``; an unknown dimension gets a generated
        name, ``"<input>_dim<axis>"``). Dimensions sharing a symbol must be
        equal in every request.
    :ivar shape_valued: whether the input's values decide shapes (it feeds
        ``Reshape``'s shape, ``Slice``'s starts, a reduction's axes,
        ``Range``'s bounds, ...): its values are part of the signature, and a
        specialization binds them as constants.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    shape_valued: bool = False

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def describe(self) -> str:
        """The declared shape as text: ``("batch", 128)``."""
        dims = ", ".join(repr(d) for d in self.shape)
        return f"({dims},)" if len(self.shape) == 1 else f"({dims})"


@dataclass(frozen=True)
class Specialized:
    """The static form of a symbolic graph for one signature.

    :ivar graph: a static graph, ready for ``graph_executor.create``-style
        planning; its shape-valued inputs are bound as constants.
    :ivar params: the constants folded for this signature that kernels
        read, by name (every name is distinct from the shared parameters'
        and the inputs').
    :ivar inputs: the graph inputs a run gives, in graph order (the
        symbolic graph's inputs less the shape-valued ones).
    :ivar shared: the shared parameters (``from_onnx``'s ``params``) this
        graph reads, by name.
    """

    graph: Graph
    params: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    def with_shared(self, shared: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter the graph reads: the shared ones it names, taken
        from ``shared`` (not copied), and its own.

        :param shared: the shared parameters (``from_onnx``'s ``params``, or
            their NDArrays on a device).
        :raises GraphError: if ``shared`` lacks one the graph reads.
        """
        missing = [name for name in self.shared if name not in shared]
        if missing:
            raise GraphError(f"shared parameters missing: {missing}", field="params")
        return {**{name: shared[name] for name in self.shared}, **self.params}


class Specializer(Protocol):
    """What a model format supplies to a :class:`SymbolicGraph`."""

    @property
    def format(self) -> str:
        """The format's name in :meth:`SymbolicGraph.to_bytes`."""
        ...

    def specialize(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray[Any, Any]],
        dims: Mapping[str, int],
    ) -> Specialized:
        """The static graph for shapes and values already validated.

        :param dims: the size of every symbol.
        """
        ...

    def payload(self) -> bytes:
        """The format's data, for :meth:`SymbolicGraph.to_bytes`."""
        ...


#: A format's loader: ``(payload, inputs, params) -> specializer``.
Loader = Callable[
    [bytes, Sequence[SymbolicInput], Mapping[str, "np.ndarray[Any, Any]"]],
    Specializer,
]
_LOADERS: dict[str, Loader] = {}


def register_symbolic_format(name: str, loader: Loader) -> None:
    """Register how :meth:`SymbolicGraph.from_bytes` reads format ``name``."""
    _LOADERS[name] = loader


@dataclass(frozen=True)
class _Check:
    """One input's checks, prepared once."""

    name: str
    dtype: str
    np_dtype: np.dtype[Any]
    rank: int
    fixed: tuple[tuple[int, int], ...]
    symbols: tuple[tuple[int, str], ...]


class SymbolicGraph:
    """A model for every input shape; see the module docstring.

    :param inputs: the inputs a caller gives, in graph order.
    :param outputs: the output names, in order.
    :param specializer: the format's specialization.
    :param params: the shared parameters by name (their specs are checked by
        :meth:`from_bytes` and shown by :attr:`params`).
    :raises GraphError: if two inputs share a name or a dtype is unknown.
    """

    def __init__(
        self,
        inputs: Sequence[SymbolicInput],
        outputs: Sequence[str],
        specializer: Specializer,
        params: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
    ) -> None:
        table: dict[str, SymbolicInput] = {}
        for item in inputs:
            if item.name in table:
                raise GraphError("duplicate input", node=item.name, field="inputs")
            table[item.name] = item
        self._inputs = MappingProxyType(table)
        self._outputs = tuple(outputs)
        self._specializer = specializer
        self._params = MappingProxyType(dict(params or {}))
        self._checks = tuple(_check_of(item) for item in inputs)
        self._valued = tuple(c for c in self._checks if table[c.name].shape_valued)
        symbols: dict[str, None] = {}
        for item in inputs:
            symbols.update((d, None) for d in item.shape if isinstance(d, str))
        self._symbols = tuple(symbols)

    # -- what it is ------------------------------------------------------------

    @property
    def inputs(self) -> Mapping[str, SymbolicInput]:
        """The inputs a caller gives (not parameters), in graph order."""
        return self._inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        """The output names, in order."""
        return self._outputs

    @property
    def symbols(self) -> tuple[str, ...]:
        """The dimension symbols, in order of first appearance."""
        return self._symbols

    @property
    def shape_valued(self) -> tuple[str, ...]:
        """The inputs whose values are part of the signature, in order."""
        return tuple(c.name for c in self._valued)

    @property
    def params(self) -> Mapping[str, tuple[tuple[int, ...], str]]:
        """The shared parameters' shapes and dtypes, by name."""
        return self._params

    @property
    def format(self) -> str:
        """The model format it was imported from (``"onnx"``)."""
        return self._specializer.format

    def __repr__(self) -> str:
        inputs = ", ".join(f"{i.name}{i.describe()}" for i in self._inputs.values())
        return f"<SymbolicGraph {self.format}: {inputs} -> {', '.join(self.outputs)}>"

    # -- per request -----------------------------------------------------------

    def signature(
        self,
        shapes: Shapes,
        values: Values,
        *,
        dtypes: Mapping[str, str] | None = None,
    ) -> Hashable:
        """The key of the specialization that serves these inputs.

        Two requests share a key exactly when they can share a plan: the
        same shape for every input and the same values for the
        shape-valued ones.

        :param shapes: every input's shape, by name.
        :param values: the shape-valued inputs' arrays, by name (others are
            ignored).
        :param dtypes: the inputs' dtypes, to check them too.
        :return: a hashable key.
        :raises InputError: if an input is missing or unknown, has the wrong
            rank, breaks a dimension the model fixes, gives a symbol two
            sizes (a mismatched batch), has a negative size, or (for a
            shape-valued input, or one in ``dtypes``) the wrong dtype; the
            message names the input, the dimension and its symbol.
        """
        return self._validate(shapes, values, dtypes)[0]

    def dims(self, shapes: Shapes) -> dict[str, int]:
        """The size of every symbol in ``shapes``.

        :raises InputError: as :meth:`signature` does for shapes.
        """
        return self._bind(shapes)[2]

    def specialize(self, shapes: Shapes, values: Values) -> Specialized:
        """The static graph and constants for one signature.

        :param shapes: every input's shape, by name.
        :param values: the shape-valued inputs' arrays, by name.
        :return: the specialization (see :class:`Specialized`).
        :raises InputError: as :meth:`signature` does, or if the model cannot
            take these shapes or values (a ``Reshape`` to an impossible
            shape, ...), naming the node.
        :raises UnsupportedOpError: if a node cannot be lowered for them.
        """
        _, normal, chosen, dims = self._validate(shapes, values, None)
        return self._specializer.specialize(normal, chosen, dims)

    # -- checks ----------------------------------------------------------------

    def _validate(
        self,
        shapes: Shapes,
        values: Values,
        dtypes: Mapping[str, str] | None,
    ) -> tuple[
        Hashable,
        dict[str, tuple[int, ...]],
        dict[str, np.ndarray[Any, Any]],
        dict[str, int],
    ]:
        key, normal, dims = self._bind(shapes)
        chosen: dict[str, np.ndarray[Any, Any]] = {}
        blobs = []
        for check in self._valued:
            value = values.get(check.name)
            if value is None:
                raise InputError(
                    f"input {check.name!r} decides shapes: give its value to "
                    "choose the specialization"
                )
            if not isinstance(value, np.ndarray):
                raise InputError(
                    f"input {check.name!r}: expected a numpy array, got "
                    f"{type(value).__name__}"
                )
            if value.dtype != check.np_dtype:
                raise InputError(
                    f"input {check.name!r}: dtype {value.dtype}, the model "
                    f"expects {check.dtype}"
                )
            if value.shape != normal[check.name]:
                raise InputError(
                    f"input {check.name!r}: its value has shape {value.shape}, "
                    f"but its shape is given as {normal[check.name]}"
                )
            chosen[check.name] = value
            blobs.append(value.tobytes())
        if dtypes is not None:
            for name, dtype in dtypes.items():
                item = self._inputs.get(name)
                if item is None:
                    raise InputError(self._unknown(name))
                if dtype != item.dtype:
                    raise InputError(
                        f"input {name!r}: dtype {dtype}, the model expects {item.dtype}"
                    )
        return (key, tuple(blobs)), normal, chosen, dims

    def _bind(
        self, shapes: Shapes
    ) -> tuple[tuple[tuple[int, ...], ...], dict[str, tuple[int, ...]], dict[str, int]]:
        if len(shapes) != len(self._checks):
            for name in shapes:
                if name not in self._inputs:
                    raise InputError(self._unknown(name))
        bound: dict[str, tuple[int, str, int]] = {}
        normal: dict[str, tuple[int, ...]] = {}
        key = []
        for check in self._checks:
            given = shapes.get(check.name)
            if given is None:
                names = ", ".join(repr(c.name) for c in self._checks)
                raise InputError(f"missing input {check.name!r} (inputs: {names})")
            shape = _dims(check, given)
            if len(shape) != check.rank:
                raise InputError(
                    f"input {check.name!r}: shape {shape} has rank {len(shape)}, "
                    f"the model expects rank {check.rank}: "
                    f"{self._inputs[check.name].describe()}"
                )
            for index, size in enumerate(shape):
                if size < 0:
                    raise InputError(
                        f"input {check.name!r}: dimension {index}"
                        f"{self._label(check, index)} is {size}: a size must be "
                        ">= 0"
                    )
            for index, want in check.fixed:
                if shape[index] != want:
                    raise InputError(
                        f"input {check.name!r}: dimension {index} is "
                        f"{shape[index]}, the model fixes it at {want}"
                    )
            for index, symbol in check.symbols:
                size = shape[index]
                first = bound.get(symbol)
                if first is None:
                    bound[symbol] = (size, check.name, index)
                elif first[0] != size:
                    raise InputError(
                        f"input {check.name!r}: dimension {index} ({symbol!r}) is "
                        f"{size}, but input {first[1]!r} dimension {first[2]} gave "
                        f"{symbol!r} = {first[0]}: dimensions that share a symbol "
                        "must be equal"
                    )
            normal[check.name] = shape
            key.append(shape)
        return tuple(key), normal, {s: b[0] for s, b in bound.items()}

    def _unknown(self, name: str) -> str:
        names = ", ".join(repr(c.name) for c in self._checks)
        return f"unknown input {name!r} (inputs: {names})"

    def _label(self, check: _Check, index: int) -> str:
        symbol = self._inputs[check.name].shape[index]
        return f" ({symbol!r})" if isinstance(symbol, str) else ""

    # -- as data ---------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The graph as data, for a worker process (its parameters travel
        separately, e.g. in TVM's params format).

        :return: bytes for :meth:`from_bytes`.
        """
        header = {
            "version": _VERSION,
            "format": self.format,
            "inputs": [
                {
                    "name": i.name,
                    "dtype": i.dtype,
                    "shape": list(i.shape),
                    "shape_valued": i.shape_valued,
                }
                for i in self._inputs.values()
            ],
            "outputs": list(self._outputs),
            "params": {
                name: {"shape": list(shape), "dtype": dtype}
                for name, (shape, dtype) in self._params.items()
            },
        }
        text = json.dumps(header, sort_keys=True).encode()
        return (
            _MAGIC + struct.pack("<Q", len(text)) + text + self._specializer.payload()
        )

    @classmethod
    def from_bytes(
        cls, data: bytes, params: Mapping[str, np.ndarray[Any, Any]]
    ) -> SymbolicGraph:
        """A graph from :meth:`to_bytes`, with its shared parameters.

        :param data: the bytes.
        :param params: the shared parameters by name (``from_onnx``'s
            ``params``, e.g. read back with ``load_param_dict``).
        :return: the graph.
        :raises GraphError: if the bytes are not a symbolic graph, are of an
            unknown format, or a parameter is missing or of another shape or
            dtype.
        """
        view = memoryview(data)
        start = len(_MAGIC)
        if bytes(view[:start]) != _MAGIC or len(view) < start + 8:
            raise GraphError("not a symbolic graph (bad magic)", field="magic")
        (length,) = struct.unpack("<Q", view[start : start + 8])
        body = start + 8 + length
        if body > len(view):
            raise GraphError("truncated header", field="header")
        try:
            header = json.loads(bytes(view[start + 8 : body]))
            inputs = [
                SymbolicInput(
                    str(i["name"]),
                    str(i["dtype"]),
                    tuple(d if isinstance(d, str) else int(d) for d in i["shape"]),
                    bool(i["shape_valued"]),
                )
                for i in header["inputs"]
            ]
            outputs = [str(o) for o in header["outputs"]]
            specs = {
                str(name): (tuple(int(d) for d in p["shape"]), str(p["dtype"]))
                for name, p in header["params"].items()
            }
            version, kind = int(header["version"]), str(header["format"])
        except (ValueError, KeyError, TypeError) as exc:
            raise GraphError(f"malformed header: {exc}", field="header") from exc
        if version != _VERSION:
            raise GraphError(f"unknown version {version}", field="version")
        for name, (shape, dtype) in specs.items():
            array = params.get(name)
            if array is None:
                raise GraphError("shared parameter is missing", node=name)
            if array.shape != shape or str(array.dtype) != dtype:
                raise GraphError(
                    f"shared parameter is {array.dtype}{list(array.shape)}, the "
                    f"graph expects {dtype}{list(shape)}",
                    node=name,
                )
        loader = _loader(kind)
        chosen = {name: params[name] for name in specs}
        return cls(inputs, outputs, loader(bytes(view[body:]), inputs, chosen), specs)


def _loader(kind: str) -> Loader:
    if kind not in _LOADERS and kind in _FORMAT_MODULES:
        importlib.import_module(_FORMAT_MODULES[kind])
    loader = _LOADERS.get(kind)
    if loader is None:
        raise GraphError(f"unknown symbolic graph format {kind!r}", field="format")
    return loader


def _check_of(item: SymbolicInput) -> _Check:
    try:
        np_dtype = numpy_dtype(item.dtype)
    except DTypeError as exc:
        raise GraphError(str(exc), node=item.name, field="dtype") from exc
    fixed = tuple((i, d) for i, d in enumerate(item.shape) if isinstance(d, int))
    symbols = tuple((i, d) for i, d in enumerate(item.shape) if isinstance(d, str))
    return _Check(item.name, item.dtype, np_dtype, item.rank, fixed, symbols)


def _dims(check: _Check, given: Sequence[int]) -> tuple[int, ...]:
    """``given`` as a tuple of ints (numpy integers allowed, bools not)."""
    if type(given) is tuple and all(type(size) is int for size in given):
        return given  # the common case, checked cheaply
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise InputError(f"input {check.name!r}: shape {given!r} must be a sequence")
    shape = tuple(given)
    for size in shape:
        if type(size) is not int and (
            isinstance(size, bool) or not isinstance(size, (int, np.integer))
        ):
            raise InputError(
                f"input {check.name!r}: shape {given!r} must hold integers"
            )
    return tuple(int(size) for size in shape)
