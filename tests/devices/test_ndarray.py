"""NDArray: creation, copies, views, DLPack, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import asyncrt
from asyncrt import nd
from devices import Device
from devices.errors import (
    AllocationError,
    CopyError,
    DTypeError,
    UnsupportedOperationError,
)

CPU, SIM0, SIM1 = Device("cpu"), Device("sim", 0), Device("sim", 1)


def test_empty_array_numpy_roundtrip() -> None:
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for dev in (CPU, SIM0, SIM1):
        arr = nd.array(data, dev)
        assert arr.shape == (2, 3, 4)
        assert arr.dtype == "float32"
        assert arr.device == dev
        assert arr.nbytes == 96
        out = arr.numpy()
        np.testing.assert_array_equal(out, data)
        out[0, 0, 0] = 99  # numpy() is a copy: the array keeps its data
        assert arr.numpy()[0, 0, 0] == 0


def test_scalar_and_zero_size() -> None:
    scalar = nd.array(np.float64(2.5), SIM0)
    assert scalar.shape == () and scalar.numpy() == 2.5
    empty = nd.empty((0, 5), "int8", SIM1)
    assert empty.size == 0 and empty.numpy().shape == (0, 5)


def test_copyto_device_and_array() -> None:
    data = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    on_sim = nd.array(data, SIM0)
    on_sim1 = on_sim.copyto(SIM1)
    target = nd.empty((5, 7), "float32", CPU)
    assert on_sim1.copyto(target) is target
    np.testing.assert_array_equal(target.numpy(), data)


def test_copyfrom_checks_layout() -> None:
    arr = nd.empty((2, 2), "float32", SIM0)
    with pytest.raises(CopyError, match=r"shape \(3,\)"):
        arr.copyfrom(np.zeros(3, dtype=np.float32))
    with pytest.raises(CopyError, match="float64"):
        arr.copyfrom(nd.empty((2, 2), "float64", CPU))
    # host data of another dtype is cast, as numpy would
    arr.copyfrom(np.ones((2, 2), dtype=np.int64))
    np.testing.assert_array_equal(arr.numpy(), np.ones((2, 2), dtype=np.float32))


def test_views_share_memory() -> None:
    arena = nd.empty((64,), "uint8", SIM0)
    arena.copyfrom(np.zeros(64, dtype=np.uint8))
    a = arena.view((4,), "float32", byte_offset=16)
    a.copyfrom(np.array([1, 2, 3, 4], dtype=np.float32))
    raw = arena.numpy()
    assert raw[:16].sum() == 0 and raw[32:].sum() == 0
    np.testing.assert_array_equal(raw[16:32].view(np.float32), [1, 2, 3, 4])
    with pytest.raises(AllocationError, match="does not fit"):
        arena.view((17,), "float32")
    with pytest.raises(AllocationError, match="does not fit"):
        arena.view((1,), "float32", byte_offset=62)


def test_bad_shapes_and_dtypes() -> None:
    with pytest.raises(AllocationError, match="negative dim -1"):
        nd.empty((2, -1))
    with pytest.raises(AllocationError, match="absurdly large"):
        nd.empty((1 << 30, 1 << 30, 1 << 30))
    with pytest.raises(AllocationError, match="non-integer"):
        nd.empty((2.5,))  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="'float8'"):
        nd.empty((2,), "float8")
    with pytest.raises(DTypeError, match="complex64"):
        nd.array(np.zeros(2, dtype=np.complex64))


def test_dlpack_out_of_cpu_is_zero_copy() -> None:
    arr = nd.array(np.arange(6, dtype=np.int32), CPU)
    host = np.from_dlpack(arr)
    host[0] = 42
    assert arr.numpy()[0] == 42
    assert arr.__dlpack_device__() == (1, 0)


def test_dlpack_in_is_zero_copy() -> None:
    host = np.arange(10, dtype=np.float64)
    arr = nd.from_dlpack(host)
    assert arr.device == CPU and arr.shape == (10,)
    host[3] = -1.0
    assert arr.numpy()[3] == -1.0


def test_dlpack_in_non_contiguous_copies() -> None:
    host = np.arange(20, dtype=np.int16)[::2]
    arr = nd.from_dlpack(host)
    np.testing.assert_array_equal(arr.numpy(), host)


def test_sim_memory_is_not_host_memory() -> None:
    arr = nd.array(np.ones(4, dtype=np.float32), SIM0)
    with pytest.raises(UnsupportedOperationError, match="copy it to cpu"):
        arr.__dlpack__()
    with pytest.raises(ValueError, match="without a copy"):
        np.asarray(arr, copy=False)
    np.testing.assert_array_equal(np.asarray(arr), np.ones(4))  # a copy is fine


def test_not_a_dlpack_tensor() -> None:
    with pytest.raises(UnsupportedOperationError, match="list is not a DLPack"):
        nd.from_dlpack([1, 2, 3])


def test_torch_tensors_pass_through_dlpack() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(8, dtype=torch.float32)
    arr = nd.from_dlpack(tensor)
    tensor[0] = 5.0
    assert arr.numpy()[0] == 5.0
    back = torch.from_dlpack(arr)
    assert back.data_ptr() == tensor.data_ptr()


def test_public_names_are_pinned() -> None:
    assert set(asyncrt.nd.__all__) == {"NDArray", "array", "empty", "from_dlpack"}
    for name in asyncrt.__all__:
        assert hasattr(asyncrt, name), name
