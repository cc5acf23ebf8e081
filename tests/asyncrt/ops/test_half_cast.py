"""float32 -> float16 casts (:mod:`asyncrt.ops._jitcast`): the CPU's
conversion where it has one, and the bits loop elsewhere, both numpy's
bits for every kind of value: halves, the ties between them, subnormals,
overflow, and NaN payloads, signalling ones included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit, _jitcast

pytest.importorskip("numba")

Array = np.ndarray[Any, Any]


def _values() -> Array:
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    exact = halves.astype(np.float32).view(np.uint32)
    finite = exact[np.isfinite(halves)]
    # every bit pattern within 4 ulps (float32) of each half: the ties
    # between halves, and the values just either side of them
    around = (finite[:, None].astype(np.int64) + np.arange(-4, 5)).ravel()
    around = around[(around >= 0) & (around < 1 << 32)].astype(np.uint32)
    ties = ((finite[:-1].astype(np.uint64) + finite[1:]) // 2).astype(np.uint32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    nans = np.array(
        [0x7F800001, 0xFF800001, 0x7F802000, 0x7FA00000, 0x7FC00000, 0xFFFFFFFF,
         0x7F801FFF, 0x7FBFFFFF],
        np.uint32,
    )  # fmt: skip
    return np.concatenate([exact, around, ties, random, nans]).view(np.float32)


def _numpy(x: Array) -> Array:
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)


def _cast(x: Array) -> Array:
    out = np.empty(x.shape, np.float16)
    bound = _jitcast.bind_float32_to_half(x, out)
    assert bound is not None
    bound()
    return out.view(np.uint16)


@pytest.mark.parametrize("hardware", [True, False], ids=["cpu", "bits"])
def test_float32_to_half_gives_numpys_bits(
    hardware: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _jit.available():
        pytest.skip("numba is not installed")
    _jitcast._hardware_kernel.cache_clear()
    if not hardware:  # compiling for another CPU: the bits loop
        monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    elif _jitcast._hardware_kernel() is None:
        pytest.skip("this CPU has no float16 conversion")
    try:
        assert (_jitcast._hardware_kernel() is not None) == hardware
        x = _values()
        np.testing.assert_array_equal(_cast(x), _numpy(x))
        # a signalling NaN keeps numpy's bits (the CPU's instruction quiets it)
        snan = np.array([0x7F800001], np.uint32).view(np.float32)
        assert _cast(snan)[0] == 0x7C01
    finally:
        _jitcast._hardware_kernel.cache_clear()


def test_arrays_without_nan_and_with_take_the_same_path_to_the_same_bits() -> None:
    if not _jit.available():
        pytest.skip("numba is not installed")
    x = np.linspace(-70000, 70000, 100_003, dtype=np.float32)
    clean = _cast(x)
    x[50_000] = np.nan  # one NaN: its fix-up touches only NaN cells
    dirty = _cast(x)
    changed = np.flatnonzero(clean != dirty)
    assert changed.tolist() == [50_000]
    assert dirty[50_000] == _numpy(x[50_000:50_001])[0]
