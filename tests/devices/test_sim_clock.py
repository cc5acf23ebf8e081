"""The sim keeps its own clock: records are stamped with the modelled time,
and a device-side wait goes on from when the event was reached by the model,
not from when the waiting stream's thread woke up."""

from __future__ import annotations

import pytest

from devices import Device, Event, copy_function, get_api, sim
from devices.sim import SimConfig

S0 = Device("sim", 0)
#: 1e6 FLOPs at 1e9 FLOP/s: each call lasts 1 ms by the model.
WORK = 1e6
CALL = 1e-3


def nothing() -> None:
    pass


def test_records_are_stamped_with_the_modelled_time() -> None:
    sim.configure(1, SimConfig(flops=1e9))
    api = get_api("sim")
    stream = api.create_stream(S0)
    try:
        stream.launch(nothing, work=WORK)
        first = stream.record()
        stream.launch(nothing, work=WORK)
        stream.launch(nothing, work=WORK)
        second = stream.record()
        second.synchronize()
        # Everything was queued before the first call ended: the stream
        # never idled, so its clock moved by the calls' durations alone.
        gap = second.completion.time - first.completion.time
        assert gap == pytest.approx(2 * CALL, abs=1e-9)
    finally:
        api.free_stream(stream)


def test_a_wait_goes_on_from_the_events_modelled_time() -> None:
    """Two devices, so no shared engine: sim:1 waits for sim:0's event and
    then runs one call; by the model it ends one call after the event."""
    sim.configure(2, SimConfig(flops=1e9))
    api = get_api("sim")
    producer = api.create_stream(S0)
    consumer = api.create_stream(Device("sim", 1))
    try:
        event = Event("produced")
        producer.launch(nothing, work=WORK)
        producer.record(event)
        consumer.wait_event(event)
        consumer.launch(nothing, work=WORK)
        done = consumer.record()
        done.synchronize()
        gap = done.completion.time - event.completion.time
        assert gap == pytest.approx(CALL, abs=1e-9)
    finally:
        api.free_stream(producer)
        api.free_stream(consumer)


def test_a_copy_on_a_sim_stream_keeps_the_clock() -> None:
    """A copy from the host launched on the sim's stream lasts the link's
    modelled time on the device's clock."""
    config = SimConfig(flops=1e9, bandwidth=1e6, latency=1e-4)
    sim.configure(1, config)
    api = get_api("sim")
    cpu = get_api("cpu")
    host = cpu.alloc(Device("cpu", 0), 1000)
    device = api.alloc(S0, 1000)
    stream = api.create_stream(S0)
    try:
        stream.launch(nothing, work=WORK)
        before = stream.record()
        stream.launch(copy_function(host, 0, device, 0, 1000))
        after = stream.record()
        after.synchronize()
        gap = after.completion.time - before.completion.time
        assert gap == pytest.approx(config.copy_seconds(1000), abs=1e-9)
    finally:
        api.free_stream(stream)
        api.free(device)
        cpu.free(host)


def test_the_engine_serves_the_call_ready_first_by_the_model() -> None:
    """Stream A runs a long call and has more queued behind it; stream B's
    one call, launched while the long one runs, was ready first by the
    model, so it gets the engine next, not A's next call (whose thread is
    the one that just let the engine go)."""
    import time

    sim.configure(1, SimConfig(flops=1e9))
    api = get_api("sim")
    a, b = api.create_stream(S0), api.create_stream(S0)
    try:
        a.launch(nothing, work=10 * WORK)
        long_done = a.record()
        time.sleep(2e-3)  # the long call holds the engine by now
        for _ in range(5):
            a.launch(nothing, work=WORK)
        b.launch(nothing, work=WORK)
        b_done = b.record()
        a_done = a.record()
        a_done.synchronize()
        b_done.synchronize()
        assert b_done.completion.time == pytest.approx(
            long_done.completion.time + CALL, abs=1e-9
        )
        assert a_done.completion.time == pytest.approx(
            long_done.completion.time + 6 * CALL, abs=1e-9
        )
    finally:
        api.free_stream(a)
        api.free_stream(b)
