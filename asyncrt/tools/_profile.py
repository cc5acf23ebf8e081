"""The profile report: per-node device times of traced runs, and their sums
per op and per device.

A :class:`ProfileReport` is plain data built from the runs a
:class:`~scheduler.trace.TraceRecorder` kept: each node's time is the mean,
over the complete runs, of its device time (see :mod:`scheduler.trace`:
modelled on ``sim``, CUDA events on ``cuda``, wall time on ``cpu``); a
node's share is its part of the sum of all node times (TVM's ``Time(%)``).
Copies the planner inserted between devices are rows too (op ``__copy``).
A node is grouped by its operator type, not its kernel: the ONNX operator it
came from (``Conv``), else the kernel library's op (``conv``), else the
kernel's name; kernels configured by attributes are named by a digest
(``conv.11218daf9cccc6b0``), so the report shows their configuration
(``group=1 pads=1,1,1,1 strides=1,1``) beside the type instead. It prints
as a text table, sorts by any column, and exports to JSON and CSV. Times
are in seconds in the data and the exports, microseconds in the text table.
A report of an executor served through a :class:`~asyncrt.serving.Batcher`
can carry the batcher's figures (:meth:`ProfileReport.with_batching`:
batch sizes, queue delay and batch time percentiles), printed after the
tables and exported under ``"batching"``; a report of a model served by an
executor of every shape can carry that executor's plan cache
(:meth:`ProfileReport.with_plan_cache`: hits, misses, builds and their
times), printed and exported under ``"plan_cache"``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from scheduler.dag import Entry
from scheduler.plan import Launch, Plan
from scheduler.trace import RunTrace

from ..errors import ArgumentError
from ..graph import Graph
from ..ops import OP_ATTRS_ATTR, OP_NAME_ATTR

if TYPE_CHECKING:
    from ..runtime._plan_cache import CacheStats
    from ..serving import BatchStats

__all__ = (
    "SORT_KEYS",
    "GroupProfile",
    "NodeOp",
    "NodeProfile",
    "ProfileReport",
    "node_ops",
)

GroupBy = Literal["node", "op", "device"]

#: Columns a report sorts by; ``"order"`` is the order the nodes ran in.
SORT_KEYS = ("time", "name", "op", "device", "stream", "order")

#: The node attr naming the ONNX operator a node came from (the frontend's
#: ``ONNX_OP_ATTR``; spelt here so profiling never imports onnx).
_ONNX_OP_ATTR = "onnx_op"
#: Where a configuration is cut in tables (the JSON and CSV keep it whole).
_CONFIG_WIDTH = 72
#: Attributes that tell configurations apart best come first, so that a cut
#: keeps them; the rest follow alphabetically.
_FIRST = {
    key: rank
    for rank, key in enumerate(
        ("kernel_shape", "strides", "pads", "group", "dilations", "axis", "axes")
    )
}


@dataclass(frozen=True)
class NodeOp:
    """What a graph node runs, for grouping: see the module docstring.

    :ivar func_name: the node's kernel (the report uses this record only for
        launches of that kernel: a fused node runs another).
    :ivar op_type: the operator type (``Conv``, ``conv`` or the kernel name).
    :ivar config: the kernel's attributes as short text (``""``: none).
    """

    func_name: str
    op_type: str
    config: str


def node_ops(graph: Graph) -> dict[int, NodeOp]:
    """The operator type and configuration of every operator node of
    ``graph``, by node id."""
    found = {}
    for nid, node in enumerate(graph.nodes):
        if node.is_null:
            continue
        attrs = node.attrs
        op_type = attrs.get(_ONNX_OP_ATTR) or attrs.get(OP_NAME_ATTR) or node.func_name
        found[nid] = NodeOp(node.func_name, op_type, _config(attrs.get(OP_ATTRS_ATTR)))
    return found


def _config(encoded: str | None) -> str:
    """``{"pads": [1, 1], "group": 1}`` as ``group=1 pads=1,1``."""
    if not encoded:
        return ""
    try:
        attrs = json.loads(encoded)
    except ValueError:
        return encoded
    if not isinstance(attrs, dict):
        return encoded
    keys = sorted(attrs, key=lambda k: (_FIRST.get(k, len(_FIRST)), k))
    return " ".join(f"{key}={_value(attrs[key])}" for key in keys)


def _value(value: Any) -> str:
    if isinstance(value, list):
        if all(isinstance(v, list) for v in value) and value:
            return ";".join(_value(v) for v in value)
        return ",".join(_value(v) for v in value)
    if value is None:
        return "none"
    return str(value)


@dataclass(frozen=True)
class NodeProfile:
    """One node's line of the report.

    :ivar nid: the node id (copies have ids past the graph's nodes).
    :ivar name: the node's name.
    :ivar op: its kernel (``__copy`` for an inserted copy).
    :ivar device: the device it ran on.
    :ivar stream: its stream's index in the plan.
    :ivar time: mean device time per run, seconds.
    :ivar wall: mean wall time per run on its stream, seconds.
    :ivar percent: its share of the sum of all node times.
    :ivar shapes: the shapes of its outputs.
    :ivar dtypes: the dtypes of its outputs.
    :ivar inputs: what it reads, as ``name`` or ``name:index``.
    :ivar measurements: its device time in each run, seconds.
    :ivar order: its position when the nodes are ordered by mean start.
    :ivar op_type: its operator type (``Conv``), where it is known and not
        the kernel itself (``""``: the same as ``op``).
    :ivar config: its kernel's configuration as text (``""``: none).
    """

    nid: int
    name: str
    op: str
    device: str
    stream: int
    time: float
    wall: float
    percent: float
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    inputs: tuple[str, ...]
    measurements: tuple[float, ...]
    order: int
    op_type: str = ""
    config: str = ""

    @property
    def kind(self) -> str:
        """What the node is grouped by: its operator type, else its kernel."""
        return self.op_type or self.op

    def to_dict(self) -> dict[str, Any]:
        """The line as plain data (seconds)."""
        data = dataclasses.asdict(self)
        data.update(  # JSON's lists for tuples; the type even where it is the op
            shapes=[list(s) for s in self.shapes],
            dtypes=list(self.dtypes),
            inputs=list(self.inputs),
            measurements=list(self.measurements),
            op_type=self.kind,
        )
        return data


@dataclass(frozen=True)
class GroupProfile:
    """The nodes of one op or one device, summed.

    :ivar key: the operator type or the device.
    :ivar count: how many nodes.
    :ivar time: their summed mean device times, seconds.
    :ivar percent: their share of the sum of all node times.
    :ivar kernels: how many distinct kernels (configurations) they ran.
    """

    key: str
    count: int
    time: float
    percent: float
    kernels: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The line as plain data (seconds)."""
        return dataclasses.asdict(self)


_NODE_SORT: dict[str, Callable[[NodeProfile], Any]] = {
    "time": lambda n: n.time,
    "name": lambda n: n.name,
    "op": lambda n: (n.kind, -n.time),
    "device": lambda n: (n.device, -n.time),
    "stream": lambda n: (n.stream, n.order),
    "order": lambda n: n.order,
}


class ProfileReport:
    """Per-node times of traced runs; see the module docstring.

    :param nodes: the lines.
    :param runs: how many runs were averaged.
    :param run_time: the mean wall time of a run (issue to last stream).
    :param total: the sum of every node's time (default: of ``nodes``; a
        report cut to its first lines keeps the whole run's).
    :param batching: the figures of the batcher that served the runs, or
        ``None``.
    :param plan_cache: the plan cache of the executor that served them
        (``GraphModule.plan_cache_stats()``), or ``None``.
    """

    def __init__(
        self,
        nodes: Sequence[NodeProfile],
        runs: int,
        run_time: float,
        total: float | None = None,
        batching: BatchStats | None = None,
        plan_cache: CacheStats | None = None,
    ) -> None:
        self.nodes = tuple(nodes)
        self.runs = runs
        self.run_time = run_time
        #: The sum of the nodes' mean device times, seconds: the busy time of
        #: all streams together (concurrent streams make a run shorter).
        self.total = sum(n.time for n in self.nodes) if total is None else total
        #: The figures of the batcher that served the runs, if given.
        self.batching = batching
        #: The serving executor's plan cache figures, if given.
        self.plan_cache = plan_cache

    def _with(self, nodes: Sequence[NodeProfile], **extra: Any) -> ProfileReport:
        """This report's figures over ``nodes``, ``extra`` replacing some."""
        figures = {"batching": self.batching, "plan_cache": self.plan_cache, **extra}
        return ProfileReport(nodes, self.runs, self.run_time, self.total, **figures)

    def with_batching(self, stats: BatchStats) -> ProfileReport:
        """The same report with a batcher's figures
        (``batcher.stats()``): printed after the tables, exported under
        ``"batching"``."""
        return self._with(self.nodes, batching=stats)

    def with_plan_cache(self, stats: CacheStats) -> ProfileReport:
        """The same report with an executor's plan cache figures
        (``ex.plan_cache_stats()``: hits, misses, builds and their times):
        printed after the tables, exported under ``"plan_cache"``."""
        return self._with(self.nodes, plan_cache=stats)

    @classmethod
    def from_runs(
        cls,
        plan: Plan,
        runs: Sequence[RunTrace],
        names: Mapping[int, str],
        ops: Mapping[int, NodeOp] | None = None,
    ) -> ProfileReport:
        """Build the report of ``runs`` (only complete ones count).

        :param plan: the plan the runs ran.
        :param runs: traced runs of it.
        :param names: node names by id (the graph's; copies are named by
            their launches).
        :param ops: the graph's operator types and configurations
            (:func:`node_ops`); without them nodes are grouped by kernel.
        :raises ArgumentError: if no run is complete.
        """
        complete = [r for r in runs if r.complete]
        if not complete:
            raise ArgumentError("no complete traced run to report on")
        device_times: dict[int, list[float]] = {}
        walls: dict[int, list[float]] = {}
        starts: dict[int, list[float]] = {}
        where: dict[int, tuple[Launch, str, int]] = {}
        for run in complete:
            # A node split into parts (scheduler.split) runs as several
            # launches: its time is theirs together, its wall span from the
            # first part's start to the last one's end.
            seen: dict[int, tuple[float, float, float]] = {}
            for span in run.spans:
                launch = span.launch
                if launch is None:  # a record or a wait
                    continue
                nid = launch.nid
                if nid in seen:
                    busy, first, last = seen[nid]
                    seen[nid] = (
                        busy + span.device_time,
                        min(first, span.start),
                        max(last, span.end),
                    )
                    continue
                seen[nid] = (span.device_time, span.start, span.end)
                where[nid] = (launch, str(span.device), span.stream)
            for nid, (busy, first, last) in seen.items():
                device_times.setdefault(nid, []).append(busy)
                walls.setdefault(nid, []).append(last - first)
                starts.setdefault(nid, []).append(first - run.start)
        # What ran is named by its launch (fusion may rename); inputs by the graph.
        all_names = {**names, **{n: w[0].name for n, w in where.items()}}
        means = {nid: statistics.fmean(t) for nid, t in device_times.items()}
        total = sum(means.values())
        by_start = sorted(where, key=lambda nid: statistics.fmean(starts[nid]))
        order = {nid: i for i, nid in enumerate(by_start)}
        nodes = []
        for nid in by_start:
            launch, device, stream = where[nid]
            outputs = launch.args[launch.num_inputs :]
            op = (ops or {}).get(nid)
            if op is not None and op.func_name != launch.func_name:
                op = None  # the node was fused into another kernel
            nodes.append(
                NodeProfile(
                    nid=nid,
                    name=all_names.get(nid, launch.name),
                    op=launch.func_name,
                    device=device,
                    stream=stream,
                    time=means[nid],
                    wall=statistics.fmean(walls[nid]),
                    percent=100.0 * means[nid] / total if total > 0 else 0.0,
                    shapes=tuple(plan.tensors[e].shape for e in outputs),
                    dtypes=tuple(plan.tensors[e].dtype for e in outputs),
                    inputs=tuple(
                        _entry_name(e, all_names)
                        for e in launch.args[: launch.num_inputs]
                    ),
                    measurements=tuple(device_times[nid]),
                    order=order[nid],
                    op_type=op.op_type if op is not None else "",
                    config=op.config if op is not None else "",
                )
            )
        run_time = statistics.fmean(r.end - r.start for r in complete)
        return cls(nodes, len(complete), run_time)

    # -- views -------------------------------------------------------------------

    def sort(
        self, key: str = "time", *, descending: bool | None = None
    ) -> ProfileReport:
        """The same report, lines sorted.

        :param key: one of :data:`SORT_KEYS`.
        :param descending: the direction; by default descending for
            ``"time"``, ascending otherwise.
        :raises ArgumentError: for an unknown key.
        """
        if key not in _NODE_SORT:
            raise ArgumentError(
                f"cannot sort by {key!r}; choose one of {', '.join(SORT_KEYS)}"
            )
        reverse = key == "time" if descending is None else descending
        nodes = sorted(self.nodes, key=_NODE_SORT[key], reverse=reverse)
        return self._with(nodes)

    def by_op(self) -> tuple[GroupProfile, ...]:
        """Times summed per operator type (:attr:`NodeProfile.kind`),
        slowest first."""
        return self._group(lambda n: n.kind)

    def by_device(self) -> tuple[GroupProfile, ...]:
        """Times summed per device, slowest first."""
        return self._group(lambda n: n.device)

    def groups(self, by: GroupBy) -> tuple[GroupProfile, ...]:
        """:meth:`by_op` or :meth:`by_device`.

        :raises ArgumentError: if ``by`` is neither ``"op"`` nor ``"device"``.
        """
        if by == "op":
            return self.by_op()
        if by == "device":
            return self.by_device()
        raise ArgumentError(f"cannot group by {by!r}; choose 'op' or 'device'")

    def _group(self, key: Callable[[NodeProfile], str]) -> tuple[GroupProfile, ...]:
        times: dict[str, list[float]] = {}
        kernels: dict[str, set[str]] = {}
        for node in self.nodes:
            times.setdefault(key(node), []).append(node.time)
            kernels.setdefault(key(node), set()).add(node.op)
        total = self.total
        groups = [
            GroupProfile(
                k,
                len(t),
                sum(t),
                100.0 * sum(t) / total if total else 0.0,
                len(kernels[k]),
            )
            for k, t in times.items()
        ]
        return tuple(sorted(groups, key=lambda g: (-g.time, g.key)))

    def head(self, count: int) -> ProfileReport:
        """The first ``count`` lines (after sorting by time, the slowest);
        shares stay parts of the whole run's time."""
        nodes = self.nodes[: max(count, 0)]
        return self._with(nodes)

    # -- output ------------------------------------------------------------------

    def cells(self, by: GroupBy = "node") -> tuple[tuple[str, ...], list[list[str]]]:
        """The table as text cells: the header, and one row per node (or
        op, or device) then a ``Total`` row. Times in microseconds.

        :param by: ``"node"``, ``"op"`` or ``"device"``.
        :raises ArgumentError: for another ``by``.
        """
        total = f"{1e6 * self.total:.3f}"
        if by == "node":
            rows = [node_row(n) for n in self.nodes]
            rows.append(["Total", "-", "-", "-", total, "100.000", "-", "-", "-"])
            return NODE_COLUMNS, rows
        groups = self.groups(by)
        if by == "op":
            rows = [[*group_row(g), str(g.kernels)] for g in groups]
            kernels = len({n.op for n in self.nodes})
            rows.append(["Total", str(len(self.nodes)), total, "100.000", str(kernels)])
            return (*group_columns(by), "Kernels"), rows
        rows = [group_row(g) for g in groups]
        rows.append(["Total", str(len(self.nodes)), total, "100.000"])
        return group_columns(by), rows

    def table(self, by: GroupBy = "node") -> str:
        """:meth:`cells` as a fixed-width text table.

        :raises ArgumentError: for an unknown ``by``.
        """
        return _format_table(*self.cells(by))

    def summary(self) -> str:
        """One line: runs, node time, run time."""
        return (
            f"{len(self.nodes)} nodes, {self.runs} run(s): node time "
            f"{1e3 * self.total:.3f} ms (sum), run time {1e3 * self.run_time:.3f} ms "
            "(wall, mean)"
        )

    def __str__(self) -> str:
        parts = [self.table("node"), self.table("op"), self.table("device")]
        parts.append(self.summary())
        if self.batching is not None:
            parts.append("Batching\n" + self.batching.summary())
        if self.plan_cache is not None:
            parts.append("Plan cache\n" + self.plan_cache.summary())
        return "\n\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (seconds; the batching figures, if any,
        in milliseconds as :meth:`BatchStats.to_dict` gives them; the plan
        cache's, if any, as its fields)."""
        data: dict[str, Any] = {
            "runs": self.runs,
            "run_time": self.run_time,
            "total": self.total,
            "nodes": [n.to_dict() for n in self.nodes],
            "by_op": [g.to_dict() for g in self.by_op()],
            "by_device": [g.to_dict() for g in self.by_device()],
        }
        if self.batching is not None:
            data["batching"] = self.batching.to_dict()
        if self.plan_cache is not None:
            data["plan_cache"] = dataclasses.asdict(self.plan_cache)
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (seconds)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self, by: GroupBy = "node") -> str:
        """The report as CSV text (seconds), one row per node, op or device.

        :raises ArgumentError: for an unknown ``by``.
        """
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if by == "node":
            writer.writerow(
                [
                    "name", "op", "device", "stream", "time_s", "wall_s",
                    "percent", "shape", "dtype", "inputs", "op_type", "config",
                ]
            )  # fmt: skip
            for n in self.nodes:
                writer.writerow(
                    [
                        n.name, n.op, n.device, n.stream, f"{n.time:.9f}",
                        f"{n.wall:.9f}", f"{n.percent:.3f}", _shapes(n.shapes),
                        ";".join(n.dtypes), ";".join(n.inputs), n.kind, n.config,
                    ]
                )  # fmt: skip
        else:
            groups = self.groups(by)
            extra = ["kernels"] if by == "op" else []
            writer.writerow([by, "nodes", "time_s", "percent", *extra])
            for g in groups:
                kernels = [g.kernels] if by == "op" else []
                writer.writerow(
                    [g.key, g.count, f"{g.time:.9f}", f"{g.percent:.3f}", *kernels]
                )
        return out.getvalue()


#: The columns of the per-node table (shared with the command line).
NODE_COLUMNS = (
    "Node",
    "Op",
    "Device",
    "Stream",
    "Time(us)",
    "Time(%)",
    "Shape",
    "Inputs",
    "Config",
)


def group_columns(by: str) -> tuple[str, ...]:
    """The columns of a per-op or per-device table."""
    return (by.capitalize(), "Nodes", "Time(us)", "Time(%)")


def node_row(node: NodeProfile) -> list[str]:
    """One node as table cells (its operator type in the Op column, its
    configuration, cut to a table's width, in the last)."""
    config = node.config
    if len(config) > _CONFIG_WIDTH:
        config = config[: _CONFIG_WIDTH - 3] + "..."
    return [
        node.name,
        node.kind,
        node.device,
        str(node.stream),
        f"{1e6 * node.time:.3f}",
        f"{node.percent:.3f}",
        _shapes(node.shapes),
        ", ".join(node.inputs),
        config or "-",
    ]


def group_row(group: GroupProfile) -> list[str]:
    """One op or device as table cells."""
    return [
        group.key,
        str(group.count),
        f"{1e6 * group.time:.3f}",
        f"{group.percent:.3f}",
    ]


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> str:
    return "; ".join("(" + ", ".join(map(str, s)) + ")" for s in shapes)


def _entry_name(entry: Entry, names: Mapping[int, str]) -> str:
    name = names.get(entry.nid, str(entry.nid))
    return name if entry.index == 0 else f"{name}:{entry.index}"


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines.extend(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )
    return "\n".join(line.rstrip() for line in lines)
