"""Device values, attribute queries, allocation limits, and the registry."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncrt
import devices
from devices import Device, DeviceAPI
from devices.errors import (
    AllocationError,
    ClosedResourceError,
    DeviceNotFoundError,
    OutOfMemoryError,
    StreamMismatchError,
    UnsupportedOperationError,
)
from devices.sim import SimConfig


class TestDeviceValues:
    def test_parse_and_print(self) -> None:
        assert Device.parse("cuda:1") == Device("cuda", 1)
        assert Device.parse("cpu") == Device("cpu", 0)
        assert Device.parse(" sim : 3 ") == Device("sim", 3)
        assert str(Device("sim", 1)) == "sim:1"
        assert repr(Device("cpu")) == "Device('cpu:0')"

    def test_tvm_spellings(self) -> None:
        assert asyncrt.cpu() == Device("cpu", 0)
        assert asyncrt.cuda(2) == Device("cuda", 2)
        assert asyncrt.sim(1) == Device("sim", 1)
        assert asyncrt.device("cuda:0") == Device("cuda", 0)
        assert asyncrt.device(Device("sim"), 1) == Device("sim", 1)

    def test_hashable_and_ordered(self) -> None:
        table = {Device("cpu"): 1, Device.parse("cpu:0"): 2}
        assert table == {Device("cpu"): 2}
        assert sorted([Device("sim", 1), Device("cpu"), Device("sim", 0)]) == [
            Device("cpu"),
            Device("sim", 0),
            Device("sim", 1),
        ]

    @pytest.mark.parametrize("text", ["", "cuda:", "cuda:-1", "CUDA:0", "cu da", "1:2"])
    def test_bad_strings(self, text: str) -> None:
        with pytest.raises(DeviceNotFoundError, match="cannot parse device"):
            Device.parse(text)

    def test_bad_fields(self) -> None:
        with pytest.raises(DeviceNotFoundError, match=">= 0"):
            Device("cpu", -1)
        with pytest.raises(DeviceNotFoundError, match="must be an int"):
            Device("cpu", True)

    def test_exist(self) -> None:
        assert Device("cpu").exist
        assert Device("sim", 1).exist
        assert not Device("sim", 2).exist
        assert not Device("nosuchkind").exist


class TestAttributes:
    def test_cpu_reports_what_it_can(self) -> None:
        api = devices.get_api("cpu")
        attrs = api.attributes(Device("cpu"))
        assert attrs["exist"] is True
        assert attrs["total_global_memory"] > 0
        assert attrs["flops"] > 0
        assert api.get_attr(Device("cpu"), "max_threads_per_block") >= 1

    def test_sim_reports_its_config(self) -> None:
        devices.sim.configure(1, SimConfig(flops=1e9, memory=1 << 20))
        api = devices.get_api("sim")
        assert api.get_attr(Device("sim"), "flops") == 1e9
        assert api.get_attr(Device("sim"), "total_global_memory") == 1 << 20

    def test_unknown_attribute_is_a_clear_answer(self) -> None:
        with pytest.raises(UnsupportedOperationError, match="compute_version"):
            devices.get_api("cpu").get_attr(Device("cpu"), "compute_version")

    def test_missing_device(self) -> None:
        api = devices.get_api("sim")
        assert api.get_attr(Device("sim", 7), "exist") is False
        with pytest.raises(DeviceNotFoundError, match=r"sim:7 does not exist"):
            api.get_attr(Device("sim", 7), "flops")
        with pytest.raises(DeviceNotFoundError, match="sim:5 does not exist"):
            api.alloc(Device("sim", 5), 16)

    def test_unknown_kind(self) -> None:
        with pytest.raises(DeviceNotFoundError, match="unknown device kind 'tpu'"):
            devices.get_api("tpu")


class TestAllocation:
    @pytest.mark.parametrize("kind", ["cpu", "sim"])
    def test_bad_sizes(self, kind: str) -> None:
        api, dev = devices.get_api(kind), Device(kind)
        with pytest.raises(AllocationError, match="-1 bytes"):
            api.alloc(dev, -1)
        with pytest.raises(AllocationError, match="limit"):
            api.alloc(dev, 1 << 60)
        with pytest.raises(AllocationError, match="must be an int"):
            api.alloc(dev, 1.5)  # type: ignore[arg-type]

    def test_sim_out_of_memory_names_device_and_request(self) -> None:
        devices.sim.configure(1, SimConfig(memory=1000))
        api, dev = devices.get_api("sim"), Device("sim")
        held = api.alloc(dev, 600)
        with pytest.raises(OutOfMemoryError) as info:
            api.alloc(dev, 600)
        assert info.value.device == "sim:0"
        assert info.value.requested == 600
        assert info.value.available == 400
        api.free(held)
        api.free(api.alloc(dev, 600))  # room again after the free

    def test_cpu_buffers_are_aligned(self) -> None:
        api = devices.get_api("cpu")
        for size in (1, 3, 64, 1000):
            buffer = api.alloc(Device("cpu"), size)
            assert buffer.raw.ctypes.data % 64 == 0
            api.free(buffer)

    def test_use_after_free(self) -> None:
        api = devices.get_api("sim")
        buffer = api.alloc(Device("sim"), 8)
        api.free(buffer)
        api.free(buffer)  # idempotent
        with pytest.raises(ClosedResourceError, match="after free"):
            buffer.raw  # noqa: B018

    def test_workspace_is_pooled(self) -> None:
        api, dev = devices.get_api("cpu"), Device("cpu")
        first = api.alloc_workspace(dev, 1000)
        assert first.nbytes == 1024
        api.free_workspace(first)
        assert api.alloc_workspace(dev, 1000) is first
        api.free_workspace(first)
        api.close(dev)
        assert first.freed


class TestStreamsBelongToDevices:
    def test_stream_of_another_device(self) -> None:
        cpu_api, sim_api = devices.get_api("cpu"), devices.get_api("sim")
        with sim_api.stream(Device("sim", 1)) as other:
            with pytest.raises(StreamMismatchError, match="belongs to sim:1"):
                sim_api.stream_sync(Device("sim", 0), other)
            with (
                cpu_api.stream(Device("cpu")) as mine,
                pytest.raises(StreamMismatchError),
            ):
                cpu_api.sync_stream_from_to(Device("cpu"), mine, other)

    def test_close_device_closes_its_streams(self) -> None:
        api = devices.get_api("cpu")
        stream = api.create_stream(Device("cpu"))
        api.close(Device("cpu"))
        assert stream.closed
        with pytest.raises(ClosedResourceError, match="closed"):
            stream.launch(print)


class ToyAPI(DeviceAPI):
    """A backend defined outside the package: memory is a bytearray."""

    kind = "toy"

    def device_count(self) -> int:
        return 3

    def _attributes(self, device: Device) -> dict[str, Any]:
        return {"device_name": f"toy #{device.index}"}

    def _alloc(self, device: Device, nbytes: int) -> Any:
        return np.zeros(nbytes, dtype=np.uint8)

    def _copy_within(self, src: Any, so: int, dst: Any, do: int, n: int) -> None:
        dst.raw[do : do + n] = src.raw[so : so + n]

    def _copy_to_host(self, src: Any, so: int, dst: np.ndarray[Any, Any]) -> None:
        dst[...] = src.raw[so : so + dst.nbytes]

    def _copy_from_host(self, src: np.ndarray[Any, Any], dst: Any, do: int) -> None:
        dst.raw[do : do + src.nbytes] = src


class TestRegistry:
    def test_toy_backend_from_outside(self) -> None:
        devices.register("toy", ToyAPI)
        try:
            assert "toy" in devices.registered_kinds()
            assert Device("toy", 2) in devices.list_devices()
            assert Device("toy", 2).exist and not Device("toy", 3).exist
            api = devices.get_api("toy")
            assert api.get_attr(Device("toy", 1), "device_name") == "toy #1"
            data = np.arange(12, dtype=np.int32).reshape(3, 4)
            on_toy = devices.array(data, Device("toy", 1))
            via_sim = on_toy.copyto(Device("sim", 0))  # staged through host
            back = via_sim.copyto(Device("toy", 0))
            np.testing.assert_array_equal(back.numpy(), data)
            with api.stream(Device("toy")) as stream:
                result = devices.empty((3, 4), "int32", Device("toy"))
                result.copyfrom(on_toy, stream)
                stream.synchronize()
            np.testing.assert_array_equal(result.numpy(), data)
        finally:
            devices.unregister("toy")
        assert not Device("toy").exist

    def test_kind_taken(self) -> None:
        with pytest.raises(ValueError, match="already registered"):
            devices.register("cpu", ToyAPI)

    def test_cuda_absent_is_reported_not_crashed(self) -> None:
        try:
            import cupy  # noqa: F401
        except ImportError:
            assert not Device("cuda").exist
            with pytest.raises(DeviceNotFoundError, match="not available"):
                devices.get_api("cuda")
        else:
            pytest.skip("cupy is installed")


def test_a_buffer_collected_while_its_api_is_locked_does_not_deadlock() -> None:
    """The garbage collector may drop a buffer at any allocation, also one
    made while the same thread holds the API's lock (seen on an H200 as a
    hung test): the release is deferred, never taken under that lock."""
    import gc

    from devices import get_api

    api = get_api("cpu")
    device = Device("cpu", 0)
    before = api.used_bytes(device)
    buffer = api.alloc(device, 4096)
    cycle: list[object] = [buffer]
    cycle.append(cycle)  # freed only by the collector
    del buffer
    with api._lock:  # as if an allocation under the lock triggered a collection
        del cycle
        gc.collect()
    assert api.used_bytes(device) == before
