"""The graph executor: TVM's ``GraphModule`` API with an awaitable ``run``.

.. code-block:: python

    ex = asyncrt.graph_executor.create(graph_json, lib, asyncrt.cpu())
    ex.load_params(params_bytes)
    outputs = await ex.run(x=data)          # one call, outputs are yours

    ex.set_input("x", data)                 # or TVM's stateful style
    await ex.run()
    y = ex.get_output(0)

Everything is decided when the executor is created: the graph is validated,
every kernel resolved (a missing one is an error now, not at run time), the
plan computed. A run only copies inputs in, launches pre-bound calls onto the
device streams and awaits their completion.

Two ways to run, and what they mean under concurrency:

* ``await ex.run(**inputs)`` borrows a run context from a pool (at most
  ``max_contexts``; later callers wait their turn, first come first served),
  so any number of tasks may call it at once. It returns new arrays that
  belong to the caller.
* The stateful API (``set_input`` / ``run()`` / ``get_output``) uses the
  executor's own context, for one caller at a time, as in TVM. Starting a
  stateful run while another is in flight raises :class:`BusyError` rather
  than mixing two callers' tensors.

Parameters (``load_params``) are shared read-only by every context.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from devices import Device, NDArray, empty, from_dlpack, numpy_dtype
from scheduler.dag import Entry, graph_spec, node_spec
from scheduler.dispatch import Kernel
from scheduler.placement import Policy
from scheduler.plan import Plan
from scheduler.planner import plan_graph

from ._context import ContextPool, RunContext
from ._kernels import Module, resolve
from ._params import decode_params
from ._work import annotate_work
from .errors import BusyError, ClosedResourceError, InputError, KernelNotFoundError
from .graph import Graph, load_graph, to_dag

__all__ = ("GraphModule", "create")

DeviceSpec = Device | str | Sequence[Device | str]


def create(
    graph: Graph | str | bytes | Mapping[str, Any],
    lib: Module | None = None,
    devices: DeviceSpec = "cpu",
    *,
    max_contexts: int = 4,
    policy: str | Policy = "auto",
    max_streams: int = 1,
) -> GraphModule:
    """Create an executor (TVM's ``graph_executor.create``).

    :param graph: graph JSON text or bytes, a parsed dict, a path, or a
        :class:`~asyncrt.graph.Graph`.
    :param lib: kernels looked up before the global registry; ``None`` means
        the global registry only.
    :param devices: one device or a list; the first faces the host.
    :param max_contexts: how many runs may be in flight at once.
    :param policy: how nodes are placed on several devices: ``"auto"`` (the
        better of HEFT and PEFT, never worse than the fastest single
        device), ``"heft"``, ``"peft"``, ``"fastest"``, ``"single"``, or a
        callable (:data:`scheduler.placement.Policy`).
    :param max_streams: compute streams per device; independent branches
        run on different streams.
    :raises GraphError: if the graph is malformed.
    :raises KernelNotFoundError: if a node's kernel is missing for its device.
    :raises PlanError: if the graph cannot be planned on these devices.
    """
    loaded = graph if isinstance(graph, Graph) else load_graph(graph)
    return GraphModule(
        loaded,
        lib,
        _devices(devices),
        max_contexts=max_contexts,
        policy=policy,
        max_streams=max_streams,
    )


def _devices(spec: DeviceSpec) -> tuple[Device, ...]:
    items = [spec] if isinstance(spec, (Device, str)) else list(spec)
    return tuple(d if isinstance(d, Device) else Device.parse(d) for d in items)


class GraphModule:
    """A graph ready to run on devices; see the module docstring.

    Use :func:`create` rather than this constructor.
    """

    def __init__(
        self,
        graph: Graph,
        lib: Module | None,
        devices: Sequence[Device],
        *,
        max_contexts: int = 4,
        policy: str | Policy = "auto",
        max_streams: int = 1,
    ) -> None:
        self.graph = graph
        self._dag = to_dag(graph)
        annotate_work(self._dag, lib)

        def supported(nid: int, device: Device) -> bool:
            spec = node_spec(self._dag, nid)
            return resolve(spec.func_name, device.kind, lib) is not None

        self.plan: Plan = plan_graph(
            self._dag,
            devices,
            policy=policy,
            max_streams=max_streams,
            supported=supported,
        )
        self._kernels = self._resolve_kernels(lib)
        spec = graph_spec(self._dag)
        self._input_nids: tuple[int, ...] = self.plan.inputs
        self._input_names = [node_spec(self._dag, n).name for n in self._input_nids]
        self._index_of = {name: i for i, name in enumerate(self._input_names)}
        self._heads = spec.heads
        self._params: dict[Entry, NDArray] = {}
        self._all_inputs = frozenset(Entry(n, 0) for n in self._input_nids)
        # Inputs a run must be given: every graph input that is no parameter.
        self._required_inputs = self._all_inputs
        self._lock = threading.Lock()
        self._stateful_busy = False
        self._closed = False
        self._pool = ContextPool(self._new_context, max_contexts)
        self._generation = 0
        self._own: RunContext | None = None

    # -- building --------------------------------------------------------------

    def _resolve_kernels(self, lib: Module | None) -> dict[int, Kernel]:
        kernels: dict[int, Kernel] = {}
        missing: list[str] = []
        for launch in self.plan.launches():
            if launch.func_name == "__copy":
                continue
            kind = self.plan.placement[launch.nid].kind
            kernel = resolve(launch.func_name, kind, lib)
            if kernel is None:
                missing.append(f"{launch.name!r} needs {launch.func_name!r} on {kind}")
            else:
                kernels[launch.nid] = kernel
        if missing:
            shown = "; ".join(missing[:10])
            more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
            raise KernelNotFoundError(f"kernels not found: {shown}{more}")
        return kernels

    def _new_context(self) -> RunContext:
        owned = tuple(n for n in self._input_nids if Entry(n, 0) not in self._params)
        context = RunContext(self.plan, self._kernels, owned, self._params)
        context.generation = self._generation
        return context

    def _own_context(self) -> RunContext:
        if self._own is None or self._own.generation != self._generation:
            previous = self._own
            self._own = self._new_context()
            if previous is not None:
                for entry in previous.is_set & self._own.inputs.keys():
                    self._own.inputs[entry].copyfrom(previous.inputs[entry])
                    self._own.is_set.add(entry)
                previous.close()
        return self._own

    # -- inputs ------------------------------------------------------------------

    def get_num_inputs(self) -> int:
        """How many graph inputs there are (parameters included, as in TVM)."""
        return len(self._input_nids)

    def get_num_outputs(self) -> int:
        """How many outputs the graph has."""
        return len(self._heads)

    def get_input_index(self, name: str) -> int:
        """The index of the input called ``name``, or -1 (TVM's convention)."""
        return self._index_of.get(name, -1)

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """Shapes and dtypes of the inputs by name (TVM's ``get_input_info``)."""
        shapes, dtypes = {}, {}
        for nid, name in zip(self._input_nids, self._input_names, strict=True):
            spec = self.plan.tensors[Entry(nid, 0)]
            shapes[name], dtypes[name] = spec.shape, spec.dtype
        return shapes, dtypes

    def _input_entry(self, key: int | str) -> Entry:
        if isinstance(key, str):
            index = self._index_of.get(key)
            if index is None:
                known = ", ".join(self._input_names)
                raise InputError(f"graph has no input {key!r}; inputs: {known}")
        else:
            index = int(key)
            if not 0 <= index < len(self._input_nids):
                raise InputError(
                    f"input index {index} out of range (graph has "
                    f"{len(self._input_nids)} inputs)"
                )
        return Entry(self._input_nids[index], 0)

    def _input_name(self, entry: Entry) -> str:
        return node_spec(self._dag, entry.nid).name

    def _check_value(self, entry: Entry, value: Any) -> NDArray | np.ndarray[Any, Any]:
        """Check an input against the graph; return an NDArray or host array."""
        spec = self.plan.tensors[entry]
        name = self._input_name(entry)
        if isinstance(value, NDArray):
            array: NDArray | np.ndarray[Any, Any] = value
        elif isinstance(value, np.ndarray):
            array = value
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

    def set_input(
        self, key: int | str | None = None, value: Any = None, **params: Any
    ) -> None:
        """Set inputs by name or index, or by keywords (TVM's ``set_input``).

        Values may be NDArrays (on any device; they are copied), numpy
        arrays, DLPack tensors or nested lists. Setting a parameter's name
        changes that parameter for every run.

        :raises InputError: for an unknown name or index, or a value whose
            shape or dtype does not match the graph.
        """
        self._check_open()
        items: list[tuple[int | str, Any]] = list(params.items())
        if key is not None:
            items.insert(0, (key, value))
        checked = [(self._input_entry(k), v) for k, v in items]
        checked = [(e, self._check_value(e, v)) for e, v in checked]
        self._check_not_busy()
        context = self._own_context()
        for entry, array in checked:
            target = self._params.get(entry)
            (target if target is not None else context.inputs[entry]).copyfrom(array)
            context.is_set.add(entry)

    def get_input(self, key: int | str) -> NDArray:
        """The executor's own input array (TVM's ``get_input``)."""
        entry = self._input_entry(key)
        if entry in self._params:
            return self._params[entry]
        return self._own_context().inputs[entry]

    def load_params(self, params: bytes | bytearray | Mapping[str, Any]) -> None:
        """Load parameters: a blob in TVM's format, or a name -> array map.

        Parameters become shared, read-only arrays that every run context
        binds; contexts made before are rebuilt.

        :raises ParamsError: if the blob is corrupt.
        :raises InputError: for a name the graph has no input for, or a
            shape or dtype mismatch.
        """
        self._check_open()
        values = (
            decode_params(params) if isinstance(params, (bytes, bytearray)) else params
        )
        checked = []
        for name, value in values.items():
            entry = self._input_entry(name)
            checked.append((entry, self._check_value(entry, value)))
        self._check_not_busy()
        for entry, array in checked:
            if entry not in self._params:
                spec = self.plan.tensors[entry]
                self._params[entry] = empty(
                    spec.shape, spec.dtype, self.plan.storage[entry].device
                )
            self._params[entry].copyfrom(array)
        self._rebind()

    def share_params(self, other: GraphModule, params_bytes: bytes) -> None:
        """Use ``other``'s parameter arrays (no copy) for the names in
        ``params_bytes`` (TVM's ``share_params``).

        :raises InputError: if a name is unknown or the shapes differ.
        """
        self._check_open()
        names = decode_params(params_bytes).keys()
        for name in names:
            entry = self._input_entry(name)
            source_entry = other._input_entry(name)
            shared = other._params.get(source_entry)
            if shared is None:
                raise InputError(f"the other executor has no parameter {name!r} loaded")
            self._check_value(entry, shared)
            self._params[entry] = shared
        self._rebind()

    def _rebind(self) -> None:
        self._generation += 1
        self._required_inputs = self._all_inputs - self._params.keys()
        self._pool.clear_idle()

    # -- running -----------------------------------------------------------------

    async def run(self, **inputs: Any) -> list[NDArray] | None:
        """Run the graph.

        With keyword inputs, runs in a pooled context (safe for many
        concurrent callers) and returns the outputs as new arrays on the
        host-facing device. Without, runs the stateful context after
        ``set_input`` and returns ``None``; read results with
        :meth:`get_output`.

        :raises InputError: for missing, unknown or mismatched inputs.
        :raises NodeFailedError: if a kernel raised.
        :raises BusyError: for a stateful run while another is in flight.
        :raises ClosedResourceError: if the executor is closed.
        """
        self._check_open()
        if not inputs:
            await self._run_stateful()
            return None
        checked = self._check_run_inputs(inputs)
        context = await self._pool.acquire()
        try:
            self._fill(context, checked)
            # A failed or cancelled run drains its streams before raising,
            # so the context is fit to lend again either way.
            await context.program.run()
            return [self._copy_out(context.output(e)) for e in self._heads]
        finally:
            self._release(context)

    def _release(self, context: RunContext) -> None:
        if context.generation != self._generation:
            self._pool.discard(context)
        else:
            self._pool.release(context)

    def _check_run_inputs(self, inputs: Mapping[str, Any]) -> list[tuple[Entry, Any]]:
        checked = [(self._input_entry(k), v) for k, v in inputs.items()]
        missing = self._required_inputs.difference(e for e, _ in checked)
        if missing:
            names = sorted(self._input_name(e) for e in missing)
            raise InputError(f"inputs not given: {', '.join(names)}")
        return [(e, self._check_value(e, v)) for e, v in checked]

    def _fill(self, context: RunContext, checked: list[tuple[Entry, Any]]) -> None:
        for entry, array in checked:
            if entry in self._params:
                raise InputError(
                    f"{self._input_name(entry)!r} is a parameter; use load_params"
                )
            context.inputs[entry].copyfrom(array)

    def _copy_out(self, array: NDArray) -> NDArray:
        return array.copyto(self.plan.host)

    async def _run_stateful(self) -> None:
        self._check_not_busy()
        context = self._own_context()
        self._check_all_set(context)
        self._stateful_busy = True
        try:
            await context.program.run()
        finally:
            self._stateful_busy = False

    def _check_all_set(self, context: RunContext) -> None:
        missing = [
            self._input_name(e) for e in context.inputs if e not in context.is_set
        ]
        if missing:
            raise InputError(f"inputs never set: {', '.join(missing)}")

    def run_sync(self, **inputs: Any) -> list[NDArray] | None:
        """:meth:`run` for callers without an event loop: blocks the thread.

        It uses the executor's own context (one caller at a time).
        """
        self._check_open()
        if inputs:
            self.set_input(**inputs)
        self._check_not_busy()
        context = self._own_context()
        self._check_all_set(context)
        self._stateful_busy = True
        try:
            context.program.run_sync()
        finally:
            self._stateful_busy = False
        if inputs:
            return [self._copy_out(context.output(e)) for e in self._heads]
        return None

    def get_output(self, index: int, out: NDArray | None = None) -> NDArray:
        """Output ``index`` of the last stateful run (TVM's ``get_output``).

        Without ``out`` this is the executor's own array, overwritten by the
        next stateful run; with ``out``, the data is copied into it.

        :raises InputError: if ``index`` is out of range.
        """
        if not 0 <= index < len(self._heads):
            raise InputError(
                f"output index {index} out of range (graph has {len(self._heads)})"
            )
        array = self._own_context().output(self._heads[index])
        return array if out is None else out.copyfrom(array)

    # -- lifetime ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("this executor is closed")

    def _check_not_busy(self) -> None:
        if self._stateful_busy:
            raise BusyError(
                "a stateful run is in flight; use `await run(**inputs)` for "
                "concurrent runs"
            )

    def close(self) -> None:
        """Release every context's streams, threads and memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        if self._own is not None:
            self._own.close()
            self._own = None

    async def __aenter__(self) -> GraphModule:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def __enter__(self) -> GraphModule:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
