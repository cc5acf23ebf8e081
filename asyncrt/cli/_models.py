"""What the command line runs: a model file (or the built-in example), its
parameters, its devices, and its inputs.

A MODEL is recognised by its content, not trusted by its name: ``.onnx``
goes to the ONNX frontend (imported only then); a zip archive is an
exported module (:func:`asyncrt.load_module`); anything else must be TVM
graph JSON. Nothing in a file is ever executed.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices import Device, list_devices, numpy_dtype

from ..errors import ArgumentError, DeviceNotFoundError, InputError
from ..graph import Graph, load_graph
from ..io._factory import load_module
from ..io._param_dict import load_param_dict
from ..ops._kernels import Module
from ._example import example_graph, example_inputs, example_reference

__all__ = ("Model", "load_model", "make_inputs", "pick_devices")

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
    """

    name: str
    graph: Graph
    params: Mapping[str, Any] = field(default_factory=dict)
    lib: Module | None = None
    inputs: Mapping[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    reference: Reference | None = None

    @property
    def input_names(self) -> tuple[str, ...]:
        """Graph inputs that are not parameters."""
        return tuple(n for n in self.graph.input_names if n not in self.params)


def load_model(path: str | None, params_path: str | None = None) -> Model:
    """Load MODEL (``None``: the built-in example).

    :raises ArgumentError: for a missing file, a folder, ``--params`` where
        the model carries its own, or an ONNX model without the frontend.
    :raises GraphError: if a graph is malformed.
    :raises ParamsError: if a params file is corrupt.
    :raises ArtifactError: if a module file is malformed.
    :raises OSError: if a file cannot be read.
    """
    if path is None:
        if params_path is not None:
            raise ArgumentError("--params needs a MODEL (a TVM graph JSON file)")
        graph, params = example_graph()
        return Model(
            "built-in example (MLP with 3 branches)",
            graph,
            params,
            inputs=example_inputs(),
            reference=example_reference,
        )
    file = Path(path)
    if not file.exists():
        raise ArgumentError(f"{path}: no such file")
    if file.is_dir():
        raise ArgumentError(f"{path}: is a folder, not a model file")
    if file.suffix.lower() == ".onnx":
        _no_params(params_path, path, "an ONNX model")
        return _onnx(file)
    if zipfile.is_zipfile(file):
        _no_params(params_path, path, "an exported module")
        factory = load_module(file)
        return Model(file.name, factory.graph, factory.get_params(), lib=factory.lib)
    graph = load_graph(file)
    params = {} if params_path is None else _read_params(params_path)
    unknown = sorted(set(params) - set(graph.input_names))
    if unknown:
        raise ArgumentError(
            f"{params_path}: parameters the graph has no input for: "
            + ", ".join(unknown)
        )
    return Model(file.name, graph, params)


def _no_params(params_path: str | None, path: str, what: str) -> None:
    if params_path is not None:
        raise ArgumentError(f"{path} is {what}, which carries its own parameters: "
                            "drop --params")  # fmt: skip


def _read_params(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ArgumentError(f"{path}: no such file")
    return dict(load_param_dict(file.read_bytes()))


def _onnx(file: Path) -> Model:
    try:
        from ..frontend import from_onnx
    except ImportError as exc:
        raise ArgumentError(
            f"{file}: ONNX models need asyncrt's ONNX frontend, which cannot be "
            f"imported here ({exc}); pip install 'asyncrt[onnx]'"
        ) from exc
    graph, params = from_onnx(str(file))
    if not isinstance(graph, Graph):
        inputs = ", ".join(f"{i.name}{i.describe()}" for i in graph.inputs.values())
        raise ArgumentError(
            f"{file}: the model's input shapes are symbolic or decided by input "
            f"values ({inputs}); the command line runs fixed shapes only"
        )
    return Model(file.name, graph, params)


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


def make_inputs(
    model: Model, given: Sequence[str], *, seed: int = 0
) -> tuple[dict[str, np.ndarray[Any, Any]], list[str]]:
    """The run's inputs: ``--input name=file.npy`` values, the model's own,
    and random data for the rest.

    :return: the inputs by name, and the names filled with random data.
    :raises InputError: for a malformed ``--input``, an unknown name, or a
        file that is not a plain ``.npy`` array of the right shape and dtype.
    """
    shapes = {}
    for nid in model.graph.arg_nodes:
        eid = model.graph.entry_id(nid, 0)
        shapes[model.graph.nodes[nid].name] = (
            model.graph.shape[eid],
            model.graph.dltype[eid],
        )
    values: dict[str, np.ndarray[Any, Any]] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {item!r}: expected NAME=FILE.npy")
        if name not in shapes or name in model.params:
            known = ", ".join(model.input_names) or "none"
            raise InputError(f"--input {name!r}: the model has no such input ({known})")
        values[name] = _read_npy(name, path, *shapes[name])
    for name, value in model.inputs.items():
        values.setdefault(name, value)
    rng = np.random.default_rng(seed)
    random = [n for n in model.input_names if n not in values]
    for name in random:
        shape, dtype = shapes[name]
        values[name] = _random(rng, shape, dtype)
    return values, random


def _read_npy(
    name: str, path: str, shape: tuple[int, ...], dtype: str
) -> np.ndarray[Any, Any]:
    try:
        value = np.load(path, allow_pickle=False)  # never unpickle a file
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(
            f"--input {name}={path}: not a readable .npy file ({exc})"
        ) from exc
    if not isinstance(value, np.ndarray):  # an .npz archive
        value.close()
        raise InputError(f"--input {name}={path}: holds several arrays, not one")
    if value.shape != shape:
        raise InputError(
            f"--input {name}={path}: shape {value.shape}, the model wants {shape}"
        )
    if value.dtype != numpy_dtype(dtype):
        raise InputError(
            f"--input {name}={path}: dtype {value.dtype}, the model wants {dtype}"
        )
    return value


def _random(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: str
) -> np.ndarray[Any, Any]:
    target = numpy_dtype(dtype)
    if target.kind == "b":
        return rng.integers(0, 2, shape).astype(target)
    if target.kind in "iu":
        return rng.integers(0, 10, shape).astype(target)
    return rng.standard_normal(shape).astype(target)
