"""A graph compiled for its devices: the DAG, its Plan and a kernel per launch.

:func:`compile_graph` does, once, everything a run must not do: it turns the
graph into the scheduler's DAG, annotates each node's work, fuses
elementwise chains (if asked), plans placement, streams, events, storage
and copies, and resolves a kernel for every launch. The result, a
:class:`CompiledGraph`, is immutable and knows the graph's inputs and
outputs by name; run contexts (:mod:`asyncrt.runtime._context`) bind to it.

A compiled graph is what one *shape signature* of a graph runs: the
executor core keeps one per signature it has seen.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from devices import Device, NDArray, from_dlpack, get_api, numpy_dtype
from scheduler.dag import Entry, TensorSpec, node_spec
from scheduler.dispatch import Kernel
from scheduler.plan import Plan
from scheduler.planner import plan_graph
from scheduler.split import RowSplit

from ..errors import InputError, KernelNotFoundError
from ..graph import Graph, to_dag
from ..ops import register_graph_kernels
from ..ops._fusion import elementwise_predicate, fuse_graph
from ..ops._kernels import Module, resolve
from ..ops._library import calls_blas
from ..ops._work import annotate_work
from ._options import ExecutorOptions

__all__ = ("CompiledGraph", "HostValue", "compile_graph")

#: An input value, checked: an NDArray (any device) or a host array.
HostValue = NDArray | np.ndarray[Any, Any]

#: How many missing kernels an error lists before "and N more".
_SHOWN = 10


@dataclass(frozen=True, eq=False)
class CompiledGraph:
    """A graph planned onto devices, every kernel resolved.

    :ivar graph: the graph as given (before fusion).
    :ivar dag: the DAG that was planned (fused, when fusion was asked for).
    :ivar plan: the plan.
    :ivar kernels: the kernel of each kernel launch, by node id.
    :ivar params: names of the graph inputs bound to parameters.
    """

    graph: Graph
    dag: nx.DiGraph
    plan: Plan
    kernels: dict[int, Kernel]
    params: frozenset[str]

    @cached_property
    def host_blas(self) -> bool:
        """Whether a kernel on the host's cores calls BLAS."""
        return any(
            get_api(self.plan.placement[launch.nid].kind).is_host
            and calls_blas(launch.func_name)
            for launch in self.plan.kernel_launches()
        )

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        """Every graph input's name, parameters included (TVM's order)."""
        return tuple(node_spec(self.dag, nid).name for nid in self.plan.inputs)

    @cached_property
    def input_entries(self) -> dict[str, Entry]:
        """Each graph input's entry, by name (parameters included)."""
        return {
            name: Entry(nid, 0)
            for name, nid in zip(self.input_names, self.plan.inputs, strict=True)
        }

    @cached_property
    def caller_inputs(self) -> tuple[str, ...]:
        """The inputs a caller gives (every graph input that is no
        parameter), in graph order."""
        return tuple(name for name in self.input_names if name not in self.params)

    @property
    def heads(self) -> tuple[Entry, ...]:
        """The graph's outputs, in order (on the host-facing device)."""
        return self.plan.heads

    def name_of(self, entry: Entry) -> str:
        """The name of the node that produces ``entry``."""
        return node_spec(self.dag, entry.nid).name

    def tensor(self, entry: Entry) -> TensorSpec:
        """The shape and dtype of ``entry``."""
        return self.plan.tensors[entry]

    def input_entry(self, key: int | str) -> Entry:
        """A graph input's entry, by name or index (parameters included).

        :raises InputError: for an unknown name (listing the inputs a caller
            gives, not the parameters) or an index out of range.
        """
        if isinstance(key, str):
            entry = self.input_entries.get(key)
            if entry is None:
                shown = ", ".join(self.caller_inputs) or "none"
                params = f" (and {len(self.params)} parameters)" if self.params else ""
                raise InputError(f"graph has no input {key!r}; inputs: {shown}{params}")
            return entry
        if isinstance(key, bool) or not isinstance(key, int):
            raise InputError(f"an input is a name or an index, not {key!r}")
        if not 0 <= key < len(self.input_names):
            raise InputError(
                f"input index {key} out of range (graph has "
                f"{len(self.input_names)} inputs)"
            )
        return Entry(self.plan.inputs[key], 0)

    def check_value(self, entry: Entry, value: Any) -> HostValue:
        """Check an input value against the graph; return an NDArray or a
        host array.

        :raises InputError: if it cannot be made an array, or its shape or
            dtype is not the graph's.
        """
        spec = self.tensor(entry)
        name = self.name_of(entry)
        if isinstance(value, (NDArray, np.ndarray)):
            array: HostValue = value
        elif hasattr(value, "__dlpack__"):
            array = from_dlpack(value)
        else:
            try:
                array = np.asarray(value, dtype=numpy_dtype(spec.dtype))
            except (TypeError, ValueError) as exc:
                raise InputError(
                    f"input {name!r}: cannot use {value!r}: {exc}"
                ) from exc
        shape = tuple(array.shape)
        dtype = array.dtype if isinstance(array, NDArray) else str(array.dtype)
        if dtype == "bool_":
            dtype = "bool"
        if shape != spec.shape:
            raise InputError(f"input {name!r} expects shape {spec.shape}, got {shape}")
        if dtype != spec.dtype:
            raise InputError(f"input {name!r} expects dtype {spec.dtype}, got {dtype}")
        return array

    def check_out(self, out: Sequence[Any]) -> list[Any]:
        """``out=`` arrays, checked against the outputs.

        :raises InputError: for the wrong number, shape, dtype or kind.
        """
        heads = self.heads
        targets = list(out)
        if len(targets) != len(heads):
            raise InputError(
                f"out= needs {len(heads)} arrays (one per output), got {len(targets)}"
            )
        for index, (target, head) in enumerate(zip(targets, heads, strict=True)):
            spec = self.tensor(head)
            if isinstance(target, NDArray):
                shape, dtype = target.shape, target.dtype
            elif isinstance(target, np.ndarray):
                if not (target.flags.writeable and target.flags.c_contiguous):
                    raise InputError(
                        f"out[{index}] must be a writable, C-contiguous array"
                    )
                shape, dtype = target.shape, str(target.dtype)
                dtype = "bool" if dtype == "bool_" else dtype
            else:
                raise InputError(
                    f"out[{index}] must be an NDArray or a numpy array, "
                    f"got {type(target).__name__}"
                )
            if tuple(shape) != spec.shape or dtype != spec.dtype:
                raise InputError(
                    f"out[{index}] must have shape {spec.shape} and dtype "
                    f"{spec.dtype}, got {tuple(shape)} {dtype}"
                )
        return targets


def compile_graph(
    graph: Graph,
    lib: Module | None,
    devices: Sequence[Device],
    options: ExecutorOptions,
    params: Collection[str] = (),
) -> CompiledGraph:
    """Plan ``graph`` onto ``devices`` and resolve its kernels.

    :param graph: a validated graph.
    :param lib: kernels looked up before the global registry.
    :param devices: the devices, host-facing first.
    :param options: the executor's options (policy, streams, fusion, split).
    :param params: names of the inputs bound to parameters (constants the
        planner may copy once to the devices that read them).
    :raises GraphError: if a name in ``params`` is not an input node.
    :raises KernelNotFoundError: if a node's kernel exists for none of the
        devices, or for the device the plan chose.
    :raises PlanError: if the graph cannot be planned on these devices.
    """
    register_graph_kernels(graph)  # in any process that loads the graph
    dag = to_dag(graph, tuple(params))
    annotate_work(dag, lib)
    engine = options.fuse_engine
    if engine is not None:
        dag, lib = fuse_graph(dag, lib, devices, engine, exact=options.fuse == "auto")
    _check_runnable(dag, devices, lib)

    def supported(nid: int, device: Device) -> bool:
        return _find(node_spec(dag, nid).func_name, device, lib) is not None

    split = None
    if options.split:
        split = RowSplit(elementwise_predicate(lib, devices), options.split_min_bytes)
    plan = plan_graph(
        dag,
        devices,
        policy=options.policy,
        max_streams=options.max_streams,
        supported=supported,
        split=split,
    )
    return CompiledGraph(graph, dag, plan, _kernels(plan, lib), frozenset(params))


def _find(name: str, device: Device, lib: Module | None) -> Kernel | None:
    return resolve(name, device.kind, lib)


def _check_runnable(
    dag: nx.DiGraph, devices: Sequence[Device], lib: Module | None
) -> None:
    """Name the kernels that exist on none of the devices before planning
    (the planner alone could only say that a node runs nowhere)."""
    missing: dict[str, list[str]] = {}
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        if spec.is_null or spec.is_nop:
            continue
        pinned = spec.device is not None
        candidates = [spec.device] if spec.device is not None else devices
        if not any(_find(spec.func_name, d, lib) is not None for d in candidates):
            where = f" (pinned to {spec.device})" if pinned else ""
            missing.setdefault(spec.func_name, []).append(f"{spec.name!r}{where}")
    if missing:
        on = ", ".join(str(d) for d in devices)
        parts = [
            f"{name!r} for node {nodes[0]}"
            + (f" and {len(nodes) - 1} more" if len(nodes) > 1 else "")
            for name, nodes in sorted(missing.items())
        ]
        raise KernelNotFoundError(
            f"kernels not found on {on}: {_listed(parts)}; register them with "
            "asyncrt.register_func, pass them in lib, or (command line) "
            "--import the module that registers them"
        )


def _kernels(plan: Plan, lib: Module | None) -> dict[int, Kernel]:
    kernels: dict[int, Kernel] = {}
    missing: list[str] = []
    for launch in plan.kernel_launches():
        device = plan.placement[launch.nid]
        kernel = _find(launch.func_name, device, lib)
        if kernel is None:
            missing.append(f"{launch.name!r} needs {launch.func_name!r} on {device}")
        else:
            kernels[launch.nid] = kernel
    if missing:
        raise KernelNotFoundError(f"kernels not found: {_listed(missing)}")
    return kernels


def _listed(items: Sequence[str]) -> str:
    shown = "; ".join(items[:_SHOWN])
    more = len(items) - _SHOWN
    return shown + (f" (and {more} more)" if more > 0 else "")
