"""The executor core: a compiled graph, its parameters and its run contexts.

:class:`ExecutorCore` is everything of an executor but TVM's vocabulary
(:mod:`asyncrt.graph_executor` is the facade): it holds the
:class:`~asyncrt.runtime._compiled.CompiledGraph`, the shared
:class:`~asyncrt.runtime._parameters.Parameters`, a pool of run contexts
made by a :class:`~asyncrt.runtime._backends.ContextBackend`, and its own
context for the stateful API. Two ways to run:

* :meth:`ExecutorCore.run_pooled` borrows a context from the pool (any
  number of concurrent callers), copies the inputs in, runs, and hands
  back new output arrays (or fills the caller's);
* :meth:`ExecutorCore.run_own` / :meth:`ExecutorCore.run_own_sync` run
  the executor's own context, one caller at a time.

State changes in few places: ``_generation`` (bumped when the parameters
change: contexts made before are rebuilt), ``_stateful_busy``,
``_running`` and ``_closed``. Every run either returns or raises having
given its context back, so a failed or cancelled run leaves the executor
usable.

An executor dropped without :meth:`ExecutorCore.close` is closed when it
is collected (its threads, streams and memory released), with a
``ResourceWarning``, as an unclosed file is.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import numpy as np

from devices import Device, NDArray
from scheduler.dag import Entry
from scheduler.dispatch import Program
from scheduler.plan import Plan

from ..errors import (
    ArgumentError,
    BusyError,
    ClosedResourceError,
    InputError,
    NodeFailedError,
    NodeOutOfMemoryError,
    OutOfMemoryError,
)
from ..graph import Graph
from ..ops._kernels import Module
from . import _threads
from ._backends import (
    AnyContext,
    ContextBackend,
    backend_for,
    nbytes_of,
    new_run_context,
)
from ._compiled import CompiledGraph, compile_graph
from ._context import ContextPool, RunContext
from ._host_feed import HostFeed
from ._options import ExecutorOptions
from ._parameters import HostValue, Parameters
from ._process import ProcessProgram

__all__ = ("AnyContext", "ExecutorCore", "Guards")


class Guards:
    """The checks every executor core makes before it acts (a core sets
    ``closed`` and ``_stateful_busy``)."""

    _stateful_busy: bool

    @property
    def closed(self) -> bool:
        """Whether the executor was closed."""
        raise NotImplementedError

    def check_open(self) -> None:
        """:raises ClosedResourceError: if the executor is closed."""
        if self.closed:
            raise ClosedResourceError("this executor is closed")

    def check_not_busy(self) -> None:
        """:raises BusyError: while a stateful run is in flight."""
        if self._stateful_busy:
            raise BusyError(
                "a stateful run is in flight; use `await run(**inputs)` for "
                "concurrent runs"
            )


class ExecutorCore(Guards):
    """A graph ready to run on devices; see the module docstring.

    :param graph: a validated graph.
    :param lib: kernels looked up before the global registry.
    :param devices: the devices, host-facing first.
    :param options: the executor's options.
    :param params: parameter values by name (already decoded), or ``None``.
    :param parameters: the parameters to bind (an executor's shared ones,
        under one shape signature's own); new ones if ``None``.
    :param on_context: called with every run context made in this process
        (the debug executor traces them).
    :raises ArgumentError: for ``processes`` with a ``lib``.
    :raises GraphError: if a parameter names no input node.
    :raises KernelNotFoundError: if a node's kernel is missing.
    :raises PlanError: if the graph cannot be planned on these devices.
    """

    def __init__(
        self,
        graph: Graph,
        lib: Module | None,
        devices: Sequence[Device],
        options: ExecutorOptions,
        params: Mapping[str, Any] | None = None,
        *,
        parameters: Parameters | None = None,
        on_context: Callable[[RunContext], None] | None = None,
    ) -> None:
        if options.processes and lib is not None:
            raise ArgumentError(
                "processes=True takes kernels from the global registry only "
                "(lib must be None): register them in a module named in "
                "worker_imports"
            )
        self.options = options
        self.devices = tuple(devices)
        self._parameters = Parameters() if parameters is None else parameters
        inputs = {node.name for node in graph.nodes if node.is_null}
        # Inherited parameters this graph does not read are no concern of
        # its; a name given here that is no input is an error (GraphError).
        constants = set(params or ()) | (self._parameters.names() & inputs)
        self.compiled: CompiledGraph = compile_graph(
            graph, lib, self.devices, options, sorted(constants)
        )
        self._on_context = on_context
        self._backend: ContextBackend = backend_for(options, self.devices, on_context)
        self._generation = 0
        self._retired = False
        self._resources = _Resources()
        # The pool (released by the finalizer) must not keep the core alive.
        core = weakref.ref(self)
        self._resources.pool = self.pool = ContextPool(
            lambda: _alive(core)._new_pooled_context(),
            options.max_contexts,
            budget=options.memory_budget,
            cost=lambda: _alive(core).context_nbytes,
        )
        self._stateful_busy = False
        self._running = 0  # runs under way, waiting ones included
        self._drained: anyio.Event | None = None
        self._feed: HostFeed | None = None  # the own context's host views
        # Pooled contexts' host views, dropped with their contexts.
        self._pooled_feeds: weakref.WeakKeyDictionary[AnyContext, HostFeed] = (
            weakref.WeakKeyDictionary()
        )
        self._finalizer = weakref.finalize(self, _collected, self._resources)
        if params:
            self.load_params(params)
        self._resources.lease = _threads.lease_for(
            _threads.cpu_streams(self.compiled.plan),
            options.kernel_threads,
            options.max_contexts,
            blas=self.compiled.host_blas,
        )

    # -- what was built ------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The plan."""
        return self.compiled.plan

    def input_names(self) -> tuple[str, ...]:
        """Every graph input's name, parameters included (TVM's order)."""
        return self.compiled.input_names

    def input_name(self, key: int | str) -> str:
        """The name of an input given by name or index.

        :raises InputError: for an unknown name or an index out of range.
        """
        return self.compiled.name_of(self.compiled.input_entry(key))

    def input_info(self) -> tuple[dict[str, tuple[int | str, ...]], dict[str, str]]:
        """Shapes and dtypes of the inputs by name."""
        shapes: dict[str, tuple[int | str, ...]] = {}
        dtypes: dict[str, str] = {}
        for name, entry in self.compiled.input_entries.items():
            spec = self.compiled.tensor(entry)
            shapes[name], dtypes[name] = spec.shape, spec.dtype
        return shapes, dtypes

    def num_outputs(self) -> int:
        """How many outputs the graph has."""
        return len(self.compiled.heads)

    def output(self, index: int) -> NDArray:
        """Output ``index`` of the last stateful run (the own context's).

        :raises InputError: if ``index`` is out of range.
        """
        heads = self.compiled.heads
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not (0 <= index < len(heads))
        ):
            raise InputError(
                f"output index {index!r} out of range (graph has {len(heads)})"
            )
        return self.own_context().output(heads[index])

    def own_outputs(self, targets: list[Any]) -> list[Any]:
        """The last stateful run's outputs copied into ``targets``."""
        return self.outputs(self.own_context(), targets)

    # -- inputs and parameters ---------------------------------------------------

    @property
    def backend(self) -> ContextBackend:
        """What the pooled contexts are (in process, worker processes)."""
        return self._backend

    @property
    def thread_lease(self) -> _threads.ThreadLease | None:
        """The kernel thread pools' lease this executor holds, if any."""
        return self._resources.lease

    @property
    def parameters(self) -> Parameters:
        """The shared parameter arrays."""
        return self._parameters

    @property
    def context_nbytes(self) -> int:
        """Device bytes one run context costs (arenas and input buffers)."""
        return nbytes_of(self.compiled, self._parameters)

    def checked(self, values: Mapping[str, Any]) -> list[tuple[str, HostValue]]:
        """``values`` checked against the graph's inputs, by name.

        :raises InputError: for an unknown name or a mismatched value.
        """
        entries = [(name, self.compiled.input_entry(name)) for name in values]
        return [
            (name, self.compiled.check_value(e, values[name])) for name, e in entries
        ]

    def load_params(self, values: Mapping[str, Any]) -> None:
        """Set parameters by name (shared by every later run).

        :raises InputError: for an unknown name or a mismatched value.
        :raises BusyError: while runs are in flight.
        """
        self.check_open()
        checked = self.checked(values)
        self.check_no_runs()
        self._parameters.load(checked)
        self._rebind()

    def share_params(self, arrays: Mapping[str, NDArray]) -> None:
        """Use these arrays (another executor's) as parameters, no copy.

        :raises InputError: for an unknown name or a mismatched array.
        :raises BusyError: while runs are in flight.
        """
        self.check_open()
        self.check_no_runs()
        for name, array in arrays.items():
            self.compiled.check_value(self.compiled.input_entry(name), array)
        self._parameters.share(arrays)
        self._rebind()

    def set_inputs(self, values: Mapping[str, Any]) -> None:
        """Set the own context's inputs (a parameter's name sets that
        parameter for every run).

        :raises InputError: for an unknown name or a mismatched value.
        :raises BusyError: while a stateful run is in flight, or, for a
            parameter, while any run is.
        """
        self.check_open()
        checked = self.checked(values)
        self.check_not_busy()
        params = [(n, v) for n, v in checked if n in self._parameters]
        if params:
            self.check_no_runs()
        context = self.own_context()
        for name, array in checked:
            if name not in self._parameters:
                entry = self.compiled.input_entries[name]
                context.inputs[entry].copyfrom(array)
                context.is_set.add(entry)
        if params:
            self._parameters.load(params)
            self._rebind()  # contexts bind the new arrays

    def input_array(self, name: str) -> NDArray:
        """The executor's own array of input ``name`` (or the parameter)."""
        entry = self.compiled.input_entries[name]
        if name in self._parameters:
            return self._parameters.on(name, self.compiled.plan.storage[entry].device)
        return self.own_context().inputs[entry]

    def _rebind(self) -> None:
        self._generation += 1
        self._backend.parameters_changed()
        self.pool.clear_idle()

    def rebind(self) -> None:
        """Rebuild the contexts made before now (the parameters this core
        reads through changed elsewhere).

        :raises BusyError: while runs are in flight.
        """
        self.check_no_runs()
        self._rebind()

    # -- contexts ------------------------------------------------------------------

    def _new_pooled_context(self) -> AnyContext:
        return self._backend.new_context(
            self.compiled, self._parameters, self._generation
        )

    def new_own_context(self) -> RunContext:
        """A new in-process context (the stateful API's; overridable for
        tracing)."""
        return new_run_context(
            self.compiled, self._parameters, self._generation, self._on_context
        )

    def own_context(self) -> RunContext:
        """The stateful API's context, rebuilt (keeping the inputs set)
        after the parameters changed."""
        own = self._resources.own
        if own is None or own.generation != self._generation:
            fresh = self._resources.own = self.new_own_context()
            if own is not None:
                for entry in own.is_set & fresh.inputs.keys():
                    fresh.inputs[entry].copyfrom(own.inputs[entry])
                    fresh.is_set.add(entry)
                own.close()
            own = fresh
        return own

    def _feed_of(self, context: AnyContext) -> HostFeed:
        """The host views of ``context``, made on its first use."""
        if context is self._resources.own:
            if self._feed is None or self._feed.context is not context:
                self._feed = self._new_feed(context)
            return self._feed
        feed = self._pooled_feeds.get(context)
        if feed is None:
            feed = self._pooled_feeds[context] = self._new_feed(context)
        return feed

    def _new_feed(self, context: AnyContext) -> HostFeed:
        return HostFeed(
            context,
            self.compiled.input_entries,
            self.compiled.heads,
            self.compiled.plan.host,
        )

    # -- running -------------------------------------------------------------------

    def check_run_inputs(self, inputs: Mapping[str, Any]) -> list[tuple[Entry, Any]]:
        """A pooled run's inputs, checked: every caller input given once,
        no parameter.

        :raises InputError: for a missing, unknown or mismatched input, or a
            parameter's name.
        """
        compiled = self.compiled
        for name in inputs:
            compiled.input_entry(name)
            if name in self._parameters:
                raise InputError(f"{name!r} is a parameter; use load_params")
        missing = [
            name
            for name in compiled.input_names
            if name not in inputs and name not in self._parameters
        ]
        if missing:
            raise InputError(f"inputs not given: {', '.join(sorted(missing))}")
        return [
            (entry, self.compiled.check_value(entry, inputs[name]))
            for name, entry in compiled.input_entries.items()
            if name in inputs
        ]

    def check_out(self, out: Sequence[Any]) -> list[Any]:
        """``out=`` arrays, checked against the outputs.

        :raises InputError: for the wrong number, shape, dtype or kind.
        """
        return self.compiled.check_out(out)

    async def run_pooled(
        self, inputs: Mapping[str, Any], targets: list[Any] | None
    ) -> list[Any]:
        """One run in a pooled context; see the module docstring.

        :raises InputError: for bad inputs.
        :raises NodeFailedError: if a kernel raised.
        :raises ClosedResourceError: if the executor is or gets closed.
        """
        self.check_open()
        checked = self.check_run_inputs(inputs)
        self._running += 1
        try:
            await self._backend.prepare(
                self.compiled, self._parameters, lambda: self._generation, self.pool
            )
            context = await self.pool.acquire()
            try:
                self.check_open()  # closed while this run waited for its turn
                feed = self._feed_of(context)
                if not feed.fill(inputs):
                    for entry, array in checked:
                        context.inputs[entry].copyfrom(array)
                # A failed, stopped or cancelled run drains its streams before
                # raising, so the context is fit to lend again either way.
                await self._run_program(context.program)
                self.check_open()
                if targets is None:
                    outputs = feed.outputs()
                    if outputs is not None:
                        return outputs
                return self.outputs(context, targets)
            finally:
                self._release(context)
        finally:
            self._run_ended()

    async def run_own(self) -> None:
        """A stateful run of the own context (inputs set before).

        :raises InputError: if an input was never set.
        :raises BusyError: while another stateful run is in flight.
        """
        self.check_open()
        self.check_not_busy()
        context = self.own_context()
        self._check_all_set(context)
        self._stateful_busy = True
        self._running += 1
        try:
            await self._run_program(context.program)
        finally:
            self._stateful_busy = False
            self._run_ended()
            if self.closed:  # close() left our context for us to free
                self._resources.close_own()
        self.check_open()

    def run_own_sync(self, inputs: Mapping[str, Any]) -> list[NDArray] | None:
        """A stateful run on the calling thread, with ``inputs`` set first;
        returns the outputs if inputs were given.

        :raises NodeFailedError: if a kernel raised.
        :raises BusyError: while another stateful run is in flight.
        """
        self.check_open()
        context = self.own_context()
        feed = self._feed_of(context) if inputs else None
        # Filled, every input the context owns is set: no check, no rebuild.
        filled = feed is not None and not self._stateful_busy and feed.fill(inputs)
        if not filled:
            if feed is not None:
                self.set_inputs(inputs)  # the general path, and its errors
            self.check_not_busy()
            context = self.own_context()  # rebuilt if a parameter was set
            if feed is not None:
                feed = self._feed_of(context)
            self._check_all_set(context)
        self._stateful_busy = True
        try:
            with _threads.running(self._resources.lease):
                context.program.run_sync()
        except NodeFailedError as exc:
            raise _out_of_memory(exc) from exc.__cause__
        finally:
            self._stateful_busy = False
        if feed is None:
            return None
        outputs = feed.outputs()
        if outputs is None:
            host = self.compiled.plan.host
            return [context.output(e).copyto(host) for e in self.compiled.heads]
        return outputs

    def stop_own_run(self) -> None:
        """Stop the stateful run in flight, if any (thread-safe: it only
        stops the program); it raises :class:`ClosedResourceError` once
        drained. A worker process's reader thread cancels runs this way."""
        own = self._resources.own
        if own is not None:
            own.program.stop()

    async def _run_program(self, program: Program | ProcessProgram) -> None:
        try:
            with _threads.running(self._resources.lease):  # shares the cores
                await program.run()
        except NodeFailedError as exc:
            raise _out_of_memory(exc) from exc.__cause__
        except ClosedResourceError as exc:
            if self.closed:
                raise ClosedResourceError(
                    "the executor was closed while this run was in flight"
                ) from exc
            raise

    def outputs(self, context: AnyContext, targets: list[Any] | None) -> list[Any]:
        """The outputs of ``context``'s last run: new arrays on the host
        device, or copied into ``targets``."""
        arrays = [context.output(e) for e in self.compiled.heads]
        if targets is None:
            host = self.compiled.plan.host
            return [array.copyto(host) for array in arrays]
        for array, target in zip(arrays, targets, strict=True):
            if isinstance(target, NDArray):
                target.copyfrom(array)
            else:
                np.copyto(target, array.numpy(), casting="no")
        return targets

    def _check_all_set(self, context: RunContext) -> None:
        missing = [
            self.compiled.name_of(e) for e in context.inputs if e not in context.is_set
        ]
        if missing:
            raise InputError(f"inputs never set: {', '.join(missing)}")

    def _run_ended(self) -> None:
        self._running -= 1
        if self._running == 0 and self._drained is not None:
            self._drained.set()

    def _release(self, context: AnyContext) -> None:
        if context.generation != self._generation or not context.usable:
            self.pool.discard(context)
        else:
            self.pool.release(context)
        if self._retired and not self.pool.lent:
            self.close()

    @property
    def retired(self) -> bool:
        """Whether :meth:`retire` was called."""
        return self._retired

    def retire(self) -> None:
        """Close once the runs in flight are done (a plan evicted from an
        executor's cache: its runs finish, nothing new starts on it)."""
        self._retired = True
        self.pool.clear_idle()
        if not self.pool.lent and not self._stateful_busy:
            self.close()

    # -- lifetime ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._resources.closed

    def check_no_runs(self) -> None:
        """:raises BusyError: while any run is in flight."""
        if self._stateful_busy or self.pool.lent:
            raise BusyError(
                "parameters cannot change while runs are in flight (they are "
                "shared by every run); wait for the runs to finish"
            )

    def close(self) -> None:
        """Close; idempotent, safe while runs are in flight (they stop and
        raise :class:`ClosedResourceError` once drained)."""
        self._finalizer.detach()
        self._resources.close(stateful_busy=self._stateful_busy)

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the runs in flight are gone."""
        self.close()
        if self._running:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()


class _Resources:
    """What an executor must release, apart from the executor itself, so
    that a finalizer can release it without keeping the executor alive."""

    def __init__(self) -> None:
        self.pool: ContextPool[AnyContext] | None = None
        self.own: RunContext | None = None
        self.lease: _threads.ThreadLease | None = None
        self.closed = False

    def close(self, *, stateful_busy: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if self.lease is not None:
            self.lease.release()
        if self.pool is not None:
            for context in self.pool.lent:
                context.program.stop()
            self.pool.close()
        if self.own is not None:
            if stateful_busy:
                self.own.program.stop()  # freed when that run returns
            else:
                self.close_own()

    def close_own(self) -> None:
        if self.own is not None:
            self.own.close()
            self.own = None


def _alive(core: weakref.ref[ExecutorCore]) -> ExecutorCore:
    found = core()
    if found is None:  # only while the collected executor's pool closes
        raise ClosedResourceError("this executor was collected")
    return found


def _collected(resources: _Resources) -> None:
    """An executor was collected without ``close()``: release its threads,
    streams and memory, and say so as an unclosed file does."""
    if resources.closed:
        return
    resources.close()
    warnings.warn(
        "an asyncrt executor was not closed: its threads, streams and memory "
        "were released when it was collected; call close() or use it as a "
        "context manager",
        ResourceWarning,
        stacklevel=2,
    )


def _out_of_memory(exc: NodeFailedError) -> NodeFailedError:
    """``exc``, or a :class:`NodeOutOfMemoryError` if a device ran out."""
    cause = exc.__cause__
    if isinstance(cause, OutOfMemoryError):
        return NodeOutOfMemoryError(exc, cause)
    return exc
