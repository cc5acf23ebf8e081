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

* ``await ex.run(**inputs)`` borrows a *run context* (its own input buffers
  and arenas: every activation of one run) from a pool, so any number of
  tasks may call it at once. The pool holds at most ``max_contexts``
  contexts and, with ``memory_budget``, at most that many bytes of them (a
  context costs its arenas plus its input buffers:
  :attr:`GraphModule.context_nbytes`; one context is always allowed). Later
  callers wait their turn, first come first served. The outputs are new
  arrays that belong to the caller; with ``out=[...]`` they are copied into
  the caller's own arrays instead.
* The stateful API (``set_input`` / ``run()`` / ``get_output``) uses the
  executor's own context (outside the pool and its budget), for one caller
  at a time, as in TVM: ``get_output(i)`` is a view that the next stateful
  run overwrites. It does not mix with the pooled runs (they never touch its
  tensors), but two tasks sharing it would mix their tensors: calling
  ``set_input`` / ``run()`` / ``run_sync`` / ``load_params`` while a
  stateful run is in flight raises :class:`BusyError`.

Parameters (``load_params``) are shared read-only by every context. They
change in place, so changing them (``load_params``, ``share_params``, or
``set_input`` of a parameter's name) while any run is in flight raises
:class:`BusyError` rather than let that run read half-old, half-new values.

Cancelling a run (a cancelled task or scope, a timeout) stops launching its
work, lets in-flight kernels drain, returns its context to the pool, and
re-raises the cancellation. A kernel that raises fails only its own run, with
:class:`NodeFailedError` (:class:`NodeOutOfMemoryError` when a device ran
out of memory) naming the node, op, device and stream. ``close()`` (or
leaving ``async with``) stops the runs in flight — each raises
:class:`ClosedResourceError` once its in-flight kernels have drained —
wakes the callers waiting for a context with the same error, and releases
every thread, stream and arena; ``await aclose()`` also waits until the runs
in flight are gone.

The executor belongs to one event loop (asyncio, uvloop or trio): call it
from that loop's tasks, or from a thread without a loop through
:meth:`GraphModule.run_sync`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import numpy as np
from typing_extensions import Unpack

from devices import Device, NDArray
from scheduler.plan import Plan

from ._devices import host
from .errors import ArgumentError, InputError, UnsupportedOperationError
from .graph import Graph, SymbolicGraph, load_graph
from .io._params import decode_params
from .ops._kernels import Module
from .runtime._context import ContextPool, RunContext
from .runtime._core import AnyContext, ExecutorCore
from .runtime._options import ExecutorOptions, OptionOverrides
from .runtime._plan_cache import CacheStats
from .runtime._polymorphic import PolymorphicCore
from .tools import _benchmark
from .tools._time_evaluator import BenchmarkResult, Progress

__all__ = (
    "DeviceSpec",
    "ExecutorOptions",
    "GraphModule",
    "Params",
    "create",
    "parse_devices",
)

DeviceSpec = Device | str | Sequence[Device | str]
#: Parameters: a blob in TVM's params format, or arrays by name.
Params = bytes | bytearray | Mapping[str, Any]
#: What ``run(out=...)`` fills: NDArrays (any device) or writable,
#: C-contiguous numpy arrays.
OutArray = TypeVar("OutArray", NDArray, "np.ndarray[Any, Any]")


def create(
    graph: Graph | SymbolicGraph | str | bytes | Mapping[str, Any],
    lib: Module | None = None,
    devices: DeviceSpec | None = None,
    *,
    params: Params | None = None,
    options: ExecutorOptions | None = None,
    **overrides: Unpack[OptionOverrides],
) -> GraphModule:
    """Create an executor (TVM's ``graph_executor.create``).

    The executor's options are one :class:`ExecutorOptions` (``options=``),
    keyword overrides of its fields, or both; every field has the fast,
    safe default, and each is documented there: ``max_contexts``,
    ``memory_budget``, ``policy``, ``max_streams``, ``fuse``, ``split``,
    ``split_min_bytes``, ``kernel_threads``, ``processes``,
    ``worker_imports``, ``worker_nice``, ``worker_env``, ``worker_blas``.

    :param graph: graph JSON text or bytes, a parsed dict, a path, or a
        :class:`~asyncrt.graph.Graph`.
    :param lib: kernels looked up before the global registry; ``None`` means
        the global registry only.
    :param devices: one device or a list; the first faces the host.
        ``None``: the host alone (``asyncrt.cpu()``).
    :param params: parameters to load now (as :meth:`GraphModule.load_params`
        takes them). The planner then knows them as constants: a parameter
        read on another device is copied there once, when loaded, instead of
        on every run.
    :param options: the options to start from (default: the defaults).
    :param overrides: options changed from ``options``.
    :raises ArgumentError: for an unknown option or a bad value (named, with
        the accepted values), a ``lib`` that is not a :class:`Module`, or
        ``processes`` with a ``lib``.
    :raises GraphError: if the graph is malformed.
    :raises KernelNotFoundError: if a node's kernel is missing for its device.
    :raises PlanError: if the graph cannot be planned on these devices.
    """
    return GraphModule(
        _graph(graph),
        lib,
        parse_devices(devices),
        ExecutorOptions.of(options, **overrides),
        params=params,
    )


def _graph(
    graph: Graph | SymbolicGraph | str | bytes | Mapping[str, Any],
) -> Graph | SymbolicGraph:
    if isinstance(graph, (Graph, SymbolicGraph)):
        return graph
    return load_graph(graph)


def parse_devices(spec: DeviceSpec | None) -> tuple[Device, ...]:
    """The devices of ``spec`` (``None``: the host alone).

    :raises ArgumentError: for something that is not a device or its name.
    """
    if spec is None:
        return (host(),)
    if isinstance(spec, (Device, str)):
        items: list[object] = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        items = [spec]  # refused below, by its type
    devices = []
    for item in items:
        if isinstance(item, Device):
            devices.append(item)
        elif isinstance(item, str):
            devices.append(Device.parse(item))
        else:
            raise ArgumentError(
                f"devices must be a device, a name such as 'cpu' or 'cuda:0', or "
                f"a list of them, got {type(item).__name__}"
            )
    if not devices:
        raise ArgumentError("devices must name at least one device")
    return tuple(devices)


def check_lib(lib: object) -> Module | None:
    """``lib``, checked to be a kernel :class:`Module` or ``None``.

    :raises ArgumentError: otherwise (a device passed where ``lib`` goes is
        the usual slip: ``build(graph, params, asyncrt.cpu())``).
    """
    if lib is None or isinstance(lib, Module):
        return lib
    hint = (
        "; devices go by keyword: devices=..."
        if isinstance(lib, (Device, str, list, tuple))
        else ""
    )
    raise ArgumentError(
        f"lib must be an asyncrt.Module or None, got {type(lib).__name__} "
        f"{lib!r:.60}{hint}"
    )


class GraphModule:
    """A graph ready to run on devices; see the module docstring.

    Use :func:`create` rather than this constructor.

    :param graph: the graph.
    :param lib: kernels looked up before the global registry.
    :param devices: the devices, host-facing first.
    :param options: the executor's options.
    :param params: parameters to load now.
    :param on_context: called with every run context made in this process
        (the debug executor traces them).
    """

    def __init__(
        self,
        graph: Graph | SymbolicGraph,
        lib: Module | None,
        devices: Sequence[Device],
        options: ExecutorOptions,
        *,
        params: Params | None = None,
        on_context: Callable[[RunContext], None] | None = None,
    ) -> None:
        values = (
            decode_params(params) if isinstance(params, (bytes, bytearray)) else params
        )
        self.graph = graph
        self._core: ExecutorCore | PolymorphicCore
        if isinstance(graph, SymbolicGraph):
            if on_context is not None:
                raise UnsupportedOperationError(
                    "tracing every context (the debug executor) needs static "
                    "shapes: import the model with shape_dict= to fix its "
                    "symbolic dimensions"
                )
            self._core = PolymorphicCore(
                graph, check_lib(lib), devices, options, values
            )
        else:
            self._core = ExecutorCore(
                graph, check_lib(lib), devices, options, values, on_context=on_context
            )

    # -- what was built ------------------------------------------------------------

    @property
    def core(self) -> ExecutorCore:
        """The executor core behind this facade (for asyncrt's own tools:
        the debug executor, worker processes); not for applications.

        :raises UnsupportedOperationError: for a graph with symbolic shapes
            (one core per shape signature).
        """
        if not isinstance(self._core, ExecutorCore):
            raise UnsupportedOperationError(
                "a graph with symbolic shapes has one executor core per shape signature"
            )
        return self._core

    def plan_cache_stats(self) -> CacheStats | None:
        """The plan cache's figures for a graph with symbolic shapes (hits,
        misses, requests that joined a build in flight, builds, failures,
        evictions, build seconds), or ``None`` for a static graph (one plan,
        made by ``create``)."""
        if isinstance(self._core, PolymorphicCore):
            return self._core.stats
        return None

    @property
    def options(self) -> ExecutorOptions:
        """The options this executor was made with."""
        return self._core.options

    @property
    def plan(self) -> Plan:
        """The plan (placement, streams, events, storage, copies)."""
        return self._core.plan

    @property
    def context_nbytes(self) -> int:
        """Device bytes one run context costs (arenas and input buffers):
        what ``memory_budget`` is counted in."""
        return self._core.context_nbytes

    @property
    def pool(self) -> ContextPool[AnyContext]:
        """The pool of run contexts (to inspect: ``size``, ``idle``,
        ``lent``, ``waiting``, ``nbytes``, ``limit``, ``budget``)."""
        return self._core.pool

    @property
    def worker_blas(self) -> str | None:
        """The OpenBLAS kernel set the workers load: a set's name,
        ``"default"`` (OpenBLAS's own choice), or ``None`` where there are
        no workers or ``"auto"`` has not timed the graph yet (it does before
        the first pooled run)."""
        return self._core.backend.blas

    @property
    def worker_blas_timing(self) -> Mapping[str, float] | None:
        """The median run seconds per kernel set that ``"auto"`` measured,
        or ``None`` if it timed nothing."""
        return self._core.backend.blas_timing

    # -- inputs ------------------------------------------------------------------

    def get_num_inputs(self) -> int:
        """How many graph inputs there are (parameters included, as in TVM)."""
        return len(self._core.input_names())

    def get_num_outputs(self) -> int:
        """How many outputs the graph has."""
        return self._core.num_outputs()

    def get_input_index(self, name: str) -> int:
        """The index of the input called ``name``, or -1 (TVM's convention)."""
        names = self._core.input_names()
        return names.index(name) if name in names else -1

    def get_input_info(
        self,
    ) -> tuple[dict[str, tuple[int | str, ...]], dict[str, str]]:
        """Shapes and dtypes of the inputs by name (TVM's ``get_input_info``);
        a symbolic graph's symbolic dimensions are their symbols' names."""
        return self._core.input_info()

    def set_input(
        self, key: int | str | None = None, value: Any = None, **params: Any
    ) -> None:
        """Set inputs by name or index, or by keywords (TVM's ``set_input``).

        Values may be NDArrays (on any device; they are copied), numpy
        arrays, DLPack tensors or nested lists. Setting a parameter's name
        changes that parameter for every run.

        :raises InputError: for an unknown name or index, or a value whose
            shape or dtype does not match the graph.
        :raises BusyError: while a stateful run is in flight (or, for a
            parameter, any run).
        """
        values = dict(params)
        if key is not None:
            name = self._name(key)
            if name in values:
                raise InputError(f"input {name!r} given twice")
            values = {name: value, **values}
        self._core.set_inputs(values)

    def get_input(self, key: int | str) -> NDArray:
        """The executor's own input array (TVM's ``get_input``). For a
        parameter it is the parameter itself: change it through
        :meth:`set_input` or :meth:`load_params`, not by writing into it
        (kernels may have packed it when they were bound, as TVM's
        compiled modules fold parameters in).

        :raises InputError: for an unknown name or index.
        """
        return self._core.input_array(self._name(key))

    def _name(self, key: int | str) -> str:
        return self._core.input_name(key)

    def load_params(self, params: Params) -> None:
        """Load parameters: a blob in TVM's format, or a name -> array map.

        Parameters become shared, read-only arrays that every run context
        binds; contexts made before are rebuilt.

        :raises ParamsError: if the blob is corrupt.
        :raises InputError: for a name the graph has no input for, or a
            shape or dtype mismatch.
        :raises BusyError: while runs are in flight.
        """
        self._core.check_open()
        values = (
            decode_params(params) if isinstance(params, (bytes, bytearray)) else params
        )
        self._core.load_params(values)

    def share_params(self, other: GraphModule, params_bytes: bytes) -> None:
        """Use ``other``'s parameter arrays (no copy) for the names in
        ``params_bytes`` (TVM's ``share_params``).

        :raises InputError: if a name is unknown or the shapes differ.
        :raises BusyError: while runs are in flight.
        """
        self._core.check_open()
        arrays = {}
        for name in decode_params(params_bytes):
            self._core.input_name(name)
            if name not in other._core.parameters:
                raise InputError(f"the other executor has no parameter {name!r} loaded")
            arrays[name] = other._core.parameters.host_array(name)
        self._core.share_params(arrays)

    # -- running -----------------------------------------------------------------

    @overload
    async def run(self, *, out: None = None, **inputs: Any) -> list[NDArray]: ...

    @overload
    async def run(
        self, *, out: Sequence[OutArray], **inputs: Any
    ) -> list[OutArray]: ...

    async def run(
        self, *, out: Sequence[Any] | None = None, **inputs: Any
    ) -> list[Any]:
        """Run the graph and return its outputs.

        With keyword inputs, runs in a pooled context (safe for many
        concurrent callers) and returns the outputs as new arrays on the
        host-facing device, which belong to the caller. Without, runs the
        stateful context after ``set_input`` (TVM's ``run()``) and returns
        the executor's own output arrays, as :meth:`get_output` does: views
        that the next stateful run overwrites.

        :param out: one array per output to copy the outputs into instead
            (NDArrays on any device, or writable C-contiguous numpy arrays);
            the run then returns ``out`` as a list. (So no graph input can
            be passed by the name ``out``; use the stateful API for one.)
        :raises InputError: for missing, unknown or mismatched inputs, or
            ``out`` arrays of the wrong number, shape or dtype.
        :raises NodeFailedError: if a kernel raised (chained, its reason in
            the message); :class:`NodeOutOfMemoryError` if it ran out of
            device memory.
        :raises OutOfMemoryError: if a device has no room for the first run
            context, or for the outputs.
        :raises BusyError: for a stateful run while another is in flight.
        :raises ClosedResourceError: if the executor is closed, or gets
            closed before this run returns.
        """
        core = self._core
        core.check_open()
        targets = None if out is None else core.check_out(out)
        if inputs:
            return await core.run_pooled(inputs, targets)
        await core.run_own()
        if targets is None:
            return self._own_outputs()
        return core.own_outputs(targets)

    def run_sync(self, **inputs: Any) -> list[NDArray]:
        """:meth:`run` for callers without an event loop: blocks the thread.

        It uses the executor's own context (one caller at a time): with
        inputs it returns the outputs as new arrays; without, the
        executor's own output arrays (as :meth:`get_output`).

        :raises InputError: for missing, unknown or mismatched inputs.
        :raises NodeFailedError: if a kernel raised (chained);
            :class:`NodeOutOfMemoryError` if it ran out of device memory.
        :raises BusyError: while another stateful run is in flight.
        :raises ClosedResourceError: if the executor is closed.
        """
        outputs = self._core.run_own_sync(inputs)
        return self._own_outputs() if outputs is None else outputs

    def _own_outputs(self) -> list[NDArray]:
        return [self._core.output(i) for i in range(self._core.num_outputs())]

    def get_output(self, index: int, out: NDArray | None = None) -> NDArray:
        """Output ``index`` of the last stateful run (TVM's ``get_output``).

        Without ``out`` this is the executor's own array, overwritten by the
        next stateful run; with ``out``, the data is copied into it. Before
        any stateful run its contents are undefined (uninitialised memory).

        :raises InputError: if ``index`` is out of range.
        """
        array = self._core.output(index)
        return array if out is None else out.copyfrom(array)

    # -- benchmarking --------------------------------------------------------------

    def benchmark(
        self,
        device: Device | str | None = None,
        repeat: int = 5,
        number: int = 5,
        min_repeat_ms: float | None = None,
        end_to_end: bool = False,
        *,
        progress: Progress | None = None,
        **inputs: Any,
    ) -> BenchmarkResult:
        """Time runs of the graph (TVM's ``benchmark``), blocking the thread.

        One warm-up run, then ``repeat`` measurements of ``number`` runs
        each, ``number`` growing until a measurement lasts ``min_repeat_ms``
        (:func:`asyncrt.time_evaluator`). Without ``end_to_end`` the inputs
        are set once and the stateful run is timed (no copies counted); with
        it, each run copies its inputs in and its outputs out.

        :param device: TVM's device argument: checked to be one of the
            executor's (the plan decides where nodes run).
        :param progress: called after each measurement with (done, repeat).
        :return: seconds per run: ``mean``, ``median``, ``std``, ``min``,
            ``max`` and the raw ``results``.
        :raises ArgumentError: for a bad count, duration or device.
        :raises InputError: for bad or missing inputs.
        :raises NodeFailedError: if a kernel failed.
        """
        times = (repeat, number, min_repeat_ms)
        return _benchmark.evaluator(
            self, device, times, end_to_end, progress, inputs, awaited=False
        )()

    async def abenchmark(
        self,
        device: Device | str | None = None,
        repeat: int = 5,
        number: int = 5,
        min_repeat_ms: float | None = None,
        end_to_end: bool = False,
        *,
        progress: Progress | None = None,
        **inputs: Any,
    ) -> BenchmarkResult:
        """:meth:`benchmark` for async code: awaits the runs, so the event
        loop keeps serving other tasks (and coroutine kernels work)."""
        times = (repeat, number, min_repeat_ms)
        return await _benchmark.evaluator(
            self, device, times, end_to_end, progress, inputs, awaited=True
        ).acall()

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Close the executor. Idempotent; safe while runs are in flight.

        Runs in flight are stopped: each drains its in-flight kernels and
        raises :class:`ClosedResourceError`, and its context is freed as it
        comes back; callers waiting for a context get the same error. Idle
        contexts' threads, streams and memory are released now. Later calls
        raise :class:`ClosedResourceError`. Use :meth:`aclose` to also wait
        until every run in flight is gone. An executor collected without
        ``close()`` is closed then, with a ``ResourceWarning``.
        """
        self._core.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the runs in flight have drained,
        raised and given their contexts back (so every thread and stream is
        gone when this returns). Idempotent."""
        await self._core.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._core.closed

    async def __aenter__(self) -> GraphModule:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> GraphModule:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
