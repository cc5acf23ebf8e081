"""Event ordering across streams: a randomized proof, then the edge cases.

The stress test runs random programs over several streams of ``cpu:0``,
``sim:0`` and ``sim:1``. Every call logs when it starts and ends on one global
sequence counter (``itertools.count`` is atomic under the GIL), so "A
happened before B" is simply ``end(A) < start(B)``: no clocks, no sleeps. The
host tracks, per stream, a vector clock of how many calls of every stream
must precede the stream's next call (merged at each ``wait_event`` /
``sync_stream_from_to``); the check is that the log honours it. That is the
transitive closure of the rule "every call before a record happens before
every call after a wait on it", plus in-order, non-overlapping execution
within each stream.

Replay a failing example with ``pytest --hypothesis-seed=N``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devices
from devices import Device, Event, Stream
from devices.errors import ClosedResourceError, StreamError, StreamMismatchError
from devices.sim import SimConfig

CPU, SIM0, SIM1 = Device("cpu", 0), Device("sim", 0), Device("sim", 1)
DEVICES = (CPU, SIM0, SIM1)
#: Long enough for any event in these tests; a hang fails instead of blocking.
TIMEOUT = 20.0


class Boom(Exception):
    """The failure the tests inject."""


def boom() -> None:
    raise Boom("injected")


@pytest.fixture(params=DEVICES, ids=str)
def stream(request: pytest.FixtureRequest) -> Iterator[Stream]:
    dev: Device = request.param
    with devices.get_api(dev.kind).stream(dev) as s:
        yield s


@pytest.fixture
def two_streams(stream: Stream) -> Iterator[tuple[Stream, Stream]]:
    """``stream`` and a second stream on another device kind."""
    other = SIM1 if stream.device.kind == "cpu" else CPU
    with devices.get_api(other.kind).stream(other) as s:
        yield stream, s


# -- the randomized programs ---------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """Calls on ``stream``: one ``launch`` per delay, or one ``launch_many``.

    ``modelled`` asks a sim stream to take the delay as modelled work
    (``work=delay * flops``) instead of a host sleep.
    """

    stream: int
    delays: tuple[float, ...]
    batch: bool
    modelled: bool


@dataclass(frozen=True)
class Record:
    stream: int
    event: int


@dataclass(frozen=True)
class Wait:
    stream: int
    event: int


@dataclass(frozen=True)
class SyncFromTo:
    """``api.sync_stream_from_to`` between two streams of one device."""

    src: int
    dst: int


@dataclass(frozen=True)
class HostSync:
    """``event.synchronize()`` on the host, mid-program."""

    event: int


Op = Launch | Record | Wait | SyncFromTo | HostSync


@dataclass(frozen=True)
class Program:
    devices: tuple[Device, ...]
    ops: tuple[Op, ...]


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """A random, deadlock-free program: waits only name events recorded
    earlier in program order, so every wait is eventually satisfied."""
    count = draw(st.integers(3, 8))
    devs = tuple(draw(st.sampled_from(DEVICES)) for _ in range(count))
    delays = st.integers(0, 2000).map(lambda us: us / 1e6)
    kinds = st.sampled_from(["launch"] * 4 + ["record"] * 2 + ["wait"] * 2)
    kinds = kinds | st.sampled_from(["sync", "host"])
    ops: list[Op] = []
    recorded: list[tuple[int, int]] = []  # (event id, stream)
    for _ in range(draw(st.integers(4, 60))):
        kind = draw(kinds)
        s = draw(st.integers(0, count - 1))
        others = [e for e, src in recorded if src != s]
        pairs = [
            (a, b)
            for a in range(count)
            for b in range(count)
            if a != b and devs[a] == devs[b]
        ]
        if kind == "record":
            recorded.append((len(recorded), s))
            ops.append(Record(s, recorded[-1][0]))
        elif kind == "wait" and others:
            ops.append(Wait(s, draw(st.sampled_from(others))))
        elif kind == "sync" and pairs:
            ops.append(SyncFromTo(*draw(st.sampled_from(pairs))))
        elif kind == "host" and recorded:
            ops.append(HostSync(draw(st.sampled_from(recorded))[0]))
        else:
            ops.append(
                Launch(
                    s,
                    tuple(draw(st.lists(delays, min_size=1, max_size=3))),
                    draw(st.booleans()),
                    draw(st.booleans()),
                )
            )
    return Program(devs, tuple(ops))


@dataclass
class Log:
    """What the calls did: ``(stream, step) -> (start, end)`` sequence numbers."""

    seq: Iterator[int]
    spans: dict[tuple[int, int], tuple[int, int]]

    def call(self, stream: int, step: int, delay: float) -> Callable[[], None]:
        def run() -> None:
            start = next(self.seq)
            if delay:
                time.sleep(delay)
            self.spans[stream, step] = (start, next(self.seq))

        return run


def run_program(program: Program) -> None:
    """Run ``program`` and check the log against the host's vector clocks."""
    count = len(program.devices)
    log = Log(itertools.count(), {})
    steps = [0] * count
    # clock[s][t]: how many calls of stream t precede stream s's next call
    clock = [[0] * count for _ in range(count)]
    required: dict[tuple[int, int], tuple[int, ...]] = {}
    events: dict[int, tuple[Event, tuple[int, ...]]] = {}
    host_marks: list[tuple[int, tuple[int, ...]]] = []
    streams: list[Stream] = []
    try:
        for dev in program.devices:
            streams.append(devices.get_api(dev.kind).create_stream(dev))
        for op in program.ops:
            if isinstance(op, Launch):
                s, stream = op.stream, streams[op.stream]
                calls: list[devices.Call] = []
                for delay in op.delays:
                    required[s, steps[s]] = tuple(clock[s])
                    if op.modelled and stream.device.kind == "sim":
                        flops = devices.get_api("sim").config(stream.device).flops  # type: ignore[attr-defined]
                        calls.append((log.call(s, steps[s], 0.0), (), delay * flops))
                    else:
                        calls.append((log.call(s, steps[s], delay), (), 0.0))
                    steps[s] += 1
                    clock[s][s] = steps[s]
                if op.batch:
                    stream.launch_many(calls)
                else:
                    for fn, args, work in calls:
                        stream.launch(fn, args, work=work)
            elif isinstance(op, Record):
                event = streams[op.stream].record(Event(f"e{op.event}"))
                events[op.event] = (event, tuple(clock[op.stream]))
            elif isinstance(op, Wait):
                event, snapshot = events[op.event]
                streams[op.stream].wait_event(event)
                clock[op.stream] = [
                    max(a, b) for a, b in zip(clock[op.stream], snapshot, strict=True)
                ]
            elif isinstance(op, SyncFromTo):
                dev = program.devices[op.src]
                api = devices.get_api(dev.kind)
                api.sync_stream_from_to(dev, streams[op.src], streams[op.dst])
                clock[op.dst] = [
                    max(a, b) for a, b in zip(clock[op.dst], clock[op.src], strict=True)
                ]
            else:
                event, snapshot = events[op.event]
                event.synchronize(TIMEOUT)
                host_marks.append((next(log.seq), snapshot))
        for stream in streams:
            stream.synchronize(TIMEOUT)
    finally:
        for stream in streams:
            stream.close()

    # every call ran, once
    assert set(log.spans) == {(s, i) for s in range(count) for i in range(steps[s])}
    # per stream: in launch order, never overlapping
    for s in range(count):
        for i in range(1, steps[s]):
            assert log.spans[s, i - 1][1] < log.spans[s, i][0], (s, i)
    # across streams: every required call ended before the call started
    for (s, i), needs in required.items():
        start = log.spans[s, i][0]
        for t, n in enumerate(needs):
            if t != s and n:
                assert log.spans[t, n - 1][1] < start, (
                    f"stream {t} call {n - 1} did not finish before "
                    f"stream {s} call {i} started"
                )
    # the host: everything before a synchronized event had ended
    for mark, needs in host_marks:
        for t, n in enumerate(needs):
            if n:
                assert log.spans[t, n - 1][1] < mark


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(programs())
def test_random_programs_respect_event_order(program: Program) -> None:
    run_program(program)


def test_a_fixed_program_respects_event_order() -> None:
    """A hand-written program touching every op, for a readable failure."""
    program = Program(
        (CPU, SIM0, SIM1, SIM0),
        (
            Launch(0, (0.002, 0.001), batch=False, modelled=False),
            Record(0, 0),
            Launch(1, (0.002,), batch=True, modelled=True),
            Wait(1, 0),
            Launch(1, (0.0, 0.001), batch=True, modelled=False),
            Record(1, 1),
            Wait(2, 1),
            Launch(2, (0.0,), batch=False, modelled=True),
            SyncFromTo(1, 3),
            Launch(3, (0.0,), batch=False, modelled=False),
            HostSync(1),
            Launch(0, (0.0,), batch=False, modelled=False),
        ),
    )
    run_program(program)


# -- waiting from the host -----------------------------------------------------


@pytest.mark.anyio
async def test_await_event_from_host(stream: Stream) -> None:
    done: list[int] = []
    stream.launch(time.sleep, (0.01,))
    stream.launch(done.append, (1,))
    event = stream.record()
    await event.wait()
    assert event.done and event.query()
    assert done == [1]
    stream.launch(done.append, (2,))
    await stream.wait()
    assert done == [1, 2]


@pytest.mark.anyio
async def test_await_already_done_and_never_recorded_events() -> None:
    await Event().wait()
    with devices.get_api("cpu").stream(CPU) as s:
        event = s.record()
        event.synchronize(TIMEOUT)
        await event.wait()


@pytest.mark.anyio
async def test_awaiting_never_blocks_the_loop(stream: Stream) -> None:
    """A ticker keeps running while the host awaits a 50 ms call."""
    ticks = 0
    stream.launch(time.sleep, (0.05,))
    event = stream.record()

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await event.wait()
        tg.cancel_scope.cancel()
    assert ticks > 5


@pytest.mark.anyio
async def test_the_loop_runs_while_a_stream_waits_for_it(stream: Stream) -> None:
    """A call that can only finish after the loop has ticked 5 times: a
    blocked loop would deadlock here (and time out) instead of passing."""
    gate = threading.Event()
    stream.launch(gate.wait, (TIMEOUT,))
    event = stream.record()

    async def ticker() -> None:
        for _ in range(5):
            await anyio.sleep(0)
        gate.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await event.wait()
    assert gate.is_set()


@pytest.mark.anyio
async def test_awaiting_a_failed_event_raises(stream: Stream) -> None:
    stream.launch(boom)
    with pytest.raises(StreamError) as info:
        await stream.record().wait()
    assert isinstance(info.value.__cause__, Boom)
    await stream.wait()  # the next segment is clean


# -- failures ------------------------------------------------------------------


def test_failure_is_reported_by_the_next_record(stream: Stream) -> None:
    ran: list[str] = []
    stream.launch(ran.append, ("before",))
    stream.launch(boom)
    stream.launch(ran.append, ("skipped",))
    failed = stream.record()
    stream.launch(ran.append, ("after",))
    clean = stream.record()
    with pytest.raises(StreamError) as info:
        failed.synchronize(TIMEOUT)
    assert isinstance(info.value.__cause__, Boom)
    assert info.value.stream == stream.label
    clean.synchronize(TIMEOUT)
    stream.synchronize(TIMEOUT)
    assert ran == ["before", "after"]


def test_failure_in_a_batch_names_the_call(stream: Stream) -> None:
    ran: list[int] = []
    calls: list[devices.Call] = [
        (ran.append, (0,), 0.0),
        (boom, (), 0.0),
        (ran.append, (2,), 0.0),
    ]
    stream.launch_many(calls)
    with pytest.raises(StreamError) as info:
        stream.synchronize(TIMEOUT)
    cause = info.value.__cause__
    assert isinstance(cause, devices.BatchError)
    assert cause.index == 1 and cause.batch is calls
    assert isinstance(cause.__cause__, Boom)
    assert ran == [0]
    stream.launch_many([(ran.append, (3,), 0.0)])
    stream.synchronize(TIMEOUT)
    assert ran == [0, 3]


def test_a_stream_waiting_on_a_failed_event_fails(
    two_streams: tuple[Stream, Stream],
) -> None:
    """The failure travels through a pending event to the waiting stream
    (and on to a third stream that waits on the waiter)."""
    source, waiter = two_streams
    ran: list[str] = []
    gate = threading.Event()
    source.launch(gate.wait, (TIMEOUT,))
    source.launch(boom)
    failed = source.record()
    waiter.wait_event(failed)  # still pending: the gate is shut
    waiter.launch(ran.append, ("skipped",))
    waiter_event = waiter.record()
    waiter.launch(ran.append, ("after",))
    with devices.get_api("sim").stream(SIM0) as third:
        third.wait_event(waiter_event)
        third_event = third.record()
        gate.set()
        with pytest.raises(StreamError) as info:
            waiter_event.synchronize(TIMEOUT)
        assert isinstance(info.value.__cause__, Boom)
        assert info.value.stream == waiter.label
        with pytest.raises(StreamError) as info3:
            third_event.synchronize(TIMEOUT)
        assert info3.value.stream == third.label
        assert info3.value.__cause__ is info.value
    with pytest.raises(StreamError):
        failed.synchronize(TIMEOUT)
    waiter.synchronize(TIMEOUT)
    assert ran == ["after"]


def test_a_stream_waiting_on_an_already_failed_event_fails(
    two_streams: tuple[Stream, Stream],
) -> None:
    """Same as above, but the failed event completed before ``wait_event``.

    The documented rule ("reported ... by every stream that waited on that
    event") must not depend on whether the event was still pending.
    """
    source, waiter = two_streams
    source.launch(boom)
    failed = source.record()
    with pytest.raises(StreamError):
        failed.synchronize(TIMEOUT)
    waiter.wait_event(failed)
    with pytest.raises(StreamError) as info:
        waiter.record().synchronize(TIMEOUT)
    assert isinstance(info.value.__cause__, Boom)


# -- events: recording and waiting edge cases ----------------------------------


def test_re_recording_a_pending_event_raises(
    two_streams: tuple[Stream, Stream],
) -> None:
    first, second = two_streams
    gate = threading.Event()
    first.launch(gate.wait, (TIMEOUT,))
    event = first.record(Event("pending"))
    with pytest.raises(StreamError, match="pending"):
        first.record(event)
    with pytest.raises(StreamError, match="pending"):
        second.record(event)
    assert not event.done
    gate.set()
    event.synchronize(TIMEOUT)
    assert second.record(event) is event  # done: it may be recorded again
    event.synchronize(TIMEOUT)


def test_a_wait_keeps_the_completion_it_saw(
    two_streams: tuple[Stream, Stream],
) -> None:
    """Re-recording an event later does not retarget an earlier wait."""
    first, second = two_streams
    gate1, gate2 = threading.Event(), threading.Event()
    first.launch(gate1.wait, (TIMEOUT,))
    event = first.record()
    second.wait_event(event)  # waits for this record, not a later one
    ran: list[int] = []
    second.launch(ran.append, (1,))
    gate1.set()
    event.synchronize(TIMEOUT)
    first.launch(gate2.wait, (TIMEOUT,))
    first.record(event)  # pending again, behind gate2
    try:
        assert not event.done
        second.synchronize(TIMEOUT)  # does not wait for the new record
        assert ran == [1]
    finally:
        gate2.set()
    event.synchronize(TIMEOUT)


def test_waiting_on_a_never_recorded_event_is_a_no_op(stream: Stream) -> None:
    event = Event("never")
    assert event.done
    event.synchronize(0)
    ran: list[int] = []
    stream.wait_event(event)
    stream.launch(ran.append, (1,))
    stream.synchronize(TIMEOUT)
    assert ran == [1]


def test_synchronize_times_out_on_a_pending_event(stream: Stream) -> None:
    gate = threading.Event()
    stream.launch(gate.wait, (TIMEOUT,))
    event = stream.record()
    with pytest.raises(TimeoutError):
        event.synchronize(0)
    gate.set()
    event.synchronize(TIMEOUT)


def test_closed_stream_refuses_work() -> None:
    for dev in DEVICES:
        api = devices.get_api(dev.kind)
        stream = api.create_stream(dev)
        ran: list[int] = []
        stream.launch(ran.append, (1,))
        stream.close()
        assert ran == [1]  # close finishes the queued work
        assert stream.closed
        stream.close()  # idempotent
        with pytest.raises(ClosedResourceError):
            stream.launch(ran.append, (2,))
        with pytest.raises(ClosedResourceError):
            stream.launch_many([(ran.append, (3,), 0.0)])
        with pytest.raises(ClosedResourceError):
            stream.record()
        with pytest.raises(ClosedResourceError):
            stream.synchronize()
        assert ran == [1]


def test_closed_stream_refuses_to_wait_on_a_pending_event() -> None:
    with devices.get_api("cpu").stream(CPU) as live:
        gate = threading.Event()
        live.launch(gate.wait, (TIMEOUT,))
        pending = live.record()
        closed = devices.get_api("sim").create_stream(SIM0)
        closed.close()
        try:
            with pytest.raises(ClosedResourceError):
                closed.wait_event(pending)
        finally:
            gate.set()


def test_closed_stream_refuses_to_wait_on_a_done_event() -> None:
    """``wait_event`` documents ``ClosedResourceError`` for a closed stream;
    it must not depend on whether the event is already done."""
    stream = devices.get_api("cpu").create_stream(CPU)
    stream.close()
    with pytest.raises(ClosedResourceError):
        stream.wait_event(Event())


# -- sync_stream_from_to -----------------------------------------------------


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_sync_stream_from_to_orders_two_streams(dev: Device) -> None:
    api = devices.get_api(dev.kind)
    order: list[str] = []
    gate = threading.Event()
    with api.stream(dev) as first, api.stream(dev) as second:
        first.launch(gate.wait, (TIMEOUT,))
        first.launch(order.append, ("first",))
        api.sync_stream_from_to(dev, first, second)
        second.launch(order.append, ("second",))
        done = second.record()
        assert not done.done
        gate.set()
        done.synchronize(TIMEOUT)
    assert order == ["first", "second"]


def test_sync_stream_from_to_checks_devices() -> None:
    api = devices.get_api("sim")
    with api.stream(SIM0) as s0, api.stream(SIM1) as s1:
        with pytest.raises(StreamMismatchError):
            api.sync_stream_from_to(SIM0, s0, s1)
        with pytest.raises(StreamMismatchError):
            api.sync_stream_from_to(SIM0, s1, s0)


def test_modelled_sim_work_still_orders_events() -> None:
    """A slow simulated device (modelled time only) holds back a cpu stream
    that waits on it."""
    devices.sim.configure(2, SimConfig(flops=1e6))
    order: list[str] = []
    sim_api, cpu_api = devices.get_api("sim"), devices.get_api("cpu")
    with sim_api.stream(SIM0) as slow, cpu_api.stream(CPU) as fast:
        slow.launch(order.append, ("sim",), work=20e3)  # 20 ms modelled
        event = slow.record()
        fast.wait_event(event)
        fast.launch(lambda: order.append(f"cpu after sim: {event.done}"))
        fast.synchronize(TIMEOUT)
    assert order == ["sim", "cpu after sim: True"]
