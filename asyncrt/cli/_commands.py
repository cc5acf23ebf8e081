"""The commands: ``run``, ``devices``, ``plan``, ``profile``, ``bench``.

Each is a coroutine taking the parsed arguments and the :class:`Output`,
returning the exit code; errors it does not handle are
:class:`~asyncrt.errors.AsyncrtError` or :class:`OSError`, which the entry
point reports in one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from devices import Device, get_api, list_devices
from scheduler.plan import Copy, Launch, Plan, RecordEvent

from .. import debug_executor, graph_executor
from ..errors import ArgumentError, InputError
from ..graph_executor import GraphModule
from ..tools._pictures import save_gantt, save_plan_picture
from ..tools._time_evaluator import time_evaluator
from ..tools._timeline import save_chrome_trace
from ._console import Output
from ._models import (
    Given,
    Model,
    check_kernels,
    import_modules,
    load_model,
    make_inputs,
    pick_devices,
)

__all__ = ("COMMANDS",)

Command = Callable[[argparse.Namespace, Output], Awaitable[int]]

#: How close the example's output must be to numpy's.
_TOLERANCE = 1e-4


# -- shared ------------------------------------------------------------------------


def _executor(
    model: Model, devices: list[Device], args: argparse.Namespace
) -> GraphModule:
    """An executor for ``model``, its parameters loaded."""
    ex = graph_executor.create(model.graph, model.lib, devices, **_planning(args))
    return _with_params(ex, model)


def _debug_executor(
    model: Model, devices: list[Device], args: argparse.Namespace, **debug: Any
) -> debug_executor.GraphModuleDebug:
    """A debug executor for ``model``, its parameters loaded."""
    ex = debug_executor.create(
        model.graph, model.lib, devices, **_planning(args), **debug
    )
    return _with_params(ex, model)


def _planning(args: argparse.Namespace) -> dict[str, Any]:
    """The planning options every command takes from its arguments."""
    fuse = {"auto": "auto", "on": True, "off": False}[args.fuse]
    return {
        "policy": args.policy,
        "max_streams": args.streams,
        "split": args.split,
        "fuse": fuse,
    }


_Executor = TypeVar("_Executor", bound=GraphModule)


def _with_params(ex: _Executor, model: Model) -> _Executor:
    try:
        if model.params:
            ex.load_params(dict(model.params))
    except BaseException:
        ex.close()
        raise
    return ex


def _load(args: argparse.Namespace, out: Output) -> tuple[Model, Given]:
    """The model of the arguments, after importing their modules."""
    import_modules(args.imports)
    given = Given(args.input, args.shape)
    model = load_model(args.model, args.params, given)
    for note in model.notes:
        out.note(note)
    return model, given


def _prepare(
    args: argparse.Namespace, out: Output
) -> tuple[Model, list[Device], dict[str, Any]]:
    model, given = _load(args, out)
    devices = pick_devices(args.device)
    check_kernels(model, devices)
    inputs, randomised, notes = make_inputs(model, given)
    if randomised:
        out.note(f"random data (seed 0) for input(s): {', '.join(randomised)}")
    for note in notes:
        out.note(note)
    return model, devices, inputs


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # not reached


def _plan_data(plan: Plan) -> dict[str, Any]:
    devices = []
    for device in plan.devices:
        streams = [s for s in plan.streams if s.device == device]
        launches = [st for s in streams for st in s.steps if isinstance(st, Launch)]
        copies = sum(isinstance(launch, Copy) for launch in launches)
        arena = plan.arenas.get(device)
        devices.append(
            {
                "device": str(device),
                "nodes": len(launches) - copies,
                "copies": copies,
                "streams": len(streams),
                "arena_bytes": arena.size if arena else 0,
            }
        )
    return {
        "host": str(plan.host),
        "policy": plan.policy,
        "makespan_s": plan.makespan,
        "streams": len(plan.streams),
        "events": plan.num_events,
        "devices": devices,
    }


def _print_plan(out: Output, plan: Plan) -> None:
    data = _plan_data(plan)
    predicted = f", predicted {1e3 * plan.makespan:.3f} ms" if plan.makespan else ""
    out.line(
        f"Plan: policy {plan.policy}, host {plan.host}, {data['streams']} "
        f"stream(s), {data['events']} event(s){predicted}"
    )
    out.table(
        ("Device", "Nodes", "Copies", "Streams", "Arena"),
        [
            [d["device"], str(d["nodes"]), str(d["copies"]), str(d["streams"]),
             _bytes(d["arena_bytes"])]
            for d in data["devices"]
        ],
        numeric=("Nodes", "Copies", "Streams", "Arena"),
    )  # fmt: skip


def _steps(plan: Plan) -> list[dict[str, Any]]:
    streams = []
    for index, stream in enumerate(plan.streams):
        steps: list[dict[str, Any]] = []
        for step in stream.steps:
            if isinstance(step, Launch):
                entry: dict[str, Any] = {
                    "launch": step.name,
                    "op": step.func_name,
                    "nid": step.nid,
                }
                if step.part is not None:
                    entry["part"] = [step.part.index, step.part.count]
                    entry["rows"] = [step.part.start, step.part.stop]
                steps.append(entry)
            elif isinstance(step, RecordEvent):
                steps.append({"record": step.event})
            else:
                steps.append({"wait": step.event})
        streams.append({"stream": index, "device": str(stream.device), "steps": steps})
    return streams


# -- devices -----------------------------------------------------------------------


async def cmd_devices(args: argparse.Namespace, out: Output) -> int:
    """List the devices present and their attributes."""
    found = []
    for device in list_devices():
        attributes = get_api(device.kind).attributes(device)
        found.append({"device": str(device), **attributes})
    if args.json:
        out.json(found)
        return 0
    rows = []
    for item in found:
        memory = item.get("total_global_memory")
        flops = item.get("flops")
        # A remote device's figures its probes could not resolve are unknown.
        unresolved = item.get("unresolved", ())
        link = None if "host_bandwidth" in unresolved else item.get("host_bandwidth")
        latency = None if "host_latency" in unresolved else item.get("host_latency")
        rows.append(
            [
                item["device"],
                str(item.get("device_name", "?")),
                _bytes(memory) if isinstance(memory, int) else "?",
                f"{flops / 1e9:.1f}" if isinstance(flops, (int, float)) else "?",
                _rate(link),
                f"{1e6 * latency:.1f}" if isinstance(latency, (int, float)) else "?",
            ]
        )
    out.table(
        ("Device", "Name", "Memory", "GFLOP/s", "Link GB/s", "Latency us"),
        rows,
        numeric=("Memory", "GFLOP/s", "Link GB/s", "Latency us"),
        wrap=("Name",),
    )
    return 0


def _rate(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    return "host" if value == float("inf") else f"{value / 1e9:.1f}"


# -- run ---------------------------------------------------------------------------


async def cmd_run(args: argparse.Namespace, out: Output) -> int:
    """Run a model once and print (and save) its outputs."""
    model, devices, inputs = _prepare(args, out)
    if args.trace:
        ex: GraphModule = _debug_executor(model, devices, args, max_runs=1)
    else:
        ex = _executor(model, devices, args)
    with ex:
        out.line(f"Model: {model.name}")
        out.line(f"Devices: {', '.join(map(str, devices))}")
        _print_plan(out, ex.plan)
        start = time.perf_counter()
        results = await ex.run(**inputs)
        elapsed = time.perf_counter() - start
        arrays = [r.numpy() for r in results or []]
        if isinstance(ex, debug_executor.GraphModuleDebug):
            path = ex.trace.save_chrome_trace(args.trace)
            out.note(f"timeline written to {path} (open it in ui.perfetto.dev)")
    files = _save_outputs(arrays, args.output)
    check = _check(model, inputs, arrays)
    if args.json:
        out.json(
            {
                "model": model.name,
                "devices": [str(d) for d in devices],
                "plan": _plan_data(ex.plan),
                "time_s": elapsed,
                "outputs": [
                    {**_stats(a), "file": files[i] if files else None}
                    for i, a in enumerate(arrays)
                ],
                "check": check,
            }
        )
    else:
        out.line(f"Ran in {1e3 * elapsed:.3f} ms (first run, wall time)")
        out.table(
            ("Output", "Shape", "Dtype", "Min", "Max", "Mean", "First values"),
            [_output_row(i, a) for i, a in enumerate(arrays)],
            numeric=("Output", "Min", "Max", "Mean"),
        )
        if check is not None:
            verdict = "ok" if check["ok"] else "WRONG"
            out.line(
                f"max |error| vs numpy: {check['max_abs_error']:.2e} ({verdict})",
                style="green" if check["ok"] else "bold red",
            )
        for file in files or []:
            out.note(f"saved {file}")
    if check is not None and not check["ok"]:
        out.error("the outputs differ from numpy's")
        return 1
    return 0


def _stats(array: np.ndarray[Any, Any]) -> dict[str, Any]:
    values = array.astype(np.float64, copy=False) if array.size else np.zeros(1)
    return {
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "min": float(values.min()),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


def _output_row(index: int, array: np.ndarray[Any, Any]) -> list[str]:
    stats = _stats(array)
    first = ", ".join(f"{v:.4g}" for v in array.reshape(-1)[:4].tolist())
    more = ", ..." if array.size > 4 else ""
    return [
        str(index),
        str(tuple(array.shape)),
        stats["dtype"],
        f"{stats['min']:.4g}",
        f"{stats['max']:.4g}",
        f"{stats['mean']:.4g}",
        f"[{first}{more}]",
    ]


def _save_outputs(
    arrays: list[np.ndarray[Any, Any]], folder: str | None
) -> list[str] | None:
    if folder is None:
        return None
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    files = []
    for index, array in enumerate(arrays):
        path = target / f"output_{index}.npy"
        np.save(path, array, allow_pickle=False)
        files.append(str(path))
    return files


def _check(
    model: Model,
    inputs: dict[str, np.ndarray[Any, Any]],
    arrays: list[np.ndarray[Any, Any]],
) -> dict[str, Any] | None:
    if model.reference is None or not arrays:
        return None
    params = {k: np.asarray(v) for k, v in model.params.items()}
    expected = model.reference(inputs, params)
    error = float(np.max(np.abs(arrays[0].astype(np.float64) - expected)))
    return {"max_abs_error": error, "ok": error <= _TOLERANCE}


# -- plan --------------------------------------------------------------------------


async def cmd_plan(args: argparse.Namespace, out: Output) -> int:
    """Show a model's plan, and draw it."""
    model, _ = _load(args, out)
    devices = pick_devices(args.device)
    check_kernels(model, devices)
    with _executor(model, devices, args) as ex:
        plan = ex.plan
    written = save_plan_picture(plan, args.dot) if args.dot else None
    if args.json:
        out.json(
            {
                "model": model.name,
                **_plan_data(plan),
                "plan": _steps(plan),
                "figures": _figures(plan),
                "dot": None if written is None else str(written),
            }
        )
    else:
        out.line(f"Model: {model.name}")
        _print_plan(out, plan)
        _print_figures(out, plan)
        out.line(str(plan))
    if written is not None:
        wanted = Path(args.dot)
        if written.suffix != wanted.suffix:
            out.note(f"graphviz 'dot' not found: wrote DOT text to {written} instead")
        else:
            out.note(f"plan drawn to {written}")
    return 0


def _figures(plan: Plan) -> list[dict[str, Any]]:
    """The cost figures the plan was made from, per device."""
    return [
        {
            "device": str(device),
            "flops": speed.flops,
            "memory_bandwidth": speed.memory_bandwidth,
            "launch_overhead_s": speed.launch_overhead,
            "host_latency_s": speed.latency,
            "host_bandwidth": speed.bandwidth,
            "sync_latency_s": speed.sync_latency,
            "issue_overhead_s": speed.issue_overhead,
            "source": speed.source,
        }
        for device, speed in sorted(plan.speeds.items())
    ]


def _print_figures(out: Output, plan: Plan) -> None:
    figures = _figures(plan)
    if not figures:
        return

    def rate(value: float, unit: str, unbounded: str) -> str:
        return unbounded if value == float("inf") else f"{value / 1e9:.3g} G{unit}"

    out.table(
        ("Device", "Compute", "Memory", "Launch", "Link", "Wake", "Source"),
        [
            [f["device"], rate(f["flops"], "FLOP/s", "-"),
             rate(f["memory_bandwidth"], "B/s", "no bound"),
             f"{1e6 * f['launch_overhead_s']:.2f} us",
             "free" if f["host_bandwidth"] == float("inf")
             else f"{1e6 * f['host_latency_s']:.1f} us + "
             f"{rate(f['host_bandwidth'], 'B/s', '-')}",
             f"{1e6 * f['sync_latency_s']:.1f} us", f["source"] or "-"]
            for f in figures
        ],
        title="Planned from these figures",
        wrap=("Source",),
    )  # fmt: skip


# -- profile -----------------------------------------------------------------------


async def cmd_profile(args: argparse.Namespace, out: Output) -> int:
    """Per-node times of a model's runs."""
    model, devices, inputs = _prepare(args, out)
    debug: dict[str, Any] = {"max_runs": args.runs + 1}
    if args.dump:
        debug["dump_root"] = args.dump
    ex = _debug_executor(model, devices, args, **debug)
    with ex:
        ex.set_input(**inputs)
        with out.progress("profiling", args.runs) as tick:
            report = await ex.aprofile(runs=args.runs, progress=tick)
        runs = ex.trace.runs()
        dumped = await ex.adump() if args.dump else None
    report = report.sort(args.sort)
    shown = report.head(args.top) if args.top else report
    if args.csv:
        print((shown if args.by == "node" else report).to_csv(args.by), end="")
    elif args.json:
        out.json({"model": model.name, **report.to_dict(), "nodes": [
            n.to_dict() for n in shown.nodes
        ]})  # fmt: skip
    else:
        out.line(f"Model: {model.name}")
        numeric = ("Stream", "Nodes", "Time(us)", "Time(%)", "Kernels")
        groupings: tuple[Literal["node", "op", "device"], ...] = (
            "node",
            "op",
            "device",
        )
        for by in groupings:
            columns, rows = (shown if by == "node" else report).cells(by)
            out.table(columns, rows, numeric=numeric, wrap=("Inputs",))
        out.line(report.summary())
    if args.trace:
        out.note(f"timeline written to {save_chrome_trace(args.trace, runs)}")
    if args.gantt:
        out.note(f"Gantt chart drawn to {save_gantt(args.gantt, runs[-1:])}")
    if dumped is not None:
        out.note(f"node outputs dumped to {dumped.parent}")
    return 0


# -- bench -------------------------------------------------------------------------


async def cmd_bench(args: argparse.Namespace, out: Output) -> int:
    """Time a model's runs (TVM's time evaluator)."""
    if args.sweep:
        return await _bench_sweep(args, out)
    model, devices, inputs = _prepare(args, out)
    with _executor(model, devices, args) as ex:

        async def full_run() -> None:
            await ex.run(**inputs)

        with out.progress("benchmarking", args.repeat) as tick:
            if args.end_to_end:
                evaluator = time_evaluator(
                    full_run, args.number, args.repeat, args.min_repeat_ms,
                    progress=tick,
                )  # fmt: skip
                result = await evaluator.acall()
            else:
                ex.set_input(**inputs)
                result = await ex.abenchmark(
                    repeat=args.repeat,
                    number=args.number,
                    min_repeat_ms=args.min_repeat_ms,
                    progress=tick,
                )
    if args.json:
        out.json(
            {
                "model": model.name,
                "devices": [str(d) for d in devices],
                "end_to_end": args.end_to_end,
                "repeat": args.repeat,
                **result.to_dict(),
            }
        )
        return 0
    out.line(f"Model: {model.name}")
    out.line(
        f"{args.repeat} measurement(s) of {result.number} run(s) on "
        f"{', '.join(map(str, devices))}"
        + (" (end to end: with input and output copies)" if args.end_to_end else "")
    )
    values = (result.mean, result.median, result.std, result.min, result.max)
    out.table(
        ("Mean ms", "Median ms", "Std ms", "Min ms", "Max ms", "Runs/s"),
        [[*(f"{1e3 * v:.4f}" for v in values), _per_second(result.mean)]],
        numeric=("Mean ms", "Median ms", "Std ms", "Min ms", "Max ms", "Runs/s"),
    )
    return 0


async def _bench_sweep(args: argparse.Namespace, out: Output) -> int:
    """Time an ONNX model with symbolic dimensions at every combination of
    the ``--sweep`` sizes, on one executor (a plan per shape signature)."""
    from ..frontend import from_onnx
    from ..graph import SymbolicGraph

    sizes = parse_sweep(args.sweep)
    if args.model is None or not str(args.model).endswith(".onnx"):
        raise ArgumentError("--sweep takes an ONNX model with symbolic dimensions")
    graph, params = from_onnx(args.model)
    if not isinstance(graph, SymbolicGraph):
        raise ArgumentError(
            f"{args.model}: its input shapes are fixed: --sweep needs symbolic "
            "dimensions"
        )
    if graph.shape_valued:
        raise ArgumentError(
            f"{args.model}: inputs {', '.join(graph.shape_valued)} decide shapes "
            "by their values, which --sweep does not choose"
        )
    unknown = sorted(set(sizes) - set(graph.symbols))
    missing = [s for s in graph.symbols if s not in sizes]
    if unknown or missing:
        raise InputError(
            f"--sweep: the model's symbols are {', '.join(graph.symbols)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; give sizes for: {', '.join(missing)}" if missing else "")
        )
    devices = pick_devices(args.device)
    rows = []
    async with graph_executor.create(
        graph, None, devices, params=params, **_planning(args)
    ) as ex:
        combos = list(itertools.product(*sizes.values()))
        with out.progress("benchmarking shapes", len(combos)) as tick:
            for done, combo in enumerate(combos, 1):
                dims = dict(zip(sizes, combo, strict=True))
                inputs = _sweep_inputs(graph, params, dims)
                start = time.perf_counter()
                await ex.run(**inputs)
                first = time.perf_counter() - start

                async def one_run(feed: dict[str, Any] = inputs) -> None:
                    await ex.run(**feed)

                result = await time_evaluator(
                    one_run, args.number, args.repeat, args.min_repeat_ms
                ).acall()
                rows.append((dims, first, result))
                tick(done, len(combos))
        stats = ex.plan_cache_stats()
    assert stats is not None
    if args.json:
        out.json(
            {
                "model": str(args.model),
                "devices": [str(d) for d in devices],
                "shapes": [
                    {**dims, "first_run_s": first, **result.to_dict()}
                    for dims, first, result in rows
                ],
                "plan_cache": dataclasses.asdict(stats),
            }
        )
        return 0
    out.line(f"Model: {Path(args.model).name}, one executor for every shape")
    symbols = list(sizes)
    columns = (*symbols, "First run ms", "Median ms", "Min ms", "Runs/s")
    out.table(
        columns,
        [
            [
                *(str(dims[s]) for s in symbols),
                f"{1e3 * first:.3f}",
                f"{1e3 * result.median:.4f}",
                f"{1e3 * result.min:.4f}",
                _per_second(result.mean),
            ]
            for dims, first, result in rows
        ],
        numeric=columns,
    )
    mean = stats.build_seconds / stats.builds if stats.builds else 0.0
    out.line(
        f"Plan cache: {stats.builds} plans built ({1e3 * mean:.1f} ms each on "
        f"average, {1e3 * stats.build_seconds:.1f} ms in all), {stats.hits} hits, "
        f"{stats.misses} misses, {stats.evictions} evicted, {stats.size} kept "
        f"(max_plans {stats.max_plans})"
    )
    return 0


def parse_sweep(items: list[str]) -> dict[str, list[int]]:
    """``SYMBOL=1,2,4`` items as sizes by symbol.

    :raises InputError: for a malformed item or a symbol given twice.
    """
    sizes: dict[str, list[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        try:
            parsed = [int(v) for v in values.split(",")]
        except ValueError:
            parsed = []
        if not name or not parsed or any(v < 0 for v in parsed):
            raise InputError(
                f"--sweep {item!r}: expected SYMBOL=SIZE,SIZE,... (sizes >= 0)"
            )
        if name in sizes:
            raise InputError(f"--sweep {name}: given twice")
        sizes[name] = parsed
    return sizes


def _sweep_inputs(
    graph: Any, params: dict[str, Any], dims: dict[str, int]
) -> dict[str, Any]:
    """Seeded random inputs at these symbol sizes (integer indices within
    the tables they index, as for any model)."""
    shapes = {
        name: tuple(dims[d] if isinstance(d, str) else d for d in spec.shape)
        for name, spec in graph.inputs.items()
    }
    special = graph.specialize(shapes, {})
    model = Model("sweep", special.graph, special.with_shared(params))
    inputs, _, _ = make_inputs(model, Given())
    return {name: inputs[name] for name in graph.inputs}


def _per_second(seconds: float) -> str:
    return f"{1.0 / seconds:.1f}" if seconds > 0 else "-"


COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "devices": cmd_devices,
    "plan": cmd_plan,
    "profile": cmd_profile,
    "bench": cmd_bench,
}
