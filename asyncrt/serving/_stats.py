"""What a batcher did: counters, batch sizes, queue delays, and a record of
each recent batch (for a timeline).

:class:`BatchStats` is a frozen snapshot (``Batcher.stats()``); the
batcher updates one :class:`StatsRecorder` from its event loop. Queue
delays and batch times are kept for the most recent ``history`` requests
and batches (percentiles over a window, so a long-running service reports
its present, and memory stays bounded); the counters count everything.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ("BatchRecord", "BatchStats", "Percentiles", "StatsRecorder", "chrome_trace")


@dataclass(frozen=True)
class Percentiles:
    """Percentiles of a window of durations, in milliseconds (``nan`` when
    the window is empty).

    :ivar count: how many values the window holds.
    """

    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Percentiles:
        """The percentiles (nearest rank) of ``seconds``, in milliseconds."""
        if not seconds:
            nan = math.nan
            return cls(0, nan, nan, nan, nan)
        ordered = sorted(seconds)

        def rank(q: float) -> float:
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1e3

        return cls(len(ordered), rank(0.5), rank(0.9), rank(0.99), ordered[-1] * 1e3)

    def __str__(self) -> str:
        return (
            f"p50 {self.p50:.2f} ms, p90 {self.p90:.2f} ms, p99 {self.p99:.2f} ms, "
            f"max {self.max:.2f} ms"
        )


@dataclass(frozen=True)
class BatchRecord:
    """One batch, as a timeline shows it.

    :ivar start: when it started (the batcher's clock, seconds).
    :ivar end: when its outputs were split back (or it failed).
    :ivar slot: which of the concurrent batch slots ran it (0-based).
    :ivar rows: the requests' rows together.
    :ivar size: the rows it ran with (padding included).
    :ivar length: the padded length, or ``None`` without length padding.
    :ivar queue_delays: each request's wait before the batch started (s).
    :ivar error: why it failed (``"Type: message"``), or ``None``.
    """

    start: float
    end: float
    slot: int
    rows: int
    size: int
    length: int | None
    queue_delays: tuple[float, ...]
    error: str | None = None

    @property
    def requests(self) -> int:
        """How many requests it answered."""
        return len(self.queue_delays)


@dataclass(frozen=True)
class BatchStats:
    """A snapshot of a batcher's figures.

    :ivar requests: requests answered with outputs.
    :ivar rejected: requests refused before joining a batch (bad inputs).
    :ivar failed: requests whose batch failed (a kernel raised, ...).
    :ivar cancelled: requests whose caller stopped waiting.
    :ivar queued: requests waiting for a batch now.
    :ivar batches: batches run.
    :ivar running: batches running now.
    :ivar rows: the requests' rows run in batches.
    :ivar padded_rows: rows run only to reach a preferred batch size.
    :ivar sizes: batches run per batch size (padding included).
    :ivar queue_delay: each request's wait from ``run`` until its batch
        started, over the recent window.
    :ivar batch_time: each batch's time from start to its outputs split
        back, over the recent window.
    """

    requests: int = 0
    rejected: int = 0
    failed: int = 0
    cancelled: int = 0
    queued: int = 0
    batches: int = 0
    running: int = 0
    rows: int = 0
    padded_rows: int = 0
    sizes: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    queue_delay: Percentiles = field(default_factory=lambda: Percentiles.of(()))
    batch_time: Percentiles = field(default_factory=lambda: Percentiles.of(()))

    @property
    def mean_batch(self) -> float:
        """The mean real rows per batch (``nan`` before the first)."""
        return self.rows / self.batches if self.batches else math.nan

    def summary(self) -> str:
        """The figures as a few lines of text."""
        sizes = ", ".join(
            f"{size}: {count}" for size, count in sorted(self.sizes.items())
        )
        return "\n".join(
            [
                f"requests {self.requests} answered, {self.rejected} rejected, "
                f"{self.failed} failed, {self.cancelled} cancelled, "
                f"{self.queued} queued",
                f"batches {self.batches} ({self.running} running), "
                f"{self.mean_batch:.1f} rows each on average, "
                f"{self.padded_rows} padding rows",
                f"batch sizes {{{sizes}}}",
                f"queue delay {self.queue_delay}",
                f"batch time {self.batch_time}",
            ]
        )

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-able data."""
        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "queued": self.queued,
            "batches": self.batches,
            "running": self.running,
            "rows": self.rows,
            "padded_rows": self.padded_rows,
            "sizes": {str(k): v for k, v in sorted(self.sizes.items())},
            "queue_delay_ms": _percentiles(self.queue_delay),
            "batch_time_ms": _percentiles(self.batch_time),
        }


def _percentiles(p: Percentiles) -> dict[str, float | int | None]:
    def ms(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 4)

    return {
        "count": p.count,
        "p50": ms(p.p50),
        "p90": ms(p.p90),
        "p99": ms(p.p99),
        "max": ms(p.max),
    }


class StatsRecorder:
    """The batcher's running figures (one event loop updates them).

    :param history: how many recent requests' delays and batches to keep.
    """

    def __init__(self, history: int) -> None:
        self.requests = 0
        self.rejected = 0
        self.failed = 0
        self.cancelled = 0
        self.batches = 0
        self.rows = 0
        self.padded_rows = 0
        self.sizes: collections.Counter[int] = collections.Counter()
        self.delays: collections.deque[float] = collections.deque(maxlen=history)
        self.records: collections.deque[BatchRecord] = collections.deque(maxlen=history)

    def batch(self, record: BatchRecord) -> None:
        """Count a batch that ran (whatever became of it)."""
        self.batches += 1
        self.rows += record.rows
        self.padded_rows += record.size - record.rows
        self.sizes[record.size] += 1
        self.delays.extend(record.queue_delays)
        self.records.append(record)

    def snapshot(self, *, queued: int, running: int) -> BatchStats:
        """The figures now."""
        return BatchStats(
            requests=self.requests,
            rejected=self.rejected,
            failed=self.failed,
            cancelled=self.cancelled,
            queued=queued,
            batches=self.batches,
            running=running,
            rows=self.rows,
            padded_rows=self.padded_rows,
            sizes=MappingProxyType(dict(self.sizes)),
            queue_delay=Percentiles.of(list(self.delays)),
            batch_time=Percentiles.of([r.end - r.start for r in self.records]),
        )


def chrome_trace(records: Sequence[BatchRecord]) -> dict[str, Any]:
    """Batches as a Chrome trace / Perfetto JSON object: one track per
    batch slot (a slice per batch, its rows, size and delays in ``args``),
    and each request's wait in the queue as an async slice ending where
    its batch starts."""
    events: list[dict[str, Any]] = []
    if not records:
        return {"traceEvents": events, "displayTimeUnit": "ms"}
    origin = min(r.start - max(r.queue_delays, default=0.0) for r in records)

    def us(seconds: float) -> float:
        return round((seconds - origin) * 1e6, 3)

    slots = sorted({r.slot for r in records})
    events.append(_meta("process_name", 0, {"name": "batcher"}))
    for slot in slots:
        events.append(_meta("thread_name", slot, {"name": f"batch slot {slot}"}))
    request = 0
    for index, r in enumerate(records):
        name = f"batch {r.rows}/{r.size}" + ("" if r.error is None else " (failed)")
        args: dict[str, Any] = {
            "rows": r.rows,
            "size": r.size,
            "requests": r.requests,
            "queue_delay_ms": [round(d * 1e3, 3) for d in r.queue_delays],
        }
        if r.length is not None:
            args["length"] = r.length
        if r.error is not None:
            args["error"] = r.error
        events.append(
            {
                "name": name,
                "cat": "batch",
                "ph": "X",
                "pid": 0,
                "tid": r.slot,
                "ts": us(r.start),
                "dur": round((r.end - r.start) * 1e6, 3),
                "args": args,
            }
        )
        for delay in r.queue_delays:
            request += 1
            common = {"name": "queued", "cat": "queue", "pid": 0, "id": request}
            events.append(
                {
                    **common,
                    "ph": "b",
                    "ts": us(r.start - delay),
                    "args": {"batch": index},
                }
            )
            events.append({**common, "ph": "e", "ts": us(r.start)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": 0, "tid": tid, "args": args}
