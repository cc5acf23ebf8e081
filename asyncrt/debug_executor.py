"""The debug executor (TVM's ``debug_executor``): the graph executor, traced.

.. code-block:: python

    ex = asyncrt.debug_executor.create(graph, lib, devices, dump_root="dbg")
    ex.load_params(params)
    outputs = await ex.run(x=data)          # as graph_executor, and traced
    print(ex.profile(x=data))               # per-node times: a ProfileReport
    times = ex.run_individual(10, repeat=3) # per node, `repeat` mean times (s)
    h = ex.debug_get_output("tanh0")        # any node's output
    ex.dump(x=data)                         # every node's output, graph, trace
    ex.trace.save_chrome_trace("runs.json") # the timeline of the runs so far

Everything :mod:`asyncrt.graph_executor` promises still holds: the same
API, concurrent ``await run(**inputs)``, cancellation, ``close()``. In
addition every run, pooled or stateful, is traced (:mod:`scheduler.trace`)
into :attr:`GraphModuleDebug.trace`, which keeps the latest ``max_runs``.

Per-node times are *device* times: the modelled duration on ``sim``, CUDA
events on ``cuda``, the wall time on the stream's thread on ``cpu``.

TVM's measurements — :meth:`~GraphModuleDebug.profile`,
:meth:`~GraphModuleDebug.run_individual`,
:meth:`~GraphModuleDebug.debug_get_output` and
:meth:`~GraphModuleDebug.dump` — run the executor's own context, i.e. the
inputs given with ``set_input`` (keyword inputs are set first), one caller
at a time as in TVM. Each blocks the calling thread, as TVM's does; the
``a``-prefixed twin (``aprofile``, ...) awaits instead, for async code and
for graphs with coroutine kernels.

``run_individual`` runs the whole graph and reads each node's device time
(nodes are not run in isolation): one warm-up run, then ``repeat``
measurements of ``number`` runs, ``number`` growing until the runs of one
measurement last ``min_repeat_ms`` (wall time). Graph inputs and
parameters, and TVM's ``__nop`` nodes, take no time.

Dump layout (TVM's), written by :meth:`~GraphModuleDebug.dump`::

    dump_root/
      _tvmdbg_device_CPU_0/                 the host-facing device
        _tvmdbg_graph_dump.json             the graph, one entry per node
        _tvmdbg_execution_trace.json        Chrome trace of the dumped run
        x____topo-index_0____output-num_0.npy
      _tvmdbg_device_SIM_0/                 tensors that live on sim:0
        mm0a____topo-index_3____output-num_0.npy

A node fused into another kernel (the default fuses exact elementwise
chains, see :mod:`asyncrt.ops._fusion`) has no tensor of its own: the
profile names the fused kernel, :meth:`~GraphModuleDebug.debug_get_output`
refuses the member and the dump leaves it out; create the debug executor
with ``fuse=False`` to see every node as drawn.

Each tensor is dumped in the folder of the device that holds it, as
``<node name>____topo-index_<node id>____output-num_<output>.npy`` (TVM's
key, with ``_`` for ``:`` and for any character not safe in a file name).
The graph dump is the graph JSON with each node's ``op`` (its kernel, or
``"param"`` for inputs and parameters), ``inputs`` as node names, ``shape``,
``attrs.T`` (``"type: <dtype>"``), as TVM writes it, plus asyncrt's
``device`` and ``stream``.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from typing_extensions import Unpack

from devices import Device, NDArray, array
from scheduler.dag import NOP_FUNC, Entry, node_spec
from scheduler.dispatch import Program
from scheduler.fusion import FUSED_NODES_ATTR
from scheduler.plan import Launch
from scheduler.trace import RunTrace, TraceRecorder

from .errors import (
    ArgumentError,
    ClosedResourceError,
    InputError,
    UnsupportedOperationError,
)
from .graph import Graph, SymbolicGraph, load_graph
from .graph_executor import DeviceSpec, GraphModule, Params, parse_devices
from .ops._kernels import Module
from .runtime._context import RunContext
from .runtime._options import ExecutorOptions, OptionOverrides
from .tools._profile import ProfileReport, node_ops
from .tools._time_evaluator import Progress, Schedule, Settings
from .tools._timeline import save_chrome_trace
from .tools._trace import Trace

__all__ = ("GraphModuleDebug", "create")

GRAPH_DUMP_FILE_NAME = "_tvmdbg_graph_dump.json"
CHROME_TRACE_FILE_NAME = "_tvmdbg_execution_trace.json"
_DUMP_PATH_PREFIX = "_tvmdbg_device_"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")

#: What a measurement asks its driver for: a stateful run, or a pause.
_RUN = None
_Step = float | None


def create(
    graph: Graph | SymbolicGraph | str | bytes | Mapping[str, Any],
    lib: Module | None = None,
    devices: DeviceSpec | None = None,
    dump_root: str | Path | None = None,
    *,
    max_runs: int = 1000,
    params: Params | None = None,
    options: ExecutorOptions | None = None,
    **overrides: Unpack[OptionOverrides],
) -> GraphModuleDebug:
    """Create a debug executor (TVM's ``debug_executor.create``).

    :param graph: as :func:`asyncrt.graph_executor.create`.
    :param lib: as :func:`asyncrt.graph_executor.create`.
    :param devices: as :func:`asyncrt.graph_executor.create`.
    :param dump_root: where :meth:`GraphModuleDebug.dump` writes; ``None``
        makes a temporary folder on the first dump.
    :param max_runs: how many traced runs :attr:`GraphModuleDebug.trace`
        keeps.
    :param params: as :func:`asyncrt.graph_executor.create`.
    :param options: as :func:`asyncrt.graph_executor.create`.
    :param overrides: as :func:`asyncrt.graph_executor.create`.
    :raises UnsupportedOperationError: for a graph with symbolic shapes.
    :raises ArgumentError: if ``dump_root`` exists and is not a folder,
        ``max_runs`` < 1, or an option is unknown or bad.
    :raises GraphError: if the graph is malformed.
    :raises KernelNotFoundError: if a node's kernel is missing for its device.
    :raises PlanError: if the graph cannot be planned on these devices.
    """
    if isinstance(graph, SymbolicGraph):
        raise UnsupportedOperationError(
            "the debug executor traces one plan and needs static shapes: import "
            "the model with shape_dict= to fix its symbolic dimensions"
        )
    return GraphModuleDebug(
        graph if isinstance(graph, Graph) else load_graph(graph),
        lib,
        parse_devices(devices),
        ExecutorOptions.of(options, **overrides),
        params=params,
        dump_root=dump_root,
        max_runs=max_runs,
    )


class GraphModuleDebug(GraphModule):
    """A graph executor that traces its runs; see the module docstring.

    Use :func:`create` rather than this constructor.

    :ivar trace: the traced runs (the latest ``max_runs``).
    """

    graph: Graph  # always static: tracing needs one plan

    def __init__(
        self,
        graph: Graph,
        lib: Module | None,
        devices: Sequence[Device],
        options: ExecutorOptions,
        *,
        params: Params | None = None,
        dump_root: str | Path | None = None,
        max_runs: int = 1000,
    ) -> None:
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise ArgumentError(f"max_runs must be an int >= 1, got {max_runs!r}")
        root = None if dump_root is None else Path(dump_root)
        if root is not None and root.exists() and not root.is_dir():
            raise ArgumentError(f"dump_root {str(root)!r} exists and is not a folder")
        # Made first: every context the executor makes is traced into it.
        self._recorder = TraceRecorder(max_runs)
        super().__init__(
            graph, lib, devices, options, params=params, on_context=self._traced
        )
        names = {nid: node.name for nid, node in enumerate(graph.nodes)}
        self.trace = Trace(
            self.plan, names, recorder=self._recorder, ops=node_ops(graph)
        )
        self._dump_root = root
        # Each node's stream (a node split into parts: its first part's).
        self._stream_of = {
            step.nid: s
            for s, stream in enumerate(self.plan.streams)
            for step in stream.steps
            if isinstance(step, Launch) and (step.part is None or not step.part.index)
        }

    def _traced(self, context: RunContext) -> None:
        context.program.set_tracer(self._recorder)

    @property
    def dump_root(self) -> Path | None:
        """Where :meth:`dump` writes (``None`` until a temporary folder is
        made by the first dump, when none was given)."""
        return self._dump_root

    # -- nodes -----------------------------------------------------------------------

    def _node_index(self, node: int | str) -> int:
        if isinstance(node, str):
            found = [n for n, g in enumerate(self.graph.nodes) if g.name == node]
            if len(found) > 1:
                # Real TVM files repeat operator names: never pick one silently.
                raise InputError(
                    f"node name {node!r} is ambiguous: nodes "
                    f"{', '.join(map(str, found))} share it; give the node's index"
                )
            if not found:
                raise InputError(f"graph has no node named {node!r}")
            return found[0]
        if isinstance(node, bool) or not isinstance(node, int):
            raise InputError(f"a node is a name or an index, not {node!r}")
        if not 0 <= node < len(self.graph.nodes):
            raise InputError(
                f"node index {node} out of range (graph has {len(self.graph.nodes)})"
            )
        return node

    # -- measuring ---------------------------------------------------------------------

    def _own_program(self) -> Program:
        self.core.check_open()
        self.core.check_not_busy()
        return self.core.own_context().program

    def _restore_tracer(self, program: Program) -> None:
        # A program closed meanwhile (the executor closed) needs no tracer.
        with contextlib.suppress(ClosedResourceError):
            program.set_tracer(self._recorder)

    # A measurement is a generator of steps (a stateful run, or a pause), so
    # that the blocking and the awaiting forms share every line of it. The
    # drivers close it even when a run fails, so its cleanup (putting the
    # executor's tracer back) happens at once, not when it is collected.

    def _drive(self, steps: Generator[_Step, None, None]) -> None:
        with contextlib.closing(steps):
            for step in steps:
                if step is _RUN:
                    self.run_sync()
                else:
                    time.sleep(step)

    async def _adrive(self, steps: Generator[_Step, None, None]) -> None:
        with contextlib.closing(steps):
            for step in steps:
                if step is _RUN:
                    await self.run()
                else:
                    await anyio.sleep(step)

    def profile(
        self, runs: int = 10, *, progress: Progress | None = None, **inputs: Any
    ) -> ProfileReport:
        """Run the graph ``runs`` times (after one warm-up) and report each
        node's mean device time (TVM's ``profile``).

        :param runs: how many measured runs.
        :param progress: called after each run with (done, runs).
        :param inputs: graph inputs to set first.
        :return: the report (sortable; text, JSON, CSV).
        :raises ArgumentError: if ``runs`` < 1.
        :raises InputError: for bad or missing inputs.
        :raises NodeFailedError: if a kernel failed.
        """
        result: list[ProfileReport] = []
        self._drive(self._profile_steps(runs, progress, inputs, result))
        return result[0]

    async def aprofile(
        self, runs: int = 10, *, progress: Progress | None = None, **inputs: Any
    ) -> ProfileReport:
        """:meth:`profile`, awaiting the runs."""
        result: list[ProfileReport] = []
        await self._adrive(self._profile_steps(runs, progress, inputs, result))
        return result[0]

    def _profile_steps(
        self,
        runs: int,
        progress: Progress | None,
        inputs: Mapping[str, Any],
        result: list[ProfileReport],
    ) -> Generator[_Step, None, None]:
        _check_count("runs", runs)
        if inputs:
            self.set_input(**inputs)
        yield _RUN  # warm-up, in the executor's trace but not in the report
        program = self._own_program()
        hooks = program.set_tracer(self._recorder)
        for done in range(runs):
            yield _RUN
            if progress is not None:
                progress(done + 1, runs)
        context = hooks.context if hooks is not None else None
        traced = self._recorder.runs(context=context)[-runs:]
        result.append(
            ProfileReport.from_runs(self.plan, traced, self.trace.names, self.trace.ops)
        )

    def run_individual(
        self,
        number: int,
        repeat: int = 1,
        min_repeat_ms: float = 0.0,
        limit_zero_time_iterations: int = 100,
        cooldown_interval_ms: float = 0.0,
        repeats_to_cooldown: int = 1,
    ) -> list[list[float]]:
        """Each node's device time (TVM's ``run_individual``).

        :param number: runs per measurement (their mean is kept).
        :param repeat: measurements.
        :param min_repeat_ms: the least wall time of one measurement's runs;
            ``number`` grows until they last that long.
        :param limit_zero_time_iterations: retries of a 0 s measurement.
        :param cooldown_interval_ms: a pause after every
            ``repeats_to_cooldown`` measurements.
        :param repeats_to_cooldown: see ``cooldown_interval_ms``.
        :return: one list per graph node (in node order) of ``repeat`` mean
            seconds; 0 for inputs, parameters and ``__nop`` nodes.
        :raises ArgumentError: for a count < 1 or a duration < 0.
        :raises InputError: if inputs were never set.
        :raises NodeFailedError: if a kernel failed.
        """
        result: list[list[float]] = []
        settings = Settings(
            number, repeat, min_repeat_ms, limit_zero_time_iterations,
            cooldown_interval_ms, repeats_to_cooldown,
        )  # fmt: skip
        self._drive(self._individual_steps(settings.schedule(), result))
        return result

    async def arun_individual(
        self,
        number: int,
        repeat: int = 1,
        min_repeat_ms: float = 0.0,
        limit_zero_time_iterations: int = 100,
        cooldown_interval_ms: float = 0.0,
        repeats_to_cooldown: int = 1,
    ) -> list[list[float]]:
        """:meth:`run_individual`, awaiting the runs."""
        result: list[list[float]] = []
        settings = Settings(
            number, repeat, min_repeat_ms, limit_zero_time_iterations,
            cooldown_interval_ms, repeats_to_cooldown,
        )  # fmt: skip
        await self._adrive(self._individual_steps(settings.schedule(), result))
        return result

    def _individual_steps(
        self, schedule: Schedule, result: list[list[float]]
    ) -> Generator[_Step, None, None]:
        program = self._own_program()
        # A recorder of its own: a long measurement neither floods nor
        # reads the executor's trace.
        recorder = TraceRecorder(max_runs=1)
        hooks = program.set_tracer(recorder)
        context = hooks.context if hooks is not None else None
        try:
            yield _RUN  # warm-up
            per_node: list[list[float]] = [[] for _ in self.graph.nodes]
            while not schedule.done:
                sums = [0.0] * len(self.graph.nodes)
                number = schedule.number
                start = time.perf_counter()
                for _ in range(number):
                    yield _RUN
                    # Read each run at once: the recorder keeps only one.
                    for run in recorder.runs(context=context):
                        _add_device_times(run, sums)
                    recorder.clear()
                if schedule.report(time.perf_counter() - start):
                    for nid, total in enumerate(sums):
                        per_node[nid].append(total / number)
                    pause = schedule.cooldown()
                    if pause:
                        yield pause
            result.extend(per_node)
        finally:
            self._restore_tracer(program)

    # -- node outputs ----------------------------------------------------------

    def debug_get_output(
        self, node: int | str, out: NDArray | None = None, index: int = 0
    ) -> NDArray:
        """Run the graph and return output ``index`` of ``node`` (a name or
        an index), as TVM's ``debug_get_output``.

        :param out: copy into this array instead of returning a new cpu one.
        :raises InputError: for an unknown node or output, a node fused into
            another kernel (``fuse=False`` keeps every node's tensor), or if
            inputs were never set.
        :raises NodeFailedError: if a kernel failed.
        """
        entry = self._output_entry(node, index)
        captured: list[RunTrace] = []
        self._drive(self._capture_steps(captured))
        return self._deliver(self._value(entry, captured[0]), out)

    async def adebug_get_output(
        self, node: int | str, out: NDArray | None = None, index: int = 0
    ) -> NDArray:
        """:meth:`debug_get_output`, awaiting the run."""
        entry = self._output_entry(node, index)
        captured: list[RunTrace] = []
        await self._adrive(self._capture_steps(captured))
        return self._deliver(self._value(entry, captured[0]), out)

    def _output_entry(self, node: int | str, index: int) -> Entry:
        nid = self._node_index(node)
        count = self.graph.num_outputs(nid)
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < count
        ):
            raise InputError(
                f"node {self.graph.nodes[nid].name!r} has {count} output(s), "
                f"not output {index!r}"
            )
        entry = Entry(nid, index)
        if entry not in self.plan.storage:
            raise InputError(self._fused_away(nid))
        return entry

    def _fused_away(self, nid: int) -> str:
        """Why node ``nid`` has no tensor to read: it was fused (or dropped)."""
        name = self.graph.nodes[nid].name
        dag = self.core.compiled.dag
        for fused in dag.nodes:
            spec = node_spec(dag, fused)
            if name in json.loads(spec.attrs.get(FUSED_NODES_ATTR, "[]")):
                return (
                    f"node {name!r} was fused into {spec.name!r} and has no "
                    "tensor of its own; create the debug executor with "
                    "fuse=False to read every node's output"
                )
        return f"node {name!r} has no tensor in the plan (its output is never used)"

    def _deliver(self, value: np.ndarray[Any, Any], out: NDArray | None) -> NDArray:
        result = array(value)
        return result if out is None else out.copyfrom(result)

    def _capture_steps(self, captured: list[RunTrace]) -> Generator[_Step, None, None]:
        program = self._own_program()
        recorder = TraceRecorder(max_runs=1, capture=True)
        program.set_tracer(recorder)
        try:
            yield _RUN
            captured.extend(recorder.runs())
        finally:
            self._restore_tracer(program)

    def _value(self, entry: Entry, run: RunTrace) -> np.ndarray[Any, Any]:
        """A tensor's value in a captured run: what its producer wrote, or
        the bound array of an input or parameter."""
        owner = self.plan.resolve(entry)
        captured = run.outputs.get(owner)
        if captured is not None:
            return captured
        return self.core.own_context().program.arrays[owner].numpy()

    # -- dumping ---------------------------------------------------------------

    def dump(self, **inputs: Any) -> Path:
        """Run the graph twice (timed, then capturing every node's output)
        and write the dump (see the module docstring).

        :param inputs: graph inputs to set first.
        :return: the host-facing device's dump folder.
        :raises InputError: for bad or missing inputs.
        :raises NodeFailedError: if a kernel failed.
        :raises OSError: if the files cannot be written.
        """
        runs: list[RunTrace] = []
        self._drive(self._dump_steps(inputs, runs))
        return self._write_dump(runs[0], runs[1])

    async def adump(self, **inputs: Any) -> Path:
        """:meth:`dump`, awaiting the runs."""
        runs: list[RunTrace] = []
        await self._adrive(self._dump_steps(inputs, runs))
        return self._write_dump(runs[0], runs[1])

    def _dump_steps(
        self, inputs: Mapping[str, Any], runs: list[RunTrace]
    ) -> Generator[_Step, None, None]:
        if inputs:
            self.set_input(**inputs)
        program = self._own_program()
        hooks = program.set_tracer(self._recorder)
        yield _RUN
        context = hooks.context if hooks is not None else None
        runs.extend(self._recorder.runs(context=context)[-1:])
        yield from self._capture_steps(runs)

    def _write_dump(self, timed: RunTrace, captured: RunTrace) -> Path:
        if self._dump_root is None:
            self._dump_root = Path(tempfile.mkdtemp(prefix="asyncrtdbg_"))
        root = self._dump_root
        host_dir = _device_dir(root, self.plan.host)
        for folder in {_device_dir(root, d) for d in self.plan.devices}:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob("*.npy"):  # a previous dump's tensors
                stale.unlink()
        for nid, node in enumerate(self.graph.nodes):
            for index in range(self.graph.num_outputs(nid)):
                entry = Entry(nid, index)
                placement = self.plan.storage.get(entry)
                if placement is None:  # an entry the plan dropped
                    continue
                name = _tensor_file(node.name, nid, index)
                folder = _device_dir(root, placement.device)
                np.save(folder / name, self._value(entry, captured), allow_pickle=False)
        graph_dump = host_dir / GRAPH_DUMP_FILE_NAME
        graph_dump.write_text(
            json.dumps(self._graph_dump(), indent=4), encoding="utf-8"
        )
        save_chrome_trace(host_dir / CHROME_TRACE_FILE_NAME, [timed])
        return host_dir

    def _graph_dump(self) -> dict[str, Any]:
        """The graph JSON with TVM's debug fields, and device and stream."""
        graph = self.graph
        dumped = graph.to_dict()
        for nid, (node, raw) in enumerate(
            zip(graph.nodes, dumped["nodes"], strict=True)
        ):
            eid = graph.entry_id(nid, 0) if graph.num_outputs(nid) else None
            attrs = dict(raw.get("attrs", {}))
            raw["op"] = "param" if node.is_null else node.func_name
            raw["inputs"] = [graph.nodes[e.nid].name for e in node.inputs]
            if eid is not None:
                attrs["T"] = f"type: {graph.dltype[eid]}"
                raw["shape"] = list(graph.shape[eid])
            raw["attrs"] = attrs
            placement = self.plan.storage.get(Entry(nid, 0))
            device = self.plan.placement.get(nid) or (
                placement.device if placement is not None else None
            )
            raw["device"] = None if device is None else str(device)
            raw["stream"] = self._stream_of.get(nid)
        return dumped


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be an int >= 1, got {value!r}")


def _add_device_times(run: RunTrace, sums: list[float]) -> None:
    """Add each graph node's device time in ``run`` to ``sums`` (copies
    have ids past the graph's nodes and are left out)."""
    for span in run.spans:
        launch = span.launch
        if (
            launch is not None
            and launch.nid < len(sums)
            and launch.func_name != NOP_FUNC
        ):
            sums[launch.nid] += span.device_time


def _device_dir(root: Path, device: Device) -> Path:
    """TVM's folder for one device: ``_tvmdbg_device_CPU_0``."""
    return root / f"{_DUMP_PATH_PREFIX}{device.kind.upper()}_{device.index}"


def _tensor_file(name: str, nid: int, index: int) -> str:
    safe = _UNSAFE.sub("_", name) or "node"
    return f"{safe}____topo-index_{nid}____output-num_{index}.npy"
