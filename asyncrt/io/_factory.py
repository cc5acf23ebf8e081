"""Built modules: ``asyncrt.build``, ``export_library`` and ``load_module``.

A :class:`GraphExecutorFactory` is TVM's ``GraphExecutorFactoryModule``: a
graph, its parameters, and the names of the kernels it needs. It makes
executors (``factory.create(devices)``, or TVM's ``factory["default"](dev)``)
and exports itself as one file that :func:`load_module` reads back.

The file holds data only — graph JSON, the params blob, a manifest — never
code: kernels are found by name when the module is loaded, in the ``lib``
given to :func:`load_module` and then in the global registry. Kernels of the
library configured by attributes (:mod:`asyncrt.ops`: convolution, pooling,
...) are rebuilt from the op names and attributes their nodes store as data.
Loading never executes anything from the file (see :mod:`asyncrt.io._artifact`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from typing_extensions import Unpack

from devices import NDArray, get_api, registered_kinds
from devices.errors import DeviceNotFoundError
from scheduler.dag import COPY_FUNC, NOP_FUNC

from ..errors import ArgumentError, KernelNotFoundError
from ..graph import Graph, load_graph
from ..graph_executor import DeviceSpec, GraphModule, check_lib, create
from ..ops import register_graph_kernels
from ..ops._kernels import Module, resolve
from ..runtime._options import ExecutorOptions, OptionOverrides
from ._artifact import Artifact, read_artifact, write_artifact
from ._param_dict import load_param_dict, save_param_dict

__all__ = ("GraphExecutorFactory", "build", "load_module")


class GraphExecutorFactory:
    """A graph with its parameters, ready to make executors and to export.

    :param graph: the graph.
    :param params: parameter values by name (NDArrays or numpy arrays).
    :param lib: kernels looked up before the global registry.
    :param metadata: free-form strings saved with the module.
    :param devices: the devices :meth:`create` uses by default (``"cpu"``
        when ``None``).
    :param options: the executor options :meth:`create` starts from.
    :raises ArgumentError: if ``params`` is not a mapping or ``lib`` not a
        :class:`~asyncrt.Module`.
    :raises GraphError: if a node names a kernel library op with bad
        attributes.
    """

    def __init__(
        self,
        graph: Graph,
        params: Mapping[str, NDArray | np.ndarray[Any, Any]] | None = None,
        lib: Module | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        devices: DeviceSpec | None = None,
        options: ExecutorOptions | None = None,
    ) -> None:
        _check_params(params)
        register_graph_kernels(graph)
        self.graph = graph
        self.lib = check_lib(lib)
        self.devices = devices
        self.options = ExecutorOptions.of(options)
        self._params_blob = save_param_dict(params or {})
        self.metadata = MappingProxyType(dict(metadata or {}))

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The kernels the graph needs, sorted."""
        names = {
            n.func_name
            for n in self.graph.nodes
            if not n.is_null and n.func_name not in (NOP_FUNC, COPY_FUNC)
        }
        return tuple(sorted(names))

    def get_graph_json(self) -> str:
        """The graph as TVM graph JSON."""
        return self.graph.to_json()

    def get_params(self) -> dict[str, NDArray]:
        """The parameters, as new cpu arrays."""
        return load_param_dict(self._params_blob)

    def create(
        self,
        devices: DeviceSpec | None = None,
        *,
        options: ExecutorOptions | None = None,
        **overrides: Unpack[OptionOverrides],
    ) -> GraphModule:
        """An executor on ``devices`` with the parameters loaded.

        :param devices: the devices; by default those given to :func:`build`,
            else ``"cpu"``.
        :param options: the options to start from; by default the build's.
        :param overrides: options changed from those (every option of
            :func:`asyncrt.graph_executor.create`).
        :raises ArgumentError: for an unknown option or a bad value.
        :raises KernelNotFoundError: if a kernel is missing for its device.
        """
        if devices is None:
            devices = self.devices  # None: the host alone
        # Given at creation, the parameters are known to the planner as
        # constants: copied once to the devices that read them.
        return create(
            self.graph,
            self.lib,
            devices,
            params=self._params_blob,
            options=ExecutorOptions.of(options or self.options, **overrides),
        )

    def __getitem__(self, name: str) -> Callable[..., GraphModule]:
        """TVM's ``factory["default"](dev)``."""
        if name != "default":
            raise KeyError(f"a graph module has only 'default', not {name!r}")
        return self.create

    def export_library(self, path: str | os.PathLike[str]) -> None:
        """Write the module to one file (graph, params, kernel names).

        :raises ArtifactError: if it cannot be written.
        """
        write_artifact(
            path,
            Artifact(
                graph_json=self.get_graph_json(),
                params=self._params_blob,
                kernels=self.kernel_names,
                device_kinds=(),
                metadata=self.metadata,
            ),
        )


def build(
    graph: Graph | str | bytes | Mapping[str, Any],
    params: Mapping[str, NDArray | np.ndarray[Any, Any]] | None = None,
    lib: Module | None = None,
    *,
    devices: DeviceSpec | None = None,
    options: ExecutorOptions | None = None,
    **overrides: Unpack[OptionOverrides],
) -> GraphExecutorFactory:
    """Bundle a graph, its parameters and kernels into a factory.

    A graph from :func:`asyncrt.frontend.from_onnx` builds as it is: its
    library kernels are registered from its nodes' attributes.

    :param devices: the devices executors run on by default.
    :param options: the executor options executors start from.
    :param overrides: options changed from those (every option of
        :func:`asyncrt.graph_executor.create`, validated now).
    :raises ArgumentError: if ``params`` is not a mapping, ``lib`` not a
        :class:`~asyncrt.Module` (devices go by keyword: ``devices=``), or
        for an unknown option or a bad value.
    :raises GraphError: if the graph is malformed.
    """
    _check_params(params)
    check_lib(lib)
    loaded = graph if isinstance(graph, Graph) else load_graph(graph)
    return GraphExecutorFactory(
        loaded,
        params,
        lib,
        devices=devices,
        options=ExecutorOptions.of(options, **overrides),
    )


def load_module(
    path: str | os.PathLike[str], lib: Module | None = None
) -> GraphExecutorFactory:
    """Load a module written by :meth:`GraphExecutorFactory.export_library`.

    Kernels are found by name, in ``lib`` and then in the global registry;
    nothing from the file is executed.

    :raises ArtifactError: if the file is malformed or tampered with.
    :raises ArtifactNotFoundError: if there is no such file (also a
        :class:`FileNotFoundError`).
    :raises ArtifactIOError: if it cannot be read (also an :class:`OSError`).
    :raises ArgumentError: if ``lib`` is not a :class:`~asyncrt.Module`.
    :raises GraphError: if its graph is malformed.
    :raises ParamsError: if its params are corrupt.
    :raises KernelNotFoundError: if a kernel it needs is registered nowhere.
    """
    check_lib(lib)
    artifact = read_artifact(path)
    graph = load_graph(artifact.graph_json)
    params = load_param_dict(artifact.params)
    factory = GraphExecutorFactory(graph, params, lib, metadata=artifact.metadata)
    missing = [
        name
        for name in factory.kernel_names
        if not any(resolve(name, kind, lib) for kind in _kinds_running_kernels())
    ]
    if missing:
        raise KernelNotFoundError(
            f"{os.fspath(path)} needs kernels registered nowhere: {', '.join(missing)}"
        )
    return factory


def _check_params(params: object) -> None:
    """Refuse, where they are given, params that would only fail later (a
    file name instead of a mapping)."""
    if params is not None and not isinstance(params, Mapping):
        raise ArgumentError(
            f"params must map names to arrays, got {type(params).__name__} "
            f"{params!r:.60}; read a params file with asyncrt.load_param_dict"
        )


def _kinds_running_kernels() -> list[str]:
    """The device kinds available here whose kernels run in this process
    (a remote kind's run on its workers, found there by name)."""
    kinds = []
    for kind in registered_kinds():
        try:
            if get_api(kind).array_namespace is not None:
                kinds.append(kind)
        except DeviceNotFoundError:  # its backend does not load here
            continue
    return kinds
