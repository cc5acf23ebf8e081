"""TVM's params binary format: golden bytes, round trips, refusals, fuzzing."""

from __future__ import annotations

import re
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from asyncrt.errors import DTypeError, ParamsError
from asyncrt.io._params import decode_params, encode_params
from devices._dtype import DTYPES, EXTENSION_DTYPES, numpy_dtype

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def i64(value: int) -> bytes:
    return struct.pack("<q", value)


def array_record(
    code: int, bits: int, shape: tuple[int, ...], data: bytes, *, nbytes: int = -1
) -> bytes:
    """One array exactly as TVM's SaveDLTensor lays it out, built by hand."""
    return (
        u64(ARRAY_MAGIC)
        + u64(0)
        + struct.pack("<ii", 1, 0)  # DLDevice: kDLCPU, id 0
        + struct.pack("<i", len(shape))
        + struct.pack("<BBH", code, bits, 1)
        + b"".join(i64(d) for d in shape)
        + i64(len(data) if nbytes < 0 else nbytes)
        + data
    )


def blob_of(names: list[bytes], records: list[bytes]) -> bytes:
    out = u64(LIST_MAGIC) + u64(0) + u64(len(names))
    for name in names:
        out += u64(len(name)) + name
    return out + u64(len(records)) + b"".join(records)


# The golden blob: "w" float32 (2, 3) = 0..5, "b" bool (2,) = [T, F],
# "s" int64 scalar 7. Offsets of the first array's fields are fixed below.
GOLDEN = blob_of(
    [b"w", b"b", b"s"],
    [
        array_record(2, 32, (2, 3), struct.pack("<6f", 0, 1, 2, 3, 4, 5)),
        array_record(1, 1, (2,), b"\x01\x00"),
        array_record(0, 64, (), i64(7)),
    ],
)
# One-param blob for offset tests: name "w", float32 (2, 3).
ONE = blob_of([b"w"], [array_record(2, 32, (2, 3), bytes(24))])
# Offsets within ONE, from the layout: 0 magic, 8 reserved, 16 count, 24 len,
# 32 "w", 33 array count, 41 array magic, 49 reserved, 57 device_type,
# 61 device_id, 65 ndim, 69 dtype, 73 shape[0], 81 shape[1], 89 nbytes, 97 data.


def golden_arrays() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([True, False]),
        "s": np.array(7, dtype=np.int64),
    }


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_golden_decode() -> None:
    got = decode_params(GOLDEN)
    assert_same(got, golden_arrays())
    assert list(got) == ["w", "b", "s"]


def test_golden_encode_is_byte_exact() -> None:
    assert encode_params(golden_arrays()) == GOLDEN
    assert len(ONE) == 121


def test_decode_accepts_bytearray_and_memoryview() -> None:
    assert_same(decode_params(bytearray(GOLDEN)), golden_arrays())
    assert_same(decode_params(memoryview(GOLDEN)), golden_arrays())


def test_decoded_arrays_are_writable_independent_copies() -> None:
    source = bytearray(GOLDEN)
    got = decode_params(source)
    for array in got.values():
        assert array.flags.writeable
        assert array.flags.c_contiguous
        assert array.flags.aligned
    got["w"][0, 0] = 42.0
    source[97:101] = struct.pack("<f", 9.0)  # the blob changing later
    assert got["w"][0, 0] == 42.0
    assert decode_params(GOLDEN)["w"][0, 0] == 0.0


def test_kdlbool_code_is_accepted() -> None:
    blob = blob_of([b"m"], [array_record(6, 8, (3,), b"\x01\x00\x05")])
    got = decode_params(blob)["m"]
    assert got.dtype == np.bool_
    assert got.tolist() == [True, False, True]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3), (5,)])
def test_round_trip_every_dtype(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    array = (rng.random(shape) * 100).astype(dtype)
    got = decode_params(encode_params({"x": array}))
    assert_same(got, {"x": array})


def test_encoder_writes_tvm_dtype_codes() -> None:
    codes = {}
    for dtype in DTYPES:
        blob = encode_params({"x": np.zeros((), dtype=dtype)})
        codes[dtype] = struct.unpack_from("<BBH", blob, 69)
    assert codes == {
        "bool": (1, 1, 1),
        "int8": (0, 8, 1),
        "int16": (0, 16, 1),
        "int32": (0, 32, 1),
        "int64": (0, 64, 1),
        "uint8": (1, 8, 1),
        "uint16": (1, 16, 1),
        "uint32": (1, 32, 1),
        "uint64": (1, 64, 1),
        "float16": (2, 16, 1),
        "float32": (2, 32, 1),
        "float64": (2, 64, 1),
    }


def test_non_contiguous_and_big_endian_inputs() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    strided = base.T[::2]
    big = base.astype(">i4")
    blob = encode_params({"t": strided, "big": big})
    got = decode_params(blob)
    assert_same(got, {"t": np.ascontiguousarray(strided), "big": base.astype("<i4")})
    assert got["big"].dtype.isnative
    want = encode_params({"t": strided.copy(), "big": base.astype("<i4")})
    assert blob == want


def test_encode_rejects_bad_names_and_dtypes() -> None:
    with pytest.raises(ParamsError, match="not valid UTF-8") as info:
        encode_params({"a": np.zeros(1), "\ud800": np.zeros(1)})
    assert info.value.offset == 24 + 8 + 1
    with pytest.raises(ParamsError, match="not a str"):
        encode_params({1: np.zeros(1)})  # type: ignore[dict-item]
    with pytest.raises(DTypeError):
        encode_params({"c": np.zeros(2, dtype=np.complex64)})


@pytest.mark.parametrize("dtype", EXTENSION_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (2, 3)])
def test_round_trip_narrow_dtypes(dtype: str, shape: tuple[int, ...]) -> None:
    values = np.arange(np.prod(shape, dtype=int), dtype=np.float32) % 3 - 1
    if dtype.startswith("uint") or dtype == "float8_e8m0fnu":
        values = np.abs(values) + 1
    array = values.reshape(shape).astype(numpy_dtype(dtype))
    got = decode_params(encode_params({"x": array}))["x"]
    assert got.dtype == array.dtype
    assert got.shape == array.shape
    assert got.tobytes() == array.tobytes()


def test_narrow_dtypes_take_dlpack_codes_one_byte_per_element() -> None:
    codes = {}
    for dtype in EXTENSION_DTYPES:
        blob = encode_params({"x": np.zeros(3, dtype=numpy_dtype(dtype))})
        codes[dtype] = struct.unpack_from("<BBH", blob, 69)
        (nbytes,) = struct.unpack_from("<q", blob, 73 + 8)
        assert nbytes == 3 * numpy_dtype(dtype).itemsize, dtype
    assert codes == {
        "bfloat16": (4, 16, 1),
        "float8_e4m3fn": (10, 8, 1),
        "float8_e4m3fnuz": (11, 8, 1),
        "float8_e5m2": (12, 8, 1),
        "float8_e5m2fnuz": (13, 8, 1),
        "float8_e8m0fnu": (14, 8, 1),
        "float4_e2m1fn": (17, 4, 1),
        "int4": (0, 4, 1),
        "uint4": (1, 4, 1),
        "int2": (0, 2, 1),
        "uint2": (1, 2, 1),
    }


def test_sub_byte_decode_ignores_the_high_bits() -> None:
    blob = blob_of([b"q"], [array_record(0, 4, (3,), b"\xf7\x0f\x88")])
    got = decode_params(blob)["q"]
    assert str(got.dtype) == "int4"
    assert got.astype(np.int8).tolist() == [7, -1, -8]
    assert got.view(np.uint8).tolist() == [0x07, 0x0F, 0x08]


def test_empty_dict() -> None:
    blob = encode_params({})
    assert blob == u64(LIST_MAGIC) + u64(0) + u64(0) + u64(0)
    assert decode_params(blob) == {}


def patched(blob: bytes, offset: int, new: bytes) -> bytes:
    return blob[:offset] + new + blob[offset + len(new) :]


@pytest.mark.parametrize(
    ("blob", "offset", "message"),
    [
        (patched(ONE, 0, u64(1)), 0, "expected params list magic"),
        (patched(ONE, 16, u64(2**60)), 16, "name count 1152921504606846976 cannot"),
        (patched(ONE, 24, u64(2**63)), 32, "expected 9223372036854775808 bytes of"),
        (patched(ONE, 32, b"\xff"), 24, "name 0 is not valid UTF-8"),
        (patched(ONE, 33, u64(2)), 33, "array count 2 disagrees with name count 1"),
        (patched(ONE, 41, u64(5)), 41, "expected array magic"),
        (patched(ONE, 57, struct.pack("<i", 2)), 57, "device_type 2, expected kDLCPU"),
        (patched(ONE, 65, struct.pack("<i", -1)), 65, "ndim -1, expected 0..32"),
        (patched(ONE, 65, struct.pack("<i", 33)), 65, "ndim 33, expected 0..32"),
        (patched(ONE, 65, struct.pack("<i", 2**31 - 1)), 65, "ndim 2147483647"),
        (patched(ONE, 69, struct.pack("<BBH", 5, 64, 1)), 69, "unknown dtype"),
        (patched(ONE, 69, struct.pack("<BBH", 2, 32, 4)), 69, "lanes=4"),
        (patched(ONE, 73, i64(-2)), 73, "negative dim"),
        (patched(ONE, 73, i64(2**62)), 73, "overflows int64"),
        (patched(ONE, 89, i64(20)), 89, "declares 20 data bytes, but shape (2, 3)"),
        (patched(ONE, 73, i64(2**40)), 89, "needs 13194139533312"),
        (ONE + b"\x00", 121, "1 trailing bytes"),
        (ONE[:-1], 97, "expected 24 bytes of data of 'w', only 23 remain"),
        (ONE[:5], 0, "expected 8 bytes of list magic, only 5 remain"),
        (blob_of([b"a", b"a"], [ONE[41:], ONE[41:]]), 33, "duplicate param name"),
        (patched(ONE, 16, u64(0)), 24, "array count 1 disagrees with name count 0"),
    ],
)
def test_refusals_name_the_offset(blob: bytes, offset: int, message: str) -> None:
    with pytest.raises(ParamsError, match=re.escape(message)) as info:
        decode_params(blob)
    assert info.value.offset == offset
    assert f"byte offset {offset}:" in str(info.value)


def test_array_count_past_the_end() -> None:
    # A huge array count with matching names can never fit in what remains.
    names = [bytes([97 + i]) for i in range(3)]
    blob = blob_of(names, [])[:-8] + u64(3)
    with pytest.raises(ParamsError, match="array count 3 cannot fit") as info:
        decode_params(blob)
    assert info.value.offset == 24 + 3 * 9


def test_zero_size_array_with_huge_dim_is_refused_without_allocating() -> None:
    blob = patched(ONE, 73, i64(0))
    blob = patched(blob, 81, i64(2**62))
    blob = patched(blob, 89, i64(0))[:97]
    with pytest.raises(ParamsError, match="overflows int64"):
        decode_params(blob)
    fine = patched(patched(ONE, 73, i64(0)), 89, i64(0))[:97]
    assert decode_params(fine)["w"].shape == (0, 3)


@pytest.mark.parametrize(
    "blob",
    [
        patched(ONE, 16, u64(2**64 - 1)),
        patched(ONE, 24, u64(2**40)),
        patched(patched(ONE, 73, i64(2**30)), 89, i64(2**33)),
        patched(ONE, 65, struct.pack("<i", 2**31 - 1)),
    ],
)
def test_absurd_sizes_allocate_nothing_big(blob: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ParamsError):
            decode_params(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    blob = bytearray(draw(st.sampled_from([GOLDEN, ONE])))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "word"]))
        at = draw(st.integers(0, max(len(blob) - 1, 0)))
        if kind == "flip" and blob:
            blob[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and blob:
            blob[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "word" and len(blob) >= at + 8:
            value = draw(st.sampled_from([0, 1, 2**31, 2**32, 2**63, 2**64 - 1]))
            blob[at : at + 8] = u64(value)
    return bytes(blob)


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_fuzz_mutations_give_dict_or_params_error(blob: bytes) -> None:
    try:
        result = decode_params(blob)
    except ParamsError as exc:
        assert 0 <= exc.offset <= len(blob)
    else:
        assert isinstance(result, dict)
        for array in result.values():
            assert isinstance(array, np.ndarray)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(blob: bytes) -> None:
    try:
        result = decode_params(u64(LIST_MAGIC) + blob)
    except ParamsError:
        pass
    else:
        assert isinstance(result, dict)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.text(max_size=8),
        hnp.arrays(
            st.sampled_from(DTYPES).map(np.dtype),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        ),
        max_size=4,
    )
)
def test_round_trip_property(params: dict[str, np.ndarray]) -> None:
    params = {k: v for k, v in params.items() if _utf8(k)}
    blob = encode_params(params)
    got = decode_params(blob)
    assert list(got) == list(params)
    for name, array in params.items():
        assert got[name].dtype == array.dtype
        assert got[name].shape == array.shape
        assert got[name].tobytes() == array.tobytes()
    assert encode_params(got) == blob


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
