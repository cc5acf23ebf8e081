"""Where pooled runs happen: the context backends of an executor core.

The core (:mod:`asyncrt.runtime._core`) lends run contexts to concurrent
``await run(**inputs)`` callers; *what* a context is comes from a backend,
passed in as a strategy (as dask's ``get_async`` takes its pool):

* :class:`InProcess` (the default): a :class:`~asyncrt.runtime._context.RunContext`
  in this process, bound to the shared parameters;
* :class:`WorkerProcesses` (``processes=True``): a
  :class:`~asyncrt.runtime._process.ProcessContext`, a worker process that
  rebuilds the executor from a :class:`~asyncrt.runtime._process_wire.WorkerSpec`
  and runs there, so kernels never hold the event loop's GIL. Before its
  first run it may choose the workers' OpenBLAS kernel set by timing the
  graph (:mod:`asyncrt.runtime._blas_choice`).

The stateful API (``set_input`` / ``run()`` / ``get_output``) always runs
in this process, whatever the backend.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence

import anyio

from devices import Device, get_api, process_state

from ..errors import ArgumentError, NodeFailedError, WorkerError
from . import _blas_choice, _threads
from ._compiled import CompiledGraph
from ._context import ContextPool, RunContext, context_nbytes
from ._options import ExecutorOptions
from ._parameters import Parameters
from ._process import ProcessContext
from ._process_wire import IoLayout, WorkerSpec

__all__ = (
    "AnyContext",
    "ContextBackend",
    "InProcess",
    "WorkerProcesses",
    "backend_for",
)

#: A pooled run context: in this process, or in a worker process.
AnyContext = RunContext | ProcessContext


class ContextBackend(abc.ABC):
    """Makes the pooled run contexts of an executor; a backend overrides
    what it does beyond making them (the defaults do nothing)."""

    @abc.abstractmethod
    def new_context(
        self, compiled: CompiledGraph, parameters: Parameters, generation: int
    ) -> AnyContext:
        """A new run context of ``compiled``.

        :raises OutOfMemoryError: if a device has no room for it.
        :raises WorkerError: if a worker process cannot start.
        """

    async def prepare(
        self,
        compiled: CompiledGraph,
        parameters: Parameters,
        generation: Callable[[], int],
        pool: ContextPool[AnyContext],
    ) -> None:
        """Get ready for the first pooled run (awaited before each; cheap
        once ready). ``generation()`` is the executor's current one."""
        return None  # contexts in this process need nothing first

    def parameters_changed(self) -> None:
        """Forget what was derived from the parameters' values."""
        return None  # nothing derived by default

    @property
    def blas(self) -> str | None:
        """The OpenBLAS kernel set the contexts load, if the backend chose
        one (``None`` otherwise)."""
        return None

    @property
    def blas_timing(self) -> Mapping[str, float] | None:
        """What choosing :attr:`blas` measured, if anything."""
        return None


class InProcess(ContextBackend):
    """Run contexts in this process.

    :param on_context: called with every new context (tracing).
    """

    def __init__(self, on_context: Callable[[RunContext], None] | None = None) -> None:
        self._on_context = on_context

    def new_context(
        self, compiled: CompiledGraph, parameters: Parameters, generation: int
    ) -> AnyContext:
        return new_run_context(compiled, parameters, generation, self._on_context)


def new_run_context(
    compiled: CompiledGraph,
    parameters: Parameters,
    generation: int,
    on_context: Callable[[RunContext], None] | None = None,
) -> RunContext:
    """A run context of ``compiled`` in this process, passed to
    ``on_context`` (closed again if that raises)."""
    context = RunContext(
        compiled.plan,
        compiled.kernels,
        owned_inputs(compiled, parameters),
        parameters.bound(compiled),
    )
    context.generation = generation
    if on_context is not None:
        try:
            on_context(context)
        except BaseException:
            context.close()
            raise
    return context


def owned_inputs(compiled: CompiledGraph, parameters: Parameters) -> tuple[int, ...]:
    """The node ids of the graph inputs a context owns a buffer for: every
    input that is not a parameter."""
    return tuple(
        entry.nid
        for name, entry in compiled.input_entries.items()
        if name not in parameters
    )


def nbytes_of(compiled: CompiledGraph, parameters: Parameters) -> int:
    """Device bytes one run context of ``compiled`` costs."""
    return context_nbytes(compiled.plan, owned_inputs(compiled, parameters))


class WorkerProcesses(ContextBackend):
    """Run contexts in worker processes (``processes=True``).

    :param options: the executor's options (worker imports, niceness,
        environment, kernel set, and what the workers plan with).
    :param devices: the executor's devices.
    :raises ArgumentError: if the kernel set is given both as
        ``worker_blas`` and in ``worker_env``.
    """

    def __init__(self, options: ExecutorOptions, devices: Sequence[Device]) -> None:
        self._options = options
        self._devices = tuple(devices)
        self._env = dict(options.worker_env)
        # The workers' kernel set: None until "auto" has timed the graph.
        self._blas_env: dict[str, str] | None = _blas_env(options)
        self._timing: _blas_choice.Timing | None = None
        self._lock: anyio.Lock | None = None
        self._spec: WorkerSpec | None = None

    @property
    def blas(self) -> str | None:
        if self._blas_env is None:
            return None
        env = {**self._env, **self._blas_env}  # worker_env may name it
        return env.get(_blas_choice.ENV, "default")

    @property
    def blas_timing(self) -> Mapping[str, float] | None:
        return None if self._timing is None else self._timing.medians

    def parameters_changed(self) -> None:
        self._spec = None

    def new_context(
        self, compiled: CompiledGraph, parameters: Parameters, generation: int
    ) -> AnyContext:
        return self._new_worker(compiled, parameters, generation, self._blas_env or {})

    def _new_worker(
        self,
        compiled: CompiledGraph,
        parameters: Parameters,
        generation: int,
        blas_env: Mapping[str, str],
    ) -> ProcessContext:
        spec = self._spec
        if spec is None:  # made again whenever the parameters change
            spec = self._spec = self.worker_spec(compiled, parameters)
        owned = {
            name: entry
            for name, entry in compiled.input_entries.items()
            if name not in parameters
        }
        context = ProcessContext(
            spec,
            owned,
            compiled.heads,
            nbytes_of(compiled, parameters),
            {**self._env, **blas_env},
        )
        context.generation = generation
        return context

    def worker_spec(
        self, compiled: CompiledGraph, parameters: Parameters
    ) -> WorkerSpec:
        """What a worker builds: the graph, the parameters' current values,
        the parent's placement and the worker's options."""
        plan = compiled.plan
        inputs = {
            name: (compiled.tensor(entry).shape, compiled.tensor(entry).dtype)
            for name, entry in compiled.input_entries.items()
            if name not in parameters
        }
        outputs = [
            (compiled.tensor(h).shape, compiled.tensor(h).dtype) for h in plan.heads
        ]
        options = self._options
        return WorkerSpec(
            graph=compiled.graph.to_json(),
            # Only those this graph reads: a shape signature's graph reads a
            # part of the weights its executor shares among all of them.
            params={
                name: parameters.host_array(name).numpy()
                for name in compiled.input_entries
                if name in parameters
            },
            devices=tuple(str(d) for d in self._devices),
            placement={nid: str(d) for nid, d in plan.placement.items()},
            options=options.for_worker(
                _threads.threads_for(
                    _threads.cpu_streams(plan),
                    # Workers run side by side by design: "auto" sizes their
                    # pools for that, so N workers never put N x cores
                    # threads on the cores.
                    "throughput"
                    if options.kernel_threads == "auto"
                    else options.kernel_threads,
                    options.max_contexts,
                )
            ),
            imports=options.worker_imports,
            layout=IoLayout.of(inputs, outputs),
            nice=options.worker_nice,
            device_state=process_state(),
        )

    async def prepare(
        self,
        compiled: CompiledGraph,
        parameters: Parameters,
        generation: Callable[[], int],
        pool: ContextPool[AnyContext],
    ) -> None:
        """Time the graph in one worker per candidate kernel set and keep
        the faster (:mod:`asyncrt.runtime._blas_choice`); the winning
        worker becomes the first pooled context."""
        if self._blas_env is not None:
            return
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._blas_env is not None:  # another run chose meanwhile
                return
            on_host = any(
                get_api(d.kind).is_host for d in compiled.plan.placement.values()
            )
            sets = _blas_choice.candidates(self._env) if on_host else ()
            if not sets:  # nothing to choose, or no kernel runs on the cpu
                self._blas_env = {}
                return
            workers: dict[str, ProcessContext] = {}
            keep: ProcessContext | None = None
            started = generation()
            try:
                for name in sets:  # OpenBLAS's own choice first, as it is
                    env = {_blas_choice.ENV: name} if workers else {}
                    workers[name] = self._new_worker(compiled, parameters, started, env)
                for worker in workers.values():
                    await worker.ready()  # started side by side; not timed
                timing = await _blas_choice.time_interleaved(
                    {name: w.program.run for name, w in workers.items()}
                )
                chosen = sets[0]
                if timing is not None:
                    chosen = _blas_choice.faster(timing, chosen)
                self._timing = timing
                self._blas_env = {_blas_choice.ENV: chosen} if chosen != sets[0] else {}
                if started == generation():  # else parameters changed meanwhile
                    keep = workers[chosen]
            except (NodeFailedError, WorkerError):
                # The graph cannot run on zeros, or no worker starts: keep
                # OpenBLAS's own set; the first run meets the error itself.
                self._blas_env = {}
            finally:
                for worker in workers.values():
                    if worker is not keep or not pool.adopt(worker):
                        worker.close()


def backend_for(
    options: ExecutorOptions,
    devices: Sequence[Device],
    on_context: Callable[[RunContext], None] | None = None,
) -> ContextBackend:
    """The backend ``options`` ask for (``on_context`` applies in process)."""
    if options.processes:
        return WorkerProcesses(options, devices)
    return InProcess(on_context)


def _blas_env(options: ExecutorOptions) -> dict[str, str] | None:
    """The environment that selects the workers' kernel set, or ``None``
    if ``"auto"`` is to time the graph first."""
    if options.worker_blas == "auto":
        return None
    if options.worker_blas == "default":
        return {}
    if _blas_choice.ENV in options.worker_env:
        raise ArgumentError(
            f"worker_blas={options.worker_blas!r} and "
            f"worker_env[{_blas_choice.ENV!r}] both choose the kernel set: give one"
        )
    return {_blas_choice.ENV: options.worker_blas}
