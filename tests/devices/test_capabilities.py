"""What a DeviceAPI says it can do: host or not, streams side by side, copy
engines, its timing model (defined once, in devices), how its clock times a
call, and the state a worker process needs to have the same devices."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devices
from devices import (
    CallTimer,
    CopyEngines,
    Device,
    DeviceSpeed,
    Link,
    ModelTimer,
    empty,
    get_api,
    modelled_copy_seconds,
    sim,
    transfer_seconds,
)
from devices.errors import ArgumentError, DeviceNotFoundError
from devices.sim import SimConfig

CPU = Device("cpu", 0)
S0 = Device("sim", 0)
S1 = Device("sim", 1)
FAST = SimConfig(flops=2e9, bandwidth=4e9, latency=3e-6, launch_overhead=1e-6)
SLOW = SimConfig(flops=1e9, bandwidth=1e9, latency=7e-6, memory_bandwidth=5e9)


def test_the_host_is_the_cpu_and_its_streams_compute_side_by_side() -> None:
    cpu, simulated = get_api("cpu"), get_api("sim")
    assert cpu.is_host and cpu.concurrent_streams and not cpu.outgoing_copies
    assert not simulated.is_host and not simulated.concurrent_streams
    assert simulated.outgoing_copies  # its copy engines move data both ways
    assert cpu.array_namespace == simulated.array_namespace == "numpy"


def test_a_sims_speed_copy_engines_and_timer_are_its_configuration() -> None:
    sim.configure(2, [FAST, SLOW])
    api = get_api("sim")
    for device, config in ((S0, FAST), (S1, SLOW)):
        speed = api.speed(device)
        assert speed == config.speed
        assert speed.compute_seconds(1e6, 4096) == config.compute_seconds(1e6, 4096)
        assert api.copy_engines(device) == CopyEngines(
            Link(config.latency, config.bandwidth), None, outgoing=True
        )
        timer = api.call_timer(device)
        assert isinstance(timer, ModelTimer) and timer.model == config.speed
        assert not timer.marks
        assert timer.call_seconds(1e6, 4096) == config.compute_seconds(1e6, 4096)


def test_the_cpu_is_timed_by_the_wall_clock_and_reports_its_figures() -> None:
    api = get_api("cpu")
    timer = api.call_timer(CPU)
    assert type(timer) is CallTimer and timer.model is None and not timer.marks
    assert timer.call_seconds(1e9, 0) is None
    speed = api.speed(CPU)
    assert speed.flops > 0 and speed.sync_latency > 0 and speed.issue_overhead > 0
    assert speed.copy_seconds(10**9) == 0.0  # the host's own link is free
    assert speed.source  # where the figures came from


def test_a_copy_is_modelled_where_only_modelled_devices_and_the_host_take_part() -> (
    None
):
    sim.configure(2, [FAST, SLOW])
    nbytes = 4096
    arrays = {d: empty((nbytes,), "uint8", d) for d in (CPU, S0, S1)}
    other_cpu = empty((nbytes,), "uint8", CPU)

    def modelled(src: Device, dst: Device) -> float | None:
        a, b = arrays[src].buffer, arrays[dst].buffer
        return modelled_copy_seconds(a, b, nbytes)

    assert modelled(CPU, S0) == FAST.copy_seconds(nbytes)
    assert modelled(S1, CPU) == SLOW.copy_seconds(nbytes)
    assert modelled(S0, S1) == max(FAST.copy_seconds(nbytes), SLOW.copy_seconds(nbytes))
    assert modelled(S0, S0) == 0.0
    # the host's own copies are measured
    assert modelled_copy_seconds(arrays[CPU].buffer, other_cpu.buffer, nbytes) is None


def test_transfer_seconds_takes_the_slower_link_and_peer_links_within_a_kind() -> None:
    a = DeviceSpeed(1e9, bandwidth=1e9, latency=1e-6, peer=Link(1e-5, 1e10))
    b = DeviceSpeed(1e9, bandwidth=2e9, latency=2e-6, peer=Link(2e-5, 1e11))
    assert transfer_seconds(a, b, 1000, same_kind=False) == max(
        a.copy_seconds(1000), b.copy_seconds(1000)
    )
    assert transfer_seconds(a, b, 1000, same_kind=True) == 2e-5 + 1000 / 1e11


@pytest.mark.parametrize(
    "make",
    [
        lambda: DeviceSpeed(flops=0.0),
        lambda: DeviceSpeed(flops=1.0, issue_overhead=-1.0),
        lambda: Link(bandwidth=-1.0),
        lambda: SimConfig(flops=-1.0),
        lambda: SimConfig(latency=-1.0),
    ],
)
def test_speeds_out_of_range_are_argument_errors(make: Any) -> None:
    with pytest.raises(ArgumentError, match="must be"):
        make()


def test_configure_refuses_to_strand_memory_in_use() -> None:
    """Shrinking a sim below what it holds, or removing a sim that holds
    memory, once led to 'free -7340032 bytes'; now it is refused, and the
    same configuration (or a larger one) is fine."""
    held = empty((8 << 20,), "uint8", S1)
    with pytest.raises(ArgumentError, match=r"sim:1 .*8388608 bytes are in use"):
        sim.configure(2, SimConfig(memory=1 << 20))
    with pytest.raises(ArgumentError, match="sim:1 holds 8388608 bytes"):
        sim.configure(1)
    assert get_api("sim").device_count() == 2  # nothing changed
    sim.configure(2)
    sim.configure(2, SimConfig(memory=16 << 20))
    held.buffer._api.free(held.buffer)
    sim.configure(1, SimConfig(memory=1 << 20))
    with pytest.raises(ArgumentError, match="count"):
        sim.configure(-1)


def test_process_state_round_trips_through_json() -> None:
    sim.configure(2, [FAST, SLOW])
    state = devices.process_state()
    assert state["sim"] == [
        {
            "flops": 2e9,
            "bandwidth": 4e9,
            "latency": 3e-6,
            "launch_overhead": 1e-6,
            "memory": 4 << 30,
            "memory_bandwidth": math.inf,
        },
        {
            "flops": 1e9,
            "bandwidth": 1e9,
            "latency": 7e-6,
            "launch_overhead": 0.0,
            "memory": 4 << 30,
            "memory_bandwidth": 5e9,
        },
    ]
    assert "cpu" not in state  # the cpu keeps no state
    sim.configure(3)
    devices.restore_process_state(json.loads(json.dumps(state)))
    api: Any = get_api("sim")
    assert [api.config(S0), api.config(S1)] == [FAST, SLOW]
    assert api.device_count() == 2


def test_process_state_reaches_a_worker_process() -> None:
    sim.configure(1, SLOW)
    script = (
        "import json, sys, devices\n"
        "devices.restore_process_state(json.loads(sys.argv[1]))\n"
        "print(devices.get_api('sim').speed(devices.Device('sim', 0)).flops)\n"
    )
    state = json.dumps(devices.process_state())
    out = subprocess.run(
        [sys.executable, "-c", script, state],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],  # this checkout's packages
    )
    assert float(out.stdout) == SLOW.flops


@pytest.mark.parametrize(
    ("state", "error"),
    [
        (["sim"], ArgumentError),
        ({"sim": "fast"}, ArgumentError),
        ({"sim": [{"speed": 1}]}, ArgumentError),
        ({"cpu": {"flops": 1}}, ArgumentError),
        ({"nonesuch": None}, DeviceNotFoundError),
    ],
)
def test_bad_process_state_is_refused(state: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        devices.restore_process_state(state)


def test_the_cpus_copy_engines_are_free_and_issued_by_the_host() -> None:
    engines = get_api("cpu").copy_engines(CPU)
    assert engines == CopyEngines(Link(0.0, math.inf), None, outgoing=False)
    assert np.isinf(engines.host.bandwidth)
