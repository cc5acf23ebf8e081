"""What the command line runs: a model file (or the built-in example), its
parameters, its devices, and its inputs.

A MODEL is recognised by its content, not trusted by its name: ``.onnx``
goes to the ONNX frontend (imported only then); a zip archive is an
exported module (:func:`asyncrt.load_module`); anything else must be TVM
graph JSON. Nothing in a model file is ever executed; ``--import`` runs the
modules the user names, as ``python -c 'import MODULE'`` would.

An ONNX model may declare symbolic dimensions (``batch``, ``sequence``). The
command line fixes them before importing, from ``--shape NAME=2x16``, else
from the shapes of the ``--input`` arrays; a symbol that two inputs share
(both ``input_ids`` and ``attention_mask`` are ``batch x sequence``) takes
the value given for either, and one given nowhere is taken as 1, with a
note. Inputs not given get seeded random data; an integer input that a
Gather uses as indices gets values within the table it indexes, and one
that reaches no Gather gets ones (a mask that attends everywhere, a count
or a step that is not zero: random integers would make an attention mask's
``(1 - mask) * min`` overflow).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from devices import Device, list_devices, numpy_dtype

from .._module_files import import_file
from ..errors import (
    ArgumentError,
    DeviceNotFoundError,
    InputError,
    KernelNotFoundError,
)
from ..graph import Graph, load_graph
from ..io._factory import load_module
from ..io._param_dict import load_param_dict
from ..ops import OP_ATTRS_ATTR, OP_NAME_ATTR, register_graph_kernels
from ..ops._kernels import Module, resolve
from ._example import example_graph, example_inputs, example_reference

if TYPE_CHECKING:
    import onnx

__all__ = (
    "Given",
    "Model",
    "check_kernels",
    "import_modules",
    "load_model",
    "make_inputs",
    "pick_devices",
)

Reference = Callable[
    [dict[str, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]]],
    np.ndarray[Any, Any],
]


@dataclass(frozen=True)
class Model:
    """A graph ready for an executor.

    :ivar name: what to call it in output.
    :ivar graph: the graph.
    :ivar params: parameter values by name (loaded before running).
    :ivar lib: kernels looked up before the registry (exported modules).
    :ivar inputs: fixed inputs (the example's), by name.
    :ivar reference: computes the expected first output (the example).
    :ivar notes: what was assumed while loading it (symbols taken as 1).
    """

    name: str
    graph: Graph
    params: Mapping[str, Any] = field(default_factory=dict)
    lib: Module | None = None
    inputs: Mapping[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    reference: Reference | None = None
    notes: tuple[str, ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        """Graph inputs that are not parameters."""
        return tuple(n for n in self.graph.input_names if n not in self.params)


def load_model(
    path: str | None, params_path: str | None = None, given: Given | None = None
) -> Model:
    """Load MODEL (``None``: the built-in example).

    :param given: the ``--input`` and ``--shape`` arguments: they fix an
        ONNX model's symbolic dimensions.
    :raises ArgumentError: for a missing file, a folder, ``--params`` where
        the model carries its own, or an ONNX model without the frontend.
    :raises InputError: for a ``--shape`` or ``--input`` the model cannot
        take (an unknown name, a rank or fixed dimension it contradicts).
    :raises GraphError: if a graph is malformed.
    :raises ParamsError: if a params file is corrupt.
    :raises ArtifactError: if a module file is malformed.
    :raises OSError: if a file cannot be read.
    """
    given = given if given is not None else Given()
    if path is None:
        if params_path is not None:
            raise ArgumentError("--params needs a MODEL (a TVM graph JSON file)")
        graph, params = example_graph()
        model = Model(
            "built-in example (MLP with 3 branches)",
            graph,
            params,
            inputs=example_inputs(),
            reference=example_reference,
        )
        given.check_static_shapes(model)
        return model
    file = Path(path)
    if not file.exists():
        raise ArgumentError(f"{path}: no such file")
    if file.is_dir():
        raise ArgumentError(f"{path}: is a folder, not a model file")
    if file.suffix.lower() == ".onnx":
        _no_params(params_path, path, "an ONNX model")
        return _onnx(file, given)
    if zipfile.is_zipfile(file):
        _no_params(params_path, path, "an exported module")
        factory = load_module(file)
        model = Model(file.name, factory.graph, factory.get_params(), lib=factory.lib)
    else:
        graph = load_graph(file)
        params = {} if params_path is None else _read_params(params_path)
        unknown = sorted(set(params) - set(graph.input_names))
        if unknown:
            raise ArgumentError(
                f"{params_path}: parameters the graph has no input for: "
                + ", ".join(unknown)
            )
        model = Model(file.name, graph, params)
    given.check_static_shapes(model)
    return model


def _no_params(params_path: str | None, path: str, what: str) -> None:
    if params_path is not None:
        raise ArgumentError(f"{path} is {what}, which carries its own parameters: "
                            "drop --params")  # fmt: skip


def _read_params(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ArgumentError(f"{path}: no such file")
    return dict(load_param_dict(file.read_bytes()))


def _onnx(file: Path, given: Given) -> Model:
    try:
        from ..frontend import from_onnx
        from ..frontend._importer import load_model as load_onnx
    except ImportError as exc:
        raise ArgumentError(
            f"{file}: ONNX models need asyncrt's ONNX frontend, which cannot be "
            f"imported here ({exc}); pip install 'asyncrt[onnx]'"
        ) from exc
    proto = load_onnx(str(file))
    shape_dict, notes = _onnx_shapes(proto, given)
    graph, params = from_onnx(proto, shape_dict)
    if not isinstance(graph, Graph):  # inputs whose values decide shapes
        inputs = ", ".join(f"{i.name}{i.describe()}" for i in graph.inputs.values())
        raise ArgumentError(
            f"{file}: the model's shapes are decided by input values ({inputs}); "
            "the command line runs fixed shapes only"
        )
    return Model(file.name, graph, params, notes=tuple(notes))


Dim = int | str | None  # fixed, a named symbol, or unknown


def _declared(proto: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """The inputs a caller gives (initializers excluded), with their
    declared dimensions (``()`` for an input declared without a shape)."""
    initializers = {init.name for init in proto.graph.initializer}
    declared: dict[str, tuple[Dim, ...]] = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims: list[Dim] = []
        if value.type.HasField("tensor_type") and tensor.HasField("shape"):
            for dim in tensor.shape.dim:
                if dim.HasField("dim_value"):
                    dims.append(int(dim.dim_value))
                else:
                    dims.append(dim.dim_param or None)
        declared[value.name] = tuple(dims)
    return declared


def _onnx_shapes(
    proto: onnx.ModelProto, given: Given
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """``from_onnx``'s shape_dict for the symbolic dimensions, and notes on
    what was assumed (see the module docstring)."""
    declared = _declared(proto)
    arrays = given.arrays(declared)
    for name in given.shapes:
        if name not in declared:
            raise InputError(
                f"--shape {name}: the model has no such input "
                f"({', '.join(declared) or 'none'})"
            )
    wanted: dict[str, tuple[int, ...]] = {}
    symbols: dict[str, tuple[int, str]] = {}  # value, and the input it came from
    for name, dims in declared.items():
        shape = given.shapes.get(name)
        if shape is None and name in arrays:
            shape = arrays[name].shape
        if shape is None:
            continue
        if dims and len(shape) != len(dims):
            raise InputError(
                f"{_where(given, name)}: {len(shape)} dimension(s) {shape}, the "
                f"model declares {len(dims)} ({_text(dims)})"
            )
        for axis, dim in enumerate(dims):
            if not isinstance(dim, str):
                continue
            seen = symbols.setdefault(dim, (shape[axis], name))
            if seen[0] != shape[axis]:
                raise InputError(
                    f"{_where(given, name)}: dimension {axis} ({dim!r}) is "
                    f"{shape[axis]}, but {seen[1]} gives {dim!r} as {seen[0]}"
                )
        if name in given.shapes or any(not isinstance(d, int) for d in dims):
            wanted[name] = tuple(shape)
    notes = []
    for name, dims in declared.items():
        if name in wanted or all(isinstance(d, int) for d in dims):
            continue
        if not dims:
            raise InputError(
                f"input {name!r} has no declared shape: give --shape {name}=... "
                f"or --input {name}=FILE.npy"
            )
        filled: list[int] = []
        assumed: list[str] = []
        for dim in dims:
            if isinstance(dim, int):
                filled.append(dim)
            elif isinstance(dim, str) and dim in symbols:
                filled.append(symbols[dim][0])
            else:
                filled.append(1)
                assumed.append("?" if dim is None else repr(dim))
        wanted[name] = tuple(filled)
        if assumed:
            notes.append(
                f"input {name!r}: symbolic dimension(s) {', '.join(assumed)} taken "
                f"as 1, so its shape is {tuple(filled)} (give --shape {name}=...)"
            )
    return wanted, notes


def _text(dims: Sequence[Dim]) -> str:
    return " x ".join("?" if d is None else str(d) for d in dims) or "no shape"


def _where(given: Given, name: str) -> str:
    return f"--shape {name}" if name in given.shapes else f"--input {name}"


def pick_devices(specs: Sequence[str] | None) -> list[Device]:
    """The devices named (``--device cpu --device sim:0``, or comma
    separated), or every device present.

    :raises ArgumentError: if a name is malformed or repeated.
    :raises DeviceNotFoundError: if a device is not present.
    """
    if not specs:
        return list_devices()
    chosen: list[Device] = []
    for spec in specs:
        for part in spec.split(","):
            text = part.strip()
            if not text:
                continue
            device = Device.parse(text)
            if device in chosen:
                raise ArgumentError(f"device {device} is given twice")
            if not device.exist:
                present = ", ".join(map(str, list_devices())) or "none"
                raise DeviceNotFoundError(
                    f"device {device} is not present here (present: {present})"
                )
            chosen.append(device)
    if not chosen:
        raise ArgumentError("--device needs at least one device")
    return chosen


def check_kernels(model: Model, devices: Sequence[Device]) -> None:
    """Refuse, naming them, the kernels the model needs that no device given
    has, and say how to bring them (the planner would only say that a node
    cannot run anywhere).

    :raises KernelNotFoundError: if a kernel is registered for none of the
        devices' kinds.
    :raises GraphError: if a node's kernel library attributes are bad.
    """
    register_graph_kernels(model.graph)
    kinds = sorted({device.kind for device in devices})
    missing = sorted(
        {
            node.func_name
            for node in model.graph.nodes
            if not node.is_null
            and node.func_name != "__nop"
            and not any(resolve(node.func_name, kind, model.lib) for kind in kinds)
        }
    )
    if missing:
        shown = ", ".join(missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise KernelNotFoundError(
            f"{model.name} needs kernels registered for none of "
            f"{', '.join(kinds)}: {shown}{more}; give --import MODULE, a "
            "module that registers them"
        )


def make_inputs(
    model: Model, given: Given, *, seed: int = 0
) -> tuple[dict[str, np.ndarray[Any, Any]], list[str], list[str]]:
    """The run's inputs: ``--input`` values, the model's own, and seeded
    random data for the rest.

    :return: the inputs by name, the names filled with random data, and
        notes on random data that may not suit the model.
    :raises InputError: for an unknown name, or an array of the wrong shape
        or dtype.
    """
    shapes = {}
    for nid in model.graph.arg_nodes:
        eid = model.graph.entry_id(nid, 0)
        shapes[model.graph.nodes[nid].name] = (
            model.graph.shape[eid],
            model.graph.dltype[eid],
        )
    values: dict[str, np.ndarray[Any, Any]] = {}
    for name, value in given.arrays(model.input_names).items():
        values[name] = _check_array(given.source(name), value, *shapes[name])
    for name, value in model.inputs.items():
        values.setdefault(name, value)
    rng = np.random.default_rng(seed)
    random = [n for n in model.input_names if n not in values]
    bounds, indexing = _index_bounds(model, random)
    notes = []
    for name in random:
        shape, dtype = shapes[name]
        values[name] = _random(rng, shape, dtype, bounds.get(name), name in indexing)
        if name in indexing and name not in bounds:
            notes.append(
                f"input {name!r} reaches the indices of a Gather through other "
                f"operators: its random values 0..9 may index past a table; give "
                f"--input {name}=FILE.npy"
            )
    return values, random, notes


def _check_array(
    where: str, value: np.ndarray[Any, Any], shape: tuple[int, ...], dtype: str
) -> np.ndarray[Any, Any]:
    if value.shape != shape:
        raise InputError(f"{where}: shape {value.shape}, the model wants {shape}")
    if value.dtype != numpy_dtype(dtype):
        raise InputError(f"{where}: dtype {value.dtype}, the model wants {dtype}")
    return value


def _random(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: str,
    bound: int | None,
    indexes: bool,
) -> np.ndarray[Any, Any]:
    target = numpy_dtype(dtype)
    if target.kind == "b":
        return rng.integers(0, 2, shape).astype(target)
    if target.kind in "iu":
        if not indexes:
            return np.ones(shape, dtype=target)
        return rng.integers(0, 10 if bound is None else bound, shape).astype(target)
    return rng.standard_normal(shape).astype(target)


# -- integer inputs that index ------------------------------------------------------

#: Kernel-library ops whose input 1 indexes axis ``axis`` of input 0.
_INDEXING = ("gather", "gather_elements")
#: What passes an input's values on unchanged (reshapes, casts, copies...).
_PASSING_KERNELS = ("__nop", "cast", "copy")
_PASSING_ONNX = (
    "Cast", "Concat", "Expand", "Flatten", "Identity", "Reshape", "Slice",
    "Squeeze", "Tile", "Transpose", "Unsqueeze",
)  # fmt: skip


def _index_bounds(
    model: Model, names: Collection[str]
) -> tuple[dict[str, int], set[str]]:
    """For the integer inputs among ``names``: the size of the smallest
    table each one indexes where its values reach a Gather's indices
    unchanged, and the set of those that reach one at all."""
    graph = model.graph
    readers: dict[int, list[tuple[int, int]]] = {}
    for nid, node in enumerate(graph.nodes):
        for position, entry in enumerate(node.inputs):
            readers.setdefault(entry.nid, []).append((nid, position))
    bounds: dict[str, int] = {}
    indexing: set[str] = set()
    for nid in graph.arg_nodes:
        name = graph.nodes[nid].name
        dtype = graph.dltype[graph.entry_id(nid, 0)]
        if name not in names or numpy_dtype(dtype).kind not in "iu":
            continue
        sizes, reaches = _tables_indexed(graph, readers, nid)
        if sizes:
            bounds[name] = min(sizes)
        if reaches:
            indexing.add(name)
    return bounds, indexing


def _tables_indexed(
    graph: Graph, readers: Mapping[int, list[tuple[int, int]]], start: int
) -> tuple[list[int], bool]:
    sizes: list[int] = []
    reaches = False
    unchanged, seen = [start], {start}
    changed: list[int] = []
    while unchanged:
        for nid, position in readers.get(unchanged.pop(), []):
            node = graph.nodes[nid]
            size = _table_size(graph, nid) if position == 1 else None
            if size is not None:
                sizes.append(size)
                reaches = True
            elif nid not in seen:
                seen.add(nid)
                passes = node.func_name in _PASSING_KERNELS or (
                    node.attrs.get("onnx_op") in _PASSING_ONNX
                )
                (unchanged if passes else changed).append(nid)
    while changed and not reaches:  # does it reach indices some other way?
        for nid, position in readers.get(changed.pop(), []):
            reaches = reaches or (position == 1 and _table_size(graph, nid) is not None)
            if nid not in seen:
                seen.add(nid)
                changed.append(nid)
    return sizes, reaches


def _table_size(graph: Graph, nid: int) -> int | None:
    """The length of the axis that node ``nid`` gathers along, if it is a
    gather (its input 1 the indices)."""
    node = graph.nodes[nid]
    if node.attrs.get(OP_NAME_ATTR) not in _INDEXING or len(node.inputs) < 2:
        return None
    try:
        axis = int(json.loads(node.attrs.get(OP_ATTRS_ATTR, "{}")).get("axis", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    data = node.inputs[0]
    shape = graph.shape[graph.entry_id(data.nid, data.index)]
    return shape[axis] if -len(shape) <= axis < len(shape) else None


# -- --input, --shape and --import ----------------------------------------------------

_DIMENSIONS = re.compile(r"\d+(?:[x,]\d+)*")


@dataclass(frozen=True)
class _InputFile:
    name: str | None  # None: an .npz whose arrays are named by input
    path: str


class Given:
    """The ``--input`` and ``--shape`` arguments, checked for form; the
    files are read once, on first use.

    :param inputs: ``NAME=FILE.npy``, ``NAME=FILE.npz`` or ``FILE.npz`` items.
    :param shapes: ``NAME=1x3x224x224`` items.
    :raises InputError: for a malformed item, or a name given twice.
    """

    def __init__(self, inputs: Sequence[str] = (), shapes: Sequence[str] = ()) -> None:
        self.files = tuple(_input_file(item) for item in inputs)
        self.shapes = _shapes(shapes)
        self._arrays: dict[str, np.ndarray[Any, Any]] | None = None
        self._sources: dict[str, str] = {}

    def source(self, name: str) -> str:
        """How an input was given, for messages (``--input x=x.npy``)."""
        return self._sources.get(name, f"--input {name}")

    def arrays(self, known: Collection[str]) -> dict[str, np.ndarray[Any, Any]]:
        """The arrays given, by input name.

        :param known: the inputs the model takes.
        :raises InputError: for a name the model does not take, a name given
            twice, or a file that is not a plain ``.npy``/``.npz``.
        """
        if self._arrays is None:
            self._arrays = {}
            for file in self.files:
                for name, value in self._read(file, known):
                    if name in self._arrays:
                        raise InputError(f"--input: input {name!r} is given twice")
                    self._arrays[name] = value
        for name in self._arrays:
            if name not in known:
                raise self._unknown(self._sources[name], name, known)
        return dict(self._arrays)

    def check_static_shapes(self, model: Model) -> None:
        """Refuse ``--shape`` for a model whose shapes are fixed, unless it
        says what the graph already does.

        :raises InputError: if a shape names no input or contradicts one.
        """
        for name, shape in self.shapes.items():
            if name not in model.input_names:
                raise self._unknown(f"--shape {name}", name, model.input_names)
            nid = model.graph.arg_nodes[model.graph.input_names.index(name)]
            fixed = model.graph.shape[model.graph.entry_id(nid, 0)]
            if fixed != shape:
                raise InputError(
                    f"--shape {name}: the graph's input has the fixed shape "
                    f"{fixed}; --shape fixes symbolic dimensions of ONNX models"
                )

    def _read(
        self, file: _InputFile, known: Collection[str]
    ) -> list[tuple[str, np.ndarray[Any, Any]]]:
        if file.name is not None and file.name not in known:
            raise self._unknown(f"--input {file.name}", file.name, known)
        where = f"--input {file.path}" if file.name is None else (
            f"--input {file.name}={file.path}"
        )  # fmt: skip
        try:
            loaded = np.load(file.path, allow_pickle=False)  # never unpickle
        except (OSError, ValueError, EOFError) as exc:
            raise InputError(
                f"{where}: not a readable .npy or .npz file ({exc})"
            ) from exc
        if isinstance(loaded, np.ndarray):
            if file.name is None:
                raise InputError(f"{where}: a .npy file needs a NAME=")
            self._sources[file.name] = where
            return [(file.name, loaded)]
        with loaded:  # an .npz archive
            keys = list(loaded.files)
            if file.name is not None:
                if file.name in keys:
                    key = file.name
                elif len(keys) == 1:
                    key = keys[0]
                else:
                    raise InputError(
                        f"{where}: holds {len(keys)} arrays ({', '.join(keys)}), "
                        f"none named {file.name!r}"
                    )
                self._sources[file.name] = where
                return [(file.name, _npz_array(loaded, key, where))]
            found = []
            for key in keys:
                if key not in known:
                    raise self._unknown(f"{where} (array {key!r})", key, known)
                self._sources[key] = f"{where} (array {key!r})"
                found.append((key, _npz_array(loaded, key, where)))
            return found

    @staticmethod
    def _unknown(where: str, name: str, known: Collection[str]) -> InputError:
        names = ", ".join(known) or "none"
        return InputError(f"{where}: the model has no such input ({names})")


def _npz_array(archive: Any, key: str, where: str) -> np.ndarray[Any, Any]:
    try:
        value: np.ndarray[Any, Any] = archive[key]
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{where}: array {key!r} is not readable ({exc})") from exc
    return value


def _input_file(item: str) -> _InputFile:
    name, sep, path = item.partition("=")
    if sep and name and path:
        return _InputFile(name, path)
    if not sep and item.lower().endswith(".npz"):
        return _InputFile(None, item)
    raise InputError(f"--input {item!r}: expected NAME=FILE.npy or FILE.npz")


def _shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        dims = text.strip().lower()
        if not sep or not name or not _DIMENSIONS.fullmatch(dims):
            raise InputError(
                f"--shape {item!r}: expected NAME=DIMS, such as x=1x3x224x224"
            )
        if name in shapes:
            raise InputError(f"--shape {name} is given twice")
        shapes[name] = tuple(int(d) for d in re.split("[x,]", dims))
    return shapes


def import_modules(names: Sequence[str]) -> None:
    """Import the ``--import`` modules: a dotted name (found from the
    current folder too, as ``python -m`` finds it) or a ``.py`` file.

    :raises ArgumentError: if a module is not found or raises on import.
    """
    for name in names:
        try:
            if name.endswith(".py") or os.sep in name or "/" in name:
                _import_file(name)
            else:
                if "" not in sys.path and os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(name)
        except ArgumentError:
            raise
        except ImportError as exc:
            raise ArgumentError(f"--import {name}: {exc}") from exc
        except Exception as exc:
            raise ArgumentError(
                f"--import {name}: importing it raised {type(exc).__name__}: {exc}"
            ) from exc


def _import_file(name: str) -> None:
    path = Path(name).resolve()
    if not path.is_file():
        raise ArgumentError(f"--import {name}: no such file")
    module_name = path.stem
    existing = sys.modules.get(module_name)
    if existing is not None:
        if getattr(existing, "__file__", None) == str(path):
            return  # imported already
        raise ArgumentError(
            f"--import {name}: a module named {module_name!r} is imported "
            "already; rename the file"
        )
    import_file(module_name, path)
