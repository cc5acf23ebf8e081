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

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import anyio
import numpy as np

from devices import Device, NDArray, empty, from_dlpack, get_api, numpy_dtype
from devices.sim import SimConfig, SimDeviceAPI
from scheduler.dag import Entry, node_spec
from scheduler.dispatch import Kernel, Program
from scheduler.placement import Policy
from scheduler.plan import Plan
from scheduler.planner import plan_graph
from scheduler.split import MIN_BYTES, RowSplit

from .errors import (
    ArgumentError,
    BusyError,
    ClosedResourceError,
    InputError,
    KernelNotFoundError,
    NodeFailedError,
    NodeOutOfMemoryError,
    OutOfMemoryError,
    WorkerError,
)
from .graph import Graph, load_graph, to_dag
from .io._params import decode_params
from .ops._fusion import Engine, elementwise_predicate, fuse_graph
from .ops._kernels import Module, resolve
from .ops._work import annotate_work
from .runtime import _blas_choice, _threads
from .runtime._context import ContextPool, RunContext, context_nbytes
from .runtime._host_feed import HostFeed
from .runtime._process import ProcessContext, ProcessProgram
from .runtime._process_wire import IoLayout, WorkerSpec
from .tools import _benchmark
from .tools._time_evaluator import BenchmarkResult, Progress

__all__ = ("GraphModule", "create")

DeviceSpec = Device | str | Sequence[Device | str]
#: A pooled run context: in this process, or in a worker process.
_AnyContext = RunContext | ProcessContext
#: What ``run(out=...)`` fills: NDArrays (any device) or writable,
#: C-contiguous numpy arrays.
OutArray = TypeVar("OutArray", NDArray, "np.ndarray[Any, Any]")


def create(
    graph: Graph | str | bytes | Mapping[str, Any],
    lib: Module | None = None,
    devices: DeviceSpec = "cpu",
    *,
    max_contexts: int = 4,
    memory_budget: int | None = None,
    policy: str | Policy = "auto",
    max_streams: int = 1,
    params: bytes | bytearray | Mapping[str, Any] | None = None,
    fuse: bool | Engine = False,
    split: bool = True,
    split_min_bytes: int = MIN_BYTES,
    kernel_threads: int | str = "auto",
    processes: bool = False,
    worker_imports: Sequence[str] = (),
    worker_nice: int = 0,
    worker_env: Mapping[str, str] | None = None,
    worker_blas: str = "auto",
) -> GraphModule:
    """Create an executor (TVM's ``graph_executor.create``).

    :param graph: graph JSON text or bytes, a parsed dict, a path, or a
        :class:`~asyncrt.graph.Graph`.
    :param lib: kernels looked up before the global registry; ``None`` means
        the global registry only.
    :param devices: one device or a list; the first faces the host.
    :param max_contexts: how many runs may be in flight at once.
    :param memory_budget: the most device bytes (all devices together) the
        pooled run contexts may hold, or ``None`` for no limit; fewer runs
        are then in flight at once, but always at least one. Parameters and
        outputs handed to callers are not counted.
    :param policy: how nodes are placed on several devices: ``"auto"`` (the
        best of HEFT, PEFT and lookahead, never worse than the fastest
        single device), ``"heft"``, ``"peft"``, ``"lookahead"``,
        ``"fastest"``, ``"single"``, or a callable
        (:data:`scheduler.placement.Policy`).
    :param max_streams: compute streams per device; independent branches
        run on different streams.
    :param params: parameters to load now (as :meth:`GraphModule.load_params`
        takes them). The planner then knows them as constants: a parameter
        read on another device is copied there once, when loaded, instead of
        on every run.
    :param fuse: fuse chains of elementwise nodes into one node each
        (:mod:`asyncrt.ops._fusion`): ``True`` or ``"numpy"`` runs the members'
        own kernels block by block (results identical to unfused),
        ``"numexpr"`` evaluates one numexpr expression where it can.
    :param split: with ``max_streams`` of 2 or more, let the planner cut a
        large elementwise node (a built-in kernel of the fusion table: a
        join such as ``sum``, ``add``, ``tanh``...) into row blocks, one per
        cpu stream, where the cost model says the other streams would
        otherwise idle (:mod:`scheduler.split`): both cores then work on
        the join that ends a set of parallel branches. Results are
        bit-identical; ``print(ex.plan)`` shows the parts (``sum[0/2]``,
        ``sum[1/2]``). ``False`` keeps every node whole. No effect with one
        stream.
    :param split_min_bytes: the smallest output (bytes) worth splitting.
    :param kernel_threads: threads of the BLAS, OpenMP, numexpr and
        fused-kernel pools while this executor is open: ``"auto"``
        (``max(1, cores // cpu streams)``: one run's latency first),
        ``"throughput"`` (``max(1, cores // (cpu streams * max_contexts))``:
        for services with concurrent runs), ``"keep"`` (untouched) or a
        number (:mod:`asyncrt.runtime._threads`). With ``processes``, each worker's
        pools get that many threads, and ``"auto"`` means ``"throughput"``
        (the workers run side by side).
    :param processes: run each pooled context (``await run(**inputs)``) in
        a worker process of its own (:mod:`asyncrt.runtime._process`): kernels then
        never hold the event loop's GIL. Kernels come from the global
        registry (``lib`` must be ``None``); the stateful API still runs in
        this process.
    :param worker_imports: modules each worker process imports before it
        builds its executor: where kernels registered with
        :func:`~asyncrt.register_func` live (this process must have imported
        them too, to plan the graph).
    :param worker_nice: niceness added to each worker process (0 to 19).
        A positive value lets the event loop's process preempt the workers
        at once when it wakes, which keeps event-loop lag low while the
        workers saturate the cores; the workers then yield to every other
        busy process of the machine too.
    :param worker_env: environment variables set in each worker process.
    :param worker_blas: the OpenBLAS kernel set the workers load
        (:mod:`asyncrt.runtime._blas_choice`): ``"auto"`` times the graph under
        OpenBLAS's own choice and under its AVX2 set before the first pooled
        run, where numpy's OpenBLAS chose an AVX-512 set, and keeps the
        faster; ``"default"`` keeps OpenBLAS's own choice; any other value
        is an ``OPENBLAS_CORETYPE`` name (``"Haswell"``, ``"SkylakeX"``...).
    :raises ArgumentError: for ``processes`` with a ``lib``, a
        ``worker_nice`` outside 0..19, or a kernel set given both as
        ``worker_blas`` and in ``worker_env``.
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
        memory_budget=memory_budget,
        policy=policy,
        max_streams=max_streams,
        params=params,
        fuse=fuse,
        split=split,
        split_min_bytes=split_min_bytes,
        kernel_threads=kernel_threads,
        processes=processes,
        worker_imports=worker_imports,
        worker_nice=worker_nice,
        worker_env=worker_env,
        worker_blas=worker_blas,
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
        memory_budget: int | None = None,
        policy: str | Policy = "auto",
        max_streams: int = 1,
        params: bytes | bytearray | Mapping[str, Any] | None = None,
        fuse: bool | Engine = False,
        split: bool = True,
        split_min_bytes: int = MIN_BYTES,
        kernel_threads: int | str = "auto",
        processes: bool = False,
        worker_imports: Sequence[str] = (),
        worker_nice: int = 0,
        worker_env: Mapping[str, str] | None = None,
        worker_blas: str = "auto",
    ) -> None:
        if not 0 <= worker_nice <= 19:
            raise ArgumentError(f"worker_nice must be in 0..19, got {worker_nice}")
        if (
            isinstance(split_min_bytes, bool)
            or not isinstance(split_min_bytes, int)
            or split_min_bytes < 0
        ):
            raise ArgumentError(
                f"split_min_bytes must be an int >= 0, got {split_min_bytes!r}"
            )
        blas_env = _worker_blas_env(worker_blas, worker_env or {})
        if processes and lib is not None:
            raise ArgumentError(
                "processes=True takes kernels from the global registry only "
                "(lib must be None): register them in a module named in "
                "worker_imports"
            )
        self.graph = graph
        values = (
            decode_params(params) if isinstance(params, (bytes, bytearray)) else params
        )
        self._dag = to_dag(graph, () if values is None else tuple(values))
        annotate_work(self._dag, lib)
        if fuse:
            engine: Engine = "numpy" if fuse is True else fuse
            self._dag, lib = fuse_graph(self._dag, lib, devices, engine)

        def supported(nid: int, device: Device) -> bool:
            spec = node_spec(self._dag, nid)
            return resolve(spec.func_name, device.kind, lib) is not None

        self.plan: Plan = plan_graph(
            self._dag,
            devices,
            policy=policy,
            max_streams=max_streams,
            supported=supported,
            split=RowSplit(elementwise_predicate(lib, devices), split_min_bytes)
            if split
            else None,
        )
        self._kernels = self._resolve_kernels(lib)
        self._input_nids: tuple[int, ...] = self.plan.inputs
        self._input_names = [node_spec(self._dag, n).name for n in self._input_nids]
        self._index_of = {name: i for i, name in enumerate(self._input_names)}
        # The outputs on the host: copies where a head was computed elsewhere.
        self._heads = self.plan.heads
        self._params: dict[Entry, NDArray] = {}
        self._all_inputs = frozenset(Entry(n, 0) for n in self._input_nids)
        # Inputs a run must be given: every graph input that is no parameter.
        self._required_inputs = self._all_inputs
        self._stateful_busy = False
        self._closed = False
        self._workers = (
            _WorkerOptions(
                graph,
                tuple(devices),
                max_streams,
                fuse,
                split,
                split_min_bytes,
                kernel_threads,
                tuple(worker_imports),
                worker_nice,
                dict(worker_env or {}),
            )
            if processes
            else None
        )
        self._worker_spec: WorkerSpec | None = None
        # The workers' kernel set: None until "auto" has timed the graph.
        self._blas_env: dict[str, str] | None = blas_env
        self._blas_lock: anyio.Lock | None = None
        self._blas_timing: _blas_choice.Timing | None = None
        self._pool: ContextPool[_AnyContext] = ContextPool(
            self._new_pooled_context,
            max_contexts,
            budget=memory_budget,
            cost=lambda: self.context_nbytes,
        )
        self._generation = 0
        self._own: RunContext | None = None
        self._feed: HostFeed | None = None  # run_sync's views of self._own
        # Pooled contexts' views, dropped with their contexts.
        self._pooled_feeds: weakref.WeakKeyDictionary[_AnyContext, HostFeed] = (
            weakref.WeakKeyDictionary()
        )
        self._running = 0  # run() calls under way, waiting ones included
        self._drained: anyio.Event | None = None
        # Parameters read on other devices: copied there once, when loaded.
        self._param_copies: dict[Entry, NDArray] = {}
        if values is not None:
            self.load_params(values)
        self._thread_lease = _threads.lease_for(
            _threads.cpu_streams(self.plan), kernel_threads, max_contexts
        )

    # -- building --------------------------------------------------------------

    def _resolve_kernels(self, lib: Module | None) -> dict[int, Kernel]:
        kernels: dict[int, Kernel] = {}
        missing: list[str] = []
        for launch in self.plan.kernel_launches():
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

    def _owned_inputs(self) -> tuple[int, ...]:
        return tuple(n for n in self._input_nids if Entry(n, 0) not in self._params)

    @property
    def context_nbytes(self) -> int:
        """Device bytes one run context costs (arenas and input buffers):
        what ``memory_budget`` is counted in."""
        return context_nbytes(self.plan, self._owned_inputs())

    @property
    def pool(self) -> ContextPool[_AnyContext]:
        """The pool of run contexts (to inspect: ``size``, ``idle``,
        ``lent``, ``waiting``, ``nbytes``, ``limit``, ``budget``)."""
        return self._pool

    def _new_context(self) -> RunContext:
        context = RunContext(
            self.plan,
            self._kernels,
            self._owned_inputs(),
            {**self._params, **self._param_copies},
        )
        context.generation = self._generation
        return context

    def _new_pooled_context(self) -> _AnyContext:
        if self._workers is None:
            return self._new_context()
        return self._new_worker(self._blas_env or {})

    def _new_worker(self, blas_env: Mapping[str, str]) -> ProcessContext:
        assert self._workers is not None
        spec = self._worker_spec
        if spec is None:  # made again whenever the parameters change
            spec = self._worker_spec = self._workers.spec(self)
        owned = [Entry(nid, 0) for nid in self._owned_inputs()]
        context = ProcessContext(
            spec,
            {self._input_name(entry): entry for entry in owned},
            self._heads,
            self.context_nbytes,
            {**self._workers.env, **blas_env},
        )
        context.generation = self._generation
        return context

    @property
    def worker_blas(self) -> str | None:
        """The OpenBLAS kernel set the workers load: a set's name,
        ``"default"`` (OpenBLAS's own choice), or ``None`` where there are
        no workers or ``"auto"`` has not timed the graph yet (it does before
        the first pooled run)."""
        if self._workers is None or self._blas_env is None:
            return None
        env = {**self._workers.env, **self._blas_env}  # worker_env may name it
        return env.get(_blas_choice.ENV, "default")

    @property
    def worker_blas_timing(self) -> Mapping[str, float] | None:
        """The median run seconds per kernel set that ``"auto"`` measured,
        or ``None`` if it timed nothing."""
        return None if self._blas_timing is None else self._blas_timing.medians

    async def _choose_worker_blas(self) -> None:
        """Time the graph in one worker per candidate kernel set and keep
        the faster (:mod:`asyncrt.runtime._blas_choice`); the winning worker becomes
        the first pooled context."""
        if self._blas_lock is None:
            self._blas_lock = anyio.Lock()
        async with self._blas_lock:
            if self._blas_env is not None:  # another run chose meanwhile
                return
            assert self._workers is not None
            on_cpu = any(d.kind == "cpu" for d in self.plan.placement.values())
            sets = _blas_choice.candidates(self._workers.env) if on_cpu else ()
            if not sets:  # nothing to choose, or no kernel runs on the cpu
                self._blas_env = {}
                return
            workers: dict[str, ProcessContext] = {}
            keep: ProcessContext | None = None
            try:
                for name in sets:  # OpenBLAS's own choice first, as it is
                    env = {_blas_choice.ENV: name} if workers else {}
                    workers[name] = self._new_worker(env)
                for worker in workers.values():
                    await worker.ready()  # started side by side; not timed
                timing = await _blas_choice.time_interleaved(
                    {name: w.program.run for name, w in workers.items()}
                )
                chosen = sets[0]
                if timing is not None:
                    chosen = _blas_choice.faster(timing, chosen)
                self._blas_timing = timing
                self._blas_env = {_blas_choice.ENV: chosen} if chosen != sets[0] else {}
                if workers[chosen].generation == self._generation:
                    keep = workers[chosen]  # else parameters changed meanwhile
            except (NodeFailedError, WorkerError):
                # The graph cannot run on zeros, or no worker starts: keep
                # OpenBLAS's own set; the first run meets the error itself.
                self._blas_env = {}
            finally:
                for worker in workers.values():
                    if worker is not keep or not self._pool.adopt(worker):
                        worker.close()

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
        if any(e in self._params for e, _ in checked):
            self._check_no_runs()
        context = self._own_context()
        for entry, array in checked:
            target = self._params.get(entry)
            (target if target is not None else context.inputs[entry]).copyfrom(array)
            context.is_set.add(entry)
        if any(e in self._params for e, _ in checked):
            if self._workers is not None:
                self._rebind()  # workers hold their own copies: new workers
            else:
                self._copy_params()

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
        self._check_no_runs()
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
        self._check_no_runs()
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
        self._worker_spec = None
        self._required_inputs = self._all_inputs - self._params.keys()
        self._copy_params()
        self._pool.clear_idle()

    def _copy_params(self) -> None:
        """Bring the parameters' copies on other devices up to date (in
        place, so contexts stay bound to them)."""
        plan = self.plan
        for copy, source in plan.constant_copies.items():
            param = self._params.get(plan.resolve(source))
            if param is None:
                continue
            spec = plan.tensors[copy]
            view = NDArray(param.buffer, spec.shape, spec.dtype, param.byte_offset)
            target = self._param_copies.get(copy)
            if target is None:
                target = empty(spec.shape, spec.dtype, plan.storage[copy].device)
                self._param_copies[copy] = target
            target.copyfrom(view)

    # -- running -----------------------------------------------------------------

    @overload
    async def run(self, *, out: None = None, **inputs: Any) -> list[NDArray] | None: ...

    @overload
    async def run(
        self, *, out: Sequence[OutArray], **inputs: Any
    ) -> list[OutArray]: ...

    async def run(
        self, *, out: Sequence[Any] | None = None, **inputs: Any
    ) -> list[Any] | None:
        """Run the graph.

        With keyword inputs, runs in a pooled context (safe for many
        concurrent callers) and returns the outputs as new arrays on the
        host-facing device. Without, runs the stateful context after
        ``set_input`` and returns ``None``; read results with
        :meth:`get_output`.

        :param out: one array per output to copy the outputs into instead
            (NDArrays on any device, or writable C-contiguous numpy arrays);
            the run then returns ``out`` as a list. (So no graph input can
            be passed by the name ``out``; use the stateful API for one.)
        :raises InputError: for missing, unknown or mismatched inputs, or
            ``out`` arrays of the wrong number, shape or dtype.
        :raises NodeFailedError: if a kernel raised (chained);
            :class:`NodeOutOfMemoryError` if it ran out of device memory.
        :raises OutOfMemoryError: if a device has no room for the first run
            context, or for the outputs.
        :raises BusyError: for a stateful run while another is in flight.
        :raises ClosedResourceError: if the executor is closed, or gets
            closed before this run returns.
        """
        self._check_open()
        targets = None if out is None else self._check_out(out)
        if not inputs:
            await self._run_stateful()
            if targets is None:
                return None
            own = self._own_context()
            return self._outputs(own, targets)
        checked = self._check_run_inputs(inputs)
        self._running += 1
        try:
            if self._workers is not None and self._blas_env is None:
                await self._choose_worker_blas()
            context = await self._pool.acquire()
            try:
                self._check_open()  # closed while this run waited for its turn
                feed = self._pooled_feed(context)
                if not feed.fill(inputs):
                    self._fill(context, checked)
                # A failed, stopped or cancelled run drains its streams before
                # raising, so the context is fit to lend again either way.
                await self._run_program(context.program)
                self._check_open()
                if targets is None:
                    outputs = feed.outputs()
                    if outputs is not None:
                        return outputs
                return self._outputs(context, targets)
            finally:
                self._release(context)
        finally:
            self._run_ended()

    async def _run_program(self, program: Program | ProcessProgram) -> None:
        try:
            await program.run()
        except NodeFailedError as exc:
            cause = exc.__cause__
            if isinstance(cause, OutOfMemoryError):
                raise NodeOutOfMemoryError(exc, cause) from cause
            raise
        except ClosedResourceError as exc:
            if self._closed:
                raise ClosedResourceError(
                    "the executor was closed while this run was in flight"
                ) from exc
            raise

    def _run_ended(self) -> None:
        self._running -= 1
        if self._running == 0 and self._drained is not None:
            self._drained.set()

    def _release(self, context: _AnyContext) -> None:
        if context.generation != self._generation or not context.usable:
            self._pool.discard(context)
        else:
            self._pool.release(context)

    def _check_run_inputs(self, inputs: Mapping[str, Any]) -> list[tuple[Entry, Any]]:
        checked = [(self._input_entry(k), v) for k, v in inputs.items()]
        for entry, _ in checked:
            if entry in self._params:
                raise InputError(
                    f"{self._input_name(entry)!r} is a parameter; use load_params"
                )
        missing = self._required_inputs.difference(e for e, _ in checked)
        if missing:
            names = sorted(self._input_name(e) for e in missing)
            raise InputError(f"inputs not given: {', '.join(names)}")
        return [(e, self._check_value(e, v)) for e, v in checked]

    def _check_out(self, out: Sequence[Any]) -> list[Any]:
        targets = list(out)
        if len(targets) != len(self._heads):
            raise InputError(
                f"out= needs {len(self._heads)} arrays (one per output), "
                f"got {len(targets)}"
            )
        for index, (target, head) in enumerate(zip(targets, self._heads, strict=True)):
            spec = self.plan.tensors[head]
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

    def _fill(self, context: _AnyContext, checked: list[tuple[Entry, Any]]) -> None:
        for entry, array in checked:
            context.inputs[entry].copyfrom(array)

    def _outputs(self, context: _AnyContext, targets: list[Any] | None) -> list[Any]:
        arrays = [context.output(e) for e in self._heads]
        if targets is None:
            return [array.copyto(self.plan.host) for array in arrays]
        for array, target in zip(arrays, targets, strict=True):
            if isinstance(target, NDArray):
                target.copyfrom(array)
            else:
                np.copyto(target, array.numpy(), casting="no")
        return targets

    def _copy_out(self, array: NDArray) -> NDArray:
        return array.copyto(self.plan.host)

    async def _run_stateful(self) -> None:
        self._check_not_busy()
        context = self._own_context()
        self._check_all_set(context)
        self._stateful_busy = True
        self._running += 1
        try:
            await self._run_program(context.program)
        finally:
            self._stateful_busy = False
            self._run_ended()
            if self._closed:  # close() left our context for us to free
                self._close_own()
        self._check_open()

    def _check_all_set(self, context: RunContext) -> None:
        missing = [
            self._input_name(e) for e in context.inputs if e not in context.is_set
        ]
        if missing:
            raise InputError(f"inputs never set: {', '.join(missing)}")

    def run_sync(self, **inputs: Any) -> list[NDArray] | None:
        """:meth:`run` for callers without an event loop: blocks the thread.

        It uses the executor's own context (one caller at a time).

        :raises NodeFailedError: if a kernel raised (chained);
            :class:`NodeOutOfMemoryError` if it ran out of device memory.
        :raises BusyError: while another stateful run is in flight.
        :raises ClosedResourceError: if the executor is closed.
        """
        self._check_open()
        feed = self._host_feed() if inputs else None
        if feed is not None and (self._stateful_busy or not feed.fill(inputs)):
            self.set_input(**inputs)  # the general path, and its errors
        self._check_not_busy()
        context = self._own_context()
        self._check_all_set(context)
        self._stateful_busy = True
        try:
            context.program.run_sync()
        except NodeFailedError as exc:
            cause = exc.__cause__
            if isinstance(cause, OutOfMemoryError):
                raise NodeOutOfMemoryError(exc, cause) from cause
            raise
        finally:
            self._stateful_busy = False
        if feed is None:
            return None
        outputs = feed.outputs()
        if outputs is None:
            return [self._copy_out(context.output(e)) for e in self._heads]
        return outputs

    def _stop_own_run(self) -> None:
        """Stop the stateful run in flight, if any (thread-safe: it only
        raises the program's stop flags); it raises
        :class:`ClosedResourceError` once drained. A process worker's reader
        thread cancels runs this way."""
        if self._own is not None:
            self._own.program.stop()

    def _host_feed(self) -> HostFeed:
        context = self._own_context()
        if self._feed is None or self._feed.context is not context:
            self._feed = self._new_feed(context)
        return self._feed

    def _new_feed(self, context: _AnyContext) -> HostFeed:
        names = {
            name: Entry(nid, 0)
            for name, nid in zip(self._input_names, self._input_nids, strict=True)
        }
        return HostFeed(context, names, self._heads, self.plan.host)

    def _pooled_feed(self, context: _AnyContext) -> HostFeed:
        """The host views of a pooled context, made on its first run."""
        feed = self._pooled_feeds.get(context)
        if feed is None:
            feed = self._pooled_feeds[context] = self._new_feed(context)
        return feed

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
        return _benchmark.benchmark(
            self, device, repeat, number, min_repeat_ms, end_to_end, progress, inputs
        )

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
        return await _benchmark.abenchmark(
            self, device, repeat, number, min_repeat_ms, end_to_end, progress, inputs
        )

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

    def _check_no_runs(self) -> None:
        if self._stateful_busy or self._pool.lent:
            raise BusyError(
                "parameters cannot change while runs are in flight (they are "
                "shared by every run); wait for the runs to finish"
            )

    def close(self) -> None:
        """Close the executor. Idempotent; safe while runs are in flight.

        Runs in flight are stopped: each drains its in-flight kernels and
        raises :class:`ClosedResourceError`, and its context is freed as it
        comes back; callers waiting for a context get the same error. Idle
        contexts' threads, streams and memory are released now. Later calls
        raise :class:`ClosedResourceError`. Use :meth:`aclose` to also wait
        until every run in flight is gone.
        """
        if self._closed:
            return
        self._closed = True
        if self._thread_lease is not None:
            self._thread_lease.release()
        for context in self._pool.lent:
            context.program.stop()
        self._pool.close()
        if self._own is not None:
            if self._stateful_busy:
                self._own.program.stop()  # freed when that run returns
            else:
                self._close_own()

    def _close_own(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the runs in flight have drained,
        raised and given their contexts back (so every thread and stream is
        gone when this returns). Idempotent."""
        self.close()
        if self._running:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def __aenter__(self) -> GraphModule:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> GraphModule:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class _WorkerOptions:
    """What a process-backed executor's workers are built from."""

    graph: Graph
    devices: tuple[Device, ...]
    max_streams: int
    fuse: bool | Engine
    split: bool
    split_min_bytes: int
    kernel_threads: int | str
    imports: tuple[str, ...]
    nice: int
    env: dict[str, str]

    def spec(self, module: GraphModule) -> WorkerSpec:
        """The spec of a worker of ``module``, with its current parameters."""
        plan = module.plan
        inputs = {
            module._input_name(Entry(nid, 0)): (
                plan.tensors[Entry(nid, 0)].shape,
                plan.tensors[Entry(nid, 0)].dtype,
            )
            for nid in module._owned_inputs()
        }
        outputs = [(plan.tensors[h].shape, plan.tensors[h].dtype) for h in plan.heads]
        return WorkerSpec(
            graph=self.graph.to_json(),
            params={
                module._input_name(entry): array.numpy()
                for entry, array in module._params.items()
            },
            devices=tuple(str(d) for d in self.devices),
            placement={nid: str(d) for nid, d in plan.placement.items()},
            max_streams=self.max_streams,
            fuse=self.fuse,
            split=self.split,
            split_min_bytes=self.split_min_bytes,
            kernel_threads=_threads.threads_for(
                _threads.cpu_streams(plan),
                # Workers run side by side by design: "auto" sizes their
                # pools for that, so N workers never put N x cores threads
                # on the cores.
                "throughput" if self.kernel_threads == "auto" else self.kernel_threads,
                module.pool.limit,
            ),
            imports=self.imports,
            layout=IoLayout.of(inputs, outputs),
            nice=self.nice,
            sim_configs=_sim_configs(self.devices),
        )


def _worker_blas_env(
    worker_blas: str, worker_env: Mapping[str, str]
) -> dict[str, str] | None:
    """The environment that selects the workers' kernel set, or ``None``
    if ``"auto"`` is to time the graph first."""
    if worker_blas == "auto":
        return None
    if worker_blas == "default":
        return {}
    if not worker_blas.isalnum():
        raise ArgumentError(
            f"worker_blas must be 'auto', 'default' or an OpenBLAS core type "
            f"such as 'Haswell', got {worker_blas!r}"
        )
    if _blas_choice.ENV in worker_env:
        raise ArgumentError(
            f"worker_blas={worker_blas!r} and worker_env[{_blas_choice.ENV!r}] "
            "both choose the kernel set: give one"
        )
    return {_blas_choice.ENV: worker_blas}


def _sim_configs(devices: Sequence[Device]) -> tuple[SimConfig, ...] | None:
    """This process's ``sim`` configurations, if ``devices`` has a sim."""
    if not any(d.kind == "sim" for d in devices):
        return None
    api = get_api("sim")
    if not isinstance(api, SimDeviceAPI):  # another backend took the name
        return None
    return tuple(api.config(Device("sim", i)) for i in range(api.device_count()))
