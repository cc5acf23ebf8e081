"""The cuda backend: runs only where cupy and an NVIDIA GPU are present."""

from __future__ import annotations

import numpy as np
import pytest

import devices
from devices import Device

pytestmark = pytest.mark.cuda

cupy = pytest.importorskip("cupy")
if not Device("cuda", 0).exist:
    pytest.skip("no CUDA device", allow_module_level=True)

GPU = Device("cuda", 0)


def test_attributes() -> None:
    attrs = devices.get_api("cuda").attributes(GPU)
    assert attrs["total_global_memory"] > 0
    assert "." in attrs["compute_version"]


def test_kernels_get_cupy_arrays_and_events_order_streams() -> None:
    api = devices.get_api("cuda")
    x = devices.array(np.arange(1 << 20, dtype=np.float32), GPU)
    y = devices.empty((1 << 20,), "float32", GPU)
    z = devices.empty((1 << 20,), "float32", GPU)
    with api.stream(GPU) as s1, api.stream(GPU) as s2:
        s1.launch(
            lambda a, out: cupy.multiply(a, 2, out=out),
            (x.backend_array(), y.backend_array()),
        )
        s2.wait_event(s1.record())  # device-side wait
        s2.launch(
            lambda a, out: cupy.add(a, 1, out=out),
            (y.backend_array(), z.backend_array()),
        )
        s2.synchronize()
    np.testing.assert_array_equal(
        z.numpy(), np.arange(1 << 20, dtype=np.float32) * 2 + 1
    )


@pytest.mark.anyio
async def test_await_event_from_host_callback() -> None:
    api = devices.get_api("cuda")
    x = devices.array(np.ones(1 << 22, dtype=np.float32), GPU)
    with api.stream(GPU) as stream:
        stream.launch(lambda a: cupy.multiply(a, 3, out=a), (x.backend_array(),))
        await stream.record().wait()
    assert float(x.numpy()[0]) == 3.0


def test_cpu_stream_waits_on_cuda_event_and_back() -> None:
    cuda_api, cpu_api = devices.get_api("cuda"), devices.get_api("cpu")
    host = devices.array(np.zeros(1000, dtype=np.float64), Device("cpu"))
    gpu = devices.empty((1000,), "float64", GPU)
    with cuda_api.stream(GPU) as sg, cpu_api.stream(Device("cpu")) as sc:
        sc.launch(lambda a: a.__setitem__(slice(None), 7.0), (host.backend_array(),))
        sg.wait_event(sc.record())  # cuda waits on a cpu event (host-side)
        gpu.copyfrom(host, sg)
        sg.launch(lambda a: cupy.sqrt(a, out=a), (gpu.backend_array(),))
        back = devices.empty((1000,), "float64", Device("cpu"))
        back.copyfrom(gpu, sg)
        sc.wait_event(sg.record())  # cpu waits on a cuda event (host callback)
        sc.synchronize()
    np.testing.assert_allclose(back.numpy(), np.sqrt(7.0))


def test_dlpack_both_ways_zero_copy() -> None:
    source = cupy.arange(10, dtype=cupy.float32)
    arr = devices.from_dlpack(source)
    assert arr.device == GPU
    source[0] = 42
    assert float(arr.numpy()[0]) == 42.0
    back = cupy.from_dlpack(arr)
    assert back.data.ptr == source.data.ptr


def test_out_of_memory_is_clear() -> None:
    with pytest.raises(devices.errors.OutOfMemoryError, match="cuda:0"):
        devices.empty((1 << 38,), "float32", GPU)


def test_a_stream_dying_on_the_callback_thread_is_destroyed_later() -> None:
    # A stream's last reference may go on the host-callback thread (cyclic
    # garbage is collected wherever an allocation runs the collector), where
    # cudaStreamDestroy is not permitted: it showed as an unraisable
    # CUDARuntimeError from cupy's Stream.__del__, which pytest reports as
    # a failure. The cupy stream waits in the graveyard for a stream thread.
    from devices import cuda

    api = devices.get_api("cuda")
    doomed = [api.create_stream(GPU)]
    api.free_stream(doomed[0])  # the api lets go of it
    kept_before = len(cuda._retired_events)

    def on_callback_thread(_: object) -> None:
        cuda._retired_events.mark_callback_thread()
        doomed.pop()  # the last reference goes here

    runner = cupy.cuda.Stream(non_blocking=True)
    runner.launch_host_func(on_callback_thread, None)
    runner.synchronize()
    assert not doomed
    assert len(cuda._retired_events) > kept_before  # kept, not destroyed there
    cuda._retired_events.drain()  # an ordinary thread destroys it
