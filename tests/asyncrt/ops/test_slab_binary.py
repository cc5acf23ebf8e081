"""Binary ops where one operand is a value per slab (a squeeze-excitation's
``(N, C, 1, 1)`` scales against ``(N, C, H, W)``), compiled: numpy's bits
for every operator and either operand order, special values included,
split or not; every other broadcast left to numpy's ufunc."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jitbroadcast, _team_parts
from asyncrt.runtime import _threads

pytest.importorskip("numba")

_UFUNCS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def _values(shape: tuple[int, ...], seed: int) -> Any:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, 0.0]  # special values, and a zero divisor
    return a


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("operator", sorted(_UFUNCS))
@pytest.mark.parametrize(
    ("full", "slab"),
    [
        ((1, 72, 28, 28), (1, 72, 1, 1)),
        ((2, 5, 7, 3), (2, 5, 1, 1)),
        ((3, 4, 6), (3, 4, 1)),
        ((1, 6, 5, 5), (6, 1, 1)),  # fewer axes than the output
    ],
)
def test_a_value_per_slab_gives_numpys_bits(
    monkeypatch: pytest.MonkeyPatch,
    full: tuple[int, ...],
    slab: tuple[int, ...],
    operator: str,
    split: bool,
) -> None:
    if split:  # the slabs shared out, on the native team where it runs here
        monkeypatch.setattr(_team_parts, "MIN_TEAM_ELEMENTS", 1)
        monkeypatch.setattr(_jitbroadcast, "MIN_ELEMENTS_PER_THREAD", 1)
        monkeypatch.setattr(_threads.limits, "compiled_threads", 3)
        monkeypatch.setattr(_threads.limits, "threads", 3)
    ufunc = _UFUNCS[operator]
    kernel = _jitbroadcast.compiled_slab_binary(operator, ufunc)
    x, s = _values(full, 1), _values(slab, 2)
    for a, b in ((x, s), (s, x)):
        want = np.empty(full, np.float32)
        with np.errstate(all="ignore"):
            ufunc(a, b, want)
        out = np.full(full, 7.0, np.float32)
        call = kernel.bind(a, b, out)
        assert not isinstance(call, functools.partial) or call.func is not ufunc
        call()
        np.testing.assert_array_equal(out, want)  # NaN where NaN
        assert (np.signbit(out) == np.signbit(want)).all()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((2, 3, 4), (2, 3, 4)),  # one shape: numpy's own loop is as fast
        ((2, 3, 4), (4,)),  # a tile along the last axis
        ((2, 3, 4), (1, 3, 1)),  # a value per slab of another batch
        ((2, 3, 4), ()),  # a scalar
    ],
)
def test_other_broadcasts_keep_the_ufunc(
    a: tuple[int, ...], b: tuple[int, ...]
) -> None:
    kernel = _jitbroadcast.compiled_slab_binary("*", np.multiply)
    x = _values(a, 3)
    y = np.float32(2.5) * np.ones(b, np.float32)
    out = np.empty(np.broadcast_shapes(a, b), np.float32)
    call = kernel.bind(x, y, out)
    assert isinstance(call, functools.partial) and call.func is np.multiply
    call()
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out, x * y)
    # float64 too
    x64 = x.astype(np.float64)
    out64 = np.empty(out.shape, np.float64)
    call = kernel.bind(x64, y.astype(np.float64), out64)
    assert isinstance(call, functools.partial) and call.func is np.multiply
