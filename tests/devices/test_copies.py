"""Copies between every pair of devices: exact bytes, bounds, streams, memory.

Every direction across ``cpu:0``, ``sim:0`` and ``sim:1`` (and ``cuda:0``
when a GPU is present) must move bytes exactly: random bit patterns for
floats (so NaN payloads, infinities, signed zeros and subnormals), full
integer ranges, bools. Comparisons are on raw bytes, never on values.

Tests free what they allocate (the ``owned`` fixture) and check that every
device's ``used_bytes`` is back where it started.
"""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import devices
from devices import Buffer, Device, NDArray, Stream
from devices.errors import (
    ClosedResourceError,
    CopyError,
    OutOfMemoryError,
    StreamMismatchError,
)
from devices.sim import SimConfig, SimDeviceAPI

CPU, SIM0, SIM1 = Device("cpu", 0), Device("sim", 0), Device("sim", 1)
CUDA0 = Device("cuda", 0)
DEVICES = (CPU, SIM0, SIM1)
PAIRS = list(itertools.product(DEVICES, DEVICES))
MODES = ("blocking", "src-stream", "dst-stream", "into-array")
SHAPE = (3, 37)  # odd sizes: no accidental alignment


def pair_id(pair: tuple[Device, Device]) -> str:
    return f"{pair[0]}->{pair[1]}"


def random_data(dtype: str, shape: tuple[int, ...], seed: int = 0) -> Any:
    """Random host data of ``dtype`` covering its whole range."""
    rng = np.random.default_rng(seed)
    np_dtype: np.dtype[Any] = devices.numpy_dtype(dtype)
    count = int(np.prod(shape))
    if np_dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        flat = rng.integers(
            info.min, info.max, size=count, dtype=np_dtype, endpoint=True
        )
        extremes = np.array(
            [info.min, info.max, 0, -1 if info.min else 1], dtype=np_dtype
        )
        flat[: min(4, count)] = extremes[:count]
        return flat.reshape(shape)
    # floats: random bit patterns (NaNs with payloads included), plus specials
    bits = rng.integers(0, 256, size=count * np_dtype.itemsize, dtype=np.uint8)
    flat = bits.view(np_dtype).copy()
    info_f = np.finfo(np_dtype)
    specials = [
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        info_f.max,
        info_f.min,
        info_f.tiny,
        info_f.smallest_subnormal,
    ]
    n = min(len(specials), count)
    flat[:n] = np.array(specials, dtype=np_dtype)[:n]
    return flat.reshape(shape)


def same_bytes(actual: Any, expected: Any) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


def api_of(dev: Device) -> devices.DeviceAPI:
    return devices.get_api(dev.kind)


@pytest.fixture(scope="module", autouse=True)
def no_earlier_garbage() -> None:
    """Free earlier modules' garbage first: a buffer of theirs freed by a
    finalizer mid-test would skew :func:`owned`'s accounting. Once per
    module, since a full collection costs about 0.3 s here."""
    gc.collect()


@pytest.fixture
def owned() -> Iterator[list[Buffer]]:
    """Buffers a test made; freed afterwards, then accounting is checked."""
    used = {dev: api_of(dev).used_bytes(dev) for dev in DEVICES}
    buffers: list[Buffer] = []
    yield buffers
    for buffer in buffers:
        api_of(buffer.device).free(buffer)
    assert {dev: api_of(dev).used_bytes(dev) for dev in DEVICES} == used


def keep(owned: list[Buffer], array: NDArray) -> NDArray:
    owned.append(array.buffer)
    return array


def fill(buffer: Buffer, data: Any) -> None:
    NDArray(buffer, (buffer.nbytes,), "uint8").copyfrom(data)


def contents(buffer: Buffer) -> Any:
    return NDArray(buffer, (buffer.nbytes,), "uint8").numpy()


def round_trip(
    host: Any,
    src: Device,
    dst: Device,
    mode: str,
    owned: list[Buffer],
) -> None:
    """Put ``host`` on ``src``, copy it to ``dst`` by ``mode``, check bytes."""
    source = keep(owned, devices.array(host, src))
    if mode == "blocking":
        target = keep(owned, source.copyto(dst))
    elif mode == "into-array":
        target = keep(owned, devices.empty(host.shape, source.dtype, dst))
        with api_of(dst).stream(dst) as stream:
            assert source.copyto(target, stream=stream) is target
            stream.synchronize()
    else:
        on = src if mode == "src-stream" else dst
        with api_of(on).stream(on) as stream:
            target = keep(owned, source.copyto(dst, stream=stream))
            stream.synchronize()
    assert target.device == dst
    assert target.dtype == source.dtype
    same_bytes(target.numpy(), host)
    same_bytes(source.numpy(), host)  # the source is untouched


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", devices.DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_round_trip_is_exact(
    pair: tuple[Device, Device], mode: str, dtype: str, owned: list[Buffer]
) -> None:
    round_trip(random_data(dtype, SHAPE), *pair, mode, owned)


@pytest.mark.parametrize("shape", [(), (1,), (0,), (0, 4), (2, 0, 3), (4097,)])
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_round_trip_shapes(
    pair: tuple[Device, Device], shape: tuple[int, ...], owned: list[Buffer]
) -> None:
    for mode in MODES:
        round_trip(random_data("float32", shape), *pair, mode, owned)


def test_a_chain_through_every_device(owned: list[Buffer]) -> None:
    host = random_data("float64", (64, 3))
    array = keep(owned, devices.array(host, CPU))
    for dev in (SIM0, SIM1, SIM0, CPU, SIM1, CPU):
        array = keep(owned, array.copyto(dev))
    same_bytes(array.numpy(), host)


# -- copy_data_from_to ---------------------------------------------------------


@pytest.mark.parametrize("on", ["none", "src", "dst"])
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_copy_data_from_to_with_offsets(
    pair: tuple[Device, Device], on: str, owned: list[Buffer]
) -> None:
    copy_with_offsets(*pair, on, owned)


def copy_with_offsets(
    src_dev: Device, dst_dev: Device, on: str, owned: list[Buffer]
) -> None:
    """Copy the middle of one buffer into the middle of another; check that
    the bytes around the destination range are untouched."""
    src = api_of(src_dev).alloc(src_dev, 300)
    dst = api_of(dst_dev).alloc(dst_dev, 400)
    owned += [src, dst]
    rng = np.random.default_rng(1)
    src_bytes = rng.integers(0, 256, 300, dtype=np.uint8)
    dst_bytes = rng.integers(0, 256, 400, dtype=np.uint8)
    fill(src, src_bytes)
    fill(dst, dst_bytes)
    nbytes, src_off, dst_off = 123, 61, 203
    if on == "none":
        api_of(dst_dev).copy_data_from_to(src, src_off, dst, dst_off, nbytes)
    else:
        dev = src_dev if on == "src" else dst_dev
        with api_of(dev).stream(dev) as stream:
            api_of(dev).copy_data_from_to(
                src, src_off, dst, dst_off, nbytes, stream=stream
            )
            stream.synchronize()
    expected = dst_bytes.copy()
    expected[dst_off : dst_off + nbytes] = src_bytes[src_off : src_off + nbytes]
    same_bytes(contents(dst), expected)  # outside the range: untouched
    same_bytes(contents(src), src_bytes)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_copy_within_one_buffer(dev: Device, owned: list[Buffer]) -> None:
    api = api_of(dev)
    buffer = api.alloc(dev, 256)
    owned.append(buffer)
    data = np.arange(256, dtype=np.uint8)
    fill(buffer, data)
    api.copy_data_from_to(buffer, 0, buffer, 128, 100)
    expected = data.copy()
    expected[128:228] = data[:100]
    same_bytes(contents(buffer), expected)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_zero_size_copies(pair: tuple[Device, Device], owned: list[Buffer]) -> None:
    src_dev, dst_dev = pair
    src = api_of(src_dev).alloc(src_dev, 16)
    dst = api_of(dst_dev).alloc(dst_dev, 16)
    empty_src = api_of(src_dev).alloc(src_dev, 0)
    empty_dst = api_of(dst_dev).alloc(dst_dev, 0)
    owned += [src, dst, empty_src, empty_dst]
    fill(dst, np.full(16, 7, dtype=np.uint8))
    api = api_of(src_dev)
    for offset in (0, 8, 16):  # at the very end is still inside
        api.copy_data_from_to(src, offset, dst, offset, 0)
    api.copy_data_from_to(empty_src, 0, empty_dst, 0, 0)
    api.copy_data_from_to(empty_src, 0, dst, 16, 0)
    with api_of(dst_dev).stream(dst_dev) as stream:
        api.copy_data_from_to(src, 16, empty_dst, 0, 0, stream=stream)
        stream.synchronize()
    same_bytes(contents(dst), np.full(16, 7, dtype=np.uint8))
    assert contents(empty_dst).shape == (0,)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_copies_outside_a_buffer_raise(
    pair: tuple[Device, Device], owned: list[Buffer]
) -> None:
    src_dev, dst_dev = pair
    src = api_of(src_dev).alloc(src_dev, 100)
    dst = api_of(dst_dev).alloc(dst_dev, 60)
    owned += [src, dst]
    api = api_of(src_dev)
    bad = [
        # (src offset, dst offset, nbytes, words the message must contain)
        (0, 0, 101, ("101 bytes", "100-byte source")),
        (90, 0, 11, ("11 bytes", "offset 90", "100-byte source")),
        (0, 0, 61, ("61 bytes", "60-byte destination")),
        (0, 50, 11, ("11 bytes", "offset 50", "60-byte destination")),
        (-1, 0, 10, ("offset -1", "source")),
        (0, -1, 10, ("offset -1", "destination")),
        (0, 0, -1, ("-1 bytes",)),
        (101, 0, 0, ("offset 101", "100-byte source")),
    ]
    for src_off, dst_off, nbytes, words in bad:
        for stream_dev in (None, src_dev):
            with pytest.raises(CopyError) as info:
                if stream_dev is None:
                    api.copy_data_from_to(src, src_off, dst, dst_off, nbytes)
                else:
                    with api.stream(stream_dev) as stream:
                        api.copy_data_from_to(
                            src, src_off, dst, dst_off, nbytes, stream=stream
                        )
            for word in words:
                assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_a_stream_of_a_third_device_is_refused(
    pair: tuple[Device, Device], owned: list[Buffer]
) -> None:
    src_dev, dst_dev = pair
    third = next(dev for dev in DEVICES if dev not in pair)
    src = keep(owned, devices.array(np.arange(8, dtype=np.int32), src_dev))
    dst = keep(owned, devices.empty((8,), "int32", dst_dev))
    with api_of(third).stream(third) as stream:
        with pytest.raises(StreamMismatchError, match=str(third)):
            api_of(src_dev).copy_data_from_to(
                src.buffer, 0, dst.buffer, 0, 32, stream=stream
            )
        with pytest.raises(StreamMismatchError):
            src.copyto(dst, stream=stream)
        with pytest.raises(StreamMismatchError):
            dst.copyfrom(src, stream=stream)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_copies_touching_freed_buffers_raise(
    pair: tuple[Device, Device], owned: list[Buffer]
) -> None:
    src_dev, dst_dev = pair
    live_src = api_of(src_dev).alloc(src_dev, 32)
    live_dst = api_of(dst_dev).alloc(dst_dev, 32)
    owned += [live_src, live_dst]
    freed_src = api_of(src_dev).alloc(src_dev, 32)
    freed_dst = api_of(dst_dev).alloc(dst_dev, 32)
    api_of(src_dev).free(freed_src)
    api_of(dst_dev).free(freed_dst)
    api_of(dst_dev).free(freed_dst)  # idempotent: counted once
    assert freed_src.freed and freed_dst.freed
    api = api_of(src_dev)
    with pytest.raises(ClosedResourceError):
        api.copy_data_from_to(freed_src, 0, live_dst, 0, 32)
    with pytest.raises(ClosedResourceError):
        api.copy_data_from_to(live_src, 0, freed_dst, 0, 32)
    with pytest.raises(ClosedResourceError):
        api.copy_data_from_to(freed_src, 0, live_dst, 0, 0)
    with api.stream(src_dev) as stream, pytest.raises(ClosedResourceError):
        api.copy_data_from_to(freed_src, 0, live_dst, 0, 32, stream=stream)
    with pytest.raises(ClosedResourceError):
        NDArray(freed_src, (8,), "float32").numpy()


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_a_copy_on_a_closed_stream_raises(dev: Device, owned: list[Buffer]) -> None:
    api = api_of(dev)
    src, dst = api.alloc(dev, 8), api.alloc(dev, 8)
    owned += [src, dst]
    stream: Stream = api.create_stream(dev)
    api.free_stream(stream)
    with pytest.raises(ClosedResourceError):
        api.copy_data_from_to(src, 0, dst, 0, 8, stream=stream)


# -- memory accounting ---------------------------------------------------------


def test_sim_memory_goes_up_and_back_down() -> None:
    api = devices.get_api("sim")
    base0, base1 = api.used_bytes(SIM0), api.used_bytes(SIM1)
    buffer = api.alloc(SIM0, 1000)
    assert api.used_bytes(SIM0) == base0 + 1000
    on0 = devices.array(np.zeros((10, 10), dtype=np.float64), SIM0)
    assert api.used_bytes(SIM0) == base0 + 1800
    on1 = on0.copyto(SIM1)
    assert api.used_bytes(SIM1) == base1 + 800
    assert api.used_bytes(SIM0) == base0 + 1800
    empty = api.alloc(SIM0, 0)
    assert api.used_bytes(SIM0) == base0 + 1800
    for freed in (buffer, on0.buffer, empty):
        api.free(freed)
    api.free(buffer)  # idempotent
    assert api.used_bytes(SIM0) == base0
    assert api.used_bytes(SIM1) == base1 + 800
    api.free(on1.buffer)
    assert api.used_bytes(SIM1) == base1


def test_dropped_arrays_give_their_sim_memory_back() -> None:
    """``Buffer`` documents that garbage collection returns its memory.

    Uses a private ``SimDeviceAPI`` so that a leak cannot upset other tests.
    """
    api = SimDeviceAPI()
    array = NDArray(api.alloc(SIM0, 8000), (1000,), "float64")
    assert api.used_bytes(SIM0) == 8000
    collected = weakref.ref(array.buffer)
    del array
    gc.collect()
    assert collected() is None
    assert api.used_bytes(SIM0) == 0


def test_sim_out_of_memory_names_device_and_size() -> None:
    api = devices.get_api("sim")
    base = api.used_bytes(SIM0)  # whatever earlier tests still hold
    devices.sim.configure(2, SimConfig(memory=base + 4096))
    held = api.alloc(SIM0, 3000)
    try:
        with pytest.raises(OutOfMemoryError) as info:
            api.alloc(SIM0, 2000)
        assert info.value.device == "sim:0"
        assert info.value.requested == 2000
        assert info.value.available == 1096
        assert "sim:0" in str(info.value) and "2000" in str(info.value)
        assert isinstance(info.value, MemoryError)
        host = np.zeros(250, dtype=np.float64)  # 2000 bytes
        with pytest.raises(OutOfMemoryError) as info:
            devices.array(host, SIM0)
        assert info.value.requested == 2000
        assert api.used_bytes(SIM0) == base + 3000  # a failure takes nothing
    finally:
        api.free(held)
    room = api.alloc(SIM0, 4000)  # room again after the free
    api.free(room)
    assert api.used_bytes(SIM0) == base


# -- cuda ----------------------------------------------------------------------

CUDA_PAIRS = [
    pair for pair in itertools.product((*DEVICES, CUDA0), repeat=2) if CUDA0 in pair
]


@pytest.mark.cuda
class TestCudaCopies:
    """The round-trip matrix again with ``cuda:0``; skips without a GPU."""

    @pytest.fixture(autouse=True)
    def _need_gpu(self) -> None:
        pytest.importorskip("cupy")
        if not CUDA0.exist:
            pytest.skip("no cuda:0 device")

    @pytest.mark.parametrize("dtype", devices.DTYPES)
    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("pair", CUDA_PAIRS, ids=pair_id)
    def test_round_trip_is_exact(
        self, pair: tuple[Device, Device], mode: str, dtype: str
    ) -> None:
        buffers: list[Buffer] = []
        try:
            round_trip(random_data(dtype, SHAPE), *pair, mode, buffers)
        finally:
            for buffer in buffers:
                api_of(buffer.device).free(buffer)

    @pytest.mark.parametrize("on", ["none", "src", "dst"])
    @pytest.mark.parametrize("pair", CUDA_PAIRS, ids=pair_id)
    def test_copy_data_from_to_with_offsets(
        self, pair: tuple[Device, Device], on: str
    ) -> None:
        buffers: list[Buffer] = []
        try:
            copy_with_offsets(*pair, on, buffers)
        finally:
            for buffer in buffers:
                api_of(buffer.device).free(buffer)
