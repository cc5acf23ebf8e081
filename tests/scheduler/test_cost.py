"""Cost models: exact against the sim's timing, literal tables, edge bytes."""

from __future__ import annotations

import math

import pytest

import devices
from devices import Device, get_api, sim
from devices.errors import ArgumentError
from devices.sim import SimConfig
from scheduler.cost import (
    AnalyticCostModel,
    DeviceSpeed,
    Link,
    StartCost,
    TableCostModel,
    edge_nbytes,
    speed_from_attributes,
    speeds_from_devices,
)
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.errors import PlanError

CPU = Device("cpu", 0)
SIM0 = Device("sim", 0)
SIM1 = Device("sim", 1)


def _dag():
    """x (null) -> a (two outputs) -> b reads a.0 twice and a.1; c = nop(b)."""
    f32 = "float32"
    nodes = [
        NodeSpec("x", "null", "", (), (TensorSpec((4,), f32),)),
        NodeSpec(
            "a",
            "tvm_op",
            "split",
            (Entry(0, 0),),
            (TensorSpec((2,), f32), TensorSpec((10,), f32)),
            flops=3e9,
        ),
        NodeSpec(
            "b",
            "tvm_op",
            "add3",
            (Entry(1, 0), Entry(1, 0), Entry(1, 1)),
            (TensorSpec((2,), f32),),
            flops=1e9,
        ),
        NodeSpec("c", "tvm_op", "__nop", (Entry(2, 0),), (TensorSpec((2,), f32),)),
    ]
    return make_dag(nodes, GraphSpec((0,), (), (Entry(3, 0),)))


def test_edge_nbytes_counts_each_output_once() -> None:
    dag = _dag()
    assert edge_nbytes(dag, 0, 1) == 16
    assert edge_nbytes(dag, 1, 2) == 8 + 40
    assert edge_nbytes(dag, 2, 3) == 8


def test_analytic_model_is_exact_for_sim_devices() -> None:
    configs = [
        SimConfig(flops=10e9, bandwidth=2e9, latency=5e-6, launch_overhead=0.0),
        SimConfig(flops=40e9, bandwidth=16e9, latency=30e-6, launch_overhead=0.0),
    ]
    sim.configure(2, configs)
    dag = _dag()
    model = AnalyticCostModel.from_devices(dag, [CPU, SIM0, SIM1])
    wake = model.speeds[CPU].sync_latency  # a cpu stream's thread wakes up
    assert wake > 0
    for dev, config in zip((SIM0, SIM1), configs, strict=True):
        assert model.compute_time(1, dev) == config.compute_seconds(3e9)
        assert model.compute_time(2, dev) == config.compute_seconds(1e9)
        # host <-> device: the device's link (a sim's wait costs nothing; the
        # cpu's stream wakes up)
        assert model.transfer_time(1000, CPU, dev) == config.copy_seconds(1000)
        assert model.transfer_time(1000, dev, CPU) == config.copy_seconds(1000) + wake
        assert model.transfer_time(1000, dev, dev) == 0.0
    # device <-> device: the slower link, as SimDeviceAPI._copy_within sleeps
    for nbytes in (0, 1, 4096, 10**8):
        expected = max(c.copy_seconds(nbytes) for c in configs)
        assert model.transfer_time(nbytes, SIM0, SIM1) == expected
        assert model.transfer_time(nbytes, SIM1, SIM0) == expected
    assert model.transfer_time(10**9, CPU, CPU) == 0.0


def test_a_cross_device_edge_pays_the_destinations_sync_latency() -> None:
    dag = _dag()
    host = DeviceSpeed(flops=1e9, sync_latency=1e-4)
    device = DeviceSpeed(flops=1e9, bandwidth=1e6, latency=1e-5)
    model = AnalyticCostModel(dag, {CPU: host, SIM0: device})
    assert model.transfer_time(1000, SIM0, CPU) == 1e-5 + 1e-3 + 1e-4
    assert model.transfer_time(1000, CPU, SIM0) == 1e-5 + 1e-3
    assert model.transfer_time(1000, CPU, CPU) == 0.0
    assert speed_from_attributes(CPU, {"flops": 1.0, "sync_latency": 2e-5}) == (
        DeviceSpeed(flops=1.0, sync_latency=2e-5)
    )
    with pytest.raises(ArgumentError, match="sync_latency"):
        DeviceSpeed(flops=1.0, sync_latency=-1.0)


def test_speed_from_attributes_reads_the_deviceapi_names() -> None:
    sim.configure(1, SimConfig(flops=7e9, bandwidth=3e9, latency=1e-5))
    speed = speed_from_attributes(SIM0, get_api("sim").attributes(SIM0))
    assert speed == DeviceSpeed(flops=7e9, bandwidth=3e9, latency=1e-5)
    host = speed_from_attributes(CPU, {"flops": 1e9, "host_bandwidth": math.inf})
    assert host.copy_seconds(10**9) == 0.0
    assert speeds_from_devices([SIM0])[SIM0] == speed
    with pytest.raises(PlanError, match="flops"):
        speed_from_attributes(SIM0, {"host_bandwidth": 1e9})
    with pytest.raises(PlanError, match="sim:0"):
        speed_from_attributes(SIM0, {"flops": "fast"})


def test_null_and_nop_cost_nothing_and_launch_overhead_is_added() -> None:
    dag = _dag()
    speed = DeviceSpeed(flops=1e9, bandwidth=1e9, latency=0.0, launch_overhead=1e-3)
    model = AnalyticCostModel(dag, {SIM0: speed})
    assert model.compute_time(0, SIM0) == 0.0
    assert model.compute_time(3, SIM0) == 0.0
    assert model.compute_time(2, SIM0) == 1e-3 + 1.0


def test_unsupported_kernels_cost_inf() -> None:
    dag = _dag()
    speeds = {CPU: DeviceSpeed(1e9), SIM0: DeviceSpeed(1e10, 1e9)}
    model = AnalyticCostModel(dag, speeds, supported=lambda n, d: d.kind == "cpu")
    assert model.compute_time(1, SIM0) == math.inf
    assert model.compute_time(1, CPU) == 3.0
    assert model.compute_time(0, SIM0) == 0.0  # null nodes run no kernel


def test_unknown_device_is_a_plan_error() -> None:
    model = AnalyticCostModel(_dag(), {CPU: DeviceSpeed(1e9)})
    with pytest.raises(PlanError, match="sim:1"):
        model.compute_time(1, SIM1)
    with pytest.raises(PlanError, match="sim:1"):
        model.transfer_time(1, CPU, SIM1)


def test_invalid_speeds_are_rejected() -> None:
    # The timing model's figures are the device layer's (devices._timing).
    with pytest.raises(ArgumentError):
        DeviceSpeed(flops=0.0)
    with pytest.raises(ArgumentError):
        DeviceSpeed(flops=1.0, latency=-1.0)
    with pytest.raises(ArgumentError):
        Link(bandwidth=0.0)
    with pytest.raises(PlanError):
        TableCostModel({(0, CPU): -1.0})
    with pytest.raises(PlanError):
        StartCost(per_step=-1.0)


def test_table_model_is_literal() -> None:
    dag = _dag()
    model = TableCostModel(
        {(1, CPU): 5.0, (1, SIM0): 2.0, (2, CPU): 1.0},
        links={(CPU, SIM0): Link(latency=1.0, bandwidth=10.0)},
        default_link=Link(latency=0.5, bandwidth=100.0),
        dag=dag,
    )
    assert model.compute_time(1, SIM0) == 2.0
    assert model.compute_time(2, SIM0) == math.inf  # no entry: cannot run
    assert model.compute_time(0, SIM1) == 0.0  # null
    assert model.compute_time(3, SIM1) == 0.0  # nop
    assert model.transfer_time(100, CPU, SIM0) == 11.0
    assert model.transfer_time(100, SIM0, CPU) == 11.0  # either direction
    assert model.transfer_time(100, SIM0, SIM1) == 1.5  # default link
    assert model.transfer_time(100, SIM1, SIM1) == 0.0


def test_roofline_devices_pay_for_the_bytes_a_node_moves() -> None:
    dag = _dag()
    # node 2 reads a.0 (8 bytes, passed twice, counted once) and a.1 (40),
    # writes 8: 56 bytes; node 1 reads 16 and writes 48: 64 bytes.
    roof = DeviceSpeed(flops=1e9, memory_bandwidth=8.0, launch_overhead=1e-3)
    model = AnalyticCostModel(dag, {CPU: roof, SIM0: DeviceSpeed(flops=1e9)})
    assert model.compute_time(2, CPU) == 1e-3 + max(1.0, 56 / 8.0)
    assert model.compute_time(1, CPU) == 1e-3 + max(3.0, 64 / 8.0)
    assert model.compute_time(2, SIM0) == 1.0  # no memory bound: flops alone
    with pytest.raises(ArgumentError):
        DeviceSpeed(flops=1.0, memory_bandwidth=0.0)


def test_roofline_sims_are_modelled_exactly() -> None:
    config = SimConfig(flops=1e9, memory_bandwidth=8.0)
    sim.configure(1, config)
    dag = _dag()
    model = AnalyticCostModel.from_devices(dag, [SIM0])
    assert model.speeds[SIM0].memory_bandwidth == 8.0
    assert model.compute_time(2, SIM0) == config.compute_seconds(1e9, 56)
    assert config.compute_seconds(1e9, 56) == 56 / 8.0


def test_cpu_reports_a_roofline() -> None:
    speed = speeds_from_devices([CPU])[CPU]
    assert 0 < speed.memory_bandwidth < math.inf
    assert speed.launch_overhead > 0


def test_the_timing_model_is_the_device_layers() -> None:
    """One timing model: the cost model plans with the formulas the sim
    charges by, defined once in devices."""
    assert DeviceSpeed is devices.DeviceSpeed and Link is devices.Link
    config = SimConfig(flops=3e9, bandwidth=2e9, latency=4e-6, memory_bandwidth=1e9)
    sim.configure(2, config)
    assert get_api("sim").speed(SIM1) == config.speed
    model = AnalyticCostModel.from_devices(_dag(), [SIM0, SIM1])
    assert model.speeds[SIM0] == config.speed
    assert model.compute_time(1, SIM0) == config.compute_seconds(3e9, 64)
    assert model.transfer_time(4096, SIM0, SIM1) == config.copy_seconds(4096)
