"""An executor of a symbolic graph: every input shape from one executor.

:class:`PolymorphicCore` serves a :class:`~asyncrt.graph.SymbolicGraph` (an
ONNX model with symbolic batch or sequence dimensions, or inputs whose
values decide shapes). Each request goes through three steps:

1. its **signature** (the input shapes, and the values of the shape-valued
   inputs) is computed and checked against the model, in microseconds on
   the event loop: a shape the model cannot take is an
   :class:`~asyncrt.errors.InputError` naming the input and the dimension,
   raised before anything is built or run;
2. the signature's **static executor core** comes from the
   :class:`~asyncrt.runtime._plan_cache.PlanCache`: built on first sight,
   off the loop, once however many requests bring it (specialization,
   planning, kernel resolution), then reused; at most ``max_plans`` are
   kept, least recently used evicted first (an evicted core finishes its
   runs in flight);
3. the request runs on that core as a run of a static executor does (a
   pooled context, the same fast path), with at most ``max_contexts`` runs
   in flight across all signatures.

The weights are held once (:class:`~asyncrt.runtime._parameters.Parameters`)
and shared by every signature; a signature's own folded constants live
with its core. The stateful API works on the values given last:
``set_input`` keeps them, ``run()`` runs them as a pooled request, and
``get_output`` reads that run's outputs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import anyio
import numpy as np

from devices import Device, NDArray, array
from scheduler.plan import Plan

from ..errors import ClosedResourceError, InputError
from ..graph import SymbolicGraph
from ..ops._kernels import Module
from . import _threads
from ._backends import AnyContext, ContextBackend
from ._context import ContextPool
from ._core import ExecutorCore, Guards
from ._options import ExecutorOptions
from ._parameters import Parameters
from ._plan_cache import CacheStats, PlanCache

__all__ = ("PolymorphicCore",)

#: What a signature's build needs: the shapes, and the shape-valued inputs'
#: values (host arrays).
_Request = tuple[dict[str, tuple[int, ...]], dict[str, "np.ndarray[Any, Any]"]]


class PolymorphicCore(Guards):
    """One executor for every shape of a symbolic graph; see the module
    docstring.

    :param symbolic: the graph.
    :param lib: kernels looked up before the global registry.
    :param devices: the devices, host-facing first.
    :param options: the executor's options (``max_plans`` bounds the cache).
    :param params: the shared weights by name (``from_onnx``'s ``params``).
    :raises InputError: for a parameter the graph does not have, or of the
        wrong shape or dtype.
    """

    def __init__(
        self,
        symbolic: SymbolicGraph,
        lib: Module | None,
        devices: Sequence[Device],
        options: ExecutorOptions,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.symbolic = symbolic
        self.options = options
        self.devices = tuple(devices)
        self._lib = lib
        self._parameters = Parameters()
        self._cache: PlanCache[ExecutorCore, _Request] = PlanCache(
            self._build, options.max_plans, ExecutorCore.retire
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._given: dict[str, Any] = {}  # the stateful API's inputs
        self._outputs: list[NDArray] | None = None  # ... and last outputs
        self._stateful_busy = False
        self._closed = False
        if params:
            self.load_params(params)

    # -- what was built ------------------------------------------------------------

    @property
    def stats(self) -> CacheStats:
        """The plan cache's hits, misses, builds, evictions and build times."""
        return self._cache.stats

    def _latest(self) -> ExecutorCore:
        core = self._cache.peek()
        if core is None:
            raise InputError(
                "this executor's graph has symbolic shapes and no signature has "
                "run yet: a plan exists per signature, after its first run"
            )
        return core

    @property
    def plan(self) -> Plan:
        """The plan of the signature run last.

        :raises InputError: before the first run.
        """
        return self._latest().plan

    @property
    def pool(self) -> ContextPool[AnyContext]:
        """The context pool of the signature run last.

        :raises InputError: before the first run.
        """
        return self._latest().pool

    @property
    def context_nbytes(self) -> int:
        """Device bytes one run context of the signature run last costs.

        :raises InputError: before the first run.
        """
        return self._latest().context_nbytes

    @property
    def backend(self) -> ContextBackend:
        """The context backend of the signature run last.

        :raises InputError: before the first run.
        """
        return self._latest().backend

    @property
    def thread_lease(self) -> _threads.ThreadLease | None:
        """The thread lease of the signature run last, if any."""
        core = self._cache.peek()
        return None if core is None else core.thread_lease

    @property
    def parameters(self) -> Parameters:
        """The shared weights."""
        return self._parameters

    def input_names(self) -> tuple[str, ...]:
        """The inputs a caller gives, then the parameters."""
        return (*self.symbolic.inputs, *self.symbolic.params)

    def input_name(self, key: int | str) -> str:
        """The name of an input given by name or index.

        :raises InputError: for an unknown name or an index out of range.
        """
        names = self.input_names()
        if isinstance(key, str):
            if key not in names:
                shown = ", ".join(self.symbolic.inputs) or "none"
                more = self.symbolic.params
                params = f" (and {len(more)} parameters)" if more else ""
                raise InputError(f"graph has no input {key!r}; inputs: {shown}{params}")
            return key
        if isinstance(key, bool) or not isinstance(key, int):
            raise InputError(f"an input is a name or an index, not {key!r}")
        if not 0 <= key < len(names):
            raise InputError(
                f"input index {key} out of range (graph has {len(names)} inputs)"
            )
        return names[key]

    def input_info(self) -> tuple[dict[str, tuple[int | str, ...]], dict[str, str]]:
        """Shapes (symbols by name) and dtypes of the inputs."""
        shapes: dict[str, tuple[int | str, ...]] = {}
        dtypes: dict[str, str] = {}
        for name, spec in self.symbolic.inputs.items():
            shapes[name], dtypes[name] = spec.shape, spec.dtype
        for name, (shape, dtype) in self.symbolic.params.items():
            shapes[name], dtypes[name] = tuple(shape), dtype
        return shapes, dtypes

    def num_outputs(self) -> int:
        """How many outputs the graph has."""
        return len(self.symbolic.outputs)

    # -- parameters and the stateful API ---------------------------------------------

    def load_params(self, values: Mapping[str, Any]) -> None:
        """Set shared weights by name; every signature's contexts bind them.

        :raises InputError: for an unknown name or a mismatched value.
        :raises BusyError: while runs are in flight.
        """
        self.check_open()
        checked = [(name, self._check_param(name, v)) for name, v in values.items()]
        self.check_no_runs()
        self._parameters.load(checked)
        for core in self._cache.entries():
            core.rebind()

    def share_params(self, arrays: Mapping[str, NDArray]) -> None:
        """Use these host arrays (another executor's) as shared weights.

        :raises InputError: for an unknown name or a mismatched array.
        :raises BusyError: while runs are in flight.
        """
        self.check_open()
        for name, value in arrays.items():
            self._check_param(name, value)
        self.check_no_runs()
        self._parameters.share(arrays)
        for core in self._cache.entries():
            core.rebind()

    def _check_param(self, name: str, value: Any) -> NDArray | np.ndarray[Any, Any]:
        declared = self.symbolic.params.get(name)
        if declared is None:
            self.input_name(name)  # an input, not a parameter: say which
            raise InputError(f"{name!r} is an input, not a parameter")
        shape, dtype = declared
        checked = value if isinstance(value, NDArray) else np.asarray(value)
        got_dtype = (
            checked.dtype if isinstance(checked, NDArray) else str(checked.dtype)
        )
        if tuple(checked.shape) != tuple(shape) or got_dtype != dtype:
            raise InputError(
                f"parameter {name!r} expects shape {tuple(shape)} and dtype {dtype}, "
                f"got {tuple(checked.shape)} {got_dtype}"
            )
        return checked

    def set_inputs(self, values: Mapping[str, Any]) -> None:
        """Keep inputs for the next stateful run (a parameter's name sets
        that shared weight).

        :raises InputError: for an unknown name.
        :raises BusyError: while a stateful run is in flight.
        """
        self.check_open()
        self.check_not_busy()
        params = {n: v for n, v in values.items() if n in self.symbolic.params}
        for name in values:
            self.input_name(name)
        if params:
            self.load_params(params)
        self._given.update(
            (n, v) for n, v in values.items() if n not in self.symbolic.params
        )

    def input_array(self, name: str) -> NDArray:
        """The value kept for input ``name`` (or the shared weight).

        :raises InputError: if none was set.
        """
        if name in self.symbolic.params:
            return self._parameters.host_array(name)
        if name not in self._given:
            raise InputError(f"input {name!r} was never set")
        value = self._given[name]
        return value if isinstance(value, NDArray) else array(np.asarray(value))

    async def run_own(self) -> None:
        """Run the inputs kept by :meth:`set_inputs` (one caller at a time).

        :raises InputError: if an input was never set, or for bad shapes.
        :raises BusyError: while another stateful run is in flight.
        """
        self.check_open()
        self.check_not_busy()
        self._stateful_busy = True
        try:
            self._outputs = await self.run_pooled(dict(self._given), None)
        finally:
            self._stateful_busy = False

    def run_own_sync(self, inputs: Mapping[str, Any]) -> list[NDArray] | None:
        """A run on the calling thread (its signature built there if new);
        returns the outputs if inputs were given.

        :raises InputError: for missing, unknown or mismatched inputs.
        :raises BusyError: while another stateful run is in flight.
        """
        self.check_open()
        if inputs:
            self.set_inputs(inputs)
        self.check_not_busy()
        key, request, run_inputs = self._request(self._given)
        core = self._cache.get_sync(key, request)
        self._stateful_busy = True
        try:
            outputs = core.run_own_sync(run_inputs)
            if outputs is None:  # a graph whose inputs all decide shapes
                outputs = [
                    core.output(i).copyto(core.plan.host)
                    for i in range(core.num_outputs())
                ]
        finally:
            self._stateful_busy = False
        self._outputs = outputs
        return outputs if inputs else None

    def output(self, index: int) -> NDArray:
        """Output ``index`` of the last stateful run.

        :raises InputError: before one, or if ``index`` is out of range.
        """
        if self._outputs is None:
            raise InputError("no stateful run has happened yet")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not (0 <= index < len(self._outputs))
        ):
            raise InputError(
                f"output index {index!r} out of range (graph has {len(self._outputs)})"
            )
        return self._outputs[index]

    def own_outputs(self, targets: list[Any]) -> list[Any]:
        """The last stateful run's outputs copied into ``targets``."""
        for index, target in enumerate(targets):
            value = self.output(index)
            if isinstance(target, NDArray):
                target.copyfrom(value)
            else:
                np.copyto(target, value.numpy(), casting="no")
        return targets

    # -- running ---------------------------------------------------------------------

    def _request(
        self, inputs: Mapping[str, Any]
    ) -> tuple[Hashable, _Request, dict[str, Any]]:
        """The signature of ``inputs``, what its build needs, and the inputs
        its core takes (the shape-valued ones are bound in its graph).

        :raises InputError: if the inputs do not fit the model.
        """
        symbolic = self.symbolic
        shapes: dict[str, tuple[int, ...]] = {}
        values: dict[str, np.ndarray[Any, Any]] = {}
        dtypes: dict[str, str] = {}
        run_inputs: dict[str, Any] = {}
        for name, value in inputs.items():
            if name not in symbolic.inputs:
                self.input_name(name)  # unknown: named, with the inputs
                raise InputError(f"{name!r} is a parameter; use load_params")
            if isinstance(value, NDArray):
                shapes[name], dtypes[name] = tuple(value.shape), value.dtype
            else:
                if not hasattr(value, "shape") or not hasattr(value, "dtype"):
                    value = np.asarray(value, dtype=symbolic.inputs[name].dtype)
                shapes[name] = tuple(int(d) for d in value.shape)
                dtypes[name] = (
                    "bool" if str(value.dtype) == "bool_" else str(value.dtype)
                )
            if symbolic.inputs[name].shape_valued:
                values[name] = (
                    value.numpy() if isinstance(value, NDArray) else (np.asarray(value))
                )
            else:
                run_inputs[name] = value
        key = symbolic.signature(shapes, values, dtypes=dtypes)
        return key, (shapes, values), run_inputs

    def _build(self, key: Hashable, request: _Request) -> ExecutorCore:
        """The static core of one signature (runs off the event loop)."""
        shapes, values = request
        special = self.symbolic.specialize(shapes, values)
        return ExecutorCore(
            special.graph,
            self._lib,
            self.devices,
            self.options,
            special.params,
            parameters=Parameters(self._parameters),
        )

    async def run_pooled(
        self, inputs: Mapping[str, Any], targets: list[Any] | None
    ) -> list[Any]:
        """One request: its signature, its core (built if new), a pooled run.

        :raises InputError: for inputs the model cannot take.
        :raises NodeFailedError: if a kernel raised.
        :raises ClosedResourceError: if the executor is or gets closed.
        """
        self.check_open()
        key, request, run_inputs = self._request(inputs)
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.options.max_contexts)
        async with self._limiter:
            while True:
                core = await self._cache.get(key, request)
                try:
                    return await core.run_pooled(run_inputs, targets)
                except ClosedResourceError:
                    if self._closed or not core.retired:
                        raise
                    # evicted between the lookup and the run: look it up again

    def check_out(self, out: Sequence[Any]) -> list[Any]:
        """``out=`` arrays: checked by the signature's core when it runs
        (their shapes depend on it); here only their count.

        :raises InputError: for the wrong number.
        """
        targets = list(out)
        if len(targets) != self.num_outputs():
            raise InputError(
                f"out= needs {self.num_outputs()} arrays (one per output), "
                f"got {len(targets)}"
            )
        return targets

    # -- lifetime ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check_no_runs(self) -> None:
        """:raises BusyError: while any run is in flight."""
        for core in self._cache.entries():
            core.check_no_runs()
        self.check_not_busy()

    def close(self) -> None:
        """Close every signature's core (their runs in flight stop) and the
        cache. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for core in self._cache.entries():
            core.close()
        self._cache.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until every run in flight is gone."""
        cores = self._cache.entries()
        self.close()
        for core in cores:
            await core.aclose()
